"""Max-pool gradients (``lowering/rules/pooling.py``): each plane's output gradients added at
their argmax positions in output order, bitwise as eager's CPU kernel (same adds in the same
order, float16 and bfloat16 rounded after every add), and linear in the output, not input × output."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.e2e.test_conv_gemm import _kernels

# (input shape, kernel, stride, padding, dilation, ceil_mode)
CASES = {
    "3x3 stride 2 pad 1 (ResNet stem)": ((2, 3, 9, 9), 3, 2, 1, 1, False),
    "2x2 stride 2 (UNet)": ((2, 3, 8, 8), 2, 2, 0, 1, False),
    "3x3 stride 1 ceil": ((1, 2, 7, 6), 3, 1, 1, 1, True),
    "dilated ceil": ((2, 4, 10, 10), 3, 2, 1, 2, True),
    "no batch dim": ((3, 11, 11), 3, 2, 0, 1, False),
}


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
