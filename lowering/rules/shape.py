"""Lowering rules for view and shape ops on tensor values.

On tensors a "view" is a value: ``view``/``reshape`` are row-major reshapes
(``tensor.collapse_shape``/``expand_shape``), ``permute`` is ``linalg.transpose``, ``slice`` is
``tensor.extract_slice``, ``expand`` is a broadcast indexing map. Aliasing of graph outputs is
restored by the runtime from the FX node metadata, not here.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue, numel
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten
prims = torch.ops.prims


@register_lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                   aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
                   aten.view.dtype)
def lower_view(ctx: LoweringContext, x: TensorValue, *args) -> TensorValue:
    shape, dtype = ctx.out_spec()
    if dtype != x.dtype:
        raise ctx.unsupported("view with a dtype change (bitcast) is not supported")
    return ctx.reshape(x, shape)


@register_lowering(aten.permute.default)
def lower_permute(ctx: LoweringContext, x: TensorValue, dims) -> TensorValue:
    return ctx.permute(x, dims)


@register_lowering(aten.transpose.int)
def lower_transpose(ctx: LoweringContext, x: TensorValue, d0: int, d1: int) -> TensorValue:
    perm = list(range(x.rank))
    if x.rank:
        d0, d1 = d0 % x.rank, d1 % x.rank
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.permute(x, perm)


@register_lowering(aten.t.default)
def lower_t(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return ctx.permute(x, [1, 0]) if x.rank == 2 else x


@register_lowering(aten.expand.default, prims.broadcast_in_dim.default)
def lower_expand(ctx: LoweringContext, x: TensorValue, *args, **kwargs) -> TensorValue:
    shape, _ = ctx.out_spec()
    if ctx.node.target == prims.broadcast_in_dim.default:
        dims = args[1]
        tmp = [1] * len(shape)
        for i, d in enumerate(dims):
            tmp[d] = x.shape[i]
        x = ctx.reshape(x, tmp)
    return ctx.broadcast_to(x, shape)


def _slice_bounds(size: int, start, end, step: int) -> tuple[int, int, int]:
    """Python/ATen slice normalisation (clamped, negative indices wrap) → (offset, length, step)."""
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, (end - start + step - 1) // step, step


@register_lowering(aten.slice.Tensor)
def lower_slice(ctx: LoweringContext, x: TensorValue, dim=0, start=None, end=None, step=1) -> TensorValue:
    dim = dim % x.rank
    off, length, step = _slice_bounds(x.shape[dim], start, end, step)
    offsets = [0] * x.rank
    sizes = list(x.shape)
    strides = [1] * x.rank
    offsets[dim], sizes[dim], strides[dim] = off, length, step
    return ctx.extract_slice(x, offsets, sizes, strides)


@register_lowering(aten.select.int)
def lower_select(ctx: LoweringContext, x: TensorValue, dim: int, index: int) -> TensorValue:
    dim = dim % x.rank
    index = index % x.shape[dim]
    offsets = [0] * x.rank
    sizes = list(x.shape)
    offsets[dim], sizes[dim] = index, 1
    sl = ctx.extract_slice(x, offsets, sizes, [1] * x.rank)
    shape, _ = ctx.out_spec()
    return ctx.reshape(sl, shape)


@register_lowering(aten.cat.default)
def lower_cat(ctx: LoweringContext, tensors, dim=0) -> TensorValue:
    shape, dtype = ctx.out_spec()
    dim = dim % len(shape)
    out = ctx.empty(shape, dtype)
    offset, pieces = 0, []
    for t in tensors:
        if t.rank == 1 and t.shape[0] == 0 and len(shape) != 1:
            continue  # legacy: cat skips 1-D empty tensors
        t = ctx.cast(t, dtype)
        offsets = [0] * len(shape)
        offsets[dim] = offset
        out = ctx.insert_slice(t, out, offsets)
        pieces.append((t, offsets))
        offset += t.shape[dim]
    if isinstance(out, TensorValue) and pieces:
        ctx.body.concats[out.name] = pieces   # (a copy of it into a larger buffer takes the pieces)
    return out


@register_lowering(aten.slice_scatter.default)
def lower_slice_scatter(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim=0, start=None, end=None,
                        step=1) -> TensorValue:
    dim = dim % x.rank
    off, _, step = _slice_bounds(x.shape[dim], start, end, step)
    offsets = [0] * x.rank
    strides = [1] * x.rank
    offsets[dim], strides[dim] = off, step
    return ctx.insert_slice(ctx.cast(src, x.dtype), x, offsets, strides)


@register_lowering(aten.select_scatter.default)
def lower_select_scatter(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim: int, index: int
                         ) -> TensorValue:
    dim = dim % x.rank
    index = index % x.shape[dim]
    shape = list(x.shape)
    shape[dim] = 1
    offsets = [0] * x.rank
    offsets[dim] = index
    return ctx.insert_slice(ctx.reshape(ctx.cast(src, x.dtype), shape), x, offsets)


@register_lowering(aten.flip.default, prims.rev.default)
def lower_flip(ctx: LoweringContext, x: TensorValue, dims) -> TensorValue:
    """Reverse ``dims``: a gather reading index ``size - 1 - i`` along each of them."""
    from neuron_compile.lowering.context import BodyBuilder
    flipped = {d % x.rank for d in dims} if x.rank else set()
    init = ctx.empty(x.shape, x.dtype)

    def body(b: BodyBuilder, args):
        coords = []
        for d in range(x.rank):
            i = b.index(d)
            coords.append(b.sub(b.const(x.shape[d] - 1, torch.int64), i) if d in flipped else i)
        return b.extract(x, coords)
    return ctx.generic([], [], init, ctx.identity_map(x.rank), ["parallel"] * x.rank, body)


@register_lowering(aten.constant_pad_nd.default)
def lower_constant_pad_nd(ctx: LoweringContext, x: TensorValue, pad, value=0) -> TensorValue:
    """``F.pad(x, pad, value=v)``: a tensor full of ``v`` with (the kept part of) ``x`` inserted.
    ``pad`` lists (before, after) pairs from the last dim backwards; negative pads crop."""
    shape, dtype = ctx.out_spec()
    offsets_in, sizes, offsets_out = [0] * x.rank, list(x.shape), [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        if before < 0:
            offsets_in[d], sizes[d] = -before, sizes[d] + before
        else:
            offsets_out[d] = before
        if after < 0:
            sizes[d] += after
    out = ctx.fill(shape, dtype, value)
    if any(s <= 0 for s in sizes):
        return out
    # a lazy x (a fused pointwise producer) is computed straight into the padded output unless cropped
    kept = x if list(sizes) == list(x.shape) else ctx.extract_slice(ctx.materialize(x), offsets_in, sizes, [1] * x.rank)
    return ctx.insert_slice(ctx.cast(kept, dtype), out, offsets_out)


@register_lowering(aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int)
def lower_split(ctx: LoweringContext, x: TensorValue, sizes_or_size=None, dim=0):
    """The pieces of ``x`` along ``dim`` (each an ``extract_slice``, free until materialised)."""
    outs = ctx.out_meta
    if ctx.node.target == aten.unbind.int:
        dim = sizes_or_size if sizes_or_size is not None else 0
    dim = dim % x.rank
    pieces, offset = [], 0
    for meta in outs:
        shape = tuple(int(s) for s in meta.shape)
        length = 1 if ctx.node.target == aten.unbind.int else shape[dim]
        offsets = [0] * x.rank
        sizes = list(x.shape)
        offsets[dim], sizes[dim] = offset, length
        piece = ctx.extract_slice(x, offsets, sizes, [1] * x.rank)
        pieces.append(ctx.reshape(piece, shape))
        offset += length
    return tuple(pieces)


def _nested_order(shape, stride) -> list[int] | None:
    """Dims of a strided view by decreasing stride, if each stride exceeds the span of the smaller
    ones (then a storage index splits back into one index per dim by division); else None."""
    dims = sorted((d for d, n in enumerate(shape) if n > 1), key=lambda d: stride[d])
    span = 0
    for d in dims:
        if stride[d] <= span:
            return None
        span += (shape[d] - 1) * stride[d]
    return dims[::-1]


def _reads_only_elements(src, size, stride, offset: int) -> bool:
    """True if every storage index the ``as_strided`` view reads is an element of ``src``."""
    def positions(shape, strides, start):
        at = np.full((), start, dtype=np.int64)
        for d, (n, st) in enumerate(zip(shape, strides)):
            at = at + (np.arange(n, dtype=np.int64) * st).reshape([n if k == d else 1 for k in range(len(shape))])
        return at.reshape(-1)
    return bool(np.isin(positions(size, stride, offset),
                        positions(tuple(src.shape), tuple(src.stride()), src.storage_offset())).all())


@register_lowering(aten.as_strided.default)
def lower_as_strided(ctx: LoweringContext, x: TensorValue, size, stride, storage_offset=None) -> TensorValue:
    """``as_strided`` as a gather. Storage index ``p = offset + Σ i_k·stride_k`` of each output
    element; where the input's metadata is contiguous from offset 0 that is the flat index, else
    ``p`` is split back into the input's indices by its strides, largest first (the input must not
    overlap itself and the view must read only the input's own elements, as ``diagonal`` of a
    transposed or sliced tensor does; anything else is declined)."""
    from neuron_compile.lowering.context import BodyBuilder
    from neuron_compile.lowering.ir import contiguous_strides
    src = ctx.node.args[0].meta["val"]
    shape, _ = ctx.out_spec()
    offset = src.storage_offset() if storage_offset is None else storage_offset
    contiguous = src.storage_offset() == 0 and tuple(src.stride()) == contiguous_strides(tuple(src.shape))
    order = None if contiguous else _nested_order(tuple(src.shape), tuple(src.stride()))
    if not contiguous and (order is None or not _reads_only_elements(src, size, stride, offset)):
        raise ctx.unsupported("as_strided reading storage outside its non-contiguous input")
    source = ctx.reshape(x, (numel(x.shape),)) if contiguous else x
    init = ctx.empty(shape, x.dtype)

    def body(b: BodyBuilder, args):
        pos = b.const(offset if contiguous else offset - src.storage_offset(), torch.int64)
        for d, st in enumerate(stride):
            pos = b.add(pos, b.mul(b.index(d), b.const(st, torch.int64)))
        if contiguous:
            return b.extract(source, [pos])
        indices = [b.const(0, torch.int64)] * x.rank
        for d in order:
            st = b.const(src.stride()[d], torch.int64)
            indices[d], pos = b.floordiv(pos, st), b.rem(pos, st)
        return b.extract(source, indices)
    return ctx.generic([], [], init, ctx.identity_map(len(shape)), ["parallel"] * len(shape), body)
