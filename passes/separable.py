"""Decompositions of pooling and padding ops that act on each spatial dimension separately.

Average pooling, adaptive average pooling and replication padding are linear maps that factor
per spatial dimension: along a dimension of length ``n`` each is an ``(n_out, n)`` matrix ``M``
(window weights, or a one-hot "which input feeds this output"), and the nd op applies one matrix
per dimension. So the forward is ``M @ x`` along each dimension and the backward is ``Mᵀ @ g``: a
few small matmuls we already lower, with the matrices built at trace time as constants.
Window arithmetic follows ATen's CPU kernels (``AvgPoolKernel.cpp``, ``AdaptiveAvgPoolKernel.cpp``,
``ReplicationPadding.cpp``, ``pooling_output_shape`` in ``Pool.h``).
"""
from __future__ import annotations

import torch


def _along(x: torch.Tensor, dim: int, m: torch.Tensor) -> torch.Tensor:
    """``M @ x`` contracted along ``dim`` of ``x`` (``m``: (n_out, n_in))."""
    return torch.movedim(torch.movedim(x, dim, -1) @ m.to(x.dtype).t(), -1, dim)


def _band(start: torch.Tensor, end: torch.Tensor, n: int, weight: torch.Tensor) -> torch.Tensor:
    """(n_out, n) float64 matrix: row i holds ``weight[i]`` on columns [start[i], end[i]).

    Built from ``arange`` and comparisons (not element writes or ``torch.tensor`` of Python data)
    so that tracing records functional ops."""
    j = torch.arange(n)[None, :]
    inside = (j >= start[:, None]) & (j < end[:, None])
    return inside.to(torch.float64) * weight[:, None].to(torch.float64)


