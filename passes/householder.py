"""Decompositions of the Householder QR family (``geqrf``, ``linalg_qr``, ``ormqr``,
``linalg_householder_product``), unrolled over the (static) matrix size into masked whole-matrix
vector ops we already lower.

Each op follows LAPACK's *unblocked* routine step for step — ``dgeqr2`` (what ``dgeqrf`` runs for
matrices below its block crossover), ``dlarfg`` for each reflector, ``dlarf`` to apply one,
``dorg2r``/``dorgqr`` to form Q and ``dorm2r``/``dormqr`` to multiply by it — so results match eager
(LAPACK) to rounding, signs and the stored reflectors included (Golub & Van Loan, *Matrix
Computations*, 4th ed., §5.1.2–5.1.6 on Householder reflections, §5.2.1–5.2.2 on Householder QR).
A reflector is H = I - τ v vᵀ with v[i] = 1, zeros above row i and its tail stored below a's
diagonal; Q = H₀ H₁ … H_{k-1}. Step i costs O(m n), so an m×n matrix unrolls into O(min(m, n))
whole-matrix steps: right for the small matrices of models, not a replacement for a blocked LAPACK.
Inputs are real float32/float64 with any batch dimensions (including empty ones), and computing
stays in the input dtype. Not mimicked: ``dlarfg``'s rescaling of a column whose norm underflows.
"""
from __future__ import annotations

import torch


def _reflectors(a, k: int):
    """V (..., m, k): column i holds the Householder vector vᵢ that :func:`geqrf` stored in ``a``
    (..., m, ≥k): 1 on the diagonal, ``a``'s entries below it, zeros above."""
    m = a.shape[-2]
    return a[..., :, :k].tril(-1) + torch.eye(m, k, dtype=a.dtype)


def _reflect(c, v, tau):
    """H c with H = I - τ v vᵀ, as LAPACK ``dlarf`` (side 'L'): w = cᵀ v (``dgemv``), then
    c - v (τ w)ᵀ (``dger``). c (..., m, p), v (..., m), tau (...). Rows where v is zero stay exact."""
    w = (v.unsqueeze(-1) * c).sum(-2)                                      # (..., p)
    return c - v.unsqueeze(-1) * (tau.unsqueeze(-1) * w).unsqueeze(-2)


def _larfg(col, i: int):
    """LAPACK ``dlarfg`` on x = col[i:] = [α; x₂] of col (..., m): (v, τ, new α) with H x = β e₁.

    ‖x₂‖ = 0 gives τ = 0 (H = I) and leaves α and x₂ alone; otherwise β = -sign(α)·hypot(α, ‖x₂‖),
    τ = (β - α)/β and the tail is x₂ · (1/(α - β)). v is full length m: zeros above row i, 1 at i.
    The ‖x₂‖ = 0 case is selected with ``where`` (the unused branch may hold inf/NaN)."""
    m = col.shape[-1]
    row = torch.arange(m)
    zero, one = torch.zeros((), dtype=col.dtype), torch.ones((), dtype=col.dtype)
    alpha = col[..., i]
    x2 = torch.where(row > i, col, zero)
    xnorm = x2.square().sum(-1).sqrt()
    identity = xnorm == 0
    beta = -torch.copysign(torch.hypot(alpha, xnorm), alpha)
    tau = torch.where(identity, zero, (beta - alpha) / beta)
    scale = torch.where(identity, one, torch.reciprocal(alpha - beta))
    v = torch.where(row > i, x2 * scale.unsqueeze(-1), (row == i).to(col.dtype))
    return v, tau, torch.where(identity, alpha, beta)


def geqrf(a):
    """``torch.geqrf`` (LAPACK ``dgeqrf``/``dgeqr2``): a (..., m, n) -> (factors (..., m, n),
    tau (..., min(m, n))). R is the upper triangle of ``factors``; below the diagonal, column i
    holds the tail of vᵢ. Step i reflects column i (:func:`_larfg`) and applies Hᵢ to the columns
    right of it."""
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    if a.numel() == 0:
        return a.clone(), torch.zeros((*a.shape[:-2], k), dtype=a.dtype)
    row, col = torch.arange(m), torch.arange(n)
    taus = []
    for i in range(k):
        x = a[..., :, i]
        v, tau, diag = _larfg(x, i)
        stored = torch.where(row > i, v, torch.where(row == i, diag.unsqueeze(-1), x))
        a = torch.where(col > i, _reflect(a, v, tau), torch.where(col == i, stored.unsqueeze(-1), a))
        taus.append(tau)
    return a, torch.stack(taus, -1)


def _apply_q(factors, tau, c, *, transpose: bool):
    """Q c (or Qᵀ c) for Q = H₀ … H_{k-1} held in (factors (..., m, ≥k), tau (..., k)), with
    c (..., m, p), as LAPACK ``dorm2r`` (side 'L'): Q c applies H_{k-1} first, Qᵀ c applies H₀ first."""
    k = tau.shape[-1]
    if k == 0 or c.numel() == 0:
        return c.clone()
    v = _reflectors(factors, k)
    for i in (range(k) if transpose else range(k - 1, -1, -1)):
        c = _reflect(c, v[..., :, i], tau[..., i])
    return c


def _eye(like, m: int, n: int):
    """The first n columns of the m×m identity, expanded over ``like``'s batch dimensions."""
    return torch.eye(m, n, dtype=like.dtype).expand(*like.shape[:-2], m, n)


def householder_product(a, tau):
    """``torch.linalg.householder_product`` (LAPACK ``dorgqr``/``dorg2r``): the first n columns of
    H₀ … H_{k-1} for a (..., m, n), m ≥ n ≥ k = tau.shape[-1]: Q applied to the identity's columns
    (``dorg2r`` builds the same columns in place: column i becomes eᵢ - τᵢ vᵢ)."""
    return _apply_q(a, tau, _eye(a, a.shape[-2], a.shape[-1]), transpose=False)


def linalg_qr(a, mode: str = "reduced"):
    """``torch.linalg.qr`` (``geqrf`` + ``orgqr``, as ATen): a (..., m, n), k = min(m, n) ->
    (Q, R): ``reduced`` Q (..., m, k), R (..., k, n); ``complete`` Q (..., m, m), R (..., m, n);
    ``r`` Q empty (0,), R (..., k, n)."""
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    factors, tau = geqrf(a)
    r = (factors if mode == "complete" else factors[..., :k, :]).triu()
    if mode == "r":
        return torch.empty(0, dtype=a.dtype), r
    q_cols = m if mode == "complete" else k
    return _apply_q(factors, tau, _eye(a, m, q_cols), transpose=False), r


def ormqr(a, tau, other, left: bool = True, transpose: bool = False):
    """``torch.ormqr`` (LAPACK ``dormqr``/``dorm2r``): Q C, Qᵀ C (``left``), C Q or C Qᵀ for the Q
    held in (a, tau) from :func:`geqrf` and C = ``other``. The right side is the left one on Cᵀ:
    C Q = (Qᵀ Cᵀ)ᵀ, which is also ``dorm2r``'s arithmetic for side 'R'."""
    if left:
        return _apply_q(a, tau, other, transpose=transpose)
    return _apply_q(a, tau, other.mT, transpose=not transpose).mT
