"""Decompositions of the SVD and the symmetric eigendecomposition by Jacobi rotations, unrolled
over the (static) matrix size into elementwise ops, reductions, slices and concatenations we
already lower; the pseudo-inverse on top of them.

Algorithms (Golub & Van Loan, *Matrix Computations*, 4th ed.):

- SVD: one-sided (Hestenes) Jacobi (§8.6.3): rotate pairs of columns of A until they are
  orthogonal; the column norms are the singular values, the normalized columns the left and the
  accumulated rotations the right singular vectors. It computes small singular values to high
  relative accuracy (Demmel & Veselić, *Jacobi's method is more accurate than QR*, SIAM J. Matrix
  Anal. Appl. 13(4), 1992).
- Symmetric eigen: two-sided cyclic Jacobi (§8.5.2-8.5.5): A ← Jᵀ A J zeroes a_pq; the diagonal
  converges to the eigenvalues, the accumulated J to the eigenvectors.

Every rotation is the symmetric Schur 2×2 (``symSchur2``, GvL Alg. 8.5.1) of the pair's Gram or
matrix entries. Pairs follow the round-robin ordering of parallel Jacobi (GvL §8.5.5; Brent &
Luk 1985): each of the n - 1 rounds of a sweep rotates n/2 disjoint pairs at once, so a round
is a handful of vector ops over all columns, each reading its partner through a static
``index_select``; no data moves between rounds. An odd n gets a zero last column (a rotation
with it is the identity), sliced away at the end.

Shapes are static, so the number of sweeps is fixed (no data-dependent control flow): cyclic
Jacobi converges quadratically once the off-diagonal part is below the gaps between the values
(GvL Thm. 8.5.3; Luk & Park 1989 for parallel orderings), so from a random start a few sweeps
suffice. Measured on 1000 Gaussian matrices per n with this ordering, the worst cosine between
the columns of A V (one-sided) and the off-diagonal of Vᵀ A V (two-sided) reach float64
rounding (< 1e-14) after 4 sweeps for n = 3, 5 for n = 4, 6 for 5 ≤ n ≤ 8, 7 for n ≤ 12 and 8
for n = 16. :func:`_sweeps` takes 5, 6, 7 and 8 sweeps for n ≤ 4, ≤ 6, ≤ 9 and ≤ 16, and one
fewer for float32 results, which leaves at most 1e-10 for every n from 3 to 16, far below
float32 rounding. Everything runs in float64 and is cast back, so float32 results are more
accurate than LAPACK's float32 ones. Values are sorted as LAPACK returns them (SVD descending,
eigh ascending). Real float32/float64 only; matrices larger than :data:`MAX_ORDER` decline
(``NotImplemented``, so the op is reported as unsupported): the graph has O(n log n) rounds of
O(1) nodes each.
"""
from __future__ import annotations

import torch

F64 = torch.float64
# Largest min(m, n) (SVD) or n (eigh) we unroll: a float32 SVD compiles in ~4 s at 5×5, ~12 s at
# 8×8, ~22 s at 12×12 and ~70 s at 16×16 (2 busy cores), mostly in the fuse pass and LLVM.
MAX_ORDER = 12
MAX_COMPLETE = 64  # largest max(m, n) whose full U (or Vh) we complete, one column at a time


def _sweeps(n: int, dtype: torch.dtype) -> int:
    """Fixed number of Jacobi sweeps for order n and the result ``dtype`` (see the module
    docstring for the measurements)."""
    if n <= 2:
        return n - 1 + (n == 2)  # nothing to rotate for n = 1; one rotation diagonalizes a 2×2
    return 5 + (n > 4) + (n > 6) + (n > 9) - (dtype == torch.float32)


def _pad_even(x, dims):
    """x with a zero row/column appended along each of ``dims`` when its size there is odd."""
    for d in dims:
        if x.shape[d] % 2:
            shape = list(x.shape)
            shape[d] = 1
            x = torch.cat([x, torch.zeros(shape, dtype=x.dtype)], d)
    return x


