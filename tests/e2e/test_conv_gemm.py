"""Convolutions lowered as im2col / col2im + the tiled GEMM (``lowering/conv_gemm.py``): forward,
input and weight gradients against eager PyTorch at float64, for the geometries the GEMM path
takes (unit and larger strides, dilation, padding, 1×1, one image, 1-D and 3-D), and the kernels
it produces (a shared-A batched GEMM, vectorized windowed copies)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_compile.codegen import plan_codegen
from neuron_compile.codegen.strategies.matmul import ISA_TABLE
from neuron_compile.target import HostCPU
from neuron_compile.compiler import run_fx_passes
from neuron_compile.debug import Dumper
from neuron_compile.lowering.emit import lower_graph
from neuron_compile.passes.registry import parse_pass_spec
from tests.conftest import neuron_compile
from tests.ir.lower import trace

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

# (input shape, weight shape, bias, stride, padding, dilation)
CASES = {
    "3x3 pad 1": ((4, 8, 12, 12), (16, 8, 3, 3), True, 1, 1, 1),
    "3x3 stride 2": ((3, 8, 15, 13), (16, 8, 3, 3), True, 2, 1, 1),
    "3x3 dilation 2": ((2, 6, 14, 14), (8, 6, 3, 3), False, 1, 2, 2),
    "1x1": ((4, 16, 9, 9), (24, 16, 1, 1), True, 1, 0, 1),
    "5x3 asymmetric padding": ((2, 5, 11, 16), (12, 5, 5, 3), True, 1, (2, 1), 1),
    "one image": ((1, 8, 10, 10), (16, 8, 3, 3), True, 1, 1, 1),
    "1-d": ((3, 6, 64), (10, 6, 5), True, 1, 2, 1),
    "3-d": ((2, 3, 6, 8, 8), (8, 3, 3, 3, 3), True, 1, 1, 1),
    # wide enough for the implicit weight gradient (output channels >= one register tile), with
    # channel counts that are not tile multiples (padded with zeros inside the kernel)
    "3x3 40 outputs": ((2, 8, 12, 12), (40, 8, 3, 3), True, 1, 1, 1),
    "3x3 odd channels dilated": ((3, 5, 13, 11), (33, 5, 3, 3), False, 1, (2, 1), (2, 1)),
    # whole register tiles (one GEMM region): the output is written in place through its reshape
    "3x3 stride 2 whole tiles": ((2, 4, 32, 32), (16, 4, 3, 3), True, 2, 1, 1),
    "1x1 whole tiles": ((2, 16, 16, 16), (32, 16, 1, 1), False, 1, 0, 1),
    # output planes narrower than a register tile (late ResNet stages): the batch's positions are
    # the rows of one channels-last GEMM
    "3x3 at 4x4": ((6, 24, 4, 4), (64, 24, 3, 3), True, 1, 1, 1),
    "3x3 at 2x2, one image": ((1, 40, 2, 2), (64, 40, 3, 3), True, 1, 1, 1),
    "3x3 stride 2 to 3x3": ((5, 16, 6, 6), (72, 16, 3, 3), False, 2, 1, 1),
    "1x1 stride 2 at 5x5": ((3, 32, 5, 5), (64, 32, 1, 1), True, 2, 0, 1),
    "1-d, 5 positions": ((4, 24, 5), (64, 24, 3), True, 1, 1, 1),
    # fewer input rows (C·KK) than a register tile's columns: the weight gradient's product transposed
    "1x1 few inputs": ((4, 16, 9, 9), (48, 16, 1, 1), False, 1, 0, 1),
    "1x1 few inputs at 4x4": ((8, 16, 4, 4), (48, 16, 1, 1), True, 1, 0, 1),
    # stride 2 along an even width: im2col read from the input's two column phases
    "7x7 stride 2 stem": ((2, 3, 20, 22), (16, 3, 7, 7), False, 2, 3, 1),
    "5x5 stride 2 no padding, odd height": ((2, 3, 17, 18), (8, 3, 5, 5), True, 2, 0, 1),
    "3x3 stride 2 dilated rows": ((2, 4, 13, 14), (8, 4, 3, 3), True, 2, 1, (2, 1)),
}


def _run(fn, args):
    args = [a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*args)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
    return out.detach(), [a.grad for a in args]


def _assert_like_float64(fn, args, tol=None):
    """``fn`` compiled against eager at float64: value and the gradient of every argument."""
    dtype = args[0].dtype
    tol = tol or dict(rtol=1e-4, atol=1e-4)
    out, grads = _run(torch.compile(fn, backend="neuron", dynamic=False), args)
    ref, ref_grads = _run(fn, [a.double() for a in args])
    torch.testing.assert_close(out, ref.to(dtype), **tol)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want.to(dtype), **tol)


# float64 takes the same strategies with half the vector width: one case per path is enough there
FLOAT64 = ("3x3 pad 1", "3x3 stride 2", "7x7 stride 2 stem", "1-d", "3-d", "3x3 40 outputs", "3x3 at 4x4", "1x1 few inputs at 4x4")


@pytest.mark.parametrize("case,dtype", [(c, torch.float32) for c in CASES] + [(c, torch.float64) for c in FLOAT64])
def test_convolution_and_its_gradients_match_eager_at_float64(case, dtype):
    xs, ws, has_bias, stride, padding, dilation = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    x, w = torch.randn(xs, generator=g, dtype=dtype), torch.randn(ws, generator=g, dtype=dtype)
    args = [x, w] + ([torch.randn(ws[0], generator=g, dtype=dtype)] if has_bias else [])
    conv = CONV[len(xs) - 2]

    def fn(x, w, b=None):
        return conv(x, w, b, stride=stride, padding=padding, dilation=dilation)
    _assert_like_float64(fn, args, None if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10))


def _kernels(fn, *args):
    """(kernel, schedule) pairs of ``fn``'s forward + backward graph lowered for this host."""
    gm = trace(fn, *args)
    gm.graph.eliminate_dead_code()   # (make_fx unpacks every result of a tuple, None included)
    gm.recompile()
    lowered = lower_graph(run_fx_passes(gm, "test", Dumper(None, "test"), {}, parse_pass_spec("default")), "test")
    plan = plan_codegen(lowered.kernels, HostCPU.detect().info())
    return list(zip(lowered.kernels, plan.schedules))


