"""Max pooling with indices as one pass over strided views of the padded input.

``max_pool{2,3}d_with_indices`` as ATen's CPU kernel (``cpu_max_pool`` in ``MaxPoolKernel.cpp``)
computes it: per output position, the window's taps are visited in row-major order, a tap is taken
when ``val > max || isnan(val)`` (so the last NaN wins), and the running maximum starts at ``-inf``
with the index of the window's first position inside the input (a window of ``-inf`` returns that
position). Here the input is padded with ``-inf`` (a padded tap is never taken: it is not greater
than anything and not NaN), and each tap ``t`` is a strided view of the padded input,
``xp[..., t·d : t·d + (o - 1)·s + 1 : s]`` per spatial dim: every output position reads its tap
``t`` at the same place in that view. The taps' comparisons and selects are elementwise over the
output, so they fuse into one vectorized loop over the output (a strided read, not a gather).

torch's reference decomposition gathers every window by index, permutes and reduces with
``max.dim``: ResNet-18's 3×3/2 pool (16×64×32×32) took 6 ms in three kernels, two of them on
``loops`` (now 1 ms, eager 8 ms; AMD Zen 4, 1 thread), and returned the first NaN of a window
where eager returns the last, and a padding position for a window of ``-inf``.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch
import torch.nn.functional as F

from neuron_compile.passes.separable import _pool_out


# taps unrolled into one elementwise kernel at most (each is one strided read and a compare-select
# per output element); a larger window's taps are stacked and reduced (:func:`_gathered`)
MAX_TAPS = 64


def _per_dim(v: int | Sequence[int], nd: int) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * nd if len(v) == 1 else v


def _lowest(dtype: torch.dtype) -> float | int:
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def max_pool_with_indices(x: torch.Tensor, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False,
                          *, nd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of an ``nd``-dimensional max pool over the last ``nd`` dims of ``x``
    ([..., spatial]); ``indices`` (int64) are flat positions in the input's plane, as ATen's.
    Arguments as ``max_pool{nd}d_with_indices`` (``stride`` empty: the kernel size)."""
    k, p, d = _per_dim(kernel_size, nd), _per_dim(padding, nd), _per_dim(dilation, nd)
    s = _per_dim(stride, nd) if stride else list(k)
    spatial = list(x.shape[-nd:])
    out = [_pool_out(n, d[i] * (k[i] - 1) + 1, s[i], p[i], ceil_mode) for i, n in enumerate(spatial)]
    # padded so that every tap's view is in bounds: p before, enough after for the last window
    after = [max(0, (o - 1) * s[i] + d[i] * (k[i] - 1) + 1 - p[i] - spatial[i]) for i, o in enumerate(out)]
    pads = [v for i in reversed(range(nd)) for v in (p[i], after[i])]
    lowest = _lowest(x.dtype)
    xp = F.pad(x, pads, value=lowest) if any(pads) else x
    plane_stride = [math.prod(spatial[i + 1:]) for i in range(nd)]
    tap_stride = [math.prod(k[i + 1:]) for i in range(nd)]

    def grid(per_dim: list[torch.Tensor], weight: list[int]) -> torch.Tensor:
        """Σ_i per_dim[i] · weight[i], broadcast over the output's spatial shape."""
        return sum((v * weight[i]).reshape([-1 if j == i else 1 for j in range(nd)]) for i, v in enumerate(per_dim))

    starts = [torch.arange(o) * s[i] - p[i] for i, o in enumerate(out)]
    # the running argmax is a tap number (int32, a scalar per tap: no index tensor read per tap),
    # starting at the window's first tap inside the input; its flat position is computed once
    first_tap = grid([((-st).clamp(min=0) + d[i] - 1) // d[i] for i, st in enumerate(starts)], tap_stride)
    if math.prod(k) <= MAX_TAPS:
        best, best_tap = _tap_chain(xp, k, s, d, out, first_tap.to(torch.int32))
    else:
        best, best_tap = _gathered(xp, k, s, d, out, first_tap)
    tap_at = best_tap.to(torch.int64)
    index = grid(starts, plane_stride) + sum((tap_at // tap_stride[i]) % k[i] * (d[i] * plane_stride[i])
                                             for i in range(nd))
    return best, index


def _tap_view(xp: torch.Tensor, tap: Sequence[int], s: list[int], d: list[int], out: list[int]) -> torch.Tensor:
    """Tap ``tap`` of every window of the padded ``xp``: a strided view of the output's shape."""
    nd = len(tap)
    lead = [slice(None)] * (xp.dim() - nd)
    return xp[tuple(lead + [slice(j * d[i], j * d[i] + (out[i] - 1) * s[i] + 1, s[i]) for i, j in enumerate(tap)])]


def _tap_chain(xp, k, s, d, out, first_tap):
    """(max, its tap number) per window, one compare-select per tap in row-major order (ATen's
    visiting order and rule: ``val > max || isnan(val)``), from ``first_tap``."""
    best, best_tap = torch.full((), _lowest(xp.dtype), dtype=xp.dtype), first_tap
    for t, tap in enumerate(itertools.product(*(range(n) for n in k))):
        view = _tap_view(xp, tap, s, d, out)
        take = view > best
        if xp.dtype.is_floating_point:
            take = take | torch.isnan(view)
        best = torch.where(take, view, best)
        best_tap = torch.where(take, torch.full((), t, dtype=first_tap.dtype), best_tap)
    return best, best_tap


def _gathered(xp, k, s, d, out, first_tap):
    """:func:`_tap_chain`'s result for windows of more than :data:`MAX_TAPS` taps (a chain that
    long overflows the lowering's recursion): the taps stacked on a last dim and reduced there.
    Same rule: the first maximum, else (any NaN) the last NaN, else (all ``-inf``) ``first_tap``."""
    nd = len(k)
    index = []    # per dim, [out, k] positions o·s + t·d, broadcast to [o_0.., k_0..] (a gather)
    for i in range(nd):
        at = torch.arange(out[i])[:, None] * s[i] + torch.arange(k[i])[None, :] * d[i]
        index.append(at.reshape([out[j] if j == i else 1 for j in range(nd)] + [k[j] if j == i else 1 for j in range(nd)]))
    taps = xp[(Ellipsis, *index)]
    n = math.prod(k)
    taps = taps.reshape(*taps.shape[:-nd], n)
    best = taps.amax(-1)
    first_max = taps.argmax(-1)
    tap = torch.where(best == _lowest(xp.dtype), first_tap, first_max)
    if xp.dtype.is_floating_point:
        nan = torch.isnan(taps)
        last_nan = (n - 1) - nan.flip(-1).to(torch.uint8).argmax(-1)
        tap = torch.where(nan.any(-1), last_nan, tap)
    return best, tap


def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, nd=2)


def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, nd=3)
