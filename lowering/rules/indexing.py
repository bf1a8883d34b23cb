"""Lowering rules for gathers and scatters (``embedding``, ``gather``, ``index``, ``scatter``, ``index_put``).

Gathers are a ``linalg.generic`` over the output whose region reads the source with
``tensor.extract``. Scatters with accumulation are an ``scf.for`` over the updates, each step an
``insert_slice`` of the updated row (in place after bufferization). Indices are wrapped (negative
values count from the end, as in ``torch.index``) and then clamped into range so that a bad index
can never read or write outside a buffer; eager PyTorch would raise instead.
"""
from __future__ import annotations

import math

import torch

from neuron_compile.lowering.context import BodyBuilder, LoweringContext
from neuron_compile.lowering.ir import Scalar, TensorValue, affine_map, numel, tensor_type
from neuron_compile.lowering.lazy import LazyTensor
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten


def _safe_index(b: BodyBuilder, idx: Scalar, size: int) -> Scalar:
    """``idx`` wrapped (negative: from the end) and clamped into ``[0, size)``: an index out of
    range reads the nearest row instead of outside the tensor (eager raises ``IndexError``).

    Raises:
        IndexError: ``size`` is 0 (only reached when the result is not empty): every index is out of
            range and there is no row to clamp to (reading one crashed the process); the emitter
            reports it as a ``LoweringError`` naming the op and the user's line.
    """
    if size == 0:
        raise IndexError("indexing a dimension of size 0: every index is out of range (eager raises "
                         "IndexError when the model runs); check the tensor being indexed")
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


ROW_GATHER_MIN = 16   # elements per row from which whole rows are copied (below: one generic)


def _gather_rows(ctx: LoweringContext, src: TensorValue, idx: TensorValue) -> TensorValue:
    """``out[i...] = src[idx[i...]]`` for whole rows of ``src`` (``embedding``, ``index_select``
    on dim 0): an ``scf.forall`` over the index tensor (the ``forall-loop`` strategy runs it on
    the thread pool), each iteration one ``tensor.extract_slice`` of a source row put into the
    output with ``tensor.parallel_insert_slice``, which bufferize into one contiguous ``memcpy``
    per row. As one ``linalg.generic`` reading ``tensor.extract`` per element the gather stayed
    scalar loops (the vectorizer makes a ``vector.gather`` of it: it cannot tell that the row
    index is uniform across a vector): embedding 50257×768 at (8, 128) ran at 0.07-0.10x eager.
    Indices wrap and clamp as :func:`_safe_index` (eager raises on an index out of range; a
    kernel cannot)."""
    idx = ctx.materialize(idx)
    rows = tuple(src.shape[1:])
    out_shape = tuple(idx.shape) + rows
    init = ctx.empty(out_shape, src.dtype)
    if numel(out_shape) == 0:
        return init
    nm, lines, loc = ctx.body.namer, ctx.body.lines, ctx.loc
    tag, info = ctx.tagged_kernel("loop", [src, idx], [init])
    info.attrs["forall"] = True
    ctx.body.used_as_init(init)
    ivs, shared, res = [nm("i") for _ in idx.shape], nm("acc"), nm("t")
    lines.append(f"    {res} = scf.forall ({', '.join(ivs)}) in ({', '.join(map(str, idx.shape))}) "
                 f"shared_outs({shared} = {init.name}) -> ({init.type}) {{")
    b = BodyBuilder(nm, lines, indent="      ", loc=loc)
    raw = b._emit(f"tensor.extract {idx.name}[{', '.join(ivs)}] : {idx.type}", idx.dtype)
    safe = _safe_index(b, raw, src.shape[0])
    r, row = nm("x"), nm("t")
    row_t = tensor_type(rows, src.dtype)
    tail = ", ".join(map(str, rows))
    lines += [f"      {r} = arith.index_cast {safe.name} : i64 to index",
              f"      {row} = tensor.extract_slice {src.name}[{r}{', 0' * len(rows)}] [1, {tail}] "
              f"[{', '.join(['1'] * src.rank)}] : {src.type} to {row_t}",
              "      scf.forall.in_parallel {",
              f"        tensor.parallel_insert_slice {row} into {shared}[{', '.join(ivs)}{', 0' * len(rows)}] "
              f"[{', '.join(['1'] * idx.rank)}, {tail}] [{', '.join(['1'] * len(out_shape))}] : {row_t} into {init.type}",
              "      }",
              f"    }} {tag} {loc}"]
    ctx.body.add_kernel(info)
    return TensorValue(res, out_shape, src.dtype)


