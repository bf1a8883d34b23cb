"""SVD, symmetric eigendecomposition and what is built on them (``passes/jacobi.py``), compiled
float32 against eager float64: values, reconstruction and orthonormality (vectors are unique only
up to sign, so they are not compared entrywise)."""
from __future__ import annotations

import pytest
import torch

from neuron_compile.errors import UnsupportedOpsError
from tests.conftest import neuron_compile

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _compiled(fn):
    return neuron_compile(fn, fullgraph=True)


def _assert_orthonormal(q, dim):
    """Columns (dim=-2) or rows (dim=-1) of q are orthonormal."""
    gram = q.mT @ q if dim == -2 else q @ q.mT
    torch.testing.assert_close(gram, torch.eye(gram.shape[-1]).expand_as(gram), **TOL)


@pytest.mark.parametrize("shape,full", [((2, 5, 3), True), ((3, 6), False), ((4, 4), True)],
                         ids=["batch-tall-full", "wide-reduced", "square"])
def test_svd_reconstructs_with_orthonormal_vectors(shape, full):
    torch.manual_seed(0)
    a = torch.randn(shape)
    u, s, vh = _compiled(lambda a: torch.linalg.svd(a, full_matrices=full))(a)
    ref_u, ref_s, ref_vh = torch.linalg.svd(a.double(), full_matrices=full)
    assert (u.shape, s.shape, vh.shape) == (ref_u.shape, ref_s.shape, ref_vh.shape)
    torch.testing.assert_close(s.double(), ref_s, **TOL)
    k = s.shape[-1]
    torch.testing.assert_close((u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :], a, **TOL)
    _assert_orthonormal(u, -2)
    _assert_orthonormal(vh, -1)


def test_svdvals_rank_and_pinv_of_rank_deficient_matrices():
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4) * 5
    low = torch.randn(6, 2) @ torch.randn(2, 4)                      # 6×4 of rank 2

    def fn(a, low):
        return (torch.linalg.svdvals(a), torch.linalg.matrix_rank(low), torch.linalg.pinv(low),
                torch.linalg.matrix_norm(a, ord=2), torch.linalg.cond(a))

    got = _compiled(fn)(a, low)
    ref = fn(a.double(), low.double())
    # low is rank 2 only up to float32 rounding: the float64 references use float32's tolerance
    rtol32 = torch.finfo(torch.float32).eps * 6
    torch.testing.assert_close(got[0].double(), ref[0], **TOL)
    assert int(got[1]) == int(torch.linalg.matrix_rank(low.double(), rtol=rtol32)) == 2
    torch.testing.assert_close(got[2].double(), torch.linalg.pinv(low.double(), rtol=rtol32), **TOL)
    torch.testing.assert_close(got[3].double(), ref[3], **TOL)
    torch.testing.assert_close(got[4].double(), ref[4], rtol=1e-4, atol=1e-4)


def test_eigh_reads_the_lower_triangle():
    torch.manual_seed(0)
    a = torch.randn(2, 5, 5)                                          # not symmetric: UPLO decides
    w, v = _compiled(torch.linalg.eigh)(a)
    sym = a.double().tril() + a.double().tril(-1).mT
    torch.testing.assert_close(w.double(), torch.linalg.eigvalsh(sym), **TOL)
    assert bool((w[..., 1:] >= w[..., :-1]).all())                   # ascending, as LAPACK
    torch.testing.assert_close(((v * w.unsqueeze(-2)) @ v.mT).double(), sym, **TOL)
    _assert_orthonormal(v, -2)


def test_eigvalsh_reads_the_upper_triangle():
    torch.manual_seed(0)
    a = torch.randn(4, 4)
    w = _compiled(lambda a: torch.linalg.eigvalsh(a, UPLO="U"))(a)
    torch.testing.assert_close(w.double(), torch.linalg.eigvalsh(a.double(), UPLO="U"), **TOL)


def test_empty_matrices_and_batches_match_eager_shapes():
    def fn(a, b):
        return torch.linalg.svd(a, full_matrices=True), torch.linalg.eigh(b), torch.linalg.pinv(a)

    a, b = torch.randn(3, 0), torch.randn(0, 4, 4)
    got, ref = _compiled(fn)(a, b), fn(a, b)
    for g, r in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(ref)):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r)                              # identity U, empty rest


def test_matrices_past_the_unroll_limit_are_reported_unsupported():
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        _compiled(torch.linalg.svdvals)(torch.randn(20, 20))
    inner = info.value.inner_exception
    assert isinstance(inner, UnsupportedOpsError)
    assert "_linalg_svd" in str(inner)
