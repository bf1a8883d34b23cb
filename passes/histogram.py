"""Decompositions of ``histc`` and ``histogram`` into comparisons and one counting reduction.

Bin positions follow ATen's CPU ``histogramdd`` kernel (``HistogramKernel.cpp``): an element in
[leftmost, rightmost] goes to bin ``(x - leftmost) * bins / (rightmost - leftmost)`` computed in the
input dtype and truncated (``histc``: ``LINEAR_INTERPOLATION``), or to the bin found by searching
the edges around that estimate (``histogram``: ``LINEAR_INTERPOLATION_WITH_LOCAL_SEARCH``, i.e. the
number of edges ``<= x`` minus one); the right edge belongs to the last bin; NaN and out-of-range
elements are not counted. Counts are a sum of one-hot comparisons (O(n·bins)).
"""
from __future__ import annotations

import builtins

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


def _upper_bound(edges, x):
    """``std::upper_bound(edges, edges + n, x) - edges`` per element of ``x``: the exact probe sequence
    of the C++ binary search (unrolled over its ⌈log2(n+1)⌉ halvings), so edges that are not sorted
    give eager's answer too."""
    n = edges.numel()
    first = torch.zeros(x.shape, dtype=torch.int64)
    count = torch.full(x.shape, n, dtype=torch.int64)
    for _ in range(max(n, 1).bit_length()):
        step = count // 2
        probe = first + step
        right = (count > 0) & ~(x < edges[probe.clamp(max=max(n - 1, 0))])
        first = torch.where(right, probe + 1, first)
        count = torch.where(count > 0, torch.where(right, count - step - 1, step), count)
    return first


def _histogramdd(x, edges: list, weight, density: bool, search: bool):
    """ATen's ``histogramdd`` over the last dim of ``x`` (N..., D) with per-dim ``edges``: an element
    outside [first edge, last edge] in any dim (or NaN) is skipped; its bin per dim is the number of
    edges <= x minus one (``search``: ``std::upper_bound`` exactly), the last edge closing the last bin."""
    d = x.shape[-1]
    coords = x.reshape(-1, d)
    nbins = [e.numel() - 1 for e in edges]
    flat = torch.zeros(coords.shape[0], dtype=torch.int64)
    inside = torch.ones(coords.shape[0], dtype=torch.bool)
    stride = 1
    for k in reversed(range(d)):
        c, e = coords[:, k], edges[k]
        inside = inside & (c >= e[0]) & (c <= e[-1])
        pos = (_upper_bound(e, c) if search else (c.reshape(-1, 1) >= e.reshape(1, -1)).sum(1)) - 1
        pos = torch.where(pos == nbins[k], nbins[k] - 1, pos).clamp(min=0)
        flat = flat + pos * stride
        stride *= nbins[k]
    total = stride
    hist = _count(flat, inside, total, weight.reshape(-1) if weight is not None else None).to(x.dtype)
    hist = hist.reshape(nbins)
    if density:
        hist = hist / hist.sum()
        for k, e in enumerate(edges):
            shape = [1] * d
            shape[k] = nbins[k]
            hist = hist / (e[1:] - e[:-1]).reshape(shape)
    return hist


def histogramdd_bin_edges(x, bins, range=None, weight=None, density: bool = False):  # noqa: A002
    """``_histogramdd_bin_edges``: per dim of the last axis, ``bins[k] + 1`` edges spanning the
    given ``range`` pair or the data's min and max (ATen's ``select_outer_bin_edges``), then linspace."""
    d = x.shape[-1]
    coords = x.reshape(-1, d)
    out = []
    for k in builtins.range(d):  # ``range`` is the op's argument here
        pair = (range[2 * k], range[2 * k + 1]) if range is not None else (0, 0)
        lo, hi = _outer_edges(coords[:, k], *pair, 0.5)
        out.append(_linspace(lo, hi, bins[k] + 1))
    return out


def histogramdd_from_bin_cts(x, bins, range=None, weight=None, density: bool = False):  # noqa: A002
    """``_histogramdd_from_bin_cts``: the histogram over :func:`histogramdd_bin_edges`."""
    return _histogramdd(x, histogramdd_bin_edges(x, bins, range), weight, density, search=False)


def histogramdd_from_bin_tensors(x, bins, *, weight=None, density: bool = False):
    """``_histogramdd_from_bin_tensors``: the histogram over the given edge tensors, binned by
    ``std::upper_bound`` as ATen's ``BINARY_SEARCH`` (so unsorted edges match eager too)."""
    return _histogramdd(x, list(bins), weight, density, search=True)
