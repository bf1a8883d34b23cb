"""Numerics of the vectorized schedules (pointwise, row and column reductions) against eager, on
shapes that exercise their edge cases: tails that the vector step does not divide, partial forall
tiles, broadcasts, transposed reads, several reduction dims, every dtype family; and the same bits
with 1 and 2 threads (every row or column block is one thread's, so the order of operations does not
depend on the thread count)."""
from __future__ import annotations

import json
import re

import pytest
import torch

from neuron_compile.codegen import TargetInfo, plan_codegen
from tests.conftest import neuron_compile
from tests.helpers import at_one_and_two_threads
from tests.ir.lower import lower

AVX2 = TargetInfo("avx2", 256, 16)


def _strategies(fn, *args) -> list[str]:
    _, lowered = lower(fn, *args)
    return [s.strategy for s in plan_codegen(lowered.kernels, AVX2, uses=lowered.value_uses).schedules]


def _run_both_thread_counts(fn, *args):
    return at_one_and_two_threads(neuron_compile(fn), *args)


def _close_to_reference(ours, fn, args, rtol_scale=4.0):
    """Ours no further from eager-at-float64 than eager itself (plus a few ulps)."""
    ref = fn(*[a.double() if a.is_floating_point() else a for a in args])
    eager = fn(*args)
    for o, e, r in zip(*(x if isinstance(x, tuple) else (x,) for x in (ours, eager, ref))):
        assert o.dtype == e.dtype and o.shape == e.shape
        if not o.is_floating_point():
            assert torch.equal(o, e)
            continue
        err, err_eager = (o.double() - r).abs().max(), (e.double() - r).abs().max()
        ulp = torch.finfo(o.dtype).eps * r.abs().max().clamp(min=1)
        ulps = 64 if o.dtype == torch.float64 else 4  # float64: eager is the reference, only the order differs
        assert err <= rtol_scale * err_eager + ulps * ulp, (err, err_eager)


POINTWISE = {
    "odd-2d-broadcast": (lambda x, b: torch.sigmoid(x * 1.5 + b).mul(x), (torch.randn(37, 1003), torch.randn(1003))),
    "row-broadcast": (lambda x, b: (x - b) * torch.rsqrt(b.abs() + 1), (torch.randn(96, 768), torch.randn(96, 1))),
    "vocab-row": (lambda x: torch.exp(x - 1.0) * 0.5, (torch.randn(3, 50257),)),
    "one-dim": (lambda x: torch.erf(x) + x * x, (torch.randn(100003),)),
    "rank-4": (lambda x, y: torch.where(x > y, x, y * 2), (torch.randn(4, 5, 6, 70), torch.randn(5, 1, 70))),
    "transposed-read": (lambda x, y: x.t() * y + 1, (torch.randn(300, 200), torch.randn(200, 300))),
    "float64": (lambda x: torch.exp(x) / (1 + x * x), (torch.randn(129, 257, dtype=torch.float64),)),
    "int32": (lambda x, y: x * 3 + y // 2, (torch.randint(-1000, 1000, (70, 130), dtype=torch.int32),
                                           torch.randint(1, 1000, (70, 130), dtype=torch.int32))),
    "bool": (lambda x, y: (x > 0) & (y < 0.5), (torch.randn(77, 201), torch.rand(77, 201))),
}


@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_schedule(case):
    fn, args = POINTWISE[case]
    torch.manual_seed(0)
    assert "pointwise" in _strategies(fn, *args)
    one, two = _run_both_thread_counts(fn, *args)
    _close_to_reference(one, fn, args)
    assert torch.equal(one, two)