def _rounds(n: int, sweeps: int):
    """(partner, first) per round of all sweeps over the padded (even) order m = n + n % 2: the
    round-robin "polygon" schedule (Brent & Luk 1985): in round r index i < m - 1 pairs with
    (r - i) mod (m - 1), or with the fixed m - 1 when that is i itself, so every pair meets once
    per sweep of m - 1 rounds; ``first`` is +1 for the smaller index of a pair, else -1. Built
    from ``arange`` (constant-folded), never from Python lists (``torch.tensor`` is not traceable
    into a functional graph)."""
    m = n + n % 2
    i = torch.arange(m)
    rounds = []
    for r in range(m - 1):
        q = (r - i) % (m - 1)
        partner = torch.where(i == m - 1, (r * (m // 2)) % (m - 1), torch.where(q == i, m - 1, q))
        rounds.append((partner, torch.where(i < partner, 1.0, -1.0).to(F64)))
    return [rnd for _ in range(sweeps) for rnd in rounds]


def _tangent(own, partner, cross, first):
    """tan θ of the Jacobi rotation of each pair, per member: with (a_pp, a_qq, a_pq) the pair's
    entries, δ = (a_qq - a_pp)/2 and h = hypot(δ, a_pq), t = a_pq / (δ + sign(δ)·h) (GvL Alg. 8.5.1
    in the cancellation-free form, |θ| ≤ π/4); t = 0 when a_pq = 0. ``own``/``partner``/``cross``
    are a_jj, a_π(j)π(j), a_jπ(j) for every j; ``first`` (±1) makes δ the same for both members."""
    delta = (0.5 * first) * (partner - own)
    den = delta + torch.copysign(torch.hypot(delta, cross), delta)
    return cross / torch.where(den == 0, 1.0, den)


def _rotate(x, x_partner, t, first, one):
    """Columns after the rotations: x_p ← c(x_p - t x_q), x_q ← c(x_q + t x_p), 1/c = hypot(t, 1)."""
    return (x - (first * t) * x_partner) / torch.hypot(t, one)


def _scaled(a):
    """(a / s, s) with s = max |a| per matrix (1 where a is all zero), so that squares neither
    overflow nor underflow (LAPACK scales the same way)."""
    s = a.abs().amax((-2, -1), keepdim=True)
    s = torch.where(s > 0, s, 1.0)
    return a / s, s


def _hestenes(a, with_v: bool, sweeps: int):
    """One-sided Jacobi on a float64 (*, m, n) A, m ≥ n ≥ 1: (σ (*, n), A V (*, m, n), V (*, n, n)
    or None), columns in an arbitrary common order; A V has orthogonal columns of norms σ. The
    rows of V ride along below A's (W = [A; I]) so one rotation updates both."""
    *batch, m, n = a.shape
    a, scale = _scaled(a)
    w = torch.cat([a, torch.eye(n, dtype=F64).expand(*batch, n, n)], -2) if with_v else a
    w = _pad_even(w, [-1])
    one = torch.ones((), dtype=F64)
    for partner, first in _rounds(n, sweeps):
        w_partner = w.index_select(-1, partner)
        wa, pa = w[..., :m, :], w_partner[..., :m, :]
        own = (wa * wa).sum(-2, keepdim=True)
        t = _tangent(own, own.index_select(-1, partner), (wa * pa).sum(-2, keepdim=True), first)
        w = _rotate(w, w_partner, t, first, one)
    av = w[..., :m, :n]
    sigma = (av * av).sum(-2).sqrt()
    return sigma * scale.squeeze(-1), av * scale, (w[..., m:, :n] if with_v else None)


def _jacobi_eigen(a, with_v: bool, sweeps: int):
    """Two-sided cyclic Jacobi on a float64 symmetric (*, n, n) A, n ≥ 1: (eigenvalues (*, n),
    eigenvectors (*, n, n) or None) in an arbitrary common order. A round is A ← Jᵀ A J, entrywise
    a_ij ← c_i c_j (a_ij - τ_j a_iπ(j) - τ_i (a_π(i)j - τ_j a_π(i)π(j))) with τ = ±t, and V ← V J."""
    *batch, n = a.shape[:-1]
    a, scale = _scaled(a)
    a = _pad_even(a, [-2, -1])
    v = _pad_even(torch.eye(n, dtype=F64).expand(*batch, n, n), [-1]) if with_v else None
    one = torch.ones((), dtype=F64)
    for partner, first in _rounds(n, sweeps):
        first_row, first_col = first.unsqueeze(-2), first.unsqueeze(-1)
        cols = a.index_select(-1, partner)                                  # a_iπ(j)
        diag = torch.diagonal(a, 0, -2, -1)
        t = _tangent(diag, diag.index_select(-1, partner), torch.diagonal(cols, 0, -2, -1), first)
        row, col = t.unsqueeze(-2), t.unsqueeze(-1)
        tr, tc = first_row * row, first_col * col                           # f_j t_j as a row / column
        rows = a.index_select(-2, partner) - tr * cols.index_select(-2, partner)
        a = (a - tr * cols - tc * rows) / (torch.hypot(col, one) * torch.hypot(row, one))
        if with_v:  # written apart from a's update (rsqrt, not hypot) so no value is shared
            v = (v - (first * row) * v.index_select(-1, partner)) * torch.rsqrt(1 + row * row)
    values = torch.diagonal(a, 0, -2, -1)[..., :n] * scale.squeeze(-1)
    return values, (v[..., :, :n] if with_v else None)


def _sorted(values, descending: bool, *columns):
    """values sorted along the last dim, and the columns of each of ``columns`` (or None) to match."""
    values, idx = torch.sort(values, -1, descending=descending)
    return (values, *(None if x is None else x.gather(-1, idx.unsqueeze(-2).expand(x.shape)) for x in columns))


def _complete(q, need):
    """Fill the columns of the orthonormal-or-zero (*, m, c) ``q`` where ``need`` (*, c) holds with
    unit vectors orthogonal to all other columns, in order: the column of the projector
    P = I - Q Qᵀ with the largest norm² (P is symmetric idempotent, so that is its largest
    diagonal entry P_ii ≥ (m - rank)/m), normalized. As the norm is at least 1/√m no
    reorthogonalization is needed for the small m we unroll."""
    m, cols = q.shape[-2], q.shape[-1]
    eye = torch.eye(m, dtype=F64)
    for j in range(cols):
        resid = eye - q @ q.mT                                     # (*, m, m)
        diag = torch.diagonal(resid, 0, -2, -1)
        best = diag.argmax(-1, keepdim=True)                       # (*, 1)
        u = resid.gather(-1, best.unsqueeze(-2).expand(*resid.shape[:-1], 1))
        u = u * torch.rsqrt(diag.gather(-1, best)).unsqueeze(-1)
        q = torch.where((torch.arange(cols) == j) & need.unsqueeze(-2), u, q)
    return q


def _svd64(a, full_matrices: bool, compute_uv: bool, complete: bool = True):
    """Float64 (U, S, Vh) of a real (*, m, n) A with 0 < min(m, n) ≤ MAX_ORDER (sweeps for A's
    dtype); U, Vh None unless ``compute_uv``; without ``complete`` U keeps zero columns where
    σ ≈ 0 (enough for the pseudo-inverse, which drops them)."""
    m, n = a.shape[-2], a.shape[-1]
    if m < n:
        u, s, vh = _svd64(a.mT, full_matrices, compute_uv, complete)
        return (vh.mT if compute_uv else None), s, (u.mT if compute_uv else None)
    sigma, av, v = _hestenes(a.to(F64), compute_uv, _sweeps(n, a.dtype))
    if not compute_uv:
        return None, _sorted(sigma, True)[0], None
    sigma, av, v = _sorted(sigma, True, av, v)
    # columns with σ at rounding level have no reliable direction: complete them instead
    valid = sigma > sigma[..., :1] * (torch.finfo(F64).eps * m)
    u = torch.where(valid.unsqueeze(-2), av / torch.where(valid, sigma, 1.0).unsqueeze(-2), 0.0)
    need = ~valid
    if full_matrices and m > n:
        u = torch.cat([u, torch.zeros(*u.shape[:-1], m - n, dtype=F64)], -1)
        need = torch.cat([need, torch.ones(*need.shape[:-1], m - n, dtype=torch.bool)], -1)
    return (_complete(u, need) if complete else u), sigma, v.mT


def _empty(shape, dtype):
    return torch.zeros(shape, dtype=dtype)


def svd(a, full_matrices: bool = False, compute_uv: bool = True, driver=None):
    """``aten._linalg_svd``: (U, S, Vh) with A = U diag(S) Vh for a real (*, m, n) A, k = min(m, n):
    U (*, m, k) or (*, m, m) with ``full_matrices``, S (*, k) descending, Vh (*, k, n) or (*, n, n);
    without ``compute_uv`` U and Vh are empty (0,) tensors, as ATen. Columns of U for zero singular
    values, and U's extra columns with ``full_matrices``, are an orthonormal completion (not
    LAPACK's: only the spanned subspace is defined). Vectors are unique up to sign only."""
    *batch, m, n = a.shape
    if a.dtype not in (torch.float32, F64) or min(m, n) > MAX_ORDER or (
            compute_uv and full_matrices and max(m, n) > MAX_COMPLETE):
        return NotImplemented
    k = min(m, n)
    if k == 0 or 0 in batch:
        s = _empty((*batch, k), a.dtype)
        if not compute_uv:
            return _empty((0,), a.dtype), s, _empty((0,), a.dtype)
        if full_matrices:  # as ATen: identities are the bases of the empty problem
            return (torch.eye(m, dtype=a.dtype).expand(*batch, m, m), s,
                    torch.eye(n, dtype=a.dtype).expand(*batch, n, n))
        return _empty((*batch, m, k), a.dtype), s, _empty((*batch, k, n), a.dtype)
    u, s, vh = _svd64(a, full_matrices, compute_uv)
    if not compute_uv:
        return _empty((0,), a.dtype), s.to(a.dtype), _empty((0,), a.dtype)
    return u.to(a.dtype), s.to(a.dtype), vh.to(a.dtype)


def _symmetric(a, uplo: str):
    """The symmetric matrix whose lower (``L``) or upper (``U``) triangle is that of ``a``."""
    tri = a.tril() if uplo.upper() == "L" else a.triu()
    return tri + (tri.mT.triu(1) if uplo.upper() == "L" else tri.mT.tril(-1))


def _eigh64(a, uplo: str, compute_v: bool):
    """Float64 (eigenvalues ascending, eigenvectors or None) of a real (*, n, n) A, n ≥ 1."""
    values, vectors = _jacobi_eigen(_symmetric(a.to(F64), uplo), compute_v, _sweeps(a.shape[-1], a.dtype))
    return _sorted(values, False, vectors)


def eigh(a, UPLO: str = "L", compute_v: bool = True):
    """``aten._linalg_eigh``: (eigenvalues (*, n) ascending, eigenvectors (*, n, n) as columns) of a
    real symmetric A, reading only its ``UPLO`` triangle; without ``compute_v`` the vectors are an
    empty (0,) tensor, as ATen. Eigenvectors are unique up to sign only (for simple eigenvalues)."""
    if a.dtype not in (torch.float32, F64) or a.shape[-1] > MAX_ORDER:
        return NotImplemented
    *batch, n = a.shape[:-1]
    if n == 0 or 0 in batch:
        return _empty((*batch, n), a.dtype), (_empty(a.shape, a.dtype) if compute_v else _empty((0,), a.dtype))
    values, vectors = _eigh64(a, UPLO, compute_v)
    return values.to(a.dtype), (vectors.to(a.dtype) if compute_v else _empty((0,), a.dtype))


def pinv(a, *, atol=None, rtol=None, hermitian: bool = False):
    """``aten.linalg_pinv.atol_rtol_tensor`` as ATen's ``linalg_pinv`` (``LinearAlgebra.cpp``):
    V diag(σ⁺) Uᵀ, σ⁺ = 1/σ where σ > max(atol, rtol·σ_max) else 0; the default rtol is
    eps(dtype)·max(m, n), or 0 when a positive atol is given; ``hermitian`` uses eigh with σ = |λ|.
    Computed in float64 from :func:`_svd64`/:func:`_eigh64`, then cast."""
    if a.dtype not in (torch.float32, F64):
        return NotImplemented
    *batch, m, n = a.shape
    if a.numel() == 0:
        return _empty((*batch, n, m), a.dtype)
    if min(m, n) > MAX_ORDER:
        return NotImplemented
    zero = torch.zeros((), dtype=F64)
    atol_t = zero if atol is None else atol.to(F64)
    if rtol is None:
        default = torch.full((), torch.finfo(a.dtype).eps * max(m, n), dtype=F64)
        rtol = default if atol is None else torch.where(atol > 0, zero, default)
    if hermitian:
        lam, u = _eigh64(a, "L", True)
        size, vt = lam.abs(), u.mT
        big = size.amax(-1, keepdim=True)
    else:
        u, size, vt = _svd64(a, False, True, complete=False)
        lam, big = size, size[..., :1]
    tol = torch.maximum(atol_t.unsqueeze(-1), rtol.to(F64).unsqueeze(-1) * big)
    inv = torch.where(size > tol, 1.0 / torch.where(size > tol, lam, 1.0), zero)
    return ((vt.mT * inv.unsqueeze(-2)) @ u.mT).to(a.dtype)
