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
