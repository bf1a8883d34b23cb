"""Lowering rules for gathers and scatters (``embedding``, ``gather``, ``index``, ``scatter``, ``index_put``).

Gathers are a ``linalg.generic`` over the output whose region reads the source with
``tensor.extract``. Scatters with accumulation are an ``scf.for`` over the updates, each step an
``insert_slice`` of the updated row (in place after bufferization). Indices are wrapped (negative
values count from the end, as in ``torch.index``) and then clamped into range so that a bad index
can never read or write outside a buffer; eager PyTorch would raise instead.
"""
from __future__ import annotations

import torch

from neuron_compile.lowering.context import BodyBuilder, LoweringContext
from neuron_compile.lowering.ir import Scalar, TensorValue, affine_map, numel, tensor_type
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten


def _safe_index(b: BodyBuilder, idx: Scalar, size: int) -> Scalar:
    idx = b.cast(idx, torch.int64)
    zero, n = b.const(0, torch.int64), b.const(size, torch.int64)
    idx = b.select(b.cmp("lt", idx, zero), b.add(idx, n), idx)
    return b.minimum(b.maximum(idx, zero), b.const(max(size - 1, 0), torch.int64))


def _gather_generic(ctx: LoweringContext, src: TensorValue, indices: list[TensorValue], index_dims: list[int],
                    out_shape: tuple[int, ...], src_dim_for_out) -> TensorValue:
    """``out[p] = src[q(p)]`` where ``q`` reads index tensors (mapped by ``index_dims``)."""
    init = ctx.empty(out_shape, src.dtype)
    rank = len(out_shape)
    maps = [affine_map(rank, [f"d{d}" for d in dims]) for dims in index_dims]

    def body(b: BodyBuilder, args: list[Scalar]) -> Scalar:
        idx_vals = args[:len(indices)]
        coords = src_dim_for_out(b, idx_vals)
        return b.extract(src, coords)
    return ctx.generic(indices, maps, init, ctx.identity_map(rank), ["parallel"] * rank, body)


@register_lowering(aten.embedding.default)
def lower_embedding(ctx: LoweringContext, weight: TensorValue, indices: TensorValue, padding_idx=-1,
                    scale_grad_by_freq=False, sparse=False) -> TensorValue:
    out_shape, _ = ctx.out_spec()
    k = indices.rank

    def coords(b: BodyBuilder, idx):
        return [_safe_index(b, idx[0], weight.shape[0]), b.index(k)]
    return _gather_generic(ctx, weight, [indices], [list(range(k))], out_shape, coords)


@register_lowering(aten.gather.default)
def lower_gather(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, *, sparse_grad=False
                 ) -> TensorValue:
    out_shape, _ = ctx.out_spec()
    if x.rank == 0:
        return ctx.reshape(x, out_shape)
    dim = dim % x.rank

    def coords(b: BodyBuilder, idx):
        return [(_safe_index(b, idx[0], x.shape[d]) if d == dim else b.index(d)) for d in range(x.rank)]
    return _gather_generic(ctx, x, [index], [list(range(index.rank))], out_shape, coords)


@register_lowering(aten.index_select.default)
def lower_index_select(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    out_shape, _ = ctx.out_spec()
    if x.rank == 0:  # a 0-d tensor has one element: the (only valid) index 0 selects it
        return ctx.reshape(x, out_shape)
    dim = dim % max(x.rank, 1)

    def coords(b: BodyBuilder, idx):
        return [(_safe_index(b, idx[0], x.shape[d]) if d == dim else b.index(d)) for d in range(x.rank)]
    return _gather_generic(ctx, x, [index], [[dim]], out_shape, coords)


@register_lowering(aten.index.Tensor)
def lower_index(ctx: LoweringContext, x: TensorValue, indices) -> TensorValue:
    """Advanced indexing with adjacent index tensors (``x[:, i, j]``); broadcast index shapes."""
    out_shape, _ = ctx.out_spec()
    pos = [i for i, t in enumerate(indices) if t is not None]
    if pos != list(range(pos[0], pos[-1] + 1)):
        raise ctx.unsupported("index with non-adjacent index tensors is not supported")
    tensors = [indices[i] for i in pos]
    bshape = torch.broadcast_shapes(*[t.shape for t in tensors])
    first, nb = pos[0], len(bshape)

    def index_map(t: TensorValue) -> list[str]:
        lead = nb - t.rank
        return [("0" if s == 1 and bshape[lead + i] != 1 else f"d{first + lead + i}") for i, s in enumerate(t.shape)]

    init = ctx.empty(out_shape, x.dtype)
    rank = len(out_shape)
    maps = [affine_map(rank, index_map(t)) for t in tensors]

    def body(b: BodyBuilder, args: list[Scalar]) -> Scalar:
        coords = []
        for d in range(x.rank):
            if d < first:
                coords.append(b.index(d))
            elif d in pos:
                coords.append(_safe_index(b, args[d - first], x.shape[d]))
            else:
                coords.append(b.index(d - len(pos) + nb))
        return b.extract(x, coords)
    return ctx.generic(tensors, maps, init, ctx.identity_map(rank), ["parallel"] * rank, body)


def _scatter_dense(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src, accumulate: bool
                   ) -> TensorValue:
    """``out[..j..] = x[..j..] (+)= src[..k..]`` for every k with ``index[..k..] == j`` along ``dim``.

    Written as one generic over (out dims + k): parallel, no data-dependent writes.
    """
    dim = dim % x.rank
    if any(index.shape[d] != x.shape[d] for d in range(x.rank) if d != dim):
        raise ctx.unsupported("scatter with an index smaller than self outside `dim` is not supported")
    rank = x.rank + 1
    kd = f"d{x.rank}"
    idx_map = affine_map(rank, [kd if d == dim else f"d{d}" for d in range(x.rank)])
    ins = [index]
    maps = [idx_map]
    if isinstance(src, TensorValue):
        ins.append(src)
        maps.append(affine_map(rank, [kd if d == dim else f"d{d}" for d in range(x.rank)]))
    init = x
    out_map = affine_map(rank, [f"d{d}" for d in range(x.rank)])
    iters = ["parallel"] * x.rank + ["reduction"]
    size = x.shape[dim]

    def body(b: BodyBuilder, args: list[Scalar]) -> Scalar:
        idx = _safe_index(b, args[0], size)
        val = b.cast(args[1], x.dtype) if isinstance(src, TensorValue) else b.const(src, x.dtype)
        acc = args[-1]
        hit = b.cmp("eq", idx, b.index(dim))
        return b.select(hit, b.add(acc, val) if accumulate else val, acc)
    if index.shape[dim] == 0:
        return x
    return ctx.generic(ins, maps, init, out_map, iters, body)


@register_lowering(aten.scatter.value, aten.scatter.src)
def lower_scatter(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src) -> TensorValue:
    return _scatter_dense(ctx, x, dim, index, src, accumulate=False)


@register_lowering(aten.scatter_add.default)
def lower_scatter_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: TensorValue
                      ) -> TensorValue:
    return _scatter_dense(ctx, x, dim, index, src, accumulate=True)


