"""float16, bfloat16 and float64 inputs compute natively on the host, as accurately as eager.

Each result is compared with eager PyTorch at float64 on the same (rounded) inputs: our error must
not exceed eager's own error in that dtype by more than a quarter (plus one unit in the last
place at the result's magnitude; 64 for float64, where eager *is* the reference and only summation
order differs), so a kernel that rounds more often than ATen (e.g. accumulating a half matmul in
half, which measured 3x eager's error) fails.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import neuron_compile


def _block(x, w, b):
    h = F.gelu(x @ w + b)
    return torch.softmax(h, -1), F.layer_norm(h, (h.shape[-1],)), h.sum(0), torch.exp(x).mean(1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_forward_and_backward_as_accurate_as_eager(dtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(48, 32, dtype=dtype), torch.randn(32, 24, dtype=dtype), torch.randn(24, dtype=dtype)
    eps = torch.finfo(dtype).eps * (64 if dtype == torch.float64 else 1)
    inputs = [t.clone().requires_grad_() for t in (x, w, b)]
    ours = neuron_compile(_block)(*inputs)
    eager_in = [t.clone().requires_grad_() for t in (x, w, b)]
    eager = _block(*eager_in)
    ref_in = [t.double().requires_grad_() for t in (x, w, b)]
    ref = _block(*ref_in)
    for o, e, r in zip(ours, eager, ref):
        assert o.dtype == dtype
        err_ours, err_eager = (o.double() - r).abs().max(), (e.double() - r).abs().max()
        assert err_ours <= 1.25 * err_eager + eps * r.abs().max(), (err_ours, err_eager)
    grads = [torch.autograd.grad(sum(t.float().sum() for t in outs), ins)
             for outs, ins in ((ours, inputs), (eager, eager_in), (ref, ref_in))]
    for go, ge, gr in zip(*grads):
        assert go.dtype == dtype
        err_ours, err_eager = (go.double() - gr).abs().max(), (ge.double() - gr).abs().max()
        assert err_ours <= 1.25 * err_eager + eps * gr.abs().max(), (err_ours, err_eager)