def _pool_out(n: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    o = (n + 2 * p - (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    return o - 1 if ceil_mode and (o - 1) * s >= n + p else o


def _avg_pool_matrix(n: int, k: int, s: int, p: int, ceil_mode: bool, count_include_pad: bool,
                     divided: bool) -> torch.Tensor:
    start = torch.arange(_pool_out(n, k, s, p, ceil_mode)) * s - p
    end = torch.clamp(start + k, max=n + p)
    pool = end - start
    start, end = start.clamp(min=0), end.clamp(max=n)
    count = pool if count_include_pad else end - start
    # (the reciprocal in float64: an int64 count divided in the default dtype, float32, put float64
    # pools 1.5e-8 relative off eager; a new user's trial)
    return _band(start, end, n, 1.0 / count.to(torch.float64) if divided else torch.ones_like(count))


def _expand(v, nd: int) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * nd if len(v) == 1 else v


def _avg_pool_matrices(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, p = _expand(kernel_size, nd), _expand(padding, nd)
    s = _expand(stride, nd) if stride else k
    spatial = x.shape[-nd:]
    return [_avg_pool_matrix(spatial[i], k[i], s[i], p[i], ceil_mode, count_include_pad,
                             divisor_override is None) for i in range(nd)]


_HALF = (torch.float16, torch.bfloat16)


def _apply(x, mats, transpose: bool, divisor=None):
    """The matrices applied along the last ``len(mats)`` dims of ``x`` (transposed for a backward),
    then divided by ``divisor`` if given. float16/bfloat16 work in float32 and round once at the
    end, as ATen's CPU pooling kernels accumulate in float (rounding between the per-dimension
    passes, and the weights themselves, to bfloat16 was off by up to 0.25 relative)."""
    dtype = x.dtype
    if dtype in _HALF:
        x = x.float()
    nd = len(mats)
    for i, m in enumerate(mats):
        x = _along(x, x.dim() - nd + i, m.t() if transpose else m)
    if divisor is not None:
        x = x / divisor
    return x.to(dtype)


def avg_pool(nd: int):
    """``avg_poolNd(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)``."""
    def fn(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        if not x.is_floating_point():  # integer sums, then C++ integer division (truncating), as ATen
            ones = _avg_pool_matrices(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, 1)
            sums = _apply(x, ones, transpose=False)
            if divisor_override is not None:
                return torch.div(sums, divisor_override, rounding_mode="trunc")
            weights = _avg_pool_matrices(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, None)
            count = None
            for i, m in enumerate(weights):  # each row's weight is 1/count along that dim
                c = (1.0 / m.amax(-1)).round().to(torch.int64).reshape([-1] + [1] * (nd - 1 - i))
                count = c if count is None else count * c
            return torch.div(sums, count, rounding_mode="trunc")
        mats = _avg_pool_matrices(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                  divisor_override)
        return _apply(x, mats, transpose=False, divisor=divisor_override)
    return fn


def avg_pool_backward(nd: int):
    """``avg_poolNd_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
    count_include_pad, divisor_override)``: the transposed window matrices."""
    def fn(grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        mats = _avg_pool_matrices(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                  divisor_override)
        return _apply(grad_output, mats, transpose=True, divisor=divisor_override)
    return fn


def _adaptive_matrix(n: int, o: int) -> torch.Tensor:
    i = torch.arange(o)
    start, end = (i * n) // o, ((i + 1) * n + o - 1) // o
    return _band(start, end, n, 1.0 / (end - start).to(torch.float64))


def adaptive_avg_pool(nd: int):
    """``_adaptive_avg_poolNd(x, output_size)``: output i of a dimension of length n averages the
    window [⌊i·n/o⌋, ⌈(i+1)·n/o⌉) (``AdaptiveAvgPoolKernel.cpp``), one matrix per dimension."""
    def fn(x, output_size):
        mats = [_adaptive_matrix(x.shape[-nd + i], output_size[i]) for i in range(nd)]
        return _apply(x, mats, transpose=False)
    return fn


def adaptive_avg_pool_backward(nd: int):
    """``_adaptive_avg_poolNd_backward(grad_output, self)``: windows [⌊i·n/o⌋, ⌈(i+1)·n/o⌉)."""
    def fn(grad_output, x):
        mats = [_adaptive_matrix(x.shape[-nd + i], grad_output.shape[-nd + i]) for i in range(nd)]
        return _apply(grad_output, mats, transpose=True)
    return fn


def replication_pad_backward(nd: int):
    """``replication_padNd_backward(grad_output, self, padding)``: output i reads input
    ``clamp(i - pad_before, 0, n - 1)``; the gradient sums back through that one-hot matrix.
    ``padding`` lists (before, after) pairs from the last dimension backwards, as ``F.pad``."""
    def fn(grad_output, x, padding):
        mats = []
        for i in range(nd):
            d = x.dim() - nd + i
            before = padding[2 * (nd - 1 - i)]
            n, o = x.shape[d], grad_output.shape[d]
            src = torch.clamp(torch.arange(o) - before, 0, n - 1)
            mats.append(_band(src, src + 1, n, torch.ones(o)))
        return _apply(grad_output, mats, transpose=True)
    return fn


def _aa_filter(x: torch.Tensor, bicubic: bool) -> torch.Tensor:
    """ATen's antialias filters: the triangle (bilinear) or Keys' cubic with a = -0.5 (bicubic)."""
    ax = x.abs()
    if not bicubic:
        return torch.clamp(1.0 - ax, min=0.0)
    a = -0.5
    near = ((a + 2.0) * ax - (a + 3.0)) * ax * ax + 1.0
    far = ((a * ax - 5.0 * a) * ax + 8.0 * a) * ax - 4.0 * a
    return torch.where(ax < 1.0, near, torch.where(ax < 2.0, far, torch.zeros_like(ax)))


def _aa_matrix(n: int, o: int, align_corners: bool, scale: float | None, bicubic: bool,
               forward: bool = True) -> torch.Tensor:
    """(o, n) float64 weights of antialiased resampling along one dimension (ATen
    ``UpSampleKernel.cpp``, ``_compute_indices_min_size_weights_aa``): output i is centred at
    ``s·(i + 0.5)`` in input coordinates (``s`` from ``area_pixel_compute_scale``); when shrinking
    (s > 1) the filter is stretched by ``s`` (support ``s`` for the triangle, ``2s`` for the cubic),
    so every input pixel contributes; taps outside ``[0, n)`` are dropped and each row is
    normalised to sum 1. In the forward a dimension whose size does not change is copied whatever
    the scale, as ATen's separable kernel skips it (its backward applies the scale: so does ours).

    Eager differs in one degenerate case: with an output width of 1 and a height that changes,
    ATen's forward gives every output row the first row's weights (measured, torch 2.13); the
    backward, and this matrix, weight each row at its own centre."""
    if forward and n == o:
        return torch.eye(n, dtype=torch.float64)
    if align_corners:
        s = (n - 1) / (o - 1) if o > 1 else 0.0
    else:
        s = 1.0 / scale if scale is not None and scale > 0 else n / o
    support = (2.0 if bicubic else 1.0) * (s if s >= 1.0 else 1.0)
    inv = 1.0 / s if s >= 1.0 else 1.0
    center = s * (torch.arange(o, dtype=torch.float64) + 0.5)
    lo = torch.clamp(torch.trunc(center - support + 0.5), min=0.0)
    hi = torch.clamp(torch.trunc(center + support + 0.5), max=float(n))
    j = torch.arange(n, dtype=torch.float64)[None, :]
    w = _aa_filter((j - center[:, None] + 0.5) * inv, bicubic)
    w = torch.where((j >= lo[:, None]) & (j < hi[:, None]), w, torch.zeros_like(w))
    total = w.sum(-1, keepdim=True)
    return w / torch.where(total == 0, torch.ones_like(total), total)


def upsample_aa(bicubic: bool):
    """``_upsample_{bilinear,bicubic}2d_aa(x, output_size, align_corners, scales_h, scales_w)``:
    ``Wh @ x @ Wwᵀ`` over the last two dims (:func:`_aa_matrix`), as ``F.interpolate(...,
    antialias=True)``; float inputs only (ATen's uint8 path rounds integer weights)."""
    def fn(x, output_size, align_corners, scales_h=None, scales_w=None):
        mats = [_aa_matrix(x.shape[-2], output_size[0], align_corners, scales_h, bicubic),
                _aa_matrix(x.shape[-1], output_size[1], align_corners, scales_w, bicubic)]
        return _apply(x, mats, transpose=False)
    return fn


def upsample_aa_backward(bicubic: bool):
    """``_upsample_{bilinear,bicubic}2d_aa_backward(grad_output, output_size, input_size,
    align_corners, scales_h, scales_w)``: ``Whᵀ @ g @ Ww``."""
    def fn(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        mats = [_aa_matrix(input_size[-2], output_size[0], align_corners, scales_h, bicubic, forward=False),
                _aa_matrix(input_size[-1], output_size[1], align_corners, scales_w, bicubic, forward=False)]
        return _apply(grad_output, mats, transpose=True)
    return fn
