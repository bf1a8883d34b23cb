"""Lowering rules for reductions: one ``linalg.generic`` with ``reduction`` iterators each.

Identities and NaN behaviour follow ``torch/_refs/__init__.py`` (``amax`` propagates NaN, hence
``arith.maximumf``). Floating sums accumulate in the result dtype, as ATen does for float32.
"""
from __future__ import annotations

import math

import torch

from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue, affine_map
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten
FUSION_KIND = "reduction"


def _dims(x: TensorValue, dim) -> list[int]:
    """ATen's convention: ``None`` or ``[]`` reduces every dimension (a 0-d tensor has none)."""
    if x.rank == 0:
        return []
    if dim is None:
        return list(range(x.rank))
    if isinstance(dim, int):
        dim = [dim]
    return list(range(x.rank)) if len(dim) == 0 else [d % max(x.rank, 1) for d in dim]


SHORT_SUM = 4096
"""Longest reduction (elements per output) a float32/16 sum accumulates in float32."""


def _acc_dtype(dtype: torch.dtype, count: int, innermost: bool = True) -> torch.dtype:
    """The accumulator of a sum of ``count`` elements per output.

    A sequential float32 sum of ``n`` terms errs by at most ``n·u`` of ``Σ|x|`` (``u = 2⁻²⁴``; Higham,
    *Accuracy and Stability of Numerical Algorithms*, §4.2), typically ``√n·u``: for 1M elements that
    is ~1e-4 relative, where ATen's cascade summation stays near 1e-7 (measured), so long sums
    accumulate in float64. Up to :data:`SHORT_SUM` elements (rows of softmax, layer_norm, attention,
    bias gradients) float32 stays within ATen's float32 tolerances, the vector strategies keep 8–32
    partial sums, and a float64 accumulator would halve the SIMD width and add a conversion per
    element (layer_norm 4096×1024: 6.4 → 5.3 ms, 1 thread). float16/bfloat16 sums always
    accumulate in at least float32, as ATen's ``opmath_type``. Only a reduction over the innermost
    (contiguous) dim has those partial sums: a column reduction (``innermost=False``: a bias
    gradient) adds its reduced extent one after another per output, so it keeps float64 (float32
    over 512 rows erred 6e-5 where eager's cascade erred 6e-6, measured).
    """
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return dtype
    return torch.float32 if count <= SHORT_SUM and innermost else torch.float64


def _innermost(x: TensorValue, dims) -> bool:
    """Whether the reduction covers ``x``'s innermost dim (vectorized with partial sums)."""
    return x.rank == 0 or (x.rank - 1) in dims


def _sum(ctx: LoweringContext, x: TensorValue, dims, keepdim: bool, dtype: torch.dtype):
    acc = _acc_dtype(dtype, math.prod(x.shape[d] for d in dims), _innermost(x, dims))
    total = ctx.reduce(x, dims, keepdim, 0, lambda b, a, v: b.add(a, v), acc)
    return ctx.cast(total, dtype)


@register_lowering(aten.sum.dim_IntList)
def lower_sum(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None) -> TensorValue:
    _, out_dtype = ctx.out_spec()
    return _sum(ctx, x, _dims(x, dim), keepdim, out_dtype)


@register_lowering(aten.sum.default)
def lower_sum_all(ctx: LoweringContext, x, *, dtype=None) -> TensorValue:
    _, out_dtype = ctx.out_spec()
    return _sum(ctx, x, _dims(x, None), False, out_dtype)


def _mean(ctx: LoweringContext, x: TensorValue, dims, keepdim: bool) -> TensorValue:
    shape, out_dtype = ctx.out_spec()
    count = math.prod(x.shape[d] for d in dims)
    acc = _acc_dtype(out_dtype, count, _innermost(x, dims))
    total = ctx.reduce(x, dims, keepdim, 0, lambda b, a, v: b.add(a, v), acc)
    return ctx.elementwise(lambda b, s: b.div(s, b.const(float(count), acc)), [total], shape, out_dtype,
                           compute_dtype=acc)


@register_lowering(aten.mean.dim)
def lower_mean(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None) -> TensorValue:
    return _mean(ctx, x, _dims(x, dim), keepdim)


@register_lowering(aten.mean.default)
def lower_mean_all(ctx: LoweringContext, x, *, dtype=None) -> TensorValue:
    return _mean(ctx, x, _dims(x, None), False)


