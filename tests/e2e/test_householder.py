"""Householder QR family (passes/householder.py) compiled vs eager LAPACK in float64: the same
reflectors, signs and taus, to rounding."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import neuron_compile

TOL = {"rtol": 1e-10, "atol": 1e-12}


def _compiled(fn):
    return neuron_compile(fn, fullgraph=True)


def _close(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, **TOL)


@pytest.mark.parametrize("shape", [(5, 5), (2, 3, 5), (2, 5, 3)])
def test_geqrf_matches_lapack(shape):
    a = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _close(_compiled(torch.geqrf)(a), torch.geqrf(a))


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_linalg_qr_modes_on_a_batch(mode):
    a = torch.randn(2, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fn = lambda t: torch.linalg.qr(t, mode=mode)
    _close(_compiled(fn)(a), fn(a))


def test_ormqr_left_right_transpose():
    gen = torch.Generator().manual_seed(2)
    factors, tau = torch.geqrf(torch.randn(5, 3, dtype=torch.float64, generator=gen))
    c_left = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    c_right = torch.randn(4, 5, dtype=torch.float64, generator=gen)

    def fn(f, t, cl, cr):
        return tuple(torch.ormqr(f, t, cl if left else cr, left=left, transpose=tr)
                     for left in (True, False) for tr in (False, True))
    _close(_compiled(fn)(factors, tau, c_left, c_right), fn(factors, tau, c_left, c_right))


def test_householder_product_fewer_reflectors_than_columns():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(6, 4, dtype=torch.float64, generator=gen)
    tau = torch.rand(3, dtype=torch.float64, generator=gen) + 0.5
    fn = torch.linalg.householder_product
    _close((_compiled(fn)(a, tau),), (fn(a, tau),))


def test_rank_deficient_and_empty_columns():
    # The zero first column, and the last column (its only entry below the diagonal is an exact
    # zero), take dlarfg's ‖x₂‖ = 0 branch (τ = 0, H = I); a 5×0 matrix's complete Q is the identity.
    a = torch.tensor([[0., 1., 2.], [0., 2., 4.], [0., 3., 6.], [0., 0., 0.]], dtype=torch.float64)
    empty = torch.zeros(5, 0, dtype=torch.float64)

    def fn(t, e):
        return (*torch.geqrf(t), *torch.linalg.qr(t, mode="complete"), *torch.linalg.qr(e, mode="complete"))
    got, expected = _compiled(fn)(a, empty), fn(a, empty)
    _close(got, expected)
    assert got[1][0] == 0 and got[1][2] == 0
    torch.testing.assert_close(got[4], torch.eye(5, dtype=torch.float64))
