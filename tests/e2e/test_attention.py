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


def _masks():
    bool_mask = torch.ones(4, 4, dtype=torch.bool).tril()
    bool_mask[0, 0] = False  # row 0 attends to nothing
    float_mask = torch.zeros(4, 4).masked_fill(~bool_mask, float("-inf"))
    return {"bool": bool_mask, "float -inf": float_mask}


@pytest.mark.parametrize("kind", ["bool", "float -inf"])
def test_fully_masked_rows_give_finite_gradients_like_eager(kind):
    """A row whose mask excludes every key: eager's output row is 0 and every gradient is finite
    (issue 13, item 2: the recomputed softmax in the backward was exp(-inf - -inf) = NaN)."""
    mask = _masks()[kind]
    torch.manual_seed(0)
    qkv = [torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3)]
    ref = [t.detach().double().requires_grad_() for t in qkv]

    def attend(q, k, v):
        m = mask.double() if mask.dtype != torch.bool and q.dtype == torch.float64 else mask
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    w = torch.randn(1, 2, 4, 8)
    (neuron_compile(attend)(*qkv) * w).sum().backward()
    (attend(*ref) * w.double()).sum().backward()
    for got, want in zip(qkv, ref):
        assert torch.isfinite(got.grad).all()
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-4, atol=1e-5)


def test_multihead_attention_on_a_fully_padded_sequence_has_finite_gradients():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    ref = copy.deepcopy(mha).double()
    x = torch.randn(2, 5, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1] = True  # the second sequence is all padding

    def run(m, inp):
        return m(inp, inp, inp, key_padding_mask=pad, need_weights=False)[0]
    neuron_compile(lambda inp: run(mha, inp))(x).sum().backward()
    run(ref, x.double()).sum().backward()
    for (name, p), p_ref in zip(mha.named_parameters(), ref.parameters()):
        assert torch.isfinite(p.grad).all(), name
        torch.testing.assert_close(p.grad.double(), p_ref.grad, rtol=1e-4, atol=1e-5, msg=name)
