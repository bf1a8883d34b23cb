"""Decompositions of triangular solves and the Cholesky factorization, unrolled over the (static)
matrix size into row operations we already lower.

Shapes are static, so the substitution loops of LAPACK's ``trtrs``/``potrf`` unroll at trace time
into O(n²) small vector ops (O(n) per row): right for the small and medium matrices of models
(covariances, whitening, small solves), not a replacement for a blocked LAPACK on large ones.
Algorithms: forward/back substitution and the Cholesky–Banachiewicz order (Golub & Van Loan,
*Matrix Computations*, 4th ed., §3.1 and §4.2). Batch dimensions broadcast as in ATen.
"""
from __future__ import annotations

import torch


def solve_triangular(a, b, *, upper: bool, left: bool = True, unitriangular: bool = False):
    """``torch.linalg.solve_triangular``: X with A X = B (``left``) or X A = B; only A's
    ``upper``/lower triangle is read. A singular A gives inf/NaN, as eager (no error)."""
    if not left:
        return solve_triangular(a.mT, b.mT, upper=not upper, unitriangular=unitriangular).mT
    n = a.shape[-1]
    rows: list = [None] * n
    for i in (range(n - 1, -1, -1) if upper else range(n)):
        acc = b[..., i, :]
        for j in (range(i + 1, n) if upper else range(i)):
            acc = acc - a[..., i, j:j + 1] * rows[j]
        rows[i] = acc if unitriangular else acc / a[..., i, i:i + 1]
    if n == 0:
        return torch.empty(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + b.shape[-2:], dtype=b.dtype)
    return torch.stack(torch.broadcast_tensors(*rows), -2)


def triangular_solve(b, a, upper: bool = True, transpose: bool = False, unitriangular: bool = False):
    """``torch.triangular_solve`` (deprecated API): (X with op(A) X = B, A)."""
    if transpose:
        x = solve_triangular(a.mT, b, upper=not upper, unitriangular=unitriangular)
    else:
        x = solve_triangular(a, b, upper=upper, unitriangular=unitriangular)
    return x, a.clone()


def _cholesky_lower(a):
    """(L, info): A = L Lᴴ for a real symmetric positive-definite A (lower triangle read); info is
    the 1-based order of the first non-positive pivot, 0 when A is positive-definite."""
    n = a.shape[-1]
    cols: list = []
    info = torch.zeros(a.shape[:-2], dtype=torch.int32)
    for j in range(n):
        d = a[..., j, j]
        for k in range(j):
            d = d - cols[k][..., j] * cols[k][..., j]
        bad = (~(d > 0)) & (info == 0)
        info = torch.where(bad, j + 1, info)
        ljj = d.sqrt()
        col = a[..., :, j]
        for k in range(j):
            col = col - cols[k] * cols[k][..., j:j + 1]
        col = torch.where(torch.arange(n) > j, col / ljj.unsqueeze(-1), torch.zeros((), dtype=a.dtype))
        col = torch.where(torch.arange(n) == j, ljj.unsqueeze(-1), col)
        cols.append(col)
    if n == 0:
        return a.clone(), info
    return torch.stack(cols, -1), info


def cholesky_ex(a, *, upper: bool = False, check_errors: bool = False):
    """``torch.linalg.cholesky_ex``. After a failed pivot the factor is not defined (LAPACK leaves a
    partial factor); ``info`` is exact."""
    low, info = _cholesky_lower(a)
    return (low.mT if upper else low), info


def cholesky(a, upper: bool = False):
    """``torch.cholesky`` (deprecated API), without the error check on ``info``."""
    return cholesky_ex(a, upper=upper)[0]


def cholesky_solve(b, factor, upper: bool = False):
    """``torch.cholesky_solve``: X with A X = B given A's Cholesky factor: two triangular solves."""
    low = factor.mT if upper else factor
    y = solve_triangular(low, b, upper=False)
    return solve_triangular(low.mT, y, upper=True)


def cholesky_inverse(factor, upper: bool = False):
    """``torch.cholesky_inverse``: A⁻¹ from A's Cholesky factor (solves against the identity)."""
    eye = torch.eye(factor.shape[-1], dtype=factor.dtype).expand(factor.shape)
    return cholesky_solve(eye, factor, upper)


def lu_factor_ex(a, *, pivot: bool = True, check_errors: bool = False):
    """``torch.linalg.lu_factor_ex`` (m×n A): (LU, pivots, info) of Gaussian elimination with
    partial pivoting (LAPACK ``getrf``: the first largest |a| of the column is the pivot; pivots are
    1-based int32 row interchanges; info is the 1-based first zero pivot, 0 if none). Right-looking
    and unblocked, so results may differ from LAPACK's recursive blocked order by rounding only."""
    m, n = a.shape[-2], a.shape[-1]
    if not pivot:
        return NotImplemented
    batch = a.shape[:-2]
    r = torch.arange(m).reshape(m, 1)
    c = torch.arange(n).reshape(1, n)
    pivots, info = [], torch.zeros(batch, dtype=torch.int32)
    for k in range(min(m, n)):
        col = a[..., :, k].abs()
        p = torch.where(torch.arange(m) >= k, col, torch.full((), -1.0, dtype=a.dtype)).argmax(-1)  # (batch)
        pivots.append((p + 1).to(torch.int32))
        row_k = a[..., k:k + 1, :]
        row_p = torch.gather(a, -2, p.reshape(*batch, 1, 1).expand(*batch, 1, n))
        pr = p.reshape(*batch, 1, 1)
        a = torch.where(r == k, row_p, torch.where(r == pr, row_k, a))
        piv = a[..., k:k + 1, k:k + 1]
        info = torch.where((piv.reshape(batch) == 0) & (info == 0), k + 1, info)
        below = (r > k)
        lcol = torch.where(below & (piv != 0), a[..., :, k:k + 1] / piv, a[..., :, k:k + 1])
        lcol = torch.where(below, lcol, torch.zeros((), dtype=a.dtype))
        a = a - torch.where(c > k, lcol * a[..., k:k + 1, :], torch.zeros((), dtype=a.dtype))
        a = torch.where(below & (c == k), lcol, a)
    piv_t = torch.stack(pivots, -1) if pivots else torch.zeros((*batch, 0), dtype=torch.int32)
    return a, piv_t, info


