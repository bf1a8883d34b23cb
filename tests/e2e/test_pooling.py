"""Max pools, forward and gradient, bitwise as eager's CPU kernels.

Forward (``passes/max_pool.py``): values and argmax indices as ATen's ``cpu_max_pool``: ties keep
the first position, the last NaN of a window wins, a window of ``-inf`` returns its first position
inside the input, in every dtype and layout. Gradient (``lowering/rules/pooling.py``): each plane's
output gradients added at their argmax positions in output order (same adds in the same order,
float16 and bfloat16 rounded after every add), linear in the output, not input × output."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.e2e.test_conv_gemm import _kernels

# (input shape, kernel, stride, padding, dilation, ceil_mode)
CASES = {
    "3x3 stride 2 pad 1 (ResNet stem)": ((2, 3, 9, 9), 3, 2, 1, 1, False),
    "2x2 stride 2 (UNet)": ((2, 3, 8, 8), 2, 2, 0, 1, False),
    "3x3 stride 1 ceil": ((1, 2, 7, 6), 3, 1, 1, 1, True),
    "dilated ceil": ((2, 4, 10, 10), 3, 2, 1, 2, True),
    "no batch dim": ((3, 11, 11), 3, 2, 0, 1, False),
}


def _with_specials(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """``x`` with NaNs (two in some windows: eager keeps the last) and a block of ``-inf`` at a
    corner (windows in the padding that see only ``-inf``: eager returns their first position)."""
    x = x.clone()
    flat = x.view(-1)
    flat[torch.randint(0, flat.numel(), (max(2, flat.numel() // 40),), generator=g)] = float("nan")
    x[..., :3, :3] = float("-inf")
    return x


def _assert_pool_as_eager(fn, x):
    got_v, got_i = torch.compile(fn, backend="neuron", dynamic=False)(x)
    want_v, want_i = fn(x)
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=0, equal_nan=True)
    def layout(t):   # strides of the dims that have them (a size-1 dim's stride means nothing)
        return tuple(st for n, st in zip(t.shape, t.stride()) if n > 1)
    assert (layout(got_v), layout(got_i)) == (layout(want_v), layout(want_i))   # channels-last stays so


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_max_pool2d_values_and_indices_are_eagers(case, dtype):
    shape, k, s, p, d, ceil = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    x = _with_specials(torch.randn(shape, generator=g).mul(2).round().to(dtype), g)
    _assert_pool_as_eager(lambda t: F.max_pool2d(t, k, s, p, d, ceil_mode=ceil, return_indices=True), x)


@pytest.mark.parametrize("form", ["channels_last", "1d", "3d", "49 taps", "81 taps (gathered)"])
def test_max_pool_forms_are_eagers(form):
    """A channels-last input, ``max_pool1d`` and ``max_pool3d`` take the same taps; a window of
    more than ``MAX_TAPS`` positions keeps torch's gather form (same results)."""
    g = torch.Generator().manual_seed(7)
    if form == "channels_last":
        x = _with_specials(torch.randn(2, 5, 9, 10, generator=g).round(), g).to(memory_format=torch.channels_last)
        fn = lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True)  # noqa: E731
    elif form == "1d":
        x = _with_specials(torch.randn(3, 4, 17, generator=g).round(), g)
        fn = lambda t: F.max_pool1d(t, 4, 3, 2, return_indices=True)  # noqa: E731
    elif form == "3d":
        x = _with_specials(torch.randn(2, 2, 6, 7, 6, generator=g).round(), g)
        fn = lambda t: F.max_pool3d(t, 3, 2, 1, ceil_mode=True, return_indices=True)  # noqa: E731
    else:
        side = 7 if form == "49 taps" else 9
        x = _with_specials(torch.randn(2, 3, side + 2, side, generator=g).round(), g)
        fn = lambda t: F.max_pool2d(t, side, return_indices=True)  # noqa: E731
    _assert_pool_as_eager(fn, x)