def _conv_step(stride, padding, transposed=False, groups=1):
    """``(gy, x, w) -> (y, gx, gw)``: one ``aten.convolution`` (dilation 1) and both its gradients,
    traced together for :func:`_kernels`."""
    k = len(stride)

    def step(gy, x, w):
        y = torch.ops.aten.convolution(x, w, None, stride, padding, [1] * k, transposed, [0] * k, groups)
        gx, gw, _ = torch.ops.aten.convolution_backward(gy, x, w, None, stride, padding, [1] * k, transposed,
                                                        [0] * k, groups, [True, True, False])
        return y, gx, gw
    return step


def test_unit_stride_forward_is_one_implicit_gemm_kernel():
    x, w, b = torch.randn(4, 8, 12, 12), torch.randn(16, 8, 3, 3), torch.randn(16)
    ks = _kernels(lambda x, w, b: F.conv2d(x, w, b, padding=1), x, w, b)
    (gemm,) = [k for k, _ in ks if k.kind == "matmul"]
    assert gemm.attrs["conv"] and gemm.attrs["shared_a"] and gemm.attrs["batch"] == 4
    assert (gemm.attrs["m"], gemm.attrs["n"], gemm.attrs["k"]) == (16, 144, 72)
    # no im2col matrix: the other kernels are the zero-padded copy of the input (plane by plane,
    # vectorized) and the crop of the output (computed on the padded grid) into the graph's output
    assert [(k.kind, s.strategy) for k, s in ks if k.kind != "matmul"] == [("loop", "pad-planes"),
                                                                            ("pointwise", "pointwise")]
    assert all(o.affine for k, _ in ks for o in k.operands)


def test_strided_forward_is_a_shared_weight_gemm_over_vectorized_im2col_rows():
    """At stride 2 along an even width the im2col matrix is copied from the input's two column
    phases (one ``pad-planes`` kernel writes them): each phase's taps are unit-stride windows, one
    vectorized copy per phase written in place into every other tap. Read at stride 2 the copy
    was a gather on ``loops-forall`` (a ResNet stem, 7×7/2 3→64 at 16×3×64×64: 15–17 % of the
    layer; AMD Zen 3). An odd width keeps the gather."""
    x, w = torch.randn(4, 8, 24, 24), torch.randn(16, 8, 3, 3)
    ks = _kernels(lambda x, w: F.conv2d(x, w, stride=2, padding=1), x, w)
    (gemm,) = [k for k, _ in ks if k.kind == "matmul"]
    assert gemm.attrs["shared_a"] and not gemm.attrs.get("conv") and gemm.attrs["k"] == 72
    windowed = [(k, s) for k, s in ks if not all(o.affine for o in k.operands)]
    assert [s.strategy for _, s in windowed] == ["pointwise", "pointwise"]
    # taps 0 and 2 read phase 1 of the padded columns, tap 1 phase 0: 2 + 1 of the 3 taps
    assert sorted(k.ranges[3] for k, _ in windowed) == [1, 2]
    assert [s.strategy for k, s in ks if k.kind == "loop"] == ["pad-planes"]
    assert not [k for k, _ in ks if k.kind == "copy"]
    x = torch.randn(4, 8, 24, 23)
    ks = _kernels(lambda x, w: F.conv2d(x, w, stride=2, padding=1), x, w)
    windowed = [(k, s) for k, s in ks if not all(o.affine for o in k.operands)]
    # a stride-2 row is a gather: plain loops, split over the thread pool along (n, c)
    assert len(windowed) == 1 and windowed[0][1].strategy == "loops-forall"
    assert windowed[0][1].params["forall"][:2] != [0, 0]


def test_gradients_are_gemms():
    def backward(g, x, w):   # what AOTAutograd's backward graph calls
        gx, gw, _ = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                        [True, True, False])
        return gx, gw
    ks = _kernels(backward, torch.randn(4, 40, 12, 12), torch.randn(4, 8, 12, 12), torch.randn(40, 8, 3, 3))
    gemms = [k for k, _ in ks if k.kind == "matmul"]
    # grad_input: the implicit GEMM of the flipped kernel; grad_weight: the implicit GEMM reading
    # the input's windows in place (no im2col matrix in either)
    assert len(gemms) == 2 and all(k.attrs["conv"] for k in gemms)
    assert "conv_wgrad" in gemms[1].attrs["gemm"] and gemms[1].attrs["batch"] == 9
    windowed = [(k, s) for k, s in ks if not all(o.affine for o in k.operands)]
    assert [s.strategy for _, s in windowed] == ["loops"]   # the flipped kernel (tiny)


