"""The tiled GEMM (``matmul`` strategy): every operand layout, stored and in memory, edge regions,
batches, a fused bias, float64; the same bits with 1 and 2 threads (each block of C is one thread's
and sums in the same order); and the override back to plain loops."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.codegen import TargetInfo
from neuron_compile.codegen.strategies.matmul import (ISA_TABLE, GemmProblem, a_layout, fit_kc, l1_kc, plan, regions,
                                                      tile_time)
from neuron_compile.target import HostCPU
from tests.conftest import neuron_compile
from tests.ir.lower import lower

AVX2 = TargetInfo("avx2", 256, 16)


def _check(fn, *args, threads=(1, 2)):
    compiled = neuron_compile(fn)
    old = torch.get_num_threads()
    outs = []
    try:
        for t in threads:
            torch.set_num_threads(t)
            outs.append(compiled(*args))
    finally:
        torch.set_num_threads(old)
    ref = fn(*[a.double() for a in args])
    eager = fn(*args)
    err, err_eager = (outs[0].double() - ref).abs().max(), (eager.double() - ref).abs().max()
    assert outs[0].dtype == eager.dtype and outs[0].shape == eager.shape
    # blocked summation (k-blocks of 256) may differ from MKL's order: allow a small factor
    assert err <= 3 * err_eager + 8 * torch.finfo(eager.dtype).eps * ref.abs().max(), (err, err_eager)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


LAYOUTS = {
    "A@B": lambda m, n, k: (torch.randn(m, k), torch.randn(k, n)),
    "A@B.T": lambda m, n, k: (torch.randn(m, k), torch.randn(n, k).t()),
    "A.T@B": lambda m, n, k: (torch.randn(k, m).t(), torch.randn(k, n)),
    "A.T@B.T": lambda m, n, k: (torch.randn(k, m).t(), torch.randn(n, k).t()),
}


@pytest.mark.parametrize("layout", LAYOUTS)
# (64, 100, 1031): no k-block divides a prime K, so a row-major B is streamed unpacked
@pytest.mark.parametrize("mnk", [(96, 128, 64), (37, 1013, 77), (300, 200, 64), (1, 512, 512), (130, 50, 260),
                                 (64, 100, 1031)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gemm_layouts_and_edges(layout, mnk):
    torch.manual_seed(0)
    a, b = LAYOUTS[layout](*mnk)
    _check(lambda x, y: x @ y, a, b)


def test_stored_transposes_inside_the_graph():
    torch.manual_seed(0)
    x, w, g = torch.randn(64, 96), torch.randn(80, 96), torch.randn(64, 80)
    _check(lambda x, w, g: (x @ w.t()).t() @ g + g.t() @ (x @ w.t()), x, w, g)


def test_linear_bias_is_the_accumulator():
    torch.manual_seed(0)
    x, w, b = torch.randn(128, 384), torch.randn(200, 384), torch.randn(200)
    _, lowered = lower(lambda x, w, b: F.linear(x, w, b), x, w, b)
    (mm,) = [k for k in lowered.kernels if k.kind == "matmul"]
    # the register tile is the host ISA's (AVX2 6/4 rows, AVX-512 8/12/4), never a hard-coded one
    assert mm.attrs["gemm"]["MR"] in ISA_TABLE[HostCPU.detect().info().isa]["MR_alt"]
    assert 'neuron.part = "init_r0"' in lowered.mlir
    _check(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b)


@pytest.mark.parametrize("shape", [(12, 64, 32, 64), (5, 30, 70, 50), (3, 33, 17, 65), (3, 40, 1031, 70)], ids=str)
def test_batched(shape):
    torch.manual_seed(0)
    bsz, m, k, n = shape
    q, kk = torch.randn(bsz, m, k), torch.randn(bsz, n, k)
    _check(lambda q, kk: torch.bmm(q, kk.transpose(1, 2)) * 0.5, q, kk)
    _check(lambda q, v: torch.bmm(q, v), q, torch.randn(bsz, k, n))


def test_float64():
    torch.manual_seed(0)
    a, b = torch.randn(70, 90, dtype=torch.float64), torch.randn(90, 45, dtype=torch.float64)
    _check(lambda x, y: x @ y, a, b)


def test_plan_is_data_and_regions_cover_c_exactly():
    p = GemmProblem(37, 1013, 77, 0, "float32", False, True, True, False)
    s = plan(p, AVX2)
    assert s.strategy == "matmul" and s.params["MR"] in (4, 6) and s.params["NR"] == 16
    covered = torch.zeros(37, 1013, dtype=torch.int32)
    for r in regions(37, 1013, s.params):
        covered[r.mlo:r.mlo + r.m1 * r.mr, r.nlo:r.nlo + r.n1 * r.nr] += 1
        assert r.nr in (16, 8, 4, 2, 1)
    assert bool((covered == 1).all())
    # A given transposed in memory is packed or copied K-contiguous; the M <= 256 case packs B
    # inside the k-block loop
    tn = plan(GemmProblem(512, 512, 512, 0, "float32", True, False, False, True), AVX2).params
    assert tn["pack_a"] or tn["transpose_a"]
    assert plan(GemmProblem(128, 768, 3072, 0, "float32", False, True, True, False), AVX2).params["fuse_pack_b"]


def test_override_back_to_loops():
    from neuron_compile.codegen.strategy import parse_overrides
    from neuron_compile.lowering.emit import lower_graph
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    out = neuron_compile(lambda x, y: x @ y, options={"schedule": {"matmul": "loops"}})(a, b)
    torch.testing.assert_close(out, a @ b)
    gm, lowered = lower(lambda x, y: x @ y, a, b)
    assert any("gemm" in k.attrs for k in lowered.kernels)
    plain = lower_graph(gm, "t", target=AVX2, overrides=parse_overrides('{"matmul": "loops"}'))
    assert not any("gemm" in k.attrs for k in plain.kernels) and "linalg.pack" not in plain.mlir


def test_a_gemm_narrower_than_one_register_tile_stays_a_plain_contraction():
    """``x @ W.t()`` with fewer outputs than one vector (a classifier head: 6 on AVX2, 10 on
    AVX-512): every tile is an edge tile (2.3 GFLOP/s measured, 8.9 as dot products over
    contiguous K), so the tiled GEMM declines it, and the result still matches float64 eager."""
    from neuron_compile.codegen import plan_codegen
    from neuron_compile.codegen.strategies.matmul import applies
    avx2 = TargetInfo()
    head = GemmProblem(64, 6, 512, 0, "float32", False, True, True, False)
    assert not applies(head, avx2) and applies(GemmProblem(64, 16, 512, 0, "float32", False, True, True, False), avx2)
    x, w, b = torch.randn(64, 512), torch.randn(10, 512), torch.randn(10)
    from neuron_compile.lowering.emit import lower_graph
    for n, tiled in ((6, False), (32, True)):
        gm = lower(lambda x, w: F.linear(x, w), x, torch.randn(n, 512))[0]
        kernels = lower_graph(gm, "test", target=avx2).kernels
        assert ("matmul" in {s.strategy for s in plan_codegen(kernels, avx2).schedules}) == tiled
    _check(lambda x, w, b: F.linear(x, w, b), x, w, b)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_gemm_one_vector_wide_takes_tiles_one_vector_wide(isa):
    """N at least one vector but under the table's register tile (16 output channels on AVX-512):
    tiles one vector wide (a UNet's 16-channel weight gradients ran at 30-36 GFLOP/s as an im2col
    GEMM, 83-100 this way; AMD Zen 4, 1 thread). N not a whole number of vectors (MobileNet's 24
    channels) takes the same tiles and one edge tile: as a plain contraction, 4096x144 @ 144x24 ran
    at 4.8 ms, 0.49 this way (eager 0.41-0.48; AMD Zen 4, 1 thread)."""
    from neuron_compile.codegen.strategies.matmul import applies
    target = TargetInfo(isa, 512 if isa == "avx512" else 256, 32 if isa == "avx512" else 16)
    vl = ISA_TABLE[isa]["VL"]
    if vl < ISA_TABLE[isa]["NR"]:
        for n in (vl, vl + 4):
            p = GemmProblem(64, n, 512, 0, "float32", False, False, True, True)
            assert applies(p, target) and plan(p, target).params["NR"] == vl
        # in a batch (a convolution's GEMM per image) only whole vectors: the rows form is better
        assert applies(GemmProblem(64, vl, 512, 16, "float32", False, False, True, True), target)
        assert not applies(GemmProblem(64, vl + 4, 512, 16, "float32", False, False, True, True), target)
    assert not applies(GemmProblem(64, vl - 4, 512, 0, "float32", False, False, True, True), target)


@pytest.mark.parametrize("n", [20, 24, 31])
def test_a_gemm_between_one_vector_and_one_register_tile_wide_matches_float64(n):
    """The one-vector-wide tiles with an N edge (N = 20, 24, 31 on AVX-512), A@B and A@Bᵀ."""
    _check(lambda a, b: a @ b, torch.randn(200, 144), torch.randn(144, n))
    _check(lambda a, w: a @ w.t(), torch.randn(67, 96), torch.randn(n, 96))


@pytest.mark.parametrize("n", [16, 20, 24])
def test_one_vector_wide_tiles_take_sixteen_rows_on_avx512(n):
    """A tile one vector wide broadcasts an element of A per FMA: on AVX-512 (32 registers) 16 rows,
    not the 8 the FMA chains alone ask for (4096x144 @ 144x24: 337 -> 222 us, eager 347; AMD Zen 5,
    1 thread). Values for such shapes in the test above."""
    p = GemmProblem(4096, n, 144, 0, "float32", False, True, True, False)
    params = plan(p, TargetInfo("avx512", 512, 32)).params
    assert (params["MR"], params["NR"]) == (16, 16)


def test_a_single_register_tile_is_split_in_two():
    """A GEMM of one register tile has one trip in every loop: canonicalization folds its forall
    with the tag the micro-kernel's vectorization looks for, and it ran scalar (8x32 @ K=2048:
    4.4 GFLOP/s, 33 as two 4-row tiles; AMD Zen 4, 1 thread)."""
    target = TargetInfo("avx512", 512, 32)
    p = GemmProblem(8, 32, 2048, 0, "float32", False, False, True, True)
    assert p.m // plan(p, target).params["MR"] == 2
    _check(lambda a, b: a @ b, torch.randn(8, 2048), torch.randn(2048, 32))


@pytest.mark.parametrize("m", [512, 1024, 2048, 768, 300, 1000])
def test_m_blocks_are_equal_when_a_block_size_near_the_table_divides_m(m):
    """The threads split the M×N blocks statically: a short last M block left one thread idle
    (M = 512 in 96-row blocks: 86% of torch.mm at 2 threads, 94% with equal 64-row blocks)."""
    s = plan(GemmProblem(m, 512, 512, 0, "float32", False, False, True, True), AVX2).params
    mr, mc = s["MR"], s["MC"]
    rows = m - m % mr   # the full-tile rows; the M edge is a region of its own
    near = [c for c in range(mr, 129, mr) if 64 <= c <= 128 and rows % c == 0]
    assert mc % mr == 0
    if near:
        assert rows % mc == 0 and 64 <= mc <= 128
    else:
        assert mc == 96


@pytest.mark.parametrize("m", [300, 512, 1000, 1024, 2048])
def test_register_tile_hides_the_fma_latency_at_large_m(m):
    """A 4x16 tile (8 accumulators) runs Zen 2 at 80% of its FMA rate (latency 5 x 2 ports = 10
    chains): 1024^3 measured 104% of torch.mm on 4x16 tiles and 126% on 6x16 ones. Large M takes
    the 6-row tile even when 6 does not divide M (the few edge rows cost less)."""
    t = ISA_TABLE["avx2"]
    s = plan(GemmProblem(m, 512, 512, 0, "float32", False, False, True, True), AVX2).params
    assert s["MR"] * s["NR"] // s["VL"] >= t["FMA_CHAINS"]
    assert tile_time(m, s["MR"], t) <= min(tile_time(m, r, t) for r in t["MR_alt"])


@pytest.mark.parametrize("n", [512, 768, 1024, 2304])
def test_n_blocks_split_evenly_between_two_threads_when_m_is_small(n):
    """With M <= 256 the forall runs over N blocks only; N = 512 in 192-wide blocks (192, 192, 128)
    gave one of 2 threads twice the other's work (1.34x from 1 to 2 threads for the MLP's second
    Linear, 1.9x with two 256-wide blocks)."""
    s = plan(GemmProblem(256, n, 1024, 0, "float32", False, True, True, False), AVX2).params
    assert s["MC"] == 256 and s["NC"] % s["NR"] == 0 and s["NC"] // s["NR"] >= 12
    assert n % s["NC"] == 0 and (n // s["NC"]) % 2 == 0


@pytest.mark.parametrize("m,n", [(256, 256), (256, 512), (128, 768), (64, 256)])
def test_two_threads_get_equal_work_from_the_static_split(m, n):
    """The forall's MxN blocks (row-major) split in two equal runs must hold equal work: 256^3 in
    one M block had N blocks of 192 and 64 columns (59% of torch.mm at 2 threads; 78% with two
    M blocks)."""
    s = plan(GemmProblem(m, n, 1024, 0, "float32", False, True, True, False), AVX2).params
    blocks = [min(s["MC"], m - i) * min(s["NC"], n - j) for i in range(0, m, s["MC"]) for j in range(0, n, s["NC"])]
    half = -(-len(blocks) // 2)
    assert sum(blocks[:half]) == sum(blocks[half:]) == m * n // 2


@pytest.mark.parametrize("shape", [(96, 256, 128), (514, 256, 136), (3, 100, 64, 40)])
def test_a_gemm_graph_output_is_written_in_place(tmp_path, shape):
    """C is computed in its register-tile view and materialized into an expand_shape of the output
    buffer: before, eliminate-empty-tensors (same-type values only) left C in a temporary and a
    whole-output memcpy after the GEMM (1.3 ms of the 2-thread MLP backward). With edge regions (M
    or N not a multiple of the register tile, batched or not) each region is stored into its own
    subview; before, the full-tile region went through a temporary and a copy. The only buffers
    left are the packs."""
    *bt, m, k, n = shape
    a, b = torch.randn(*bt, m, k), torch.randn(*bt, k, n)
    out = neuron_compile(lambda a, b: a @ b, options={"dump_dir": str(tmp_path), "cache": False})(a, b)
    ref = a.double() @ b.double()
    assert (out.double() - ref).abs().max() <= 2 * (a @ b - ref).abs().max() + 1e-5
    linalg = "".join(p.read_text() for p in tmp_path.rglob("*.linalg.mlir"))
    llvm = "".join(p.read_text() for p in tmp_path.rglob("*.llvm.mlir"))
    assert "memref.expand_shape %arg_out0" in linalg or "memref.subview %arg_out0" in linalg
    assert llvm and "llvm.intr.memcpy" not in llvm
    # no temporary of C's size (the one the output was copied from)
    ll = "".join(p.read_text() for p in tmp_path.rglob("*.obj.ll"))
    sizes = [int(x) for x in re.findall(r"@_mlir_memref_to_llvm_alloc\(i64 (\d+)\)", ll)]
    assert ll and out.numel() * 4 + 64 not in sizes, sizes


@pytest.mark.parametrize("case", ["conv1d", "pointwise_view", "pointwise_view_twice", "zero_dim"])
def test_a_graph_output_that_is_a_reshape_is_written_in_place(tmp_path, case):
    """A graph output that is a row-major reshape of a computed value (a Conv1d's product computed as
    a one-row image, [N, C, 1, L], returned as [N, C, L]; a pointwise result returned viewed) is
    stored as that value into the output viewed in its shape, so the kernel writes the output
    buffer: stored as the reshape, the kernel wrote a temporary and a whole-output memcpy followed
    (eliminate-empty-tensors follows same-type values only). Values against float64; with the
    value itself an output too, both hold."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 16, 40), torch.randn(16, 16, 3)
    fn = {"conv1d": lambda x, w: torch.nn.functional.conv1d(x, w, padding=1),
          "pointwise_view": lambda x, w: (x.tanh() * 2).view(4, 640).view(2, 2, 640),
          "pointwise_view_twice": lambda x, w: (lambda y: (y.view(64, 40), y))(x.sin() + 1),
          # 0-d outputs that are reshapes of computed values (var_mean's mean: an mlir-opt
          # error once, a rank-0 output has no flattened view)
          "zero_dim": lambda x, w: torch.var_mean(x[0, :2, :3] * 2)}[case]
    out = neuron_compile(fn, options={"dump_dir": str(tmp_path), "cache": False})(x, w)
    ref, eager = fn(x.double(), w.double()), fn(x, w)
    for o, r, e in zip(*(v if isinstance(v, tuple) else (v,) for v in (out, ref, eager))):
        assert o.shape == r.shape and (o.double() - r).abs().max() <= 2 * (e.double() - r).abs().max() + 1e-6
    if case == "pointwise_view_twice":
        assert out[0].data_ptr() == out[1].data_ptr()   # the view is a view of the other output, as in eager
    if case != "conv1d":
        return
    # no temporary of the output's size (the one it was copied from)
    ll = "".join(p.read_text() for p in tmp_path.rglob("*.obj.ll"))
    sizes = [int(v) for v in re.findall(r"@_mlir_memref_to_llvm_alloc\(i64 (\d+)\)", ll)]
    assert ll and out.numel() * 4 + 64 not in sizes, sizes