def _permute_rows(b, pivots, inverse: bool = False):
    """Apply LAPACK row interchanges (1-based, in order; reversed when ``inverse``) to ``b``'s rows."""
    n = pivots.shape[-1]
    batch = torch.broadcast_shapes(b.shape[:-2], pivots.shape[:-1])
    b = b.expand(*batch, *b.shape[-2:])
    r = torch.arange(b.shape[-2]).reshape(-1, 1)
    for i in (reversed(range(n)) if inverse else range(n)):
        p = (pivots[..., i].to(torch.int64) - 1).expand(batch)
        row_i = b[..., i:i + 1, :]
        row_p = torch.gather(b, -2, p.reshape(*batch, 1, 1).expand(*batch, 1, b.shape[-1]))
        b = torch.where(r == i, row_p, torch.where(r == p.reshape(*batch, 1, 1), row_i, b))
    return b


def lu_solve(lu, pivots, b, *, left: bool = True, adjoint: bool = False):
    """``torch.linalg.lu_solve`` (real dtypes): A X = B with A = P L U from :func:`lu_factor_ex`;
    ``adjoint`` solves Aᵀ X = B; ``left=False`` solves X A = B (as Aᵀ Xᵀ = Bᵀ)."""
    if not left:
        return lu_solve(lu, pivots, b.mT, adjoint=not adjoint).mT
    if not adjoint:
        y = solve_triangular(lu, _permute_rows(b, pivots), upper=False, unitriangular=True)
        return solve_triangular(lu, y, upper=True)
    y = solve_triangular(lu.mT, b, upper=False)
    return _permute_rows(solve_triangular(lu.mT, y, upper=True, unitriangular=True), pivots, inverse=True)


def _det_parts(a):
    lu, piv, _ = lu_factor_ex(a)
    n = a.shape[-1]
    swaps = (piv.to(torch.int64) != torch.arange(1, n + 1)).sum(-1)
    sign = 1.0 - 2.0 * (swaps % 2).to(a.dtype)
    return lu, piv, torch.diagonal(lu, 0, -2, -1), sign


def det(a):
    """``torch.linalg.det`` via LU: (det, LU, pivots): the product of U's diagonal, negated per
    row interchange."""
    if a.shape[-1] != a.shape[-2]:
        return NotImplemented
    lu, piv, diag, sign = _det_parts(a)
    return sign * diag.prod(-1), lu, piv


def slogdet(a):
    """``torch.linalg.slogdet`` via LU: (sign, log|det|, LU, pivots); a singular A gives sign 0 and
    -inf, as ATen."""
    if a.shape[-1] != a.shape[-2]:
        return NotImplemented
    lu, piv, diag, sign = _det_parts(a)
    sign = sign * torch.sign(diag).prod(-1)
    return sign, diag.abs().log().sum(-1), lu, piv


def inv_ex(a, *, check_errors: bool = False):
    """``torch.linalg.inv_ex``: (A⁻¹, info) by LU solves against the identity."""
    if a.shape[-1] != a.shape[-2]:
        return NotImplemented
    lu, piv, info = lu_factor_ex(a)
    eye = torch.eye(a.shape[-1], dtype=a.dtype).expand(a.shape)
    return lu_solve(lu, piv, eye), info


def solve_ex(a, b, *, left: bool = True, check_errors: bool = False):
    """``torch.linalg.solve_ex``: (X, LU, pivots, info) of A X = B (``left``) or X A = B; a B with
    one dimension fewer than A whose shape is A's without the last is a batch of vectors (ATen's
    ``linalg_solve_is_vector_rhs``)."""
    if a.shape[-1] != a.shape[-2]:
        return NotImplemented
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    lu, piv, info = lu_factor_ex(a)
    rhs = b.unsqueeze(-1) if vector else b
    x = lu_solve(lu, piv, rhs, left=left)
    return (x.squeeze(-1) if vector else x), lu, piv, info


def lu_unpack(lu, pivots, unpack_data: bool = True, unpack_pivots: bool = True):
    """``torch.lu_unpack``: (P, L, U) with A = P L U: L unit lower (m×k), U upper (k×n), k = min(m, n);
    P is the transpose of the interchanges applied to the identity. Skipped parts are empty."""
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    if unpack_data:
        low = lu[..., :, :k].tril(-1) + torch.eye(m, k, dtype=lu.dtype)
        up = lu[..., :k, :].triu()
    else:
        low = up = torch.empty(0, dtype=lu.dtype)
    if unpack_pivots:
        eye = torch.eye(m, dtype=lu.dtype).expand(*pivots.shape[:-1], m, m)
        perm = _permute_rows(eye, pivots).mT
    else:
        perm = torch.empty(0, dtype=lu.dtype)
    return perm, low, up


def lu(a, *, pivot: bool = True):
    """``torch.linalg.lu``: (P, L, U) from :func:`lu_factor_ex` and :func:`lu_unpack`."""
    factors = lu_factor_ex(a, pivot=pivot)
    if factors is NotImplemented:
        return NotImplemented
    return lu_unpack(factors[0], factors[1])