@register_lowering(aten.index_put.default)
def lower_index_put(ctx: LoweringContext, x: TensorValue, indices, values: TensorValue, accumulate=False
                    ) -> TensorValue:
    """``x[idx] (+)= values`` for one index tensor on dim 0: an ``scf.for`` over the index
    elements updating one row (slice) per step, in order (so duplicates accumulate like eager)."""
    if len([i for i in indices if i is not None]) != 1 or indices[0] is None:
        raise ctx.unsupported("index_put with anything but one index tensor on dimension 0")
    idx = indices[0]
    if idx.dtype == torch.bool:
        raise ctx.unsupported("index_put with a boolean mask is not supported")
    n = numel(idx.shape)
    row_shape = x.shape[1:]
    flat_idx = ctx.reshape(idx, (n,))
    vals = ctx.broadcast_to(ctx.cast(values, x.dtype), tuple(idx.shape) + tuple(row_shape))
    vals = ctx.reshape(vals, (n,) + tuple(row_shape))
    if n == 0:
        return x
    nm, lines, loc = ctx.body.namer, ctx.body.lines, ctx.loc
    ctx.body.kernels += 1
    c0, c1, cn, i, acc, res = nm("c"), nm("c"), nm("c"), nm("i"), nm("acc"), nm("t")
    lines += [f"    {c0} = arith.constant 0 : index", f"    {c1} = arith.constant 1 : index",
              f"    {cn} = arith.constant {n} : index",
              f"    {res} = scf.for {i} = {c0} to {cn} step {c1} iter_args({acc} = {x.name}) -> ({x.type}) {{"]
    b = BodyBuilder(nm, lines, indent="      ", loc=loc)
    raw = b._emit(f"tensor.extract {flat_idx.name}[{i}] : {flat_idx.type}", idx.dtype)  # int index
    r = nm("x")
    safe = _safe_index(b, raw, x.shape[0])
    lines.append(f"      {r} = arith.index_cast {safe.name} : i64 to index")
    one_row = (1,) + tuple(row_shape)
    zeros = ", ".join(["0"] * len(row_shape))
    tail_sizes = ", ".join(map(str, row_shape))
    ones = ", ".join(["1"] * (len(row_shape) + 1))
    row_t = tensor_type(one_row, x.dtype)
    sep = ", " if row_shape else ""
    new_v, old_v, upd, outv = nm("t"), nm("t"), nm("t"), nm("t")
    lines.append(f"      {new_v} = tensor.extract_slice {vals.name}[{i}{sep}{zeros}] [1{sep}{tail_sizes}] [{ones}]"
                 f" : {vals.type} to {row_t}")
    if accumulate:
        lines.append(f"      {old_v} = tensor.extract_slice {acc}[{r}{sep}{zeros}] [1{sep}{tail_sizes}] [{ones}]"
                     f" : {x.type} to {row_t}")
        op = "arith.addf" if x.dtype.is_floating_point else ("arith.ori" if x.dtype == torch.bool else "arith.addi")
        sa, sb, so, ss = nm("a"), nm("a"), nm("a"), nm("s")
        rank = len(one_row)
        idm = affine_map(rank, [f"d{d}" for d in range(rank)])
        ety = row_t[len("tensor<"):-1].split("x")[-1]
        iters = ", ".join(['"parallel"'] * rank)
        lines += [f"      {upd} = linalg.generic {{indexing_maps = [{idm}, {idm}, {idm}], iterator_types = "
                  f"[{iters}]}} ins({old_v}, {new_v} : {row_t}, {row_t}) "
                  f"outs({old_v} : {row_t}) {{",
                  f"      ^bb0({sa}: {ety}, {sb}: {ety}, {so}: {ety}):",
                  f"        {ss} = {op} {sa}, {sb} : {ety}",
                  f"        linalg.yield {ss} : {ety}",
                  f"      }} -> {row_t}"]
    else:
        upd = new_v
    lines += [f"      {outv} = tensor.insert_slice {upd} into {acc}[{r}{sep}{zeros}] [1{sep}{tail_sizes}] [{ones}]"
              f" : {row_t} into {x.type}",
              f"      scf.yield {outv} : {x.type}",
              f"    }} {loc}"]
    return TensorValue(res, x.shape, x.dtype)
