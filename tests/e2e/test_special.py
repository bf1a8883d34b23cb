"""Special functions (passes/special.py) under backend="neuron" against float64 eager.

The decompositions work in float64 and round once to float32, and the reference is eager float64 on
the same float32 inputs, so the only expected error is that final rounding (6e-8 relative) plus the
float64 algorithms' own error (≲1e-13 relative; ~1e-9 for ATen's trigamma series). rtol = atol = 1e-6
keeps a 10x margin over that while staying far below eager float32's own error on these inputs
(e.g. digamma near its poles, where float32 eager loses ~1e-6 relative).
"""
from __future__ import annotations

import math

import pytest
import torch

TOL = {"rtol": 1e-6, "atol": 1e-6, "equal_nan": True}


def _compiled(fn):
    return torch.compile(fn, backend="neuron", fullgraph=True, dynamic=False)


def _inputs():
    """Negative, large, near-pole, integer, tiny and special values, plus a random spread."""
    torch.manual_seed(0)
    special = [0.0, -0.0, 1.0, 2.0, 0.5, -0.5, -1.0, -3.0, -2.5, -1e-4, 1e-30, 1e-4, 1.4616321,
               -0.999, -4.0001, -17.3, 9.0, 10.0, 30.5, 1e4, 1e10, -1e10, 3e38, -3e38,
               math.inf, -math.inf, math.nan]
    return torch.cat([torch.tensor(special), torch.randn(256) * 8]).float()


def _check(fn, *args):
    out = _compiled(fn)(*args)
    ref = fn(*(a.double() for a in args)).float()   # values beyond float32's range round to ±inf
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref.double(), **TOL)


@pytest.mark.parametrize("fn", [torch.lgamma, torch.digamma], ids=["lgamma", "digamma"])
def test_lgamma_digamma_match_float64_eager(fn):
    _check(fn, _inputs())


@pytest.mark.parametrize("n", [1, 2, 3])
def test_polygamma_matches_float64_eager(n):
    # Away from the poles at the non-positive integers (there eager's trigamma returns round-off
    # sized values of sin(πx) in the denominator, not a function value).
    x = _inputs()
    x = x[~((x <= 0) & (x == torch.floor(x)))]
    _check(lambda t: torch.polygamma(n, t), x)


def test_zeta_matches_float64_eager():
    torch.manual_seed(1)
    x = torch.cat([torch.tensor([1.0, 0.5, 2.0, 3.0, 4.0, 2.0, 1.5, 2.0, 7.0]), 1 + torch.rand(64) * 12]).float()
    q = torch.cat([torch.tensor([1.0, 1.0, 0.0, -2.5, -30.25, 1e6, 0.1, -3.0, 1e-3]),
                   torch.randn(64) * 10]).float()
    _check(torch.special.zeta, x, q)


def test_integer_input_promotes_to_float():
    x = torch.arange(-3, 7)
    out = _compiled(torch.lgamma)(x)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out.double(), torch.lgamma(x.double()).float().double(), **TOL)
