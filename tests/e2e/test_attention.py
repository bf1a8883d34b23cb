"""Causal self-attention forward and backward under backend="neuron" against float64 eager."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import neuron_compile
from tests.e2e.modules import CausalSelfAttention


@pytest.mark.parametrize("b,t,c,h", [(2, 5, 16, 2), (1, 8, 24, 3)])
def test_attention_forward_backward_matches_float64_eager(b, t, c, h):
    torch.manual_seed(0)
    model = CausalSelfAttention(c, h)
    ref = copy.deepcopy(model).double()
    x = torch.randn(b, t, c, requires_grad=True)
    x_ref = x.detach().double().requires_grad_()
    w = torch.randn(b, t, c)

    out_ref = ref(x_ref)
    (out_ref * w.double()).sum().backward()
    out = neuron_compile(model)(x)
    (out * w).sum().backward()

    torch.testing.assert_close(out.double(), out_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), x_ref.grad, rtol=1e-4, atol=1e-5)
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.double(), p_ref.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"grad of {name}: {m}")