def _extreme(kind: str):
    def rule(ctx: LoweringContext, x, dim=(), keepdim=False) -> TensorValue:
        _, dtype = ctx.out_spec()
        if dtype.is_floating_point:
            init = -math.inf if kind == "max" else math.inf
        elif dtype == torch.bool:
            init = kind != "max"
        else:
            info = torch.iinfo(dtype)
            init = info.min if kind == "max" else info.max
        combine = (lambda b, acc, v: b.maximum(acc, v)) if kind == "max" else (lambda b, acc, v: b.minimum(acc, v))
        if dtype == torch.bool:
            combine = (lambda b, acc, v: b.logical_or(acc, v)) if kind == "max" else \
                (lambda b, acc, v: b.logical_and(acc, v))
        return ctx.reduce(x, _dims(x, dim), keepdim, init, combine, dtype)
    rule.__name__ = f"lower_a{kind}"
    return rule


register_lowering(aten.amax.default)(_extreme("max"))
register_lowering(aten.amin.default)(_extreme("min"))


@register_lowering(aten.prod.default, aten.prod.dim_int)
def lower_prod(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None) -> TensorValue:
    _, out_dtype = ctx.out_spec()
    return ctx.reduce(x, _dims(x, dim), keepdim, 1, lambda b, acc, v: b.mul(acc, v), out_dtype)


@register_lowering(aten.any.default, aten.any.dim, aten.any.dims)
def lower_any(ctx: LoweringContext, x, dim=None, keepdim=False) -> TensorValue:
    return ctx.reduce(x, _dims(x, dim), keepdim, False, lambda b, acc, v: b.logical_or(acc, v), torch.bool)


@register_lowering(aten.all.default, aten.all.dim, aten.all.dims)
def lower_all(ctx: LoweringContext, x, dim=None, keepdim=False) -> TensorValue:
    return ctx.reduce(x, _dims(x, dim), keepdim, True, lambda b, acc, v: b.logical_and(acc, v), torch.bool)


def _var_mean(ctx: LoweringContext, x: TensorValue, dim, correction, keepdim: bool, dtype: torch.dtype):
    """Two-pass variance ``Σ(x-μ)²/(N-correction)``; the two-pass form is what ATen's reference uses
    for accuracy (Chan et al., *Algorithms for computing the sample variance*, 1983)."""
    dims = _dims(x, dim)
    count = math.prod(x.shape[d] for d in dims)
    corr = 1 if correction is None else correction
    acc = _acc_dtype(dtype, count, _innermost(x, dims))
    mean_k = ctx.reduce(x, dims, True, 0, lambda b, a, v: b.add(a, v), acc)
    mean_k = ctx.elementwise(lambda b, s: b.div(s, b.const(float(count), acc)), [mean_k], mean_k.shape, acc,
                             compute_dtype=acc)
    centred = ctx.elementwise(lambda b, v, m: b.mul(b.sub(v, m), b.sub(v, m)), [x, mean_k], x.shape, acc,
                              compute_dtype=acc)
    ssq = ctx.reduce(centred, dims, keepdim, 0, lambda b, a, v: b.add(a, v), acc)
    denom = max(count - corr, 0)
    var = ctx.elementwise(lambda b, s: b.div(s, b.const(float(denom), acc)), [ssq], ssq.shape, dtype,
                          compute_dtype=acc)
    mean_k = ctx.cast(mean_k, dtype)
    mean = mean_k if keepdim else ctx.reshape(mean_k, var.shape)
    return var, mean


@register_lowering(aten.var_mean.correction)
def lower_var_mean(ctx: LoweringContext, x, dim=None, *, correction=None, keepdim=False):
    _, dtype = ctx.out_spec(0)
    return _var_mean(ctx, x, dim, correction, keepdim, dtype)


@register_lowering(aten.var.correction)
def lower_var(ctx: LoweringContext, x, dim=None, *, correction=None, keepdim=False) -> TensorValue:
    _, dtype = ctx.out_spec()
    return _var_mean(ctx, x, dim, correction, keepdim, dtype)[0]


