"""Host calls between kernel segments: long sorts and scans, random ops on computed values, custom
ops and the opt-in eager fallback (neuron_compile.segments, passes/host_calls.py)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F

import neuron_compile
from neuron_compile.errors import NeuronCompileError, UnsupportedOpsError
from neuron_compile.passes.host_calls import GENERATED_MAX_LENGTH
from neuron_compile.segments import Program, split_program
from neuron_compile.passes.host_calls import host_call_nodes
from tests.conftest import neuron_compile as nc
from tests.e2e.test_errors import unwrap

CALLS: list[str] = []


@torch.library.custom_op("neuron_test::host_scale", mutates_args=())
def host_scale(x: torch.Tensor, k: float) -> torch.Tensor:
    CALLS.append("host_scale")
    return x * k + 0.5


@host_scale.register_fake
def _(x, k):
    return torch.empty_like(x)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    yield
    torch._dynamo.reset()


def _same(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w), (g, w)


LONG = GENERATED_MAX_LENGTH * 20


@pytest.mark.parametrize("name, fn, x", [
    ("topk", lambda x: torch.topk(x, 50, dim=-1), torch.randn(3, LONG)),
    ("topk-smallest", lambda x: torch.topk(x, 7, dim=0, largest=False), torch.randn(LONG, 2)),
    ("sort", lambda x: torch.sort(x, dim=-1, descending=True), torch.randn(4, LONG)),
    ("sort-stable-ties", lambda x: torch.sort(x, stable=True), torch.randint(0, 5, (LONG,)).float()),
    ("argsort", lambda x: torch.argsort(x), torch.randn(LONG)),
    ("cumsum", lambda x: torch.cumsum(x, -1), torch.randn(5, LONG)),
    ("cummax", lambda x: torch.cummax(x, 0), torch.randn(LONG, 3)),
    ("logcumsumexp", lambda x: torch.logcumsumexp(x, -1), torch.randn(2, LONG)),
    ("searchsorted", lambda x: torch.searchsorted(torch.sort(x).values, x * 0.5), torch.randn(LONG)),
    ("median", lambda x: torch.median(x, -1), torch.randn(3, LONG)),
    ("median-all", lambda x: torch.median(x), torch.randn(LONG)),
    ("nanmedian", lambda x: torch.nanmedian(x, 0), torch.where(torch.rand(LONG, 2) < 0.2, float("nan"), 1.0)
     * torch.randn(LONG, 2)),
    ("kthvalue", lambda x: torch.kthvalue(x, 5, -1), torch.randn(2, LONG)),
    ("mode", lambda x: torch.mode(x, -1), torch.randint(0, 9, (3, LONG)).float()),
    ("quantile", lambda x: torch.quantile(x, torch.tensor([0.1, 0.5, 0.9]), dim=-1), torch.randn(3, LONG)),
])
def test_long_rows_run_on_the_host_and_match_eager_exactly(name, fn, x):
    got = nc(fn)(x)
    _same(got, fn(x))
    assert neuron_compile.metrics()["host_calls"] >= 1


def test_short_rows_stay_generated_kernels():
    x = torch.randn(6, GENERATED_MAX_LENGTH)
    v, i = nc(lambda x: torch.topk(x, 3))(x)
    ev, ei = torch.topk(x, 3)
    torch.testing.assert_close(v, ev)
    assert torch.equal(i, ei)
    assert neuron_compile.metrics()["host_calls"] == 0


def chain(x, w):
    h = torch.relu(x @ w)
    v, i = torch.topk(h, 20, dim=-1)
    return torch.exp(v).sum(-1), i


def test_kernels_on_both_sides_of_a_host_call():
    x, w = torch.randn(5, 40, dtype=torch.float64), torch.randn(40, LONG, dtype=torch.float64)
    got = nc(chain)(x.float(), w.float())
    want = chain(x, w)
    torch.testing.assert_close(got[0].double(), want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1])
    m = neuron_compile.metrics()
    assert m["host_calls"] == 1 and m["graphs_compiled"] == 2  # a segment each side of the topk


def test_program_splits_at_the_host_call_and_round_trips_through_json():
    gm = torch.fx.experimental.proxy_tensor.make_fx(chain, tracing_mode="fake")(
        torch.randn(5, 40), torch.randn(40, LONG))
    nodes, fallbacks = host_call_nodes(gm)
    assert [n.target for n in nodes if n.target is torch.ops.aten.topk.default] and not fallbacks
    program, segments = split_program(gm, nodes)
    kinds = ["kernel" if "kernel" in s else "host" if "host" in s else "getitem"
             for s in program.to_json()["steps"]]
    assert kinds == ["kernel", "host", "getitem", "getitem", "kernel"]
    assert len(segments) == 2
    text = json.dumps(program.to_json())
    assert Program.from_json(json.loads(text)).to_json() == program.to_json()
    assert all(n.op != "call_function" or n.target is not torch.ops.aten.topk.default
               for seg in segments for n in seg.graph.nodes)


def test_training_through_a_host_call_matches_float64_eager():
    x = torch.randn(4, LONG, dtype=torch.float64)

    def f(x):
        return (torch.topk(x.sin(), 9).values ** 2).sum() + torch.cumsum(x, -1).mean()
    xc = x.float().requires_grad_()
    nc(f)(xc).backward()
    xr = x.clone().requires_grad_()
    f(xr).backward()
    torch.testing.assert_close(xc.grad.double(), xr.grad, rtol=1e-4, atol=1e-5)


def test_random_ops_on_computed_values_draw_like_eager():
    conv = torch.nn.Conv2d(3, 8, 3)

    def f(x):
        y = F.dropout2d(conv(x), 0.5, training=True)
        p = torch.sigmoid(y.mean((2, 3)))
        return y, torch.bernoulli(p), F.rrelu(y, training=True)
    x = torch.randn(2, 3, 10, 10)
    cf = nc(f)
    torch.manual_seed(7)
    got = cf(x)
    torch.manual_seed(7)
    want = f(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert neuron_compile.metrics()["host_calls"] >= 2
    assert not torch.equal(got[1], torch.zeros_like(got[1]))  # a real draw, not a constant


def test_custom_ops_run_as_host_calls_and_are_counted():
    CALLS.clear()
    x = torch.randn(7, dtype=torch.float64)
    f = nc(lambda x: torch.ops.neuron_test.host_scale(x.exp(), 3.0).tanh())
    got = f(x.float())
    assert CALLS == ["host_scale"]  # the user's own code ran once, on the host
    torch.testing.assert_close(got.double(), (x.exp() * 3.0 + 0.5).tanh(), rtol=1e-5, atol=1e-6)
    assert neuron_compile.metrics()["host_calls"] == 1


def no_rule(x):
    return torch.nextafter(x.exp(), x) * 2 + torch.fft.rfft(x).abs().sum()


def test_eager_fallback_is_opt_in_warns_once_and_is_reported():
    x = torch.randn(6)
    with pytest.raises(Exception) as info:
        nc(no_rule)(x)
    assert isinstance(unwrap(info.value, UnsupportedOpsError), UnsupportedOpsError)
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = nc(no_rule, options={"fallback": "eager"})
        got = f(x)
        f(x)
    ours = [w for w in caught if "fallback='eager'" in str(w.message)]
    assert len(ours) == 1
    ops = neuron_compile.get_fallback_ops()
    assert {u.op for u in ops} >= {"aten.nextafter.default", "aten._fft_r2c.default"}
    line = no_rule.__code__.co_firstlineno + 1
    assert all(u.location.endswith(f"test_host_calls.py:{line}") for u in ops)
    assert neuron_compile.metrics()["fallback_ops"] == len(ops)
    want = torch.nextafter(x.exp(), x) * 2 + torch.fft.rfft(x).abs().sum()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_fallback_from_the_environment_and_bad_values(monkeypatch):
    monkeypatch.setenv("NEURON_FALLBACK", "eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.randn(3)
        torch.testing.assert_close(nc(lambda x: torch.nextafter(x, x + 1))(x), torch.nextafter(x, x + 1))
    from neuron_compile.config import resolve_config
    with pytest.raises(NeuronCompileError, match="fallback must be"):
        resolve_config({"fallback": "python"})


def test_a_program_is_one_cache_entry_that_loads_its_segments(tmp_path):
    from neuron_compile.cache import clear_memory_cache
    from neuron_compile.executable import read_manifest
    x, w = torch.randn(5, 40), torch.randn(40, LONG)
    opts = {"cache_dir": str(tmp_path)}
    clear_memory_cache()  # compiled earlier in this process: start cold
    first = nc(chain, options=opts)(x, w)
    assert neuron_compile.metrics()["graphs_compiled"] == 2
    programs = [m for m in tmp_path.rglob("manifest.json") if read_manifest(m.parent).get("program")]
    assert len(programs) == 1
    manifest = read_manifest(programs[0].parent)
    assert len(manifest["program"]["segments"]) == 2
    # a warm start (memory cache dropped, as in a new process): one disk hit, nothing compiled
    clear_memory_cache()
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    again = nc(chain, options=opts)(x, w)
    m = neuron_compile.metrics()
    assert (m["graphs_compiled"], m["disk_hits"], m["host_calls"]) == (0, 1, 1)
    for a, b in zip(again, first):
        assert torch.equal(a, b)
    # the loader runs it directly; a segment gone from the cache is a clear error, not a crash
    exe = neuron_compile.load_executable(programs[0].parent)
    assert torch.equal(exe([x, w])[1], first[1])
    seg = programs[0].parent.parent.parent / manifest["program"]["segments"][0][:2] / manifest["program"]["segments"][0]
    import shutil
    shutil.rmtree(seg)
    with pytest.raises(neuron_compile.errors.ExecutableError, match="kernel segment"):
        neuron_compile.load_executable(programs[0].parent)


@pytest.mark.parametrize("fn, x", [
    (lambda x: torch.cumsum(x, -1), torch.randn(4, LONG)),                        # a program
    (lambda x: torch.linalg.inv(x) * 2, torch.randn(4, 4) + 4 * torch.eye(4)),    # a host check after a kernel
])
def test_outputs_are_freed_when_dropped_without_the_garbage_collector(fn, x):
    """A reference cycle in the runtime would keep every output alive until gc runs (each call
    then faults in fresh memory: 3x the time of a 16 MB cumsum, measured)."""
    import gc
    import weakref
    f = nc(fn)
    f(x)
    gc.disable()
    try:
        out = f(x)
        ref = weakref.ref(out)
        del out
        assert ref() is None
    finally:
        gc.enable()
