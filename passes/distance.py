"""Decompositions of ``torch.pdist`` (``aten._pdist_forward`` and ``aten._pdist_backward``).

``pdist`` of an (N, M) input is the p-norm distance of every row pair i < j, in row-major order of
the pairs: (0, 1), (0, 2), ..., (0, N-1), (1, 2), ... (ATen ``Distance.cpp``). The pair indices are
computed from ``arange`` by the closed form of the upper triangle's row (so tracing records
functional ops and no loop over N), the pairs are gathered, and the norms taken as in
``_cdist_forward``'s difference form (:func:`norm_of_abs_diff`, shared by both). The backward
scatters each pair's gradient back to both rows with ATen's per-p formulas (``pdist_backward`` in
``DistanceOpsKernel.cpp``).
"""
from __future__ import annotations

import math

import torch


def _pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices (i, j), i < j, of the n(n-1)/2 pairs in row-major order (int64).

    Pair k lies in row i = n - 2 - floor(sqrt(4n(n-1) - 8k - 7) / 2 - 1/2) of the strict upper
    triangle, at column j = k + i + 1 - n(n-1)/2 + (n-i)(n-i-1)/2; float64 is exact for any n
    whose pair count fits in memory."""
    k = torch.arange(n * (n - 1) // 2, dtype=torch.float64)
    i = n - 2 - torch.floor(torch.sqrt(4.0 * n * (n - 1) - 8.0 * k - 7.0) / 2.0 - 0.5)
    j = k + i + 1 - n * (n - 1) / 2 + (n - i) * (n - i - 1) / 2
    return i.to(torch.int64), j.to(torch.int64)


def pdist_forward(x: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """``_pdist_forward(x, p)``: x (N, M) floating → (N(N-1)/2,) distances ``‖x_i - x_j‖_p``
    (p = 0 counts differing entries, p = inf is the largest difference)."""
    n = x.shape[0]
    if n < 2:
        return x.new_zeros((0,))
    i, j = _pairs(n)
    return norm_of_abs_diff((x[i] - x[j]).abs(), p)


def norm_of_abs_diff(diff: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm over the last dim of ``diff`` (absolute differences, [..., M] → [...]), in the
    forms ATen's distance kernels use: p = 0 counts the nonzero entries (in ``diff``'s dtype),
    p = inf takes the largest, p = 1 and 2 skip the general ``pow``."""
    if p == 0:
        return (diff != 0).sum(-1).to(diff.dtype)
    if p == math.inf:
        return diff.amax(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        return diff.pow(2).sum(-1).sqrt()
    return diff.pow(p).sum(-1).pow(1.0 / p)


def pdist_backward(grad: torch.Tensor, x: torch.Tensor, p: float, dist: torch.Tensor) -> torch.Tensor:
    """``_pdist_backward(grad, x, p, pdist)``: (N, M) gradient of x. Each pair's term ``t`` is
    added to row i and subtracted from row j, with ``t`` per ATen: p = 0 → 0; p = 1 →
    ``sign(d)·g``; p < 2 → ``sign(d)·|d|^(p-1)·g / D^(p-1)``; p = 2 → ``d·g / D``; p = inf →
    ``sign(d)·g`` where ``|d| = D``; else ``d·|d|^(p-2)·g / D^(p-1)`` (d = x_i - x_j, D the
    pair's distance; 0 where D = 0)."""
    n = x.shape[0]
    if n < 2 or p == 0:
        return torch.zeros_like(x)
    i, j = _pairs(n)
    d = x[i] - x[j]
    g, dd = grad[:, None], dist[:, None]
    zero = torch.zeros_like(d)
    if p == 1:
        t = torch.sign(d) * g
    elif p == math.inf:
        t = torch.where(d.abs() == dd, torch.sign(d) * g, zero)
    elif p == 2:
        t = torch.where(dd == 0, zero, d * g / dd)
    elif p < 2:
        t = torch.where(dd == 0, zero, torch.sign(d) * d.abs().pow(p - 1) * g / dd.pow(p - 1))
    else:
        t = torch.where(dd == 0, zero, d * d.abs().pow(p - 2) * g / dd.pow(p - 1))
    return torch.zeros_like(x).index_add(0, i, t).index_add(0, j, -t)