@register_lowering(aten.embedding.default)
def lower_embedding(ctx: LoweringContext, weight: TensorValue, indices: TensorValue, padding_idx=-1,
                    scale_grad_by_freq=False, sparse=False) -> TensorValue:
    out_shape, _ = ctx.out_spec()
    k = indices.rank
    if weight.rank == 2 and k >= 1 and weight.shape[1] >= ROW_GATHER_MIN:
        return _gather_rows(ctx, weight, indices)

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
    if index.rank == 0:  # a 0-d index selects like a 1-element one (eager's result keeps the dim)
        index = ctx.reshape(ctx.materialize(index), (1,))
    if dim == 0 and x.rank >= 2 and index.rank == 1 and numel(x.shape[1:]) >= ROW_GATHER_MIN:
        return _gather_rows(ctx, x, index)

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


# how a scattered value merges into the running result at its target
_COMBINE = {"assign": lambda b, acc, v: v, "sum": lambda b, acc, v: b.add(acc, v),
            "prod": lambda b, acc, v: b.mul(acc, v), "amax": lambda b, acc, v: b.maximum(acc, v),
            "amin": lambda b, acc, v: b.minimum(acc, v)}
_COMBINE["mean"], _COMBINE["add"], _COMBINE["multiply"] = _COMBINE["sum"], _COMBINE["sum"], _COMBINE["prod"]


def _scatter(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src, combine: str,
             include_self: bool = True, need_count: bool = False) -> tuple[TensorValue, TensorValue | None]:
    """(out, count): every src element whose ``index`` along ``dim`` is j merges into
    ``out[..j..]`` in index order, starting from ``x`` (``include_self``) or from the first such
    element; count is how many merged (``None`` unless ``need_count``: an int64 tensor of x's
    shape, which cross-entropy's one-hot gradient, 128x50257, wrote and filled for nothing: 51 MB
    each). Positions nothing scatters to keep ``x``.

    One ``linalg.generic`` over (out dims + k, the position along ``dim`` in index): parallel over
    the output, no data-dependent writes. ``index`` may be smaller than ``x`` outside ``dim``
    (read at clamped coordinates, counted only inside its extent); ``src`` is a tensor or a
    Python scalar."""
    counted = need_count or not include_self  # the first element of a merge is found by its count
    count0 = ctx.fill(x.shape, torch.int64, 0) if counted else None
    if index.shape[dim] == 0 or numel(index.shape) == 0:
        return x, count0
    src = ctx.materialize(src) if isinstance(src, (TensorValue, LazyTensor)) else src
    out_map = affine_map(x.rank + 1, [f"d{d}" for d in range(x.rank)])
    size, merge = x.shape[dim], _COMBINE[combine]
    clipped = [d for d in range(x.rank) if d != dim and index.shape[d] < x.shape[d]]

    def body(b: BodyBuilder, args: list[Scalar]) -> list[Scalar]:
        acc, cnt = args[1], args[2] if counted else None
        coords, inside = [], b.const(True, torch.bool)
        for d in range(x.rank):
            if d == dim:
                coords.append(b.index(x.rank))
            elif d in clipped:
                i, last = b.index(d), b.const(index.shape[d] - 1, torch.int64)
                inside = b.logical_and(inside, b.cmp("le", i, last))
                coords.append(b.minimum(i, last))
            else:
                coords.append(b.index(d))
        val = b.cast(b.extract(src, coords), x.dtype) if isinstance(src, TensorValue) else b.const(src, x.dtype)
        hit = b.logical_and(inside, b.cmp("eq", _safe_index(b, b.extract(index, coords), size), b.index(dim)))
        merged = merge(b, acc, val)
        if not include_self:
            merged = b.select(b.cmp("eq", cnt, b.const(0, torch.int64)), val, merged)
        out = b.select(hit, merged, acc)
        return [out, b.add(cnt, b.cast(hit, torch.int64))] if counted else [out]
    k_extent = ctx.fill((index.shape[dim],), torch.bool, False)  # gives the k loop its bound
    results = ctx.generic_multi([k_extent], [affine_map(x.rank + 1, [f"d{x.rank}"])],
                                [x, count0] if counted else [x], [out_map, out_map] if counted else [out_map],
                                ["parallel"] * x.rank + ["reduction"], body)
    return results[0], results[1] if counted else None


