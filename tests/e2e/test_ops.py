"""Each op family of the vertical slice, forward and backward, against float64 eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import neuron_compile


def _f(*shape):
    return lambda: torch.randn(*shape, requires_grad=True)


CASES = {
    "relu_gelu": (lambda x: F.relu(x) + F.gelu(x) + F.gelu(x, approximate="tanh"), [_f(4, 5)]),
    "softmax_logsoftmax": (lambda x: x.softmax(-1) * 2 + x.log_softmax(0), [_f(3, 6)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), [_f(2, 3, 6), _f(6), _f(6)]),
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3])), [_f(3, 4)]),
    "reductions": (lambda x: x.mean() + x.sum(1).amax() + x.amax(0, keepdim=True).sum() + x.mean((0, 1)),
                   [_f(3, 4)]),
    "views": (lambda x: x.view(6, 2).permute(1, 0).transpose(0, 1).reshape(3, 4).unsqueeze(0).squeeze(0)
              .expand(2, 3, 4).sum(0), [_f(3, 4)]),
    "cat_slice": (lambda x, y: torch.cat([x, y[:, 1:], x[:, ::2]], 1)[1:, :-1] * 3, [_f(3, 4), _f(3, 5)]),
    "where_cmp": (lambda x, y: torch.where(x > y, x * y, x - y) + (x <= 0.5).float() + (x == y).float(),
                  [_f(4, 4), _f(4)]),
    "pow_sqrt_rsqrt": (lambda x: x.pow(2) + (x * x + 1).sqrt() + (x.abs() + 1).rsqrt() + x.abs().pow(1.5),
                       [_f(5)]),
    "exp_log_tanh_sigmoid": (lambda x: x.exp() + (x.abs() + 1).log() + x.tanh() + x.sigmoid(), [_f(2, 3)]),
    "addmm_mm_bmm": (lambda a, b, c, w, bias: (F.linear(a, w, bias) @ b).sum() + torch.bmm(c, c.transpose(1, 2)).sum(),
                     [_f(3, 4), _f(5, 2), _f(2, 3, 4), _f(5, 4), _f(5)]),
    "creation": (lambda x: x * torch.arange(4).float() + torch.full((3, 4), 2.5) + torch.zeros(4) +
                 torch.arange(1, 9, 2), [_f(3, 4)]),
    "type_conversions": (lambda x: x * (x > 0).to(torch.int64) + (x * 10).to(torch.int64).to(torch.float32)
                         + (x > 0.3).to(torch.float32), [_f(3, 4)]),
    "mul_div_sub_neg": (lambda x, y: (x * 3 - y / 2) / (y.abs() + 1) - (-x), [_f(2, 5), _f(5)]),
}


def _run(fn, inputs):
    out = fn(*inputs)
    if out.dim():
        out = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum()
    out.backward()
    return out, [x.grad for x in inputs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_family_forward_backward(name):
    fn, makers = CASES[name]
    torch.manual_seed(0)
    xs = [m() for m in makers]
    ref_xs = [x.detach().double().requires_grad_() for x in xs]
    out_ref, grads_ref = _run(fn, ref_xs)
    out, grads = _run(neuron_compile(fn), xs)
    torch.testing.assert_close(out.double(), out_ref, rtol=1e-5, atol=1e-5)
    for i, (g, gr) in enumerate(zip(grads, grads_ref)):
        torch.testing.assert_close(g.double(), gr, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"grad {i}: {m}")


def test_embedding_forward_backward():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    idx = torch.tensor([[1, 3, 3], [9, 0, 1]])  # repeated indices accumulate in the backward
    ref = torch.nn.Embedding(10, 4).double()
    ref.weight.data.copy_(emb.weight.data)
    w = torch.randn(2, 3, 4)
    (ref(idx) * w.double()).sum().backward()
    out = neuron_compile(emb)(idx)
    (out * w).sum().backward()
    torch.testing.assert_close(out.double(), ref(idx), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(emb.weight.grad.double(), ref.weight.grad, rtol=1e-5, atol=1e-6)


def test_tied_embedding_gradient_matches_float64_eager():
    """A weight used as an embedding and as the output projection (GPT-2's wte): its gradient is
    the projection's dense part plus the embedding's rows, which fold-zeros-scatter accumulates
    into the dense part directly (repeated ids included)."""
    torch.manual_seed(0)
    w = torch.randn(50, 8, requires_grad=True)
    ids = torch.tensor([[1, 3, 3, 49], [0, 1, 7, 3]])

    def lm(w, ids):
        return torch.nn.functional.cross_entropy((w[ids] * 2).tanh().reshape(-1, 8) @ w.t(), ids.reshape(-1))
    loss = neuron_compile(lm)(w, ids)
    loss.backward()
    wd = w.detach().double().requires_grad_()
    want = lm(wd, ids)
    want.backward()
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [torch.exp, torch.erf, torch.sigmoid])
def test_inline_float32_math_matches_eager_over_its_whole_range(op):
    x = torch.cat([torch.linspace(-100, 100, 20001), torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0,
                                                                   -0.0, 88.7228, -87.3365, 1e-30, -1e-30])])
    got, exp = neuron_compile(op)(x), op(x)
    torch.testing.assert_close(got, exp, rtol=3e-7 if op is torch.exp else 1e-6, atol=1e-37, equal_nan=True)


def test_comparisons_of_fused_values_promote_like_eager():
    def f(x, y):
        return torch.isclose(x * 2, y) & ((x + 1) != 0.5), torch.logaddexp(x, y)
    x, y = torch.randn(5), torch.randn(5)
    for got, exp in zip(neuron_compile(f)(x, y), f(x, y)):
        torch.testing.assert_close(got, exp)


def test_integer_division_by_zero_or_minus_one_never_traps():
    """x86 idiv traps (SIGFPE would kill the process) on b == 0 and INT_MIN / -1; both are guarded."""
    a, b = torch.tensor([5, -7, -2**63, 9]), torch.tensor([0, 2, -1, -1])
    f = neuron_compile(lambda a, b: (a // b, a % b, torch.div(a, b, rounding_mode="trunc")))
    floor, rem, trunc = f(a, b)

    def wrap(v: int) -> int:  # int64 two's complement, as ATen's integer ops wrap
        return (v + 2**63) % 2**64 - 2**63
    # Python ints as the reference (eager itself can trap on INT_MIN // -1); b == 0 is skipped: eager raises
    for i in range(1, 4):
        x, y = int(a[i]), int(b[i])
        assert int(floor[i]) == wrap(x // y)
        assert int(rem[i]) == wrap(x % y)
        assert int(trunc[i]) == wrap(int(x / y) if abs(x) < 2**53 else -x if y == -1 else x // y)


@pytest.mark.parametrize("fn,x", [
    (torch.log1p, torch.tensor([1e-8, 1e-4, -0.5, 3.0, -1.0])),
    (torch.expm1, torch.tensor([1e-8, 1e-4, -30.0, 3.0])),
    (F.softplus, torch.tensor([-20.0, -16.0, 0.0, 25.0])),
])
def test_functions_near_cancellation_stay_accurate(fn, x):
    torch.testing.assert_close(neuron_compile(fn)(x).double(), fn(x.double()), rtol=2e-6, atol=0)


def test_long_float32_sums_are_accurate():
    x = torch.full((1_000_000,), 0.1)
    f = neuron_compile(lambda t: (t.sum(), t.mean()))
    total, mean = f(x)
    torch.testing.assert_close(total.double(), x.double().sum(), rtol=1e-6, atol=0)
    torch.testing.assert_close(mean.double(), x.double().mean(), rtol=1e-6, atol=0)
