"""Lowering rules for ordering ops: ``sort``, ``topk``, ``searchsorted``, ``bucketize``.

All are written as counting reductions, a parallel form with no data-dependent control flow:
an element's position in sorted order is its *rank*, the number of elements that sort before it
(ties broken by index, so the sort is stable, as ATen's CPU sort is); a ``searchsorted`` index is
the number of boundaries below the value. Both are O(n²) (sort) or O(n·m) (search) in the sorted
length: fine for the lengths of top-k heads and bucket boundaries, not for sorting millions of
elements (a merge-sort network would be the next step).

NaN orders after every number (before, when descending), as in ``torch.sort``.
"""
from __future__ import annotations

import torch

from neuron_compile.lowering.context import LoweringContext, result_dtype
from neuron_compile.lowering.ir import TensorValue, affine_map
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten
FUSION_KIND = "opaque"


def _sorts_before(b, xj, xi, j, i, descending: bool):
    """Whether element j sorts before element i (stable: ties go by index)."""
    nj, ni = b.isnan(xj), b.isnan(xi)
    if descending:
        strictly = b.logical_or(b.cmp("gt", xj, xi), b.logical_and(nj, b.logical_not(ni)))
    else:
        strictly = b.logical_or(b.cmp("lt", xj, xi), b.logical_and(ni, b.logical_not(nj)))
    equal = b.logical_or(b.cmp("eq", xj, xi), b.logical_and(nj, ni))
    return b.logical_or(strictly, b.logical_and(equal, b.cmp("lt", j, i)))


def _ranks(ctx: LoweringContext, x: TensorValue, dim: int, descending: bool) -> TensorValue:
    """int64 tensor shaped like ``x``: each element's position along ``dim`` in sorted order."""
    r = x.rank
    ident = affine_map(r + 1, [f"d{d}" for d in range(r)])
    other = affine_map(r + 1, [f"d{r}" if d == dim else f"d{d}" for d in range(r)])

    def body(b, args):
        xi, xj, acc = args
        before = _sorts_before(b, xj, xi, b.index(r), b.index(dim), descending)
        return b.add(acc, b.cast(before, torch.int64))
    return ctx.generic([x, x], [ident, other], ctx.fill(x.shape, torch.int64, 0), ident,
                       ["parallel"] * r + ["reduction"], body)


def _gather_by_rank(ctx: LoweringContext, x: TensorValue, ranks: TensorValue, dim: int, k: int):
    """(values, indices) of the first ``k`` positions in sorted order along ``dim``."""
    r = x.rank
    out_shape = tuple(k if d == dim else s for d, s in enumerate(x.shape))
    src = affine_map(r + 1, [f"d{r}" if d == dim else f"d{d}" for d in range(r)])
    out = affine_map(r + 1, [f"d{d}" for d in range(r)])
    inits = [ctx.fill(out_shape, x.dtype, 0), ctx.fill(out_shape, torch.int64, 0)]

    def body(b, args):
        v, rank, acc_v, acc_i = args
        hit = b.cmp("eq", rank, b.index(dim))
        return [b.select(hit, v, acc_v), b.select(hit, b.index(r), acc_i)]
    return tuple(ctx.generic_multi([x, ranks], [src, src], inits, [out, out],
                                   ["parallel"] * r + ["reduction"], body))


def _sorted_prefix(ctx: LoweringContext, x, dim: int, descending: bool, k: int | None):
    x = ctx.materialize(x)
    if x.rank == 0:
        return x, ctx.fill((), torch.int64, 0)
    dim = dim % x.rank
    k = x.shape[dim] if k is None else k
    return _gather_by_rank(ctx, x, _ranks(ctx, x, dim, descending), dim, k)


@register_lowering(aten.sort.default)
def lower_sort(ctx: LoweringContext, x, dim=-1, descending=False):
    """``torch.sort``: (values, int64 indices), stable, NaN last (first when descending)."""
    return _sorted_prefix(ctx, x, dim, descending, None)


@register_lowering(aten.sort.stable)
def lower_sort_stable(ctx: LoweringContext, x, *, stable=None, dim=-1, descending=False):
    return _sorted_prefix(ctx, x, dim, descending, None)


@register_lowering(aten.topk.default)
def lower_topk(ctx: LoweringContext, x, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    """``torch.topk``: the ``k`` largest (smallest) along ``dim``, in sorted order; equal values
    keep index order; NaN counts as the largest value, as in ATen."""
    return _sorted_prefix(ctx, x, dim, largest, k)


def _search(ctx: LoweringContext, seq, values, right: bool, out_int32: bool) -> TensorValue:
    """``out[..., n] = #{m : !(seq[..., m] >= values[..., n])}`` (``>`` when ``right``); ``seq`` is 1-D
    (shared by every value) or has the values' leading dimensions."""
    seq = ctx.materialize(seq)
    if not isinstance(values, TensorValue) and not hasattr(values, "rank"):
        values = ctx.fill((), seq.dtype, values)
    values = ctx.materialize(values)
    compute = result_dtype(seq, values)
    r = values.rank
    if seq.rank == 1:
        seq_map = affine_map(r + 1, [f"d{r}"])
    else:
        seq_map = affine_map(r + 1, [f"d{d}" for d in range(r - 1)] + [f"d{r}"])
    val_map = affine_map(r + 1, [f"d{d}" for d in range(r)])
    out_dtype = torch.int32 if out_int32 else torch.int64

    def body(b, args):
        s, v, acc = b.cast(args[0], compute), b.cast(args[1], compute), args[2]
        # ATen's binary search steps right when !(s >= v) (!(s > v) when right); as a count over
        # a sorted sequence that is the same index, NaNs included
        below = b.logical_not(b.cmp("gt" if right else "ge", s, v))
        return b.add(acc, b.cast(below, out_dtype))
    return ctx.generic([seq, values], [seq_map, val_map], ctx.fill(values.shape, out_dtype, 0), val_map,
                       ["parallel"] * r + ["reduction"], body)


@register_lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def lower_searchsorted(ctx: LoweringContext, seq, values, *, out_int32=False, right=False, side=None,
                       sorter=None):
    """``torch.searchsorted``. A ``sorter`` permutes the sequence, which a count does not depend on."""
    return _search(ctx, seq, values, right or side == "right", out_int32)


@register_lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def lower_bucketize(ctx: LoweringContext, values, boundaries, *, out_int32=False, right=False):
    """``torch.bucketize``: ``searchsorted(boundaries, values)`` with the same ``right`` flag."""
    return _search(ctx, boundaries, values, right, out_int32)