def _index_put(c, idx, vals):
    return torch.ops.aten._unsafe_index_put(c, [idx], vals.to(c.dtype), True)


@pytest.mark.parametrize("case", ["view", "index_put", "index_put_of_view", "index_put_also_read",
                                  "index_put_and_c"])
def test_a_gemm_reaching_the_output_through_a_view_or_an_index_put_is_written_in_place(tmp_path, case):
    """A GEMM with edge regions (514 = 64·8 + 2 rows, 200 = 6·32 + 8 columns) whose C reaches the
    graph output through a reshape (GPT-2's logits viewed as (1, 128, 50257)) or an accumulating
    ``index_put`` (its tied embedding and LM-head weight gradient) stores its regions straight into
    the output, and the ``index_put`` updates the output itself: before, C was assembled in a
    temporary and copied whole (154 MB a GPT-2 step). Values against float64, duplicate indices
    accumulating twice; when C is also read by another kernel or is an output too, the values
    still hold."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 514), torch.randn(64, 200)
    idx = torch.tensor([3, 513, 0, 3, 100, 513])
    vals = torch.randn(6, 200)
    fn = {"view": lambda a, b: (a.t() @ b).view(1, 514, 200),
          "index_put": lambda a, b: _index_put(a.t() @ b, idx, vals),
          "index_put_of_view": lambda a, b: _index_put((a.t() @ b).view(1028, 100), idx, vals.view(12, 100)[:6]),
          "index_put_also_read": lambda a, b: (_index_put(a.t() @ b, idx, vals), (a.t() @ b).sum(0)),
          "index_put_and_c": lambda a, b: (lambda c: (_index_put(c, idx, vals), c))(a.t() @ b)}[case]
    out = neuron_compile(fn, options={"dump_dir": str(tmp_path), "cache": False})(a, b)
    ref, eager = fn(a.double(), b.double()), fn(a, b)
    for o, r, e in zip(*(x if isinstance(x, tuple) else (x,) for x in (out, ref, eager))):
        assert o.shape == r.shape and (o.double() - r).abs().max() <= 2 * (e.double() - r).abs().max() + 1e-5
    if case in ("index_put_also_read", "index_put_and_c"):
        return
    llvm = "".join(p.read_text() for p in tmp_path.rglob("*.llvm.mlir"))
    assert llvm and "llvm.intr.memcpy" not in llvm
    ll = "".join(p.read_text() for p in tmp_path.rglob("*.obj.ll"))
    sizes = [int(x) for x in re.findall(r"@_mlir_memref_to_llvm_alloc\(i64 (\d+)\)", ll)]
    # the packs of A (64 x 514) and B (64 x 200) only: no temporary of a region (504 x 192 before)
    assert ll and sizes and max(sizes) < 514 * 200 * 4 // 2, sizes


@pytest.mark.parametrize("m", [128, 200, 256])
def test_small_m_takes_a_register_tile_that_divides_m(m):
    """With M in one block, B is packed once for all of M and an M edge reads it once more for a
    few rows: nn.Linear with M = 128 ran 5-10% slower on 6x16 tiles with a 2-row edge than on 4x16."""
    s = plan(GemmProblem(m, 3072, 768, 0, "float32", False, True, True, False), AVX2).params
    assert m % s["MR"] == 0 and s["MR"] in ISA_TABLE["avx2"]["MR_alt"]


def test_k_block_follows_the_l1_model():
    """KC from the BLIS L1 model (Low et al. 2016): for a 32 KB 8-way L1 one way is left for the A
    micro-panel, so a 6x16 float32 tile gets 4096 / 24 = 170 -> 168 and a 4x16 one 256;
    Sapphire Rapids' 48 KB 12-way L1 leaves two ways for 8x32 (256). KC 256 on 6x16 tiles ran
    512^3 at 70-74% of torch.mm on Zen 3, 168 at about 90%."""
    zen = TargetInfo("avx2", 256, 16, 512 << 10, 32 << 10, 8)
    spr = TargetInfo("avx512", 512, 32, 2 << 20, 48 << 10, 12)
    assert (l1_kc(6, 16, 4, zen), l1_kc(4, 16, 4, zen), l1_kc(8, 32, 4, spr)) == (168, 256, 256)
    # the B micro-panel plus MR rows of A fit the ways the model gives them
    for mr, nr, t in ((6, 16, zen), (4, 16, zen), (8, 32, spr), (12, 32, spr)):
        kc = l1_kc(mr, nr, 4, t)
        way = t.l1_bytes // t.l1_ways
        assert -(-kc * nr * 4 // way) + -(-kc * mr * 4 // way) <= t.l1_ways - 1
    s = plan(GemmProblem(512, 512, 512, 0, "float32", False, False, True, True), zen).params
    assert s["MR"] == 6 and 512 % s["KC"] == 0 and s["KC"] <= 168


@pytest.mark.parametrize("k,kc", [(512, 168), (1024, 168), (768, 168), (1000, 168), (50257, 256), (100, 168),
                                  (4000, 256), (256, 168), (384, 168), (512, 256), (768, 256), (384, 128)])
def test_k_blocks_are_even(k, kc):
    """K in blocks of at most KC, none of them a short tail: a divisor of K when one is at least
    KC/2, else equal blocks (a last block of 8 would pay a whole C update for 8 k steps)."""
    b = fit_kc(k, kc)
    assert 0 < b <= max(kc, k if k <= 2 * kc else 0) and (b % 8 == 0 or b == k)
    blocks = [min(b, k - i) for i in range(0, k, b)]
    assert sum(blocks) == k and min(blocks) >= b // 2 or len(blocks) == 1
    # opt fully unrolls a k-block loop of 2 or 3 equal trips (slow code): never that
    assert not (k % b == 0 and k // b in (2, 3))


@pytest.mark.parametrize("trans_a,k", [(True, 512), (True, 1000), (False, 1024)])
def test_a_register_tile_of_six_rows_is_never_read_packed(trans_a, k):
    """A packed 6-row A tile is one vector<6xf32> read that LLVM splits 4 + 2 and shuffles, one
    register too many for the 6x16 tile: an accumulator spilled in the k loop (A.T@B at 1024^3 on
    Zen 3: 48 GFLOP/s on 6x16 tiles, 67 on 4x16). A stored [K, M] is copied K-contiguous for
    6-row tiles (then read like A@B's); a packed tile has a power-of-two row count."""
    s = plan(GemmProblem(1020, 1024, k, 0, "float32", trans_a, False, not trans_a, True), AVX2).params
    assert not (s["pack_a"] and s["transpose_a"])
    if s["pack_a"]:
        assert s["MR"] & (s["MR"] - 1) == 0
    assert s["MR"] == 6 and s["transpose_a"] == trans_a and not s["pack_a"]
    # the transposed copy's tiles divide M and K (static vector shapes)
    if trans_a:
        tm, tk = s["transpose_tile"]
        assert 1020 % tm == 0 and k % tk == 0 and 1020 % s["transpose_forall"] == 0
        assert s["transpose_forall"] % tm == 0


def test_a_copy_is_not_streamed_where_its_rows_would_alias():
    """The K-contiguous copy of A is read like A@B's A, so it is only taken where that read is
    streamed: 12-row AVX-512 tiles over K = 1024 (rows 4 KB apart, one L1 set) pack A instead."""
    p = GemmProblem(1020, 1024, 1024, 0, "float32", True, False, False, True)
    assert a_layout(p, 6) == "transpose"
    assert a_layout(p, 12) == "pack" and a_layout(p, 8) == "pack"
    assert a_layout(GemmProblem(1020, 1024, 1000, 0, "float32", True, False, False, True), 12) == "transpose"
    assert a_layout(GemmProblem(1020, 1024, 1024, 0, "float32", False, False, True, True), 6) == "stream"


@pytest.mark.parametrize("m,n,k,batch", [(1024, 1024, 1024, 0), (514, 136, 192, 0), (514, 136, 192, 3),
                                         (90, 40, 33, 0), (90, 40, 33, 2)])
def test_transposed_a_matches_float64(m, n, k, batch):
    """A.T@B through the K-contiguous copy of A (6-row tiles), odd shapes included, against
    eager float64."""
    bs = (batch,) if batch else ()
    a, b = torch.randn(*bs, k, m), torch.randn(*bs, k, n)
    fn = (lambda a, b: a.transpose(-1, -2) @ b)
    out = neuron_compile(fn, options={"cache": False})(a, b)
    ref = fn(a.double(), b.double())
    assert out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4 * k ** 0.5)


def test_an_edge_region_in_one_block_is_vectorized(tmp_path):
    """A region that is one forall block (the 4-row M edge of 514 rows in 6-row tiles, N = 136 in
    one block) is tiled into two, so canonicalization cannot fold its forall away with the nest
    the GEMM cleanup vectorizes: it ran as scalar loops with a partial-accumulator malloc per
    micro-tile (6 allocations in the library instead of the pack and one corner tile)."""
    a, b = torch.randn(514, 192), torch.randn(192, 136)  # (not another test's graph: no in-process hit)
    out = neuron_compile(lambda a, b: a @ b, options={"dump_dir": str(tmp_path), "cache": False})(a, b)
    ref = a.double() @ b.double()
    assert (out.double() - ref).abs().max() <= 2 * (a @ b - ref).abs().max() + 1e-5
    ll = "".join(p.read_text() for p in tmp_path.rglob("*.obj.ll"))
    assert 1 <= ll.count("call ptr @_mlir_memref_to_llvm_alloc(") <= 2