def _arg_extreme(ctx: LoweringContext, x, dim, keepdim: bool, kind: str):
    """(values, indices) of the max/min along ``dim`` (the whole tensor, flattened, if ``dim`` is
    None), one ``linalg.generic`` with two outputs. As ATen: the first extreme wins ties, and NaN
    counts as the extreme (its first position is returned)."""
    x = ctx.materialize(x)
    if dim is None:
        x, dim = ctx.reshape(x, (math.prod(x.shape),)), 0
    if x.rank == 0:
        x, dim = ctx.reshape(x, (1,)), 0
    dim = dim % x.rank
    kept = [i for i in range(x.rank) if i != dim]
    out_shape = tuple(x.shape[i] for i in kept)
    floating = x.dtype.is_floating_point
    if floating:
        start = -math.inf if kind == "max" else math.inf
    elif x.dtype == torch.bool:
        start = kind != "max"
    else:
        info = torch.iinfo(x.dtype)
        start = info.min if kind == "max" else info.max
    inits = [ctx.fill(out_shape, x.dtype, start), ctx.fill(out_shape, torch.int64, 0)]
    out_map = affine_map(x.rank, [f"d{i}" for i in kept])

    def body(b, args):
        v, best, best_i = args
        i = b.index(dim)
        better = b.cmp("gt" if kind == "max" else "lt", v, best)
        if floating:
            v_nan, best_nan = b.isnan(v), b.isnan(best)
            better = b.logical_and(b.logical_or(better, v_nan), b.logical_not(best_nan))
        # the first position always initialises the running best (covers an all -inf/NaN slice)
        better = b.logical_or(better, b.cmp("eq", i, b.const(0, torch.int64)))
        return [b.select(better, v, best), b.select(better, i, best_i)]

    vals, idx = ctx.generic_multi([x], [ctx.identity_map(x.rank)], inits, [out_map, out_map],
                                  ["reduction" if i == dim else "parallel" for i in range(x.rank)], body)
    if keepdim:
        shape = tuple(1 if i == dim else s for i, s in enumerate(x.shape))
        vals, idx = ctx.reshape(vals, shape), ctx.reshape(idx, shape)
    return vals, idx


@register_lowering(aten.argmax.default)
def lower_argmax(ctx: LoweringContext, x, dim=None, keepdim=False) -> TensorValue:
    shape, _ = ctx.out_spec()
    return ctx.reshape(_arg_extreme(ctx, x, dim, keepdim, "max")[1], shape)


@register_lowering(aten.argmin.default)
def lower_argmin(ctx: LoweringContext, x, dim=None, keepdim=False) -> TensorValue:
    shape, _ = ctx.out_spec()
    return ctx.reshape(_arg_extreme(ctx, x, dim, keepdim, "min")[1], shape)


def _values_indices(ctx: LoweringContext, x, dim, keepdim: bool, kind: str):
    (vshape, _), (ishape, _) = ctx.out_spec(0), ctx.out_spec(1)
    vals, idx = _arg_extreme(ctx, x, dim, keepdim, kind)
    return ctx.reshape(vals, vshape), ctx.reshape(idx, ishape)  # a 0-d input keeps 0-d, keepdim or not


@register_lowering(aten.max.dim)
def lower_max_dim(ctx: LoweringContext, x, dim, keepdim=False):
    return _values_indices(ctx, x, dim, keepdim, "max")


@register_lowering(aten.min.dim)
def lower_min_dim(ctx: LoweringContext, x, dim, keepdim=False):
    return _values_indices(ctx, x, dim, keepdim, "min")


@register_lowering(aten.max.default)
def lower_max_all(ctx: LoweringContext, x) -> TensorValue:
    return _extreme("max")(ctx, x)


@register_lowering(aten.min.default)
def lower_min_all(ctx: LoweringContext, x) -> TensorValue:
    return _extreme("min")(ctx, x)


def _scan(ctx: LoweringContext, x, dim: int, kind: str):
    """Inclusive prefix sum/product along ``dim``: ``out[..i..] = Σ_{j ≤ i} x[..j..]`` as one generic
    over (out dims + j) with a mask, O(n²) in the scan length (a parallel form; a sequential scan
    loop would be O(n) — fine for the sequence lengths of position ids and masks)."""
    shape, dtype = ctx.out_spec()
    x = ctx.materialize(ctx.cast(x, dtype))
    if x.rank == 0:
        return x
    dim = dim % x.rank
    r = x.rank
    j = f"d{r}"
    x_map = affine_map(r + 1, [j if d == dim else f"d{d}" for d in range(r)])
    acc = _acc_dtype(dtype, x.shape[dim], innermost=False) if kind == "sum" else dtype  # ATen scans: double
    init = ctx.fill(shape, acc, 0 if kind == "sum" else 1)

    def body(b, args):
        v, a = b.cast(args[0], acc), args[1]
        take = b.cmp("le", b.index(r), b.index(dim))
        ident = b.const(0 if kind == "sum" else 1, acc)
        v = b.select(take, v, ident)
        return b.add(a, v) if kind == "sum" else b.mul(a, v)
    out = ctx.generic([x], [x_map], init, affine_map(r + 1, [f"d{d}" for d in range(r)]),
                      ["parallel"] * r + ["reduction"], body)
    return ctx.cast(out, dtype)