@settings(max_examples=12, deadline=None)
@given(k=st.integers(1, 4), s=st.integers(1, 3), d=st.integers(1, 2), ceil=st.booleans(), data=st.data())
def test_max_pool2d_geometry_property(k, s, d, ceil, data):
    """Any kernel, stride, padding (at most half the kernel, as ATen allows), dilation and
    ceil_mode: values and indices as eager's (differential, hypothesis)."""
    p = data.draw(st.integers(0, k // 2))
    h = data.draw(st.integers(d * (k - 1) + 1, 12))
    w = data.draw(st.integers(d * (k - 1) + 1, 12))
    g = torch.Generator().manual_seed(k * 100 + s * 10 + d)
    x = _with_specials(torch.randn(2, 3, h, w, generator=g).round(), g)
    _assert_pool_as_eager(lambda t: F.max_pool2d(t, k, s, p, d, ceil_mode=ceil, return_indices=True), x)


def test_max_pool_forward_is_vectorized():
    """The pool's taps are strided views compared elementwise: no kernel on ``loops`` (torch's
    gather + ``max.dim`` form put ResNet-18's pool, 16×64×32×32, on ``loops``: 6 ms, eager 8 ms;
    now 1 ms; AMD Zen 4, 1 thread)."""
    ks = _kernels(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), torch.randn(2, 8, 32, 32))
    assert ks and all(s.strategy != "loops" for _, s in ks)
    assert not any(k.gather for k, _ in ks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_max_pool2d_gradient_is_eagers_bit_for_bit(case, dtype):
    shape, k, s, p, d, ceil = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    # rounded values: ties, so one input position is the argmax of several windows
    x = torch.randn(shape, generator=g).mul(2).round().to(dtype)

    def fn(x):
        return F.max_pool2d(x, k, s, p, d, ceil_mode=ceil)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.compile(fn, backend="neuron", dynamic=False)(xc)
    gy = torch.randn(y.shape, generator=g).to(dtype)
    (got,) = torch.autograd.grad(y, xc, gy)
    (want,) = torch.autograd.grad(fn(xe), xe, gy)
    assert torch.equal(got, want)


def test_max_pool3d_gradient_is_eagers_bit_for_bit():
    x = torch.randn(2, 2, 6, 7, 6, generator=torch.Generator().manual_seed(0)).round()
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.compile(lambda t: F.max_pool3d(t, 3, 2, 1), backend="neuron", dynamic=False)(xc)
    gy = torch.randn(y.shape)
    assert torch.equal(torch.autograd.grad(y, xc, gy)[0], torch.autograd.grad(F.max_pool3d(xe, 3, 2, 1), xe, gy)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape, out", [((8, 32, 10, 10), 3), ((8, 32, 10, 10), 4), ((2, 3, 7, 5), (3, 2)),
                                        ((2, 3, 7, 6, 5), 3)])
def test_adaptive_max_pool_gradient_is_eagers_bit_for_bit(shape, out, dtype):
    """``adaptive_max_pool{2,3}d`` backward (no rule until a new user's trial: compilation failed
    listing ``aten.adaptive_max_pool2d_backward``): overlapping windows (10 → 3, 10 → 4) and ties
    in rounded values, so one position takes several windows' gradients, added in eager's order."""
    g = torch.Generator().manual_seed(len(shape) + (out if isinstance(out, int) else 0))
    x = torch.randn(shape, generator=g).mul(2).round().to(dtype)
    pool = F.adaptive_max_pool2d if len(shape) == 4 else F.adaptive_max_pool3d
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.compile(lambda t: pool(t, out), backend="neuron", dynamic=False)(xc)
    gy = torch.randn(y.shape, generator=g).to(dtype)
    (got,) = torch.autograd.grad(y, xc, gy)
    (want,) = torch.autograd.grad(pool(xe, out), xe, gy)
    assert torch.equal(got, want)


def test_max_pool_gradient_is_one_pass_over_the_output():
    """One loop kernel per plane over its output positions, each adding its gradient at the
    recorded argmax (ATen's algorithm): parallel over the planes, never on ``loops`` (was a
    gather over the input with per-element index arithmetic, and before that a scatter over
    input × output positions)."""
    def backward(gy, x, idx):
        return torch.ops.aten.max_pool2d_with_indices_backward(gy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)
    x = torch.randn(2, 8, 32, 32)
    _, idx = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    ks = _kernels(backward, torch.randn(2, 8, 16, 16), x, idx)
    assert all(s.strategy != "loops" for _, s in ks)
    (scatter,) = [(k, s) for k, s in ks if k.kind == "loop"]
    assert scatter[1].strategy == "forall-loop" and tuple(scatter[0].ranges) == (16, 1024)


@pytest.mark.parametrize("pool", ["avg 3/1 pad 1", "avg 3/2 no pad count", "adaptive 4"])
def test_float64_average_pools_are_float64_accurate(pool):
    """The window weights (1 / count) are float64: divided in the default dtype, float32, a
    float64 pool was 1.5e-8 relative off eager (a new user's trial)."""
    fn = {"avg 3/1 pad 1": lambda t: F.avg_pool2d(t, 3, 1, 1),
          "avg 3/2 no pad count": lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False),
          "adaptive 4": lambda t: F.adaptive_avg_pool2d(t, 4)}[pool]
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, want = torch.compile(fn, backend="neuron", dynamic=False)(xc), fn(xe)
    torch.testing.assert_close(y, want, rtol=1e-13, atol=1e-13)
    gy = torch.randn(want.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(y, xc, gy)[0], torch.autograd.grad(want, xe, gy)[0],
                               rtol=1e-13, atol=1e-13)


def test_global_average_pool_of_a_fused_activation_reduces_whole_planes():
    """ReLU6 fused into MobileNet's global average pool (``mean((2, 3))`` over 4×4 planes): the
    plane's two dims are collapsed into one row, as for a materialised input (it ran as masked
    16-lane steps over rows of 4: 0.39 ms, eager 0.04; AMD Zen 4, 1 thread)."""
    def head(x):
        return F.adaptive_avg_pool2d(F.relu6(x), 1)
    x = torch.randn(4, 32, 4, 4, generator=torch.Generator().manual_seed(5)) * 4
    (red,) = [k for k, _ in _kernels(head, x) if k.kind == "reduction"]
    assert tuple(red.ranges) == (4, 32, 16)
    torch.testing.assert_close(torch.compile(head, backend="neuron", dynamic=False)(x), head(x.double()).float())
