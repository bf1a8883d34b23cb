"""Decompositions of ``histc`` and ``histogram`` into comparisons and one counting reduction.

Bin positions follow ATen's CPU ``histogramdd`` kernel (``HistogramKernel.cpp``): an element in
[leftmost, rightmost] goes to bin ``(x - leftmost) * bins / (rightmost - leftmost)`` computed in the
input dtype and truncated (``histc``: ``LINEAR_INTERPOLATION``), or to the bin found by searching
the edges around that estimate (``histogram``: ``LINEAR_INTERPOLATION_WITH_LOCAL_SEARCH``, i.e. the
number of edges ``<= x`` minus one); the right edge belongs to the last bin; NaN and out-of-range
elements are not counted. Counts are a sum of one-hot comparisons (O(n·bins)).
"""
from __future__ import annotations

import torch


def _outer_edges(x, lo, hi, widen: float):
    """(leftmost, rightmost) as 0-d tensors of x's dtype: the given range, else the data's min and
    max (0 and 1 for an empty input, as ATen); an empty range is widened by ``widen`` on each side."""
    if lo == hi and x.numel() == 0:
        lo_t, hi_t = (torch.full((), v, dtype=x.dtype) for v in (0.0, 1.0))
    elif lo == hi:
        lo_t, hi_t = x.min(), x.max()
    else:
        lo_t, hi_t = (torch.full((), v, dtype=x.dtype) for v in (lo, hi))
    same = lo_t == hi_t
    return torch.where(same, lo_t - widen, lo_t), torch.where(same, hi_t + widen, hi_t)


def _linspace(lo, hi, steps: int):
    """ATen's CPU ``linspace``: start + i·step for the first half, end - (steps-1-i)·step after."""
    i = torch.arange(steps, dtype=lo.dtype)
    step = (hi - lo) / (steps - 1)
    half = steps // 2
    return torch.where(torch.arange(steps) < half, lo + step * i, hi - step * (steps - 1 - i))


def _count(pos, inside, bins: int, weight):
    hit = (pos.reshape(-1, 1) == torch.arange(bins).reshape(1, -1)) & inside.reshape(-1, 1)
    w = hit.to(weight.dtype) * weight.reshape(-1, 1) if weight is not None else hit
    return w.sum(0)


def histc(x, bins: int = 100, min: float = 0, max: float = 0):  # noqa: A002
    """``torch.histc``: float counts of ``x`` in ``bins`` equal bins over [min, max]."""
    lo, hi = _outer_edges(x, min, max, 1.0)
    pos = ((x - lo) * bins / (hi - lo)).to(torch.int64)
    pos = torch.where(pos == bins, bins - 1, pos)
    return _count(pos, (x >= lo) & (x <= hi), bins, None).to(x.dtype)


def histogram_bin_ct(x, bins: int = 100, *, range=None, weight=None, density: bool = False):  # noqa: A002
    """``torch.histogram(x, bins: int)``: (hist, bin_edges), with optional weights and density."""
    lo, hi = _outer_edges(x, *(range if range is not None else (0, 0)), 0.5)
    edges = _linspace(lo, hi, bins + 1)
    flat = x.reshape(-1)
    pos = (flat.reshape(-1, 1) >= edges.reshape(1, -1)).sum(1) - 1
    pos = torch.where(pos == bins, bins - 1, pos)
    hist = _count(pos, (flat >= lo) & (flat <= hi), bins,
                  weight.reshape(-1) if weight is not None else None).to(x.dtype)
    if density:
        hist = hist / (hist.sum() * (edges[1:] - edges[:-1]))
    return hist, edges


def histogram_bins_tensor(x, bins, *, weight=None, density: bool = False):
    """``torch.histogram(x, bins: Tensor)``: counts over the given (sorted) edges; an element's bin
    is the number of edges ``<= x`` minus one (ATen's ``BINARY_SEARCH``)."""
    flat, n = x.reshape(-1), bins.numel() - 1
    pos = (flat.reshape(-1, 1) >= bins.reshape(1, -1)).sum(1) - 1
    pos = torch.where(pos == n, n - 1, pos)
    hist = _count(pos, (flat >= bins[0]) & (flat <= bins[-1]), n,
                  weight.reshape(-1) if weight is not None else None).to(x.dtype)
    if density:
        hist = hist / (hist.sum() * (bins[1:] - bins[:-1]))
    return hist, bins.clone()