@register_lowering(aten.cumsum.default)
def lower_cumsum(ctx: LoweringContext, x, dim, *, dtype=None):
    return _scan(ctx, x, dim, "sum")


@register_lowering(aten.cumprod.default)
def lower_cumprod(ctx: LoweringContext, x, dim, *, dtype=None):
    return _scan(ctx, x, dim, "prod")


def _scan_extreme(ctx: LoweringContext, x, dim: int, kind: str):
    """``cummax``/``cummin`` along ``dim``: (values, int64 indices), O(n²) like :func:`_scan`.
    As ATen's ``cummax_cummin_helper``: a later element replaces the running best when it is
    NaN, or when the best is not NaN and the element is ``>=`` (``<=``) it, so ties and NaNs
    report their latest index."""
    x = ctx.materialize(x)
    if x.rank == 0:
        return x, ctx.fill((), torch.int64, 0)
    dim, r = dim % x.rank, x.rank
    x_map = affine_map(r + 1, [f"d{r}" if d == dim else f"d{d}" for d in range(r)])
    out_map = affine_map(r + 1, [f"d{d}" for d in range(r)])
    inits = [ctx.fill(x.shape, x.dtype, 0), ctx.fill(x.shape, torch.int64, 0)]

    def body(b, args):
        v, best, best_i = args
        j, i = b.index(r), b.index(dim)
        upd = b.cmp("ge" if kind == "max" else "le", v, best)
        if x.dtype.is_floating_point:
            v_nan, best_nan = b.isnan(v), b.isnan(best)
            upd = b.logical_or(v_nan, b.logical_and(b.logical_not(best_nan), upd))
        upd = b.logical_or(upd, b.cmp("eq", j, b.const(0, torch.int64)))
        upd = b.logical_and(upd, b.cmp("le", j, i))
        return [b.select(upd, v, best), b.select(upd, j, best_i)]
    return tuple(ctx.generic_multi([x], [x_map], inits, [out_map, out_map],
                                   ["parallel"] * r + ["reduction"], body))


@register_lowering(aten.cummax.default)
def lower_cummax(ctx: LoweringContext, x, dim):
    return _scan_extreme(ctx, x, dim, "max")


@register_lowering(aten.cummin.default)
def lower_cummin(ctx: LoweringContext, x, dim):
    return _scan_extreme(ctx, x, dim, "min")


@register_lowering(aten.logcumsumexp.default)
def lower_logcumsumexp(ctx: LoweringContext, x, dim):
    """``log Σ_{j ≤ i} exp(x_j)`` along ``dim``, shifted by the running maximum m_i for stability
    (m_i taken as 0 when infinite, so all -inf gives -inf and any +inf gives +inf)."""
    shape, dtype = ctx.out_spec()
    x = ctx.materialize(ctx.cast(x, dtype))
    if x.rank == 0:
        return x
    dim, r = dim % x.rank, x.rank
    x_map = affine_map(r + 1, [f"d{r}" if d == dim else f"d{d}" for d in range(r)])
    out_map = affine_map(r + 1, [f"d{d}" for d in range(r)])
    its = ["parallel"] * r + ["reduction"]

    def running_max(b, args):
        v, m = args
        return b.select(b.cmp("le", b.index(r), b.index(dim)), b.maximum(v, m), m)
    m = ctx.generic([x], [x_map], ctx.fill(shape, dtype, -math.inf), out_map, its, running_max)
    m = ctx.elementwise(lambda s, v: s.select(s.cmp("eq", s.abs(v), s.const(math.inf, dtype)),
                                              s.const(0.0, dtype), v), [m], shape, dtype)
    m = ctx.materialize(m)
    acc = _acc_dtype(dtype, x.shape[dim], innermost=False)

    def sum_exp(b, args):
        v, mi, a = args
        e = b.cast(b.exp(b.sub(v, mi)), acc)
        return b.add(a, b.select(b.cmp("le", b.index(r), b.index(dim)), e, b.const(0.0, acc)))
    s = ctx.generic([x, m], [x_map, out_map], ctx.fill(shape, acc, 0.0), out_map, its, sum_exp)
    return ctx.elementwise(lambda b, sv, mi: b.add(b.unary("math.log", b.cast(sv, dtype)), mi),
                           [s, m], shape, dtype, compute_dtype=[acc, dtype])
