"""``NEURON_PROFILE``: every kernel's calls and time are counted and tabled, results stay eager's."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.conftest import neuron_compile


def test_profile_counts_every_kernel_and_keeps_results(tmp_path):
    from neuron_compile import profile
    torch.manual_seed(0)
    x, w, b = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)

    def fn(x, w, b):
        return F.layer_norm(F.gelu(F.linear(x, w, b)), (48,)).softmax(-1)

    compiled = neuron_compile(fn, options={"profile": True, "cache_dir": str(tmp_path)})
    for _ in range(3):
        out = compiled(x, w, b)
    torch.testing.assert_close(out, fn(x, w, b))
    text = profile.report()
    exe = [e for e in profile._profiled if e.profile is not None and "inference" in e.name][-1]
    rows = profile.rows(exe)
    kernels = [r for r in rows if r["kernel"] != "-" and r["kind"] != "(glue)"]
    assert len(kernels) == len(exe.kernels) >= 3
    # the serial glue before each kernel whose root op is at the graph's top level, in a row of its own
    glue = [r for r in rows if r["kind"] == "(glue)"]
    assert glue and {r["kernel"] for r in glue} <= {f"<{k}" for k in range(len(exe.kernels))}
    assert all(r["calls"] == 3 for r in rows)
    assert {r["kind"] for r in kernels} >= {"matmul", "reduction", "pointwise"}
    assert all(r["seconds"] >= 0 for r in rows) and sum(r["seconds"] for r in rows) > 0
    assert "GFLOP/s" in text and exe.name in text
    profile.reset()
    assert all(r["calls"] == 0 for r in profile.rows(exe))


def test_unprofiled_executables_have_no_counters(tmp_path):
    from neuron_compile import profile
    exe_out = neuron_compile(lambda x: x.exp() + 1, options={"cache_dir": str(tmp_path)})(torch.randn(5))
    assert exe_out.shape == (5,)
    assert all(e.profile is not None for e in profile._profiled)


def test_fused_chain_members_name_the_kernel_holding_their_time(tmp_path):
    # layer_norm's kernels run as one fused-rows loop nest; the members whose slot holds no time
    # must not print a rate computed from that (near-zero) time
    from neuron_compile import profile
    x = torch.randn(512, 256)
    compiled = neuron_compile(lambda t: F.layer_norm(t, (256,)), options={"profile": True, "cache_dir": str(tmp_path)})
    for _ in range(2):
        compiled(x)
    exe, = [e for e in profile._profiled if e.profile is not None and any(
        k["schedule"]["strategy"] == "fused-rows" and k["ranges"] == [512, 256] for k in e.kernels)]
    rows = [r for r in profile.rows(exe) if r["kernel"] != "-"]
    fused = [r for r in rows if r["schedule"] == "fused-rows"]
    assert len(fused) >= 2
    holders = [r for r in fused if not r["rate"].startswith("(in kernel")]
    assert len(holders) == 1 and holders[0]["rate"].endswith("GB/s")
    assert all(r["rate"] == f"(in kernel {holders[0]['kernel']})" for r in fused if r is not holders[0])
    profile.reset()


def test_loops_kernels_are_flagged_and_summed_per_schedule(tmp_path):
    # every kernel forced onto loops: all the kernel time is under "loops", and a kernel with a
    # large share of its graph carries the loops flag in the table
    from neuron_compile import profile
    profile.reset()
    x = torch.randn(256, 512)
    compiled = neuron_compile(lambda t: (t.exp() * 2).sum(-1), options={
        "profile": True, "cache_dir": str(tmp_path), "schedule": '{"*": "loops"}'})
    for _ in range(3):
        out = compiled(x)
    torch.testing.assert_close(out, (x.exp() * 2).sum(-1), rtol=1e-5, atol=1e-4)
    seconds = profile.seconds_by_schedule()
    assert seconds["loops"] > 0 and {k for k, v in seconds.items() if v} <= {"loops", "", "(serial)"}
    exe = [e for e in profile._profiled if e.profile is not None and any(r["calls"] for r in profile.rows(e))][-1]
    rows = [r for r in profile.rows(exe) if r["kernel"] != "-"]
    assert any(profile.flag(r) == "loops" for r in rows)
    assert "loops" in profile.table(exe).splitlines()[2]
    profile.reset()
    assert sum(profile.seconds_by_schedule().values()) == 0


def test_serial_glue_before_a_kernel_is_flagged_when_it_takes_a_share():
    """Glue (untagged inits and fills run by the graph's serial code) is a row of its own, flagged
    from :data:`~neuron_compile.profile.FLAG_SHARE` of the graph up, like a ``loops`` kernel."""
    from neuron_compile import profile
    row = {"kernel": "<3", "kind": "(glue)", "schedule": "(serial)", "ops": [], "ranges": "", "calls": 10,
           "seconds": 0.02, "share": profile.FLAG_SHARE, "rate": ""}
    assert profile.flag(row) == "glue"
    assert profile.flag({**row, "share": profile.FLAG_SHARE / 2}) == ""


def test_a_profiled_cnn_compiles_and_matches_eager(tmp_path):
    """A profiled CNN (a convolution, batch norm, pooling and a classifier GEMM writing the graph
    output) compiles and matches eager. The glue ticks are prefixed to a kernel op's line, never
    inserted as lines of their own: rules keep indices into the graph's lines (a GEMM's region
    views, in-place loop updates), and shifted, one rewrote the wrong line (the benchmark's
    ResNet-18 and MobileNetV2 inference, profiled: ``redefinition of SSA value``)."""
    import torch.nn as nn
    torch.manual_seed(0)
    # the classifier head's GEMM writes the graph output through its register-tile region views
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(32, 8)).eval()
    x = torch.randn(16, 3, 8, 8)
    compiled = torch.compile(m, backend="neuron", dynamic=False,
                             options={"profile": True, "cache_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-5)


def test_the_table_sums_glue_rows_under_the_shown_share_into_one(monkeypatch):
    """Small glue rows are summed into one ``<*`` row, their seconds kept; a large one stays its own."""
    from neuron_compile import profile
    def row(kernel, kind, seconds, share):
        return {"kernel": kernel, "kind": kind, "schedule": "(serial)" if kind == "(glue)" else "matmul", "ops": [],
                "ranges": "", "calls": 10, "seconds": seconds, "share": share, "rate": ""}
    rs = [row("<0", "(glue)", 0.0001, 0.001), row(0, "matmul", 0.08, 0.8), row("<1", "(glue)", 0.0002, 0.002),
          row(1, "pointwise", 0.0097, 0.097), row("<2", "(glue)", 0.01, 0.1)]
    monkeypatch.setattr(profile, "rows", lambda exe: rs)
    text = profile.table(type("Exe", (), {"name": "g"})())
    lines = text.splitlines()[2:]
    assert [ln.split()[0] for ln in lines] == ["0", "<2", "1", "<*"]
    assert "(2 under 0.5%)" in lines[-1] and f"{0.0003 / 10 * 1e3:.3f}" in lines[-1]
