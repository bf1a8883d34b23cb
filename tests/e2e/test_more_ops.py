"""Ops beyond the vertical slice (first steps of the op-coverage issue), forward and backward vs eager."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.conftest import neuron_compile

CASES = {
    "vector_norm": (lambda t: torch.linalg.vector_norm(t, dim=-1) + t.norm(), (4, 6)),
    "pad_and_crop": (lambda t: F.pad(t, (1, 2, 0, 1), value=0.5) + F.pad(t, (-1, 1, 1, -1)).sum(), (4, 6)),
    "flip": (lambda t: t.flip(-1) * 2 + t.flip(0, 1), (4, 6)),
    "repeat": (lambda t: t.repeat(2, 3), (4, 6)),
    "isinf": (lambda t: torch.isinf(t / (t > 0).float()).float() + t, (4, 6)),
    "elu_hardtanh_leaky_relu": (lambda t: F.elu(t) + F.hardtanh(t) + F.leaky_relu(t, 0.1), (4, 6)),
    "group_norm": (lambda t: F.group_norm(t, 2), (2, 4, 5, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_forward_backward_matches_float64_eager(name):
    fn, shape = CASES[name]
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    ref = x.detach().double().requires_grad_()
    out, out_ref = neuron_compile(fn)(x), fn(ref)
    torch.testing.assert_close(out.double(), out_ref, rtol=1e-5, atol=1e-5)
    (g,), (g_ref,) = torch.autograd.grad(out.sum(), [x]), torch.autograd.grad(out_ref.sum(), [ref])
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-4, atol=1e-5)


def test_batchnorm_training_updates_running_stats_like_eager():
    torch.manual_seed(0)
    ours, eager = nn.BatchNorm2d(4), nn.BatchNorm2d(4)
    eager.load_state_dict(ours.state_dict())
    compiled = neuron_compile(ours)
    for step in range(5):
        x = torch.randn(3, 4, 5, 5) * (step + 1) + step
        out, ref = compiled(x), eager(x)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.running_mean, eager.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.running_var, eager.running_var, rtol=1e-5, atol=1e-6)
    assert int(ours.num_batches_tracked) == int(eager.num_batches_tracked) == 5
    ours.eval(), eager.eval()
    x = torch.randn(3, 4, 5, 5)
    torch.testing.assert_close(neuron_compile(copy.deepcopy(ours))(x), eager(x), rtol=1e-5, atol=1e-5)


def test_argmax_argmin_max_min_with_ties_and_nan_like_eager():
    x = torch.randn(4, 7)
    x[1, 3] = float("nan")
    x[2] = 5.0                      # ties: the first index wins
    i = torch.randint(-5, 5, (3, 6))

    def f(t):
        return t.argmax(-1), t.argmin(0), t.argmax(), t.max(1), t.min(0, keepdim=True), t.max(), t.min()
    for inp in (x, i):
        torch._dynamo.reset()
        torch.testing.assert_close(neuron_compile(f)(inp), f(inp), equal_nan=True)


def test_fmod_keeps_the_sign_of_the_dividend():
    x = torch.randn(4, 7) * 4
    i = torch.randint(-9, 9, (6,))
    f = lambda t, k: (torch.fmod(t, 3), torch.fmod(t, -2.5), torch.fmod(k, torch.tensor([2, 3, -3, 1, 2, -1])))  # noqa: E731
    torch.testing.assert_close(neuron_compile(f)(x, i), f(x, i))