def _scatter_rule(ctx: LoweringContext, x, dim: int, index, src, combine: str, include_self: bool = True,
                  need_count: bool = False):
    if x.rank == 0:  # as a one-element 1-d scatter
        one = [ctx.reshape(ctx.materialize(t), (1,)) if isinstance(t, (TensorValue, LazyTensor)) and t.rank == 0
               else t for t in (x, index, src)]
        out, count = _scatter(ctx, one[0], 0, one[1], one[2], combine, include_self, need_count)
        return ctx.reshape(out, ()), (ctx.reshape(count, ()) if count is not None else None)
    return _scatter(ctx, x, dim % x.rank, index, src, combine, include_self, need_count)


@register_lowering(aten.scatter.value, aten.scatter.src)
def lower_scatter(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src) -> TensorValue:
    """``Tensor.scatter``: the last src element (in index order) with ``index == j`` wins."""
    return _scatter_rule(ctx, x, dim, index, src, "assign")[0]


@register_lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def lower_scatter_with_reduce(ctx: LoweringContext, x, dim: int, index, src, *, reduce: str) -> TensorValue:
    """``Tensor.scatter(..., reduce='add'|'multiply')``."""
    return _scatter_rule(ctx, x, dim, index, src, reduce)[0]


@register_lowering(aten.scatter_add.default)
def lower_scatter_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: TensorValue
                      ) -> TensorValue:
    return _scatter_rule(ctx, x, dim, index, src, "sum")[0]


@register_lowering(aten.scatter_reduce.two)
def lower_scatter_reduce(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: TensorValue,
                         reduce: str, *, include_self: bool = True):
    """``Tensor.scatter_reduce`` (sum, prod, mean, amax, amin), from ``x`` or, without
    ``include_self``, from the first scattered element. ``mean`` divides by the count (plus one
    with ``include_self``), flooring for integers, as ATen's CPU kernel."""
    out, count = _scatter_rule(ctx, x, dim, index, src, reduce, include_self, need_count=reduce == "mean")
    if reduce != "mean":
        return out

    def mean(b, v, c):
        n = b.cast(b.add(c, b.const(1 if include_self else 0, torch.int64)), x.dtype)
        q = b.div(v, n) if x.dtype.is_floating_point else b.floordiv(v, n)
        return b.select(b.cmp("eq", c, b.const(0, torch.int64)), v, q)
    return ctx.elementwise(mean, [out, count], x.shape, x.dtype, compute_dtype=[x.dtype, torch.int64])


