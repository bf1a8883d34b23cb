"""Orthogonal polynomials of ``torch.special`` (lowering/rules/orthopoly.py) against eager.

The rules run ATen's own algorithm in the result dtype, so float64 results are compared with eager
float64 at rtol 1e-12 and float32 results with eager float32 at rtol 1e-6 (the recurrences lose
accuracy with the degree in both; the same loss on both sides is not a discrepancy). Inputs cover
ATen's branches: n < 0, 0, 1, the three-term recurrence, the trigonometric form above n = 6/8 for
|x| < 1, the edges x = ±1 (and 0, 1 for the shifted forms), overflow that stops the recurrence at
a NaN term, Hermite's degree limit, and non-integer, NaN and infinite degrees.
"""
from __future__ import annotations

import math

import pytest
import torch

S = torch.special
NAMES = [f"chebyshev_polynomial_{k}" for k in "tuvw"] + [f"shifted_chebyshev_polynomial_{k}" for k in "tuvw"] + [
    "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _compiled(fn):
    return torch.compile(fn, backend="neuron", fullgraph=True, dynamic=False)


def _grid(dtype):
    torch.manual_seed(0)
    x = torch.cat([torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 1e-20, 1 - 6e-8, -1 + 6e-8, 0.9999, 2.0, -3.0,
                                 7.5, 1e3, math.inf, -math.inf]), torch.randn(40) * 2, torch.rand(20)]).to(dtype)
    n = torch.tensor([-3.0, -0.5, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 12.0, 25.0, 40.0, 127.0, 129.0,
                      300.0, 600.0, 2.7, math.nan, math.inf, -math.inf], dtype=dtype)
    return x[:, None], n[None, :]


def _close(out, ref, dtype):
    torch.testing.assert_close(out, ref, rtol=TOL[dtype], atol=TOL[dtype], equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_polynomial_matches_eager_on_every_branch(name, dtype):
    f = getattr(S, name)
    x, n = _grid(dtype)
    out = _compiled(lambda a, b: f(a, b))(x, n)
    assert out.dtype == dtype and out.shape == (x.shape[0], n.shape[1])
    _close(out, f(x, n), dtype)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "hermite_polynomial_he", "legendre_polynomial_p"])
def test_python_number_degree_and_argument(name):
    f = getattr(S, name)
    x = torch.linspace(-1.5, 1.5, 31, dtype=torch.float64)
    for n in (0, 3, 11):
        _close(_compiled(lambda a: f(a, n))(x), f(x, n), torch.float64)
    n = torch.arange(-1, 15, dtype=torch.float64)
    _close(_compiled(lambda b: f(0.3, b))(n), f(0.3, n), torch.float64)


def test_integer_inputs_promote_to_the_default_float_dtype():
    x = torch.arange(-3, 4)
    n = torch.arange(0, 7)
    out = _compiled(lambda a, b: S.legendre_polynomial_p(a, b))(x, n)
    ref = S.legendre_polynomial_p(x, n)
    assert out.dtype == ref.dtype == torch.float32
    _close(out, ref, torch.float32)


def test_high_degree_runs_the_whole_recurrence():
    # |x| < 1 keeps Legendre bounded, so the loop runs all n steps (no NaN to stop it); the trip count
    # differs per element, and P_n(x) at n = 2000 depends on every step.
    x = torch.tensor([0.1, -0.7, 0.33, 0.999], dtype=torch.float64)
    n = torch.tensor([2000.0, 1500.0, 1.0, 977.0], dtype=torch.float64)
    _close(_compiled(lambda a, b: S.legendre_polynomial_p(a, b))(x, n), S.legendre_polynomial_p(x, n), torch.float64)


def test_nan_argument_gives_nan():
    # ATen returns an uninitialised value here for U, V, W, L and P (the loop never runs and its
    # result variable is never set): we give NaN, the mathematically defined answer for NaN input.
    x = torch.tensor([math.nan], dtype=torch.float64)
    for name in NAMES:
        out = _compiled(lambda a: getattr(S, name)(a, 5))(x)
        assert torch.isnan(out).all(), name
        torch._dynamo.reset()