REDUCTIONS = {
    "softmax-odd": (lambda x: x.softmax(-1), (torch.randn(64, 1000),), "fused-rows"),
    "amax-sum-tail": (lambda x: (x.amax(-1), (x * x).sum(-1)), (torch.randn(33, 50257 // 7),), "row-reduction"),
    "layer-norm": (lambda x, w, b: torch.nn.functional.layer_norm(x, (768,), w, b),
                   (torch.randn(128, 768), torch.randn(768), torch.randn(768)), "fused-rows"),
    "var-mean-f64": (lambda x: torch.var_mean(x, -1), (torch.randn(40, 333, dtype=torch.float64),), "row-reduction"),
    "two-dims": (lambda x: x.sum((1, 2)), (torch.randn(6, 30, 41),), "row-reduction"),
    "bias-grad": (lambda g: g.sum(0), (torch.randn(256, 1024),), "column-reduction"),
    "bias-grad-odd": (lambda g, x: (g * x).sum(0), (torch.randn(300, 1000), torch.randn(300, 1000)),
                      "column-reduction"),
    "column-small": (lambda g: g.amin(0), (torch.randn(257, 77),), "column-reduction"),
    "column-3d": (lambda g: g.sum((0, 1)), (torch.randn(8, 64, 96),), "column-reduction"),
    "int-sum": (lambda x: x.sum(-1), (torch.randint(-50, 50, (90, 333)),), "row-reduction"),
}


@pytest.mark.parametrize("case", REDUCTIONS)
def test_reduction_schedule(case):
    fn, args, expected = REDUCTIONS[case]
    torch.manual_seed(0)
    assert expected in _strategies(fn, *args)
    one, two = _run_both_thread_counts(fn, *args)
    _close_to_reference(one, fn, args)
    for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (one, two))):
        assert torch.equal(a, b)


def test_small_gather_and_half_kernels_keep_plain_loops():
    assert _strategies(lambda x: x + 1, torch.randn(3, 5)) == ["loops"]
    # LLVM legalises bf16/f16 vectors through float32 with libgcc helpers some hosts lack
    half = (lambda x, y: (x * y + 1).relu(), (torch.randn(65, 300).half(), torch.randn(65, 300).half()))
    assert _strategies(half[0], *half[1]) == ["loops"]
    _close_to_reference(neuron_compile(half[0])(*half[1]), *half)
    idx = torch.randint(0, 100, (500,))
    assert "loops" in _strategies(lambda w, i: w[i] * 2, torch.randn(100, 64), idx)


def test_schedules_are_recorded_in_the_dump(tmp_path):
    x = torch.randn(61, 999)  # a shape no other test compiles (the in-memory cache would skip the dump)
    neuron_compile(lambda t: t.softmax(-1), options={"dump_dir": str(tmp_path), "cache": False})(x)
    (path,) = tmp_path.glob("*/*.schedule.json")
    plan = json.loads(path.read_text())
    # max, exp, sum, divide: one chain, run as one pass over blocks of rows
    assert [k["schedule"]["strategy"] for k in plan["kernels"]] == ["fused-rows"] * 4
    assert plan["kernels"][0]["schedule"]["params"]["group"] == [0, 1, 2, 3]
    assert list(tmp_path.glob("*/*.schedule.mlir"))


def test_horizontal_sums_are_trees_not_serial_chains(tmp_path):
    """A row reduction's partial accumulators end in one ``llvm.vector.reduce.fadd`` per row. Without
    ``reassoc`` LLVM must add the lanes in order: 64 dependent scalar adds per row with AVX-512,
    more than the row's vector loop (layer_norm 4096x1024). The combiner is already reassociated
    into partial sums, so the tree is the same license and no less accurate."""
    x = torch.randn(67, 1001)  # a shape no other test compiles (the in-memory cache would skip the dump)
    fn = lambda t: t.sum(-1) * 2  # noqa: E731
    out = neuron_compile(fn, options={"dump_dir": str(tmp_path), "cache": False})(x)
    _close_to_reference(out, fn, (x,))
    llvm_ir = "".join(p.read_text() for p in tmp_path.glob("*/*.obj.ll"))
    calls = [line for line in llvm_ir.splitlines() if "call" in line and "llvm.vector.reduce.fadd" in line]
    assert calls and all(" reassoc " in line for line in calls), calls


FUSED = {
    "softmax": (lambda x: x.softmax(-1), (torch.randn(96, 1000),)),
    "log-softmax-vocab": (lambda x: torch.log_softmax(x, -1), (torch.randn(6, 3001),)),
    "layer-norm": (lambda x, w, b: torch.nn.functional.layer_norm(x, (768,), w, b),
                   (torch.randn(130, 768), torch.randn(768), torch.randn(768))),
    "rms-norm": (lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w,
                 (torch.randn(64, 512), torch.randn(512))),
    # rank 3 and 4 (attention scores, a batch of sequences): blocks over several row dims
    "softmax-heads": (lambda x: x.softmax(-1), (torch.randn(1, 6, 40, 72) * 3,)),
    "softmax-batch": (lambda x: x.softmax(-1), (torch.randn(3, 70, 130),)),
    "layer-norm-seq": (lambda x, w, b: torch.nn.functional.layer_norm(x, (96,), w, b),
                       (torch.randn(2, 50, 96), torch.randn(96), torch.randn(96))),
}


@pytest.mark.parametrize("case", FUSED)
def test_row_chains_fuse_into_one_pass(case):
    fn, args = FUSED[case]
    torch.manual_seed(0)
    assert set(_strategies(fn, *args)) == {"fused-rows"}
    one, two = _run_both_thread_counts(fn, *args)
    _close_to_reference(one, fn, args)
    assert torch.equal(one, two)


def _fused_rows_params(fn, *args, target=AVX2):
    _, lowered = lower(fn, *args)
    plan = plan_codegen(lowered.kernels, target, uses=lowered.value_uses)
    (params,) = {json.dumps(s.params, sort_keys=True) for s in plan.schedules if s.strategy == "fused-rows"}
    return json.loads(params)


def test_row_blocks_are_small_with_stack_temporaries_where_they_fit():
    # softmax 4096x1024 float32: max, exp, sum, divide write 8 KB a row, at least ROW_BLOCK_BYTES:
    # blocks of one row, whose temporaries (the exp row and two scalars: 4 KB) go on the stack
    zen5 = TargetInfo("avx512", 512, 32, l2_bytes=1 << 20)
    p = _fused_rows_params(lambda x: x.softmax(-1), torch.randn(4096, 1024), target=zen5)
    assert (p["rows"], p.get("stack")) == (1, True)
    # rows of 128 floats (512 bytes): blocks of SHORT_ROWS = 4 rows, whose temporaries (the exp
    # rows and two per-row scalars: 2 KB) go on the stack; rows of 16 floats: 16-row blocks (1 KB)
    p = _fused_rows_params(lambda x: x.softmax(-1), torch.randn(4096, 128), target=zen5)
    assert (p["rows"], p.get("stack")) == (4, True)
    p = _fused_rows_params(lambda x: x.softmax(-1), torch.randn(4096, 16), target=zen5)
    assert (p["rows"], p.get("stack")) == (16, True)
    # rows of 40,000 floats: one row's exp temporary alone is 160 KB, over the stack budget: on the heap
    p = _fused_rows_params(lambda x: x.softmax(-1), torch.randn(8, 40000), target=zen5)
    assert (p["rows"], p.get("stack")) == (1, None)


@pytest.mark.parametrize("cols", [1024, 128])
def test_stack_temporaries_are_cache_line_aligned(tmp_path, cols):
    # the exp rows of softmax on the stack (blocks of one row of 1024, or of 128 rows of 128):
    # every such alloca is aligned to a cache line (at the f32 default of 4 bytes, the stack
    # pointer decided, per process, whether every vector access to them straddled two lines)
    from neuron_compile.codegen.transform import STACK_ALIGNMENT
    fn = lambda x: x.softmax(-1)  # noqa: E731
    x = torch.randn(256, cols) * 3
    out = neuron_compile(fn, options={"cache": False, "dump_dir": str(tmp_path)})(x)
    _close_to_reference(out, fn, (x,))
    (llvm_ir,) = tmp_path.glob("*/10.obj.ll")
    allocas = re.findall(r"= alloca float, i64 (\d+), align (\d+)", llvm_ir.read_text())
    assert any(int(n) >= cols for n, _ in allocas)   # the row (or rows) of exponentials
    assert STACK_ALIGNMENT == 64 and {int(a) for _, a in allocas} == {STACK_ALIGNMENT}


def test_one_row_blocks_keep_their_column_loops_rolled(tmp_path):
    # layer_norm's backward over rows of 768 floats: blocks of one row, whose members' column
    # loops carry LLVM's unroll.disable (fully unrolled, GVN kept the whole row in registers
    # across the members and spilled it every row); blocks of several rows do not
    from neuron_compile.codegen.strategies.fused_rows import NO_UNROLL
    zen5 = TargetInfo("avx512", 512, 32, l2_bytes=1 << 20)
    assert _fused_rows_params(lambda x: x.softmax(-1), torch.randn(4096, 1024), target=zen5)["unroll"] is False
    assert "unroll" not in _fused_rows_params(lambda x: x.softmax(-1), torch.randn(4096, 128), target=zen5)
    ln = torch.nn.LayerNorm(768)
    x = torch.randn(4, 32, 768, dtype=torch.float64).requires_grad_()
    ref = ln.double()(x)
    ref.backward(torch.ones_like(ref))
    grads = [t.grad.clone() for t in (x, ln.weight, ln.bias)]
    for t in (x, ln.weight, ln.bias):
        t.grad = None
    ln.float()
    xf = x.detach().float().requires_grad_()
    out = neuron_compile(ln, options={"cache": False, "dump_dir": str(tmp_path)})(xf)
    out.sum().backward()
    for ours, want in zip((xf.grad, ln.weight.grad, ln.bias.grad), grads):
        torch.testing.assert_close(ours.double(), want, rtol=1e-5, atol=1e-5)
    (schedule,) = tmp_path.glob("*backward*/05.schedule.json")
    chains = [k["schedule"]["params"] for k in json.loads(schedule.read_text())["kernels"]
              if k["schedule"]["strategy"] == "fused-rows"]
    assert chains and chains[0]["unroll"] is False
    (transform,) = tmp_path.glob("*backward*/08.schedule.mlir")
    assert transform.read_text().count(NO_UNROLL) == len(chains[0]["group"])   # every member's loop
    (llvm_ir,) = tmp_path.glob("*backward*/10.obj.ll")
    assert "llvm.loop.unroll.disable" in llvm_ir.read_text()


def test_row_blocks_span_every_leading_dim():
    """Softmax over ``(B, H, S, S)`` or ``(B, S, N)`` is blocked over all the row dims: blocking
    the first alone made (8, 512, 1024) 8 blocks of 2 MB on the heap, and (1, 12, 128, 128) one
    block for both threads (0.6-0.8x eager, measured on Zen 5)."""
    zen5 = TargetInfo("avx512", 512, 32, l2_bytes=1 << 20)
    p = _fused_rows_params(lambda x: x.softmax(-1), torch.randn(8, 512, 128), target=zen5)
    assert (p["block"], p["rows"], p.get("stack")) == ([1, 4], 4, True)   # as 4096 rows of 128
    # a keepdim reduction over a unit batch dim is read at (d0, d1, d2), not through a
    # collapse_shape that dropped d0: the whole chain fuses, in blocks of 4 rows
    _, lowered = lower(lambda x: x.softmax(-1), torch.randn(1, 12, 128, 128))
    plan = plan_codegen(lowered.kernels, zen5, uses=lowered.value_uses)
    assert {s.strategy for s in plan.schedules} == {"fused-rows"}
    assert plan.schedules[0].params["block"] == [1, 1, 4]
    # whole inner dims, then a divisor of the next outer one
    p = _fused_rows_params(lambda x: x.softmax(-1), torch.randn(64, 4, 64), target=zen5)
    assert p["block"][1] == 4 and 64 % p["block"][0] == 0 and p["rows"] == 4 * p["block"][0] <= 64


def test_row_reductions_alone_split_over_every_leading_dim():
    # a (2, 2048, 1024) row sum: 64 blocks for the threads, not the 2 of its first dim (the
    # elements per block counted the reduced dim only, so it was not even split in two)
    _, lowered = lower(lambda x: x.sum(-1), torch.randn(2, 2048, 1024))
    (s,) = plan_codegen(lowered.kernels, AVX2, uses=lowered.value_uses).schedules
    assert s.strategy == "row-reduction"
    blocks = [n // t if t else 1 for n, t in zip(lowered.kernels[0].ranges, s.params["forall"])]
    assert blocks[0] * blocks[1] == 64 and blocks[2] == 1


@pytest.mark.parametrize("shape", [(64, 40000), (256, 1024), (12, 777)])
def test_row_chains_are_exact_with_stack_or_heap_temporaries(shape):
    fn = lambda x: torch.log_softmax(x, -1) * x.softmax(-1)  # noqa: E731
    x = torch.randn(*shape) * 4
    one, two = _run_both_thread_counts(fn, x)
    _close_to_reference(one, fn, (x,))
    assert torch.equal(one, two)


def test_a_chain_whose_intermediate_escapes_is_not_fused():
    # the max is also returned: fusing would need the whole max before the block finishes
    fn = lambda x: (x.softmax(-1), x.amax(-1))  # noqa: E731
    x = torch.randn(64, 1000)
    strategies = _strategies(fn, x)
    assert strategies.count("fused-rows") < len(strategies)
    _close_to_reference(neuron_compile(fn)(x), fn, (x,))


@pytest.mark.parametrize("shape,dims", [((2, 3, 32, 32), None), ((8, 4, 16, 16), (0, 2, 3))])
def test_a_reduction_over_several_dims_is_one_vector_step_per_iteration(tmp_path, shape, dims):
    """A sum over several dims whose contiguous dim fits one vector step (a loss's full ``.sum()``
    of a 4-D tensor, batch norm's per-channel sums) was vectorized whole: every element unrolled
    (2x3x32x32: 11.6 MB of LLVM dialect, minutes in ``opt``). It now loops over the other reduction
    dims with one vector step each; the code stays small and the sum matches float64."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    fn = (lambda x, w: (x * w).sum()) if dims is None else (lambda x, w: (x * w).sum(dims))
    out = neuron_compile(fn, options={"dump_dir": str(tmp_path), "cache": False})(x, w)
    torch.testing.assert_close(out.double(), fn(x.double(), w.double()), rtol=1e-5, atol=1e-4)
    llvm = sum(p.stat().st_size for p in tmp_path.rglob("*.llvm.mlir"))
    assert llvm < 400_000, f"{llvm} bytes of LLVM dialect for a {shape} reduction"


@pytest.mark.parametrize("shape,pad", [((4, 8, 40, 40), (1, 1, 1, 1)), ((3, 130, 70), (2, 3)),
                                       ((2, 50, 9, 33), (0, 0, 2, 1))])
def test_padding_copies_run_as_vector_rows_with_exact_values(shape, pad):
    import torch.nn.functional as F

    def fn(x):
        return F.pad(x, pad) * 2
    x = torch.randn(shape)
    assert "copy-rows" in _strategies(fn, x)
    one, two = _run_both_thread_counts(fn, x)
    assert torch.equal(one, fn(x)) and torch.equal(two, fn(x))


def test_head_split_transposes_run_as_vector_rows_and_others_keep_loops():
    def heads(x):   # [b, t, h, d] -> [b, h, t, d]: the last dim stays last (rows of d)
        return x.transpose(1, 2) * 2

    def keys(x):    # [b, h, t, d] -> [b, h, d, t]: the contiguous dim moves (a gather per row)
        return x.transpose(-1, -2) * 2
    x = torch.randn(4, 64, 4, 64)
    assert "copy-rows" in _strategies(heads, x) and "copy-rows" not in _strategies(keys, x)
    for fn in (heads, keys):
        one, two = _run_both_thread_counts(fn, x)
        assert torch.equal(one, fn(x)) and torch.equal(two, fn(x))


@pytest.mark.parametrize("case", ["cat-768", "cat-odd", "cat-int64", "heads-long"])
def test_rows_longer_than_a_window_copy_in_vector_pieces(case):
    """Rows over ``WINDOW_ROW`` elements (GPT-2's ``cat`` of 768-wide rows) are copied in pieces of
    whole vectors (a peeled last piece where none divides the row); they were scalar loops."""
    fn, args = {
        "cat-768": (lambda a, b: torch.cat([a, b], -1) + 1, (torch.randn(4, 32, 768), torch.randn(4, 32, 768))),
        "cat-odd": (lambda a, b: torch.cat([a, b], -1) * 2, (torch.randn(24, 1000), torch.randn(24, 2053))),
        "cat-int64": (lambda a, b: torch.cat([a, b], -1) + 1, (torch.randint(-9, 9, (32, 900)),
                                                               torch.randint(-9, 9, (32, 700)))),
        "heads-long": (lambda x: x.transpose(0, 1) * 2, (torch.randn(24, 16, 600),)),
    }[case]
    assert "copy-rows" in _strategies(fn, *args)
    one, two = _run_both_thread_counts(fn, *args)
    assert torch.equal(one, fn(*args)) and torch.equal(two, fn(*args))


@pytest.mark.parametrize("case", ["pool", "pool-keepdim", "strided", "var"])
def test_a_reduction_over_trailing_dims_is_one_row_reduction(case):
    """``mean((2, 3))`` of an NCHW tensor (global average pooling) reduces rows of ``H·W``: the
    trailing dims are collapsed first, so the row is vectorized whole instead of one short
    vector step per row of ``W`` (0.33-0.39x eager at (32, 64, 56, 56))."""
    g = torch.Generator().manual_seed(0)
    fn, x = {
        "pool": (lambda x: x.mean((2, 3)), torch.randn(4, 16, 28, 28, generator=g)),
        "pool-keepdim": (lambda x: x.mean((-1, -2), keepdim=True), torch.randn(4, 16, 28, 28, generator=g)),
        "strided": (lambda x: x.sum((2, 3)), torch.randn(4, 16, 28, 30, generator=g).transpose(2, 3)),
        "var": (lambda x: x.var((1, 2), keepdim=True), torch.randn(64, 12, 40, generator=g)),
    }[case]
    _, lowered = lower(fn, x)
    reductions = [len(k.reduction_dims) == 1 for k in lowered.kernels if k.kind == "reduction"]
    # (var's second sum reads (x - mean)^2 lazily, through its producers: left as it was)
    assert reductions and (any if case == "var" else all)(reductions)
    one, two = _run_both_thread_counts(fn, x)
    _close_to_reference(one, fn, (x,))
    assert torch.equal(one, two)


@pytest.mark.parametrize("case", ["bias-grad", "lazy-keepdim", "var-mean"])
def test_a_per_channel_reduction_over_batch_and_plane_reduces_rows_of_the_plane(case):
    """A sum over (N, H, W) of NCHW (a convolution's bias gradient, batch-norm statistics) reduces
    the contiguous ``H·W`` rows, the batch a leading reduced dim: over rows of ``W`` (28) it ran at
    12 GB/s, over rows of 784 at 14 (the bias gradient of 16×128×28×28: 0.55 → 0.45 ms; AMD Zen 5,
    1 thread). A fused prologue (``x * y``) is collapsed the same way."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 16, 28, 28, generator=g), torch.randn(4, 16, 28, 28, generator=g)
    fn, args = {
        "bias-grad": (lambda x: x.sum((0, 2, 3)), (x,)),
        "lazy-keepdim": (lambda x, y: (x * y).sum((0, 2, 3), keepdim=True), (x, y)),
        "var-mean": (lambda x: torch.var_mean(x, (0, 2, 3), correction=0), (x,)),
    }[case]
    _, lowered = lower(fn, *args)
    reductions = [k.ranges for k in lowered.kernels if k.kind == "reduction"]
    assert reductions and all(r == (4, 16, 784) for r in reductions), reductions
    one, two = _run_both_thread_counts(fn, *args)
    for o, t, want in zip(*(v if isinstance(v, tuple) else (v,) for v in (one, two, fn(*(a.double() for a in args))))):
        torch.testing.assert_close(o.double(), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(o, t)


@pytest.mark.parametrize("shape", [(32, 1031), (8, 4097)])
def test_a_strided_slice_scatter_of_long_rows_compiles_forward_and_backward(shape):
    """``x[:, ::2]``'s backward scatters its gradient into every other column: a bare strided
    ``tensor.insert_slice``, no ``linalg.copy`` for ``copy-rows`` to cut into pieces (rows over
    512 elements failed to compile: "requires exactly one target handle"; found by a new user)."""
    x = torch.randn(*shape, dtype=torch.float64)
    cols = (shape[1] + 1) // 2
    y = torch.randn(shape[0], cols)
    assert "copy-rows" not in _strategies(lambda y: torch.zeros(*shape).slice_scatter(y, 1, 0, None, 2), y)
    one, two = _run_both_thread_counts(lambda y: torch.zeros(*shape).slice_scatter(y, 1, 0, None, 2), y)
    expected = torch.zeros(*shape).slice_scatter(y, 1, 0, None, 2)
    assert torch.equal(one, expected) and torch.equal(two, expected)
    a = x.float().requires_grad_()
    neuron_compile(lambda a: a[:, ::2] * 2)(a).sum().backward()
    ref = x.clone().requires_grad_()
    (ref[:, ::2] * 2).sum().backward()
    assert torch.equal(a.grad, ref.grad.float())


@pytest.mark.parametrize("shape, dims", [((2, 16, 2), (0, 1)), ((2, 3, 5, 40), (0, 1, 2)), ((1, 4, 16), (0, 1))])
def test_reducing_the_contiguous_dim_with_others_before_a_kept_dim(shape, dims):
    """A sum over (0, 1) of a transposed ``(B, C, N)`` view reduces the contiguous dim together with
    dim 0 and keeps the strided last dim (RMSNorm's weight gradient on a transposed input): it
    failed to verify as a masked ``row-reduction`` step, and now runs as loops."""
    x = torch.randn(*shape).transpose(-1, -2)
    for fn in (lambda x: x.sum(dims), lambda x: x.amax(dims), lambda x: x.mean(dims)):
        one, two = _run_both_thread_counts(fn, x)
        _close_to_reference(one, fn, (x,))
        assert torch.equal(one, two)


@pytest.mark.parametrize("n", [1000003, 65537 * 3])
def test_one_long_dim_of_odd_length_still_splits_for_the_threads(n):
    # no multiple of four vectors divides an odd length: the forall's last tile is partial (it
    # ran on one thread, without a forall, at 1.6x the time of a length one longer)
    fn = lambda x: torch.sigmoid(x * 2 + 1) * x  # noqa: E731
    x = torch.randn(n)
    _, lowered = lower(fn, x)
    (s,) = plan_codegen(lowered.kernels, AVX2, uses=lowered.value_uses).schedules
    (tile,) = s.params["forall"]
    assert s.strategy == "pointwise" and 0 < tile < n and tile % 32 == 0 and n % tile != 0
    one, two = _run_both_thread_counts(fn, x)
    _close_to_reference(one, fn, (x,))
    assert torch.equal(one, two)


def test_an_expanded_input_is_reduced_along_its_rows():
    """A stride-0 dim (``x.expand(...)``) is not the contiguous one: layer_norm over an expanded input
    runs as a row chain, not as column reductions that summed each row one float32 at a time (rows
    offset by 50 and scaled by 30, as a new user's trial had them: 26x eager's float32 error that
    way, 3.3x now; 3-26x and 0.9-3.3x over four seeds)."""
    torch.manual_seed(1)
    x = torch.randn(1, 300, 1025, dtype=torch.float64)
    x[..., -1, :] *= 30
    x[..., -2, :] += 50
    x = x.float().expand(4, 300, 1025)
    w = (1 + 0.1 * torch.randn(1025, dtype=torch.float64)).float()
    b = (0.1 * torch.randn(1025, dtype=torch.float64)).float()
    fn = lambda x, w, b: torch.nn.functional.layer_norm(x, (1025,), w, b)  # noqa: E731
    _, lowered = lower(fn, x, w, b)
    plan = plan_codegen(lowered.kernels, AVX2, uses=lowered.value_uses)
    assert {s.strategy for s in plan.schedules} == {"fused-rows"}
    reference = fn(x.double(), w.double(), b.double())
    eager_error = (fn(x, w, b).double() - reference).abs().max().item()
    for out in at_one_and_two_threads(neuron_compile(fn, options={"cache": False}), x, w, b):
        assert (out.double() - reference).abs().max().item() <= 5 * eager_error


def _row_dims_by_definition(group, uses):
    """``row_dims`` as its docstring defines it, recomputed from the whole run."""
    from neuron_compile.codegen.strategies.fused_rows import _lead

    def closed(p):
        for i, k in enumerate(group[:-1]):
            for r in k.results:
                reads = [o for later in group[i + 1:] for o in later.inputs if o.value == r]
                if not reads or uses.get(r, 0) != len(reads) or \
                        any(tuple(o.exprs[:p]) != tuple(f"d{q}" for q in range(p)) for o in reads):
                    return False
        return True
    p = min(_lead(k) for k in group)
    while p and any(k.ranges[:p] != group[0].ranges[:p] for k in group):
        p -= 1
    while p and not closed(p):
        p -= 1
    return p


def _groups_by_definition(kernels, uses):
    """``find_groups`` as its docstring defines it, recomputing ``row_dims`` for every candidate run."""
    from neuron_compile.codegen.strategies.fused_rows import _row_kernel
    row_dims = _row_dims_by_definition
    groups, i = [], 0
    while i < len(kernels):
        best, j = None, i + 1
        while _row_kernel(kernels[i]) and j < len(kernels) and _row_kernel(kernels[j]) \
                and kernels[j].ranges[0] == kernels[i].ranges[0]:
            best = j if row_dims(kernels[i:j + 1], uses) else best
            j += 1
        if best is None:
            i += 1
        else:
            groups.append([k.id for k in kernels[i:best + 1]])
            i = best + 1
    return groups


@pytest.mark.parametrize("case", ["independent softmaxes", "layer_norm and softmax", "attention rows"])
def test_row_chains_are_found_as_by_definition(case):
    """The incremental scan (linear per start; re-testing every run was quartic: 125 s for 200
    independent softmaxes) groups the kernels exactly as the definition does."""
    from neuron_compile.codegen.strategies.fused_rows import find_groups, row_dims
    if case == "independent softmaxes":
        fn, args = (lambda *xs: [x.softmax(-1) * (i + 1) for i, x in enumerate(xs)]), [torch.randn(2, 3, 4, 5)] * 12
    elif case == "layer_norm and softmax":
        fn, args = (lambda x, w: torch.nn.functional.layer_norm(x, (64,), w).softmax(-1) + x), \
            [torch.randn(4, 8, 64), torch.randn(64)]
    else:
        fn, args = (lambda q, k: ((q @ k.transpose(-1, -2)) / 8).softmax(-1).sum(-1)), \
            [torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)]
    _, lowered = lower(fn, *args)
    got = [[k.id for k in g] for g in find_groups(lowered.kernels, lowered.value_uses)]
    assert got == _groups_by_definition(lowered.kernels, lowered.value_uses) and got
    for g in find_groups(lowered.kernels, lowered.value_uses):
        assert row_dims(g, lowered.value_uses) == _row_dims_by_definition(g, lowered.value_uses)