@register_lowering(aten.index_put.default, aten._unsafe_index_put.default)
def lower_index_put(ctx: LoweringContext, x: TensorValue, indices, values, accumulate=False) -> TensorValue:
    """``x[indices] (+)= values`` (``Tensor.index_put``) for integer index tensors at any dims.

    The indexed dims are permuted to the front and their (broadcast) index tensors combined into
    one linear index over them (each wrapped if negative and clamped into range first), which
    reduces the op to :func:`_index_put_rows`; values follow ``x[indices]``'s layout (index dims
    in place when the index tensors are adjacent, first otherwise). Boolean masks select a
    data-dependent number of elements and are refused."""
    pos = [d for d, i in enumerate(indices) if i is not None]
    if not pos:
        return x
    if any(indices[d].dtype == torch.bool for d in pos):
        if len(pos) == 1 and numel(tuple(values.shape)) == 1:  # x[mask] = v: a select, no gather
            return _masked_put_scalar(ctx, x, pos[0], indices[pos[0]], values, accumulate)
        raise ctx.unsupported("index_put with a boolean mask and a values tensor (a data-dependent "
                              "number of elements)")
    if pos == [0] and len(indices) >= 1:
        return _index_put_rows(ctx, x, indices[0], values, accumulate)
    rest = [d for d in range(x.rank) if d not in pos]
    xt = ctx.permute(ctx.materialize(x), pos + rest)
    bshape = tuple(torch.broadcast_shapes(*(tuple(indices[d].shape) for d in pos)))
    sizes = [x.shape[d] for d in pos]
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]

    def linear(s, *idx):
        total = s.const(0, torch.int64)
        for v, size, stride in zip(idx, sizes, strides):
            total = s.add(total, s.mul(_safe_index(s, v, size), s.const(stride, torch.int64)))
        return total
    lin = ctx.materialize(ctx.elementwise(linear, [indices[d] for d in pos], bshape, torch.int64,
                                          compute_dtype=[indices[d].dtype for d in pos]))
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    before, after = [x.shape[d] for d in rest if d < pos[0]], [x.shape[d] for d in rest if d > pos[0]]
    target = (*before, *bshape, *after) if adjacent else (*bshape, *before, *after)
    vals = ctx.materialize(ctx.broadcast_to(ctx.cast(values, x.dtype), target))
    if adjacent and before:  # index dims first, then the others in order
        nb, nB = len(before), len(bshape)
        vals = ctx.permute(vals, list(range(nb, nb + nB)) + list(range(nb)) + list(range(nb + nB, len(target))))
    flat = ctx.reshape(xt, (math.prod(sizes), *(x.shape[d] for d in rest)))
    out = ctx.reshape(_index_put_rows(ctx, flat, lin, vals, accumulate), xt.shape)
    inverse = [0] * x.rank
    for i, d in enumerate(pos + rest):
        inverse[d] = i
    return ctx.permute(out, inverse)


def _masked_put_scalar(ctx: LoweringContext, x, dim: int, mask, value, accumulate: bool) -> TensorValue:
    """``x[..., mask, ...] (+)= v`` for one value: ``where(mask, v, x)`` (``x + where(mask, v, 0)``)
    with the mask's dims aligned at ``dim``."""
    shape = (1,) * dim + tuple(mask.shape) + (1,) * (x.rank - dim - mask.rank)
    m = ctx.reshape(ctx.materialize(mask), shape)
    v = ctx.reshape(ctx.materialize(value), ())

    def fn(s, xv, mv, vv):
        if accumulate:
            vv = s.select(mv, vv, s.const(0, x.dtype))
            return s.logical_or(xv, vv) if x.dtype == torch.bool else s.add(xv, vv)
        return s.select(mv, vv, xv)
    return ctx.elementwise(fn, [x, m, v], x.shape, x.dtype, compute_dtype=[x.dtype, torch.bool, x.dtype])


def _index_put_rows(ctx: LoweringContext, x: TensorValue, idx: TensorValue, values, accumulate: bool
                    ) -> TensorValue:
    """``x[idx] (+)= values`` for one integer index tensor on dim 0: an ``scf.for`` over the index
    elements updating one row (slice) per step, in order (so duplicates accumulate like eager)."""
    x, idx = ctx.materialize(x), ctx.materialize(idx)
    n = numel(idx.shape)
    row_shape = x.shape[1:]
    flat_idx = ctx.reshape(idx, (n,))
    vals = ctx.broadcast_to(ctx.cast(values, x.dtype), tuple(idx.shape) + tuple(row_shape))
    vals = ctx.reshape(vals, (n,) + tuple(row_shape))
    if n == 0:
        return x
    nm, lines, loc = ctx.body.namer, ctx.body.lines, ctx.loc
    tag, info = ctx.tagged_kernel("loop", [vals, flat_idx], [x])
    ctx.body.used_as_init(x)
    c0, c1, cn, i, acc, res = nm("c"), nm("c"), nm("c"), nm("i"), nm("acc"), nm("t")
    lines += [f"    {c0} = arith.constant 0 : index", f"    {c1} = arith.constant 1 : index",
              f"    {cn} = arith.constant {n} : index",
              f"    {res} = scf.for {i} = {c0} to {cn} step {c1} iter_args({acc} = {x.name}) -> ({x.type}) {{"]
    ctx.body.updates[res] = (x, len(lines) - 1)  # x updated in place (lowering/emit.py _store_output)
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
              f"    }} {tag} {loc}"]
    ctx.body.add_kernel(info)
    return TensorValue(res, x.shape, x.dtype)