@pytest.mark.parametrize("c", [8, 24])
def test_narrow_weight_gradient_is_an_implicit_gemm_one_vector_wide(c):
    """Output channels one vector wide (half the table's register tile): the implicit GEMM with
    NR = one vector, where it took an im2col copy and a GEMM reading it transposed at 30-36
    GFLOP/s (a UNet's 32 → 16 layer at 64×64: 11.3 ms, eager 3.6; now 3.9; AMD Zen 4, 1 thread).
    Channel counts giving one register tile (8) or an odd number of them (24) once left the
    micro-kernel scalar (4 GFLOP/s); the values are checked against float64 eager."""
    target = HostCPU.detect().info()
    oc = ISA_TABLE[target.isa]["VL"]

    def backward(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [False, True, False])[1]
    gen = torch.Generator().manual_seed(c)
    args = torch.randn(2, oc, 10, 10, generator=gen), torch.randn(2, c, 10, 10, generator=gen), torch.randn(oc, c, 3, 3)
    ks = _kernels(backward, *args)
    (gemm,) = [k for k, _ in ks if k.kind == "matmul"]
    q = gemm.attrs["gemm"]
    assert q["conv_wgrad"] and q["NR"] == oc and (q["problem"]["m"] // q["MR"] >= 2)
    got = torch.compile(backward, backend="neuron", dynamic=False)(*args)
    torch.testing.assert_close(got, backward(*(a.double() for a in args)).float(), rtol=1e-5, atol=1e-4)


def test_weight_gradient_with_fewer_output_channels_than_a_vector_sums_rows():
    """A 1×1 head's weight gradient (16 → 4 channels): no GEMM form; one window sum per weight
    element over rows of ``g`` and ``x`` (``window-reduction``), not ``loops`` (1.9 → 0.3 ms at
    8×16×64×64, eager 0.24; AMD Zen 4, 1 thread)."""
    def backward(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                   [False, True, False])[1]
    args = torch.randn(2, 4, 16, 16), torch.randn(2, 16, 16, 16), torch.randn(4, 16, 1, 1)
    ks = _kernels(backward, *args)
    assert [s.strategy for k, s in ks if k.kind == "reduction"] == ["window-reduction"]
    got = torch.compile(backward, backend="neuron", dynamic=False)(*args)
    torch.testing.assert_close(got, backward(*(a.double() for a in args)).float(), rtol=1e-5, atol=1e-4)


def test_strided_input_gradient_is_a_gemm_and_a_col2im():
    def backward(g, x, w):
        gx, _, _ = torch.ops.aten.convolution_backward(g, x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1,
                                                       [True, False, False])
        return gx
    ks = _kernels(backward, torch.randn(4, 16, 12, 12), torch.randn(4, 8, 24, 24), torch.randn(16, 8, 3, 3))
    (gemm,) = [k for k, _ in ks if k.kind == "matmul"]
    assert gemm.attrs["trans_a"] and gemm.attrs["shared_a"]
    assert len([k for k, _ in ks if any(not o.affine for o in k.operands if o.output)]) == 1   # col2im


@pytest.mark.parametrize("stride", [1, 2])
def test_small_output_planes_fold_the_batch_into_gemm_rows(stride):
    """Forward, input and weight gradients of a convolution with a 2×2 output plane are GEMMs
    over the batch's N·OH·OW rows (a product per image would have 4 columns: the direct
    contraction on ``loops``, ~2 GFLOP/s, before). With fewer rows than output channels the
    forward is ``W @ rowsᵀ`` (the weight streamed as stored, not packed on every call)."""
    step = _conv_step([stride] * 2, [1, 1])
    hw = 2 * stride
    ks = _kernels(step, torch.randn(8, 64, 2, 2), torch.randn(8, 32, hw, hw), torch.randn(64, 32, 3, 3))
    gemms = [k for k, _ in ks if k.kind == "matmul"]
    assert sorted((k.attrs["m"], k.attrs["n"], k.attrs["k"]) for k in gemms) == sorted(
        [(64, 32, 288), (32, 288, 64), (64, 288, 32)])   # forward, grad_input, grad_weight
    assert all(k.attrs["gemm"]["problem"]["batch"] == 0 for k in gemms)   # one GEMM each, no batch
    assert not [k for k, s in ks if s.strategy == "loops" and k.kind == "matmul"]


def test_grids_mostly_of_wrapped_columns_take_the_rows_form():
    """4×4 images under a 3×3 kernel: the implicit GEMM's padded grid is 4 rows × 6 columns = 24,
    rounded up to 32 by a 16-column AVX2 register tile, half of them useful. Forward, input and
    weight gradients take the rows form (N·OH·OW rows, no batch of images) on every ISA; on AVX2
    the implicit forms had computed twice the product (a 256-channel layer's training step 21 ms,
    eager 13; AMD Zen 3, 1 thread). Values against float64 eager."""
    step = _conv_step([1, 1], [1, 1])
    gen = torch.Generator().manual_seed(3)
    args = (torch.randn(8, 64, 4, 4, generator=gen), torch.randn(8, 48, 4, 4, generator=gen),
            torch.randn(64, 48, 3, 3, generator=gen))
    gemms = [k for k, _ in _kernels(step, *args) if k.kind == "matmul"]
    assert len(gemms) == 3 and not [k for k in gemms if k.attrs.get("conv")]
    assert all(k.attrs["gemm"]["problem"]["batch"] == 0 for k in gemms)
    got = torch.compile(step, backend="neuron", dynamic=False)(*args)
    for a, b in zip(got, step(*(t.double() for t in args))):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("hw", [8, 16])
def test_implicit_weight_gradient_k_blocks_stay_inside_each_image(hw):
    """The implicit weight gradient's k-blocks never span two images: each image's OH·Wp grid
    columns are cut into equal blocks (multiples of 8), not rounded up to the plan's KC (8×8:
    80 columns took 168-384 k steps, 2-5× the work). Values against float64 eager."""
    def backward(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [False, True, False])[1]
    gen = torch.Generator().manual_seed(hw)
    n, grid = 4, hw * (hw + 2)
    args = (torch.randn(n, 64, hw, hw, generator=gen), torch.randn(n, 64, hw, hw, generator=gen),
            torch.randn(64, 64, 3, 3, generator=gen))
    (gemm,) = [k for k, _ in _kernels(backward, *args) if k.kind == "matmul"]
    q = gemm.attrs["gemm"]
    assert q["conv_wgrad"] and q["problem"]["k"] == grid   # (k steps per image; 80 and 288 are multiples of 8)
    got = torch.compile(backward, backend="neuron", dynamic=False)(*args)
    torch.testing.assert_close(got.double(), backward(*(t.double() for t in args)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("positions, kc", [(24, 384), (80, 168), (288, 128), (300, 128), (3248, 168)])
def test_image_k_blocks_are_equal_multiples_of_8_never_two_or_three(positions, kc):
    from neuron_compile.lowering.implicit_gemm import image_k_blocks
    block, padded = image_k_blocks(positions, kc)
    blocks = padded // block
    assert padded % block == 0 and block % 8 == 0 and padded >= positions
    assert padded - positions < 8 * blocks   # only the rounding of each block to 8
    assert blocks == 1 and positions <= 2 * kc or blocks >= 4 and block <= kc + 8


CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
# (input shape, weight shape [IC, OC, k...], bias, stride, padding, output_padding, dilation)
TRANSPOSED = {
    "2x2 stride 2 (UNet up)": ((4, 48, 6, 6), (48, 32, 2, 2), True, 2, 0, 0, 1),
    "3x3 stride 2 pad 1 output_padding 1": ((3, 40, 5, 7), (40, 36, 3, 3), True, 2, 1, 1, 1),
    "3x3 unit stride": ((2, 24, 8, 8), (24, 40, 3, 3), False, 1, 1, 0, 1),
    "3x3 at 2x2": ((8, 64, 2, 2), (64, 48, 3, 3), True, 2, 1, 1, 1),
    "1-d dilated": ((3, 24, 9), (24, 40, 3), True, 2, 2, 1, 2),
    # windows tiling the output (stride = kernel): a permutation, cropped and zero-extended
    "3x3 stride 3 pad 1 output_padding 2": ((2, 8, 4, 5), (8, 12, 3, 3), True, 3, 1, 2, 1),
    "3-d 2x2x2 stride 2": ((2, 8, 3, 4, 3), (8, 4, 2, 2, 2), False, 2, 0, 1, 1),
}


@pytest.mark.parametrize("case", list(TRANSPOSED))
def test_transposed_convolution_and_its_gradients_match_eager_at_float64(case):
    """A transposed convolution is its convolution's input gradient (a GEMM and a col2im, not a
    scatter); its own input gradient is a convolution and its weight gradient a GEMM."""
    xs, ws, has_bias, stride, padding, output_padding, dilation = TRANSPOSED[case]
    g = torch.Generator().manual_seed(len(case))
    args = [torch.randn(xs, generator=g), torch.randn(ws, generator=g)]
    args += [torch.randn(ws[1], generator=g)] if has_bias else []
    conv = CONV_T[len(xs) - 2]

    def fn(x, w, b=None):
        return conv(x, w, b, stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)
    _assert_like_float64(fn, args)


def test_transposed_convolution_is_gemms():
    ks = _kernels(_conv_step([2, 2], [0, 0], transposed=True), torch.randn(4, 32, 16, 16), torch.randn(4, 48, 8, 8),
                  torch.randn(48, 32, 2, 2))
    assert len([k for k, _ in ks if k.kind == "matmul"]) == 3
    assert not [k for k, s in ks if s.strategy == "loops" and k.kind == "matmul"]
    # stride = kernel: the columns are permuted into place (a transpose), no accumulating col2im
    assert not [k for k, _ in ks if k.kind == "pointwise" and any(not o.affine for o in k.operands if o.output)]


# (input shape, weight shape, bias, stride, padding, groups, transposed)
GROUPED = {
    "groups 4, 3x3": ((3, 16, 9, 9), (32, 4, 3, 3), True, 1, 1, 4, False),
    "groups 2, stride 2": ((2, 12, 10, 11), (8, 6, 3, 3), False, 2, 1, 2, False),
    "groups 4, 1x1": ((4, 32, 5, 5), (64, 8, 1, 1), True, 1, 0, 4, False),
    "groups 2, 1-d": ((3, 8, 20), (12, 4, 5), True, 1, 2, 2, False),
    "groups 2, transposed 2x2 stride 2": ((2, 16, 5, 5), (16, 6, 2, 2), True, 2, 0, 2, True),
    # depthwise (one input channel per group): the gradients as gathers
    "depthwise 3x3": ((3, 8, 9, 9), (8, 1, 3, 3), True, 1, 1, 8, False),
    "depthwise 3x3 stride 2": ((2, 8, 10, 9), (8, 1, 3, 3), False, 2, 1, 8, False),
    "depthwise multiplier 2, 1-d": ((3, 4, 20), (8, 1, 5), True, 1, 2, 4, False),
    "depthwise padding beyond the kernel": ((2, 4, 7, 7), (4, 1, 3, 3), False, 1, 3, 4, False),
    "depthwise 3-d stride 2": ((2, 3, 6, 6, 6), (3, 1, 3, 3, 3), True, 2, 1, 3, False),
    "depthwise multiplier 2, 5x5 stride 3": ((2, 4, 13, 14), (8, 1, 5, 5), True, 3, 2, 4, False),
}


@pytest.mark.parametrize("case", list(GROUPED))
def test_grouped_convolution_and_its_gradients_match_eager_at_float64(case):
    xs, ws, has_bias, stride, padding, groups, transposed = GROUPED[case]
    g = torch.Generator().manual_seed(len(case))
    args = [torch.randn(xs, generator=g), torch.randn(ws, generator=g)]
    args += [torch.randn(ws[1] * groups if transposed else ws[0], generator=g)] if has_bias else []
    conv = (CONV_T if transposed else CONV)[len(xs) - 2]

    def fn(x, w, b=None):
        return conv(x, w, b, stride=stride, padding=padding, groups=groups)
    _assert_like_float64(fn, args)


def _gemm_groups(k) -> int:
    """The groups a GEMM kernel runs as one loop: the implicit forms' group loop, else the batch."""
    q = k.attrs["gemm"]
    return (q.get("conv") or q.get("conv_wgrad") or {}).get("groups") or q["problem"]["batch"]


def test_grouped_convolution_is_a_gemm_batched_over_groups():
    """Forward, input and weight gradient of a 4-group convolution: three GEMM kernels, each with
    the groups as one loop (the implicit forms at unit stride), not a kernel per group."""
    ks = _kernels(_conv_step([1, 1], [1, 1], groups=4), torch.randn(8, 64, 8, 8), torch.randn(8, 64, 8, 8),
                  torch.randn(64, 16, 3, 3))
    gemms = [k for k, s in ks if k.kind == "matmul"]
    assert len(gemms) == 3 and all(_gemm_groups(k) == 4 for k in gemms)


# (N, C, OC, groups, H, W, kernel, padding, dilation, bias): channels per group not a multiple of
# a register tile's rows (padded output channels), a 5×5 dilated kernel, no padding
IMPLICIT_GROUPED = [(4, 32, 32, 4, 9, 9, 3, 1, 1, True), (2, 24, 36, 3, 9, 7, 3, 1, 1, True),
                    (3, 8, 8, 2, 10, 10, 5, 2, 2, False), (2, 30, 20, 5, 11, 6, 3, 0, 1, True)]


@pytest.mark.parametrize("case", IMPLICIT_GROUPED, ids=str)
def test_grouped_unit_stride_convolution_and_its_gradients_match_eager_at_float64(case):
    """Grouped unit-stride convolutions (the implicit GEMM with a group loop where the GEMM takes
    them; the tiny ones stay direct), forward and gradients, against float64 eager."""
    n, c, oc, groups, h, w_, k, p, d, has_bias = case
    g = torch.Generator().manual_seed(c)
    x, w = torch.randn(n, c, h, w_, generator=g, dtype=torch.float64), \
        torch.randn(oc, c // groups, k, k, generator=g, dtype=torch.float64)
    args = [x, w] + ([torch.randn(oc, generator=g, dtype=torch.float64)] if has_bias else [])

    def fn(x, w, b=None):
        return F.conv2d(x, w, b, padding=p, dilation=d, groups=groups)
    _assert_like_float64(fn, args, dict(rtol=1e-10, atol=1e-10))


def _three_gemms(step, *args) -> list:
    gemms = [ki for ki, _ in _kernels(step, *args) if ki.kind == "matmul"]
    assert len(gemms) == 3 and all(ki.attrs.get("conv") for ki in gemms)
    return gemms


def test_grouped_unit_stride_convolution_is_one_implicit_gemm_with_a_group_loop():
    """Forward and both gradients of a grouped unit-stride convolution: each one implicit-GEMM
    kernel whose groups are a loop (no im2col matrix, no permute to NCHW)."""
    gemms = _three_gemms(_conv_step([1, 1], [1, 1], groups=4), torch.randn(4, 64, 9, 9), torch.randn(4, 64, 9, 9),
                         torch.randn(64, 16, 3, 3))
    assert all(_gemm_groups(ki) == 4 for ki in gemms)


@pytest.mark.parametrize("case", [(8, 16, 16, 1, 64, 3, 1, 1), (2, 6, 10, 2, 17, 5, 2, 2), (3, 8, 4, 1, 30, 4, 0, 1)],
                         ids=str)
def test_one_dimensional_convolution_and_its_gradients_match_eager_at_float64(case):
    """Conv1d as a 2-D convolution of one-row images: values and gradients against float64 eager."""
    n, c, oc, groups, length, k, p, d = case
    g = torch.Generator().manual_seed(length)
    x, w = torch.randn(n, c, length, generator=g, dtype=torch.float64), \
        torch.randn(oc, c // groups, k, generator=g, dtype=torch.float64)
    _assert_like_float64(lambda x, w: F.conv1d(x, w, None, padding=p, dilation=d, groups=groups), [x, w],
                         dict(rtol=1e-10, atol=1e-10))


def test_one_dimensional_convolution_runs_as_an_image_of_one_row():
    """Conv1d, forward and both gradients, takes the 2-D implicit GEMM as an image of one row
    (three implicit GEMM kernels, no im2col matrix)."""
    _three_gemms(_conv_step([1], [1]), torch.randn(8, 16, 64), torch.randn(8, 16, 64), torch.randn(16, 16, 3))


def test_depthwise_gradients_read_windows_and_the_weight_gradient_is_vectorized():
    def backward(g, x, w):
        gx, gw, _ = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 32,
                                                        [True, True, False])
        return gx, gw
    ks = _kernels(backward, torch.randn(4, 32, 14, 14), torch.randn(4, 32, 14, 14), torch.randn(32, 1, 3, 3))
    reductions = {s.strategy: k for k, s in ks if k.kind == "reduction"}
    # the weight gradient sums rows of g·x windows in registers; the input gradient is a forward
    # depthwise convolution of g with the flipped kernel (every loop but the window's parallel:
    # no accumulating scatter), a row update per kernel offset
    assert set(reductions) == {"window-reduction", "window-stencil"}
    assert reductions["window-reduction"].ranges == (32, 3, 3, 4, 14, 14)
    assert reductions["window-stencil"].iterators[:4] == ("parallel",) * 4


def test_strided_depthwise_weight_gradient_is_one_window_sum_per_phase():
    """Stride 2 along the contiguous dim: the kernel offsets of each phase (kw = 0, 2 and kw = 1)
    read a unit-stride view ``x[..., r::2]``: two ``window-reduction`` kernels, none on ``loops``
    (one strided window sum on ``loops`` ran at 2 GB/s: MobileNet's 96-channel layer 4.0 ms, now
    1.5 ms; AMD Zen 4, 1 thread)."""
    def backward(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 32,
                                                   [False, True, False])[1]
    ks = _kernels(backward, torch.randn(4, 32, 7, 7), torch.randn(4, 32, 14, 14), torch.randn(32, 1, 3, 3))
    sums = [k for k, s in ks if k.kind == "reduction"]
    assert [s.strategy for k, s in ks if k.kind == "reduction"] == ["window-reduction"] * 2
    assert sorted(k.ranges[:3] for k in sums) == [(32, 3, 1), (32, 3, 2)]



def test_depthwise_rows_short_or_strided_are_vectorized():
    """Output rows of 4 (a 4×4 plane) and stride 2 along the row, forward and input gradient:
    ``window-stencil`` over whole padded rows (flattened with the padded width, or every column at
    unit stride then cropped), no depthwise kernel on scalar loops (16x384x4x4: 0.28 -> 0.08 ms;
    AMD Zen 4, 1 thread)."""
    def step(x, w, g, x8):
        y = F.conv2d(x, w, None, 1, 1, 1, 64)
        gx = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 64,
                                                 [True, False, False])[0]
        return y, gx, F.conv2d(x8, w, None, 2, 1, 1, 64)
    ks = _kernels(step, torch.randn(4, 64, 4, 4), torch.randn(64, 1, 3, 3), torch.randn(4, 64, 4, 4),
                  torch.randn(4, 64, 8, 8))
    stencils = [k for k, s in ks if k.kind == "reduction" and s.strategy == "window-stencil"]
    assert not [k for k, s in ks if k.kind == "reduction" and s.strategy != "window-stencil"]
    # rows of 4 under half a register (AVX-512) flattened: 4 rows × 6 padded columns (twice), and
    # the 4 strided outputs as 8 columns at unit stride, cropped; on AVX2 a row of 4 is half a
    # register and window-stencil takes it as it is, the strided rows as one sum per column phase
    if 4 < HostCPU.detect().info().vector_bits // 64:
        assert sorted(k.operands[-1].shape[-1] for k in stencils) == [8, 24, 24]
    else:
        assert sorted(k.operands[-1].shape[-1] for k in stencils) == [4, 4, 4, 4]


@settings(max_examples=10, deadline=None)
@given(c=st.integers(1, 20), k=st.integers(1, 5), stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dilation=st.integers(1, 2), pad=st.integers(0, 2), hw=st.tuples(st.integers(1, 10), st.integers(1, 10)),
       bias=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_depthwise_values_and_gradients_match_float64(c, k, stride, dilation, pad, hw, bias, dtype):
    if any(s + 2 * pad - dilation * (k - 1) < 1 for s in hw):
        return
    g = torch.Generator().manual_seed(c * 31 + k)
    x = torch.randn(2, c, *hw, dtype=dtype, generator=g)
    w = torch.randn(c, 1, k, k, dtype=dtype, generator=g)
    b = torch.randn(c, dtype=dtype, generator=g) if bias else None

    def f(x, w, b):
        return F.conv2d(x, w, b, stride, pad, dilation, c).tanh()
    args = [t.requires_grad_() for t in (x, w, b) if t is not None]
    got = neuron_compile(f)(x, w, b)
    gy = torch.randn(got.shape, dtype=dtype, generator=g)
    grads = torch.autograd.grad(got, args, gy)
    ref = [t.detach().double().requires_grad_() for t in args]
    want = f(ref[0], ref[1], ref[2] if bias else None)
    want_grads = torch.autograd.grad(want, ref, gy.double())
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for a, e in zip((got,) + grads, (want,) + want_grads):
        torch.testing.assert_close(a.double(), e, rtol=tol, atol=tol * max(1.0, e.abs().max().item()))


@pytest.mark.parametrize("dims, size, k, stride, pad", [(1, 33, 3, 2, 1), (3, 9, 3, 2, 1), (2, 13, 3, 3, 1),
                                                         (2, 16, 1, 2, 0), (2, 12, 4, 2, 1)], ids=str)
def test_strided_depthwise_input_gradient_spread_matches_float64(dims, size, k, stride, pad):
    """The spread of a strided depthwise input gradient: 1-D and 3-D, stride 3, a block that does
    not fit its buffer (1×1 kernel: the strided copy) and an even kernel."""
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    g = torch.Generator().manual_seed(size)
    x = torch.randn(2, 6, *[size] * dims, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(6, 1, *[k] * dims, dtype=torch.float64, generator=g)

    def f(x):
        return conv(x, w, None, stride, pad, 1, 6).sin().sum()
    got, = torch.autograd.grad(neuron_compile(f)(x), x)
    want, = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("groups, pad, size", [(6, (0, 1), (7, 9)), (6, (1, 0), (9, 7)), (6, (2, 1), (5, 8)),
                                              (1, (0, 3), (6, 5)), (1, (1, 2), (4, 11)), (3, (2, 2), (1, 1))],
                         ids=str)
def test_zero_padded_copies_match_float64(groups, pad, size):
    """The border of a convolution's zero-padded input filled around the copied box: no top and
    bottom rows (the first and last row ends filled on their own), no columns, unequal pads,
    one-pixel images; forward and both gradients against float64 eager."""
    g = torch.Generator().manual_seed(sum(pad) + groups)
    x = torch.randn(2, 6, *size, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(6, 6 // groups, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)

    def f(x, w):
        return F.conv2d(x, w, None, 1, pad, 1, groups).sin().sum()
    got = torch.autograd.grad(neuron_compile(f)(x, w), (x, w))
    want = torch.autograd.grad(f(x, w), (x, w))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


def test_col2im_is_never_split_across_threads_where_windows_overlap():
    """A Conv3d input gradient whose col2im was split over output positions: two threads' slices
    wrote the same input elements through different kernel offsets (0.3-0.7 relative error,
    different on every call; a new user's trial). Repeated calls at 2 threads equal eager."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 1, 8, 5, 100, generator=g), torch.randn(3, 1, 3, 3, 3, generator=g)
    gy = torch.randn(1, 3, 6, 3, 98, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fn = torch.compile(lambda t: F.conv3d(t, w), backend="neuron", dynamic=False)
        xe = x.double().requires_grad_()
        (want,) = torch.autograd.grad(F.conv3d(xe, w.double()), xe, gy.double())
        for _ in range(3):
            xc = x.clone().requires_grad_()
            (got,) = torch.autograd.grad(fn(xc), xc, gy)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("ks", [1, 3])
def test_input_rows_no_window_reaches_get_a_zero_gradient_whatever_memory_held(ks):
    """A stride-2 convolution at 8×8 without padding: no window reaches input row 7 or column 7,
    whose gradient is 0. Its col2im's output index ``oh·2 + kh`` spans rows 0-6 only, so a zero
    fill fused into each thread-pool tile (batch 16 splits) left row 7 holding freed memory
    (1.8e37, NaN, or the 12345.0 freed just before; a new user's trial). The col2im keeps its fill
    whole, and repeated calls after freeing poisoned buffers equal float64 eager."""
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(16, 32, 8, 8, generator=g), torch.randn(16, 32, ks, ks, generator=g)
    fwd = lambda x, w: F.conv2d(x, w, stride=2)  # noqa: E731
    gy = torch.randn(16, 16, (8 - ks) // 2 + 1, (8 - ks) // 2 + 1, generator=g)

    def backward(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1,
                                                   [True, False, False])[0]
    col2im = [k for k, _ in _kernels(backward, gy, x, w) if any(o.output and not o.covers(k.ranges) for o in k.operands)]
    assert col2im and all(not any(k.fill_inits) for k in col2im)
    fn = torch.compile(fwd, backend="neuron", dynamic=False)
    xe = x.double().requires_grad_()
    (want,) = torch.autograd.grad(fwd(xe, w.double()), xe, gy.double())
    for _ in range(3):
        junk = torch.full((16, 32, 8, 8), 12345.0)
        del junk
        xc = x.clone().requires_grad_()
        (got,) = torch.autograd.grad(fn(xc, w), xc, gy)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_unscheduled_kernels_split_over_threads_only_along_plain_output_dims():
    """``loops-forall``: a strided depthwise forward whose rows are too short for any vector
    strategy on any ISA (2 outputs, 3 at unit stride: under half an AVX2 register) runs on the
    thread pool, split along (n, c) only; at 2 threads, repeated, it equals float64 eager (a
    col2im, whose output positions sit inside windows, is covered by
    test_col2im_is_never_split_across_threads_where_windows_overlap)."""
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(8, 24, 63, 3, generator=g), torch.randn(24, 1, 3, 3, generator=g)
    fwd = lambda x, w: F.conv2d(x, w, None, 2, 1, 1, 24)  # noqa: E731
    (dw,) = [(k, s) for k, s in _kernels(fwd, x, w) if k.kind == "reduction"]
    assert dw[1].strategy == "loops-forall"
    assert all(t == 0 for d, t in enumerate(dw[1].params["forall"]) if d >= 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fn = torch.compile(fwd, backend="neuron", dynamic=False)
        want = fwd(x.double(), w.double())
        for _ in range(3):
            torch.testing.assert_close(fn(x, w).double(), want, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(4, 64, 64, 4, 16, 3, 1, 1), (2, 6, 9, 3, 9, 3, 1, 1), (2, 8, 4, 2, 7, 5, 2, 2),
                                   (1, 6, 12, 3, 6, 2, 0, 1)], ids=str)
def test_grouped_input_gradient_is_a_grouped_forward_convolution(shape):
    """At unit stride, the input gradient of a grouped convolution is the forward grouped
    convolution of the padded gradient with each group's flipped, transposed kernel (one GEMM per
    group), not a col2im scatter on loops (4 groups of 16 channels at 16×16: 3.8 ms at 2.8 GB/s);
    against float64 eager."""
    n, c, oc, g, hw, k, p, d = shape
    gen = torch.Generator().manual_seed(c)
    x, w = torch.randn(n, c, hw, hw + 1, generator=gen), torch.randn(oc, c // g, k, k, generator=gen)

    def backward(gy, x, w):
        return torch.ops.aten.convolution_backward(gy, x, w, None, [1, 1], [p, p], [d, d], False, [0, 0], g,
                                                   [True, False, False])[0]
    gy = torch.randn(F.conv2d(x, w, None, 1, p, d, g).shape, generator=gen)
    if x.numel() >= 16384:   # (tiny copies stay plain loops by design)
        ks = _kernels(backward, gy, x, w)
        # the flipped, transposed kernel, weight-sized, is the only loop nest left unscheduled
        assert [ki.ranges for ki, sc in ks if sc.strategy in ("loops", "loops-forall")] == [(c, oc // g, k, k)]
    torch.testing.assert_close(neuron_compile(backward)(gy, x, w).double(),
                               backward(gy.double(), x.double(), w.double()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", ["multiplier 2, stride 2", "multiplier 2, stride (2, 1)", "3-d groups 3, 6 out"])
def test_grouped_weight_gradients_with_several_channels_per_group_are_not_split_inside_a_floordiv(case):
    """The weight gradient's input channel is ``oc floordiv m``: split over threads at a tile
    offset m does not divide, the tiled map read the wrong channels (relative error ~1 on a third
    of the channels, depending on the sizes; a new user's trial). Against float64 eager."""
    x_shape, w_shape, stride, groups = {
        "multiplier 2, stride 2": ((4, 30, 14, 14), (60, 1, 3, 3), 2, 30),
        "multiplier 2, stride (2, 1)": ((4, 30, 14, 14), (60, 1, 3, 3), (2, 1), 30),
        "3-d groups 3, 6 out": ((2, 3, 5, 5, 5), (6, 1, 3, 3, 3), 1, 3)}[case]
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(x_shape, generator=g), torch.randn(w_shape, generator=g)
    conv = CONV[len(x_shape) - 2]

    def wgrad(x, w):
        w = w.detach().requires_grad_()
        return torch.autograd.grad(conv(x, w, None, stride, 1, 1, groups).sum(), w)[0]
    got = torch.compile(wgrad, backend="neuron", dynamic=False)(x, w)
    torch.testing.assert_close(got.double(), wgrad(x.double(), w.double()), rtol=1e-5, atol=1e-4)


def test_a_flipped_kernel_copy_is_never_tiled_over_threads():
    """The unit-stride input gradient flips the weight (``2 - d2``); MLIR's tiling aborts on a
    negative coefficient, so ``loops-forall`` declines the copy (64→64 3×3 weights: mlir-opt
    aborted compiling a UNet's backward graph). The input gradient matches float64 eager."""
    g = torch.Generator().manual_seed(1)
    x, w, gy = (torch.randn(2, 64, 8, 8, generator=g), torch.randn(64, 64, 3, 3, generator=g),
                torch.randn(2, 64, 8, 8, generator=g))

    def dgrad(gy, x, w):
        return torch.ops.aten.convolution_backward(gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [True, False, False])[0]
    ks = _kernels(dgrad, gy, x, w)
    assert any("-" in e for k, _ in ks for o in k.operands for e in o.exprs)   # the flip is there
    assert not [k for k, s in ks if s.strategy == "loops-forall" and any("-" in e for o in k.operands for e in o.exprs)]
    got = torch.compile(dgrad, backend="neuron", dynamic=False)(gy, x, w)
    torch.testing.assert_close(got.double(), dgrad(gy.double(), x.double(), w.double()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_implicit_gemm_packs_its_windows_only_where_the_target_table_says(isa):
    """The implicit GEMM's B panels (windows of the padded input) are packed per k-block or, where
    :data:`ISA_TABLE` says (AVX2 and AVX-512, measured), loaded in place by the micro-kernel: no
    pack op. The packed form stays a schedule override (``pack_b``); its values against float64."""
    from neuron_compile.codegen.strategy import TargetInfo
    target = TargetInfo(isa, 512 if isa == "avx512" else 256, 32 if isa == "avx512" else 16)
    gm = trace(lambda x, w: F.conv2d(x, w, padding=1), torch.randn(4, 16, 12, 12), torch.randn(16, 16, 3, 3))
    lowered = lower_graph(gm, "test", target=target)
    (gemm,) = [k for k in lowered.kernels if k.kind == "matmul"]
    packs = ISA_TABLE[isa]["CONV_PACK_B"]
    assert gemm.attrs["gemm"]["pack_b"] is packs
    assert ('neuron.part = "packB_r0"' in lowered.mlir) is packs
    for pack in (True, False):
        x, w = torch.randn(2, 16, 12, 12, dtype=torch.float64), torch.randn(16, 16, 3, 3, dtype=torch.float64)
        fn = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="neuron", dynamic=False,
                           options={"schedule": {"matmul": {"strategy": "matmul", "params": {"pack_b": pack}}}})
        torch.testing.assert_close(fn(x, w), F.conv2d(x, w, padding=1), rtol=1e-10, atol=1e-10)
        torch._dynamo.reset()


def test_weight_gradient_of_a_three_channel_image_is_not_the_implicit_gemm():
    """One register tile of input channels (an RGB image's first layer): the implicit weight
    gradient ran at 1.5–2.6 GFLOP/s; im2col + a GEMM per image takes it. Values against float64."""
    def wgrad(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [False, True, False])[1]
    gen = torch.Generator().manual_seed(3)
    g, x, w = torch.randn(4, 16, 20, 20, generator=gen), torch.randn(4, 3, 20, 20, generator=gen), \
        torch.randn(16, 3, 3, 3, generator=gen)
    gemms = [k for k, _ in _kernels(wgrad, g, x, w) if k.kind == "matmul"]
    assert gemms and not any("conv_wgrad" in k.attrs["gemm"] for k in gemms)
    torch.testing.assert_close(neuron_compile(wgrad)(g, x, w).double(), wgrad(g.double(), x.double(), w.double()),
                               rtol=1e-5, atol=1e-4)


def test_a_concatenated_input_is_written_piecewise_into_the_convolutions_padded_copy():
    """``conv(cat([a, relu(b)], 1))`` (a UNet's skip connection): the pieces go straight into the
    convolution's zero-padded input, no copy of the concatenated tensor; float64 against eager."""
    def fn(a, b, w):
        return F.conv2d(torch.cat([a, b.relu()], 1), w, padding=1)
    gen = torch.Generator().manual_seed(5)
    a, b, w = torch.randn(2, 8, 12, 12, generator=gen), torch.randn(2, 8, 12, 12, generator=gen), \
        torch.randn(16, 16, 3, 3, generator=gen)
    copies = [ki.operands[0].shape for ki, _ in _kernels(fn, a, b, w) if ki.kind == "copy"]
    assert (2, 16, 12, 12) not in copies, copies
    _assert_like_float64(fn, [a.double(), b.double(), w.double()], dict(rtol=1e-10, atol=1e-10))


@pytest.mark.parametrize("shape", [(1, 4, 128), (2, 4, 16, 16), (1, 4, 1, 128)], ids=str)
def test_transposed_convolution_with_output_padding_at_unit_stride_matches_eager(shape):
    """Stride 1, dilation 2, ``output_padding`` 1: the input gradient is the convolution of the
    output gradient cut to the input's size (it has one more position per dim: a reshape error in
    1-D, a shape mismatch in ``mlir-opt`` in 2-D at these sizes; a new user's trial). Forward and
    gradients against float64 eager."""
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    w = torch.randn(4, 4, *[2] * (len(shape) - 2), generator=gen, dtype=torch.float64)

    def fn(x, w):
        return CONV_T[len(shape) - 2](x, w, None, stride=1, padding=1, output_padding=1, dilation=2)
    _assert_like_float64(fn, [x, w], dict(rtol=1e-10, atol=1e-10))


@pytest.mark.parametrize("dims", [1, 2])
def test_a_convolution_without_input_channels_has_eager_gradients(dims):
    """No input channels: an empty output, and every bias element's gradient zero (the bias
    gradient was reduced over the empty output to shape (0,): an mlir-opt shape error; a new
    user's trial)."""
    conv = (F.conv1d, F.conv2d)[dims - 1]
    x = torch.randn(2, 0, *[5] * dims, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 0, *[3] * dims, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)

    def f(x, w, b):
        return conv(x, w, b, 1, 1)
    got, want = neuron_compile(f)(x, w, b), f(x, w, b)
    assert got.shape == want.shape
    for a, e in zip(torch.autograd.grad(got.sum(), (x, w, b)), torch.autograd.grad(want.sum(), (x, w, b))):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e)



def test_a_stride_2_depthwise_convolution_sums_over_column_phases_without_a_crop():
    """A stored input at stride 2 along an even row: one ``pad-planes`` kernel writes it zero-padded
    as its two column phases, then one unit-stride window sum per phase (taps 1 and 0, 2 of a
    3-wide kernel) accumulates into the output: no twice-wide rows, no crop read at stride 2
    (16x96x32x32 forward: 1.73 -> 1.37 ms at 1 thread, eager 1.38; AMD Zen 3)."""
    ks = _kernels(lambda x, w: F.conv2d(x, w, None, 2, 1, 1, 32), torch.randn(2, 32, 16, 16),
                  torch.randn(32, 1, 3, 3))
    assert [(k.kind, s.strategy) for k, s in ks] == [("loop", "pad-planes"), ("reduction", "window-stencil"),
                                                     ("reduction", "window-stencil")]
    assert ks[0][0].operands[1].shape == (2, 32, 17, 2, 9)   # rows 1 + 16 (the last window's end); columns 1 + 8
    assert [k.ranges for k, _ in ks[1:]] == [(2, 32, 8, 8, 3, 1), (2, 32, 8, 8, 3, 2)]


@pytest.mark.parametrize("h, w, k, pad, stride_h, dilation_h, bias", [
    (32, 32, 3, 1, 2, 1, False), (31, 30, 3, 1, 2, 1, True), (16, 16, 5, 2, 2, 1, False), (17, 20, 4, 0, 1, 2, True),
    (12, 18, 3, 0, 2, 1, False), (20, 24, 7, 3, 2, 1, True), (9, 16, 2, 1, 2, 1, False)], ids=str)
def test_stride_2_depthwise_convolutions_over_column_phases_match_float64(h, w, k, pad, stride_h, dilation_h, bias):
    """Values and gradients of depthwise convolutions at stride 2 along the row (even widths: the
    column phases), odd and even kernels, pads past half the kernel, row strides and dilations."""
    g = torch.Generator().manual_seed(h * w + k)
    x = torch.randn(2, 16, h, w, dtype=torch.float64, generator=g)
    wt = torch.randn(16, 1, k, k, dtype=torch.float64, generator=g)
    b = torch.randn(16, dtype=torch.float64, generator=g) if bias else None

    def fn(x, wt):
        return F.conv2d(x, wt, b, (stride_h, 2), pad, (dilation_h, 1), 16).sin()
    _assert_like_float64(fn, [x, wt], dict(rtol=1e-10, atol=1e-10))


def test_a_unit_stride_depthwise_input_gradient_pads_the_gradient_plane_by_plane():
    """The input gradient of a depthwise convolution at unit stride is the window sum of the output
    gradient zero-padded by ``K-1-p``: that padded copy is one ``pad-planes`` kernel (each plane
    filled and copied in a parallel loop), where a zero fill of the whole buffer ran in the graph's
    serial code before a copy kernel (16×128×28×28: 0.5 ms of serial fill; AMD Zen 3, 1 thread).
    Values and gradients against float64 in the depthwise tests above and in test_conv_layout."""
    step = _conv_step([1, 1], [1, 1], groups=16)
    ks = _kernels(step, torch.randn(2, 16, 12, 12), torch.randn(2, 16, 12, 12), torch.randn(16, 1, 3, 3))
    pads = [k for k, s in ks if k.kind == "loop" and s.strategy == "pad-planes"]
    # the forward's padded input and the gradient's padded copy (the weight gradient reads the former)
    assert [k.operands[0].shape for k in pads].count((2, 16, 12, 12)) >= 2
    assert not [s.strategy for k, s in ks if k.kind == "copy"]


def test_a_1d_convolution_pads_one_row_as_long_as_its_windows_reach():
    """A 1-D convolution is an implicit GEMM over images of one row; its padded input is that one
    row, as long as the last register tile's windows reach (grid columns rounded up to whole
    tiles), where whole padded rows below it were written as zeros and never read (a Conv1d's
    258-wide row took a second one for 16 wrapped columns: the pad kernel 0.13 → 0.09 ms, 16x64x256;
    AMD Zen 3, 1 thread); likewise the weight gradient's two padded operands. Values and gradients
    of 1-D cases against float64 in CASES."""
    ks = _kernels(lambda x, w: F.conv1d(x, w, None, 1, 1), torch.randn(4, 16, 40), torch.randn(32, 16, 3))
    pads = [k for k, s in ks if s.strategy == "pad-planes"]
    gemm = [k for k, s in ks if k.kind == "matmul"]
    assert len(pads) == 1 and len(gemm) == 1
    n, c, rows, width = pads[0].operands[1].shape
    assert (n, c, rows) == (4, 16, 1) and 42 < width < 2 * 42   # the padded row is 42 wide; one row, a little more
    # the weight gradient's windowed input and its output gradient on the padded grid: one row each too
    step = _conv_step([1], [1])
    ks = _kernels(step, torch.randn(4, 32, 40), torch.randn(4, 16, 40), torch.randn(32, 16, 3))
    pads = [k.operands[1].shape for k, s in ks if s.strategy == "pad-planes"]
    assert len(pads) >= 3 and all(shape[2] == 1 and shape[3] < 2 * 42 for shape in pads), pads
