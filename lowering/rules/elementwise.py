"""Lowering rules for pointwise ATen ops: each becomes one ``linalg.generic`` with broadcast maps.

Semantics follow PyTorch's reference implementations in ``torch/_refs/__init__.py``: arithmetic is
computed in the result dtype of type promotion (the node's ``meta['val'].dtype``), comparisons in the
promoted dtype of their operands.
"""
from __future__ import annotations

import math

import torch

from neuron_compile.errors import RuleDeclined
from neuron_compile.lowering.context import LoweringContext, result_dtype
from neuron_compile.lowering.ir import UNSIGNED, TensorValue
from neuron_compile.lowering.lazy import LazyTensor
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten
FUSION_KIND = "pointwise"
prims = torch.ops.prims


# float16/bfloat16 ops compute in float32 and round once per op, as ATen's CPU kernels (and
# Inductor's CPU codegen) do; a fused chain still rounds between ops, exactly like eager
_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _pointwise(ctx: LoweringContext, fn, *operands, compute=None) -> TensorValue:
    """``fn`` elementwise in ``compute`` (default: the output dtype, float16/bfloat16 upcast to float32).

    A float16/bfloat16 result takes its tensor operands of another dtype rounded to that dtype first,
    as ATen's TensorIterator casts every input to the common dtype before its kernel upcasts: float16
    ``fmod(x, torch.tensor(1.3))`` divides by float16(1.3); in float32 the float32 1.3 put results a
    whole divisor off where ``x`` is a multiple of float16(1.3)."""
    shape, dtype = ctx.out_spec()
    if dtype in _UPCAST:
        operands = tuple(ctx.cast(o, dtype) if isinstance(o, (TensorValue, LazyTensor)) and o.dtype != dtype
                         else o for o in operands)
    compute = compute or dtype
    return ctx.elementwise(fn, operands, shape, dtype, compute_dtype=_UPCAST.get(compute, compute))


def _with_alpha(ctx, a, b, alpha):
    if alpha is None or alpha == 1:
        return b, None
    return b, alpha


@register_lowering(aten.add.Tensor, aten.add.Scalar)
def lower_add(ctx: LoweringContext, a, b, alpha=1) -> TensorValue:
    if alpha != 1:
        return _pointwise(ctx, lambda s, x, y, al: s.add(x, s.mul(y, al)), a, b, alpha)
    return _pointwise(ctx, lambda s, x, y: s.add(x, y), a, b)


@register_lowering("prims::fma.default")
def lower_fma(ctx: LoweringContext, a, b, c) -> TensorValue:
    """Inductor's ``prims.fma(a, b, c) = a·b + c`` rounded once (``torch/_inductor/inductor_prims.py``),
    which Dynamo emits for ``addcmul_``/``addcdiv_`` with ``value=`` and ``add_`` with a tensor
    ``alpha`` (the optimizers' updates). Floats: ``math.fma``; integers: multiply, then add."""
    _, dtype = ctx.out_spec()
    if dtype.is_floating_point:
        return _pointwise(ctx, lambda s, x, y, z: s.fma(x, y, z), a, b, c)
    return _pointwise(ctx, lambda s, x, y, z: s.add(s.mul(x, y), z), a, b, c)


@register_lowering(aten.sub.Tensor, aten.sub.Scalar)
def lower_sub(ctx: LoweringContext, a, b, alpha=1) -> TensorValue:
    if alpha != 1:
        return _pointwise(ctx, lambda s, x, y, al: s.sub(x, s.mul(y, al)), a, b, alpha)
    return _pointwise(ctx, lambda s, x, y: s.sub(x, y), a, b)


@register_lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def lower_rsub(ctx: LoweringContext, a, b, alpha=1) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y, al: s.sub(y, s.mul(x, al)), a, b, alpha)


@register_lowering(aten.mul.Tensor, aten.mul.Scalar)
def lower_mul(ctx: LoweringContext, a, b) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.mul(x, y), a, b)


@register_lowering(aten.div.Tensor, aten.div.Scalar, prims.div.default)
def lower_div(ctx: LoweringContext, a, b) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.div(x, y), a, b)


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def lower_div_mode(ctx: LoweringContext, a, b, *, rounding_mode=None) -> TensorValue:
    if rounding_mode is None:
        return lower_div(ctx, a, b)
    if rounding_mode == "trunc":
        def fn(s, x, y):
            q = s.div(x, y)
            return s.unary("math.trunc", q) if q.dtype.is_floating_point else q
        return _pointwise(ctx, fn, a, b)
    if rounding_mode == "floor":
        return _pointwise(ctx, lambda s, x, y: s.floordiv(x, y), a, b)
    raise ctx.fail(f"unknown rounding_mode {rounding_mode!r}")


def _scalar_in_dtype(ctx: LoweringContext, b):
    """A Python number operand rounded to the output's dtype first, as eager's fmod and remainder
    kernels take it (float16 ``fmod(x, 1.3)`` divides by float16(1.3) = 1.2998..., computed in
    float32 the float32 1.3 gave results up to 2.3e-3 off)."""
    _, dtype = ctx.out_spec()
    if isinstance(b, float) and dtype in (torch.float16, torch.bfloat16):
        return torch.tensor(b, dtype=dtype).item()
    return b


@register_lowering(aten.remainder.Tensor, aten.remainder.Scalar)
def lower_remainder(ctx: LoweringContext, a, b) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.rem(x, y), a, _scalar_in_dtype(ctx, b))


@register_lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def lower_fmod(ctx: LoweringContext, a, b) -> TensorValue:
    """C ``fmod``: the result has the sign of the dividend (``arith.remf`` / ``arith.remsi``)."""
    b = _scalar_in_dtype(ctx, b)
    def fn(s, x, y):
        if x.dtype.is_floating_point:
            return s._bin("arith.remf", None, x, y)
        safe, is_m1 = s._safe_int_divisor(x, y)
        r = s._bin("", "arith.remsi", x, safe, uop="arith.remui")
        return r if x.dtype in UNSIGNED else s.select(is_m1, s.const(0, x.dtype), r)
    return _pointwise(ctx, fn, a, b)


@register_lowering(aten.atan2.default)
def lower_atan2(ctx: LoweringContext, a, b) -> TensorValue:
    """``atan2(a, b)`` in the promoted float dtype (``math.atan2``, libm ``atan2f``)."""
    return _pointwise(ctx, lambda s, x, y: s._bin("math.atan2", None, x, y), a, b)


@register_lowering(aten.copysign.Tensor, aten.copysign.Scalar)
def lower_copysign(ctx: LoweringContext, a, b) -> TensorValue:
    """``|a|`` with the sign bit of ``b`` (``math.copysign``), in the promoted float dtype."""
    return _pointwise(ctx, lambda s, x, y: s._bin("math.copysign", None, x, y), a, b)


@register_lowering(aten.fmax.default)
def lower_fmax(ctx: LoweringContext, a, b) -> TensorValue:
    """Maximum that ignores a NaN operand (C ``fmax``; ``arith.maxnumf``), NaN only if both are."""
    return _pointwise(ctx, lambda s, x, y: s._bin("arith.maxnumf", "arith.maxsi", x, y, uop="arith.maxui"), a, b)


@register_lowering(aten.fmin.default)
def lower_fmin(ctx: LoweringContext, a, b) -> TensorValue:
    """Minimum that ignores a NaN operand (C ``fmin``; ``arith.minnumf``)."""
    return _pointwise(ctx, lambda s, x, y: s._bin("arith.minnumf", "arith.minsi", x, y, uop="arith.minui"), a, b)


@register_lowering(aten.hypot.default)
def lower_hypot(ctx: LoweringContext, a, b) -> TensorValue:
    """``sqrt(a² + b²)`` without intermediate overflow: ``m·sqrt(1 + (n/m)²)`` with m = max(|a|,|b|),
    n = min; ±inf in either operand gives +inf even when the other is NaN (C ``hypot``)."""
    def fn(s, x, y):
        ax, ay = s.abs(x), s.abs(y)
        m, n = s.maximum(ax, ay), s.minimum(ax, ay)
        zero, one = s.const(0.0, x.dtype), s.const(1.0, x.dtype)
        r = s.div(n, s.select(s.cmp("eq", m, zero), one, m))
        h = s.mul(m, s.sqrt(s.add(one, s.mul(r, r))))
        inf = s.const(float("inf"), x.dtype)
        return s.select(s.logical_or(s.cmp("eq", ax, inf), s.cmp("eq", ay, inf)), inf, h)
    return _pointwise(ctx, fn, a, b)


@register_lowering(aten.maximum.default)
def lower_maximum(ctx: LoweringContext, a, b) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.max_keep_first(x, y), a, b)


@register_lowering(aten.minimum.default)
def lower_minimum(ctx: LoweringContext, a, b) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.min_keep_first(x, y), a, b)


def _pow_scalar_exponent(s, x, e):
    """``x ** e`` for a Python exponent; the special cases mirror ATen's CPU pow kernel."""
    if isinstance(e, (int, float)) and float(e).is_integer() and 0 <= e <= 4:
        return s.fma_like_pow_int(x, int(e))
    if not x.dtype.is_floating_point:
        return s.pow(x, s.const(int(e), x.dtype))
    if e == 0.5:
        return s.sqrt(x)
    if e == -0.5:
        return s.rsqrt(x)
    if e == -1:
        return s.div(s.const(1.0, x.dtype), x)
    if e == -2:
        return s.div(s.const(1.0, x.dtype), s.mul(x, x))
    return s.pow(x, s.const(float(e), x.dtype))


@register_lowering(aten.pow.Tensor_Scalar)
def lower_pow_tensor_scalar(ctx: LoweringContext, a, exponent) -> TensorValue:
    return _pointwise(ctx, lambda s, x: _pow_scalar_exponent(s, x, exponent), a)


@register_lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def lower_pow(ctx: LoweringContext, a, b) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.pow(x, y), a, b)


# -- comparisons and logic ------------------------------------------------------------------------
def _comparison(pred: str):
    def rule(ctx: LoweringContext, a, b) -> TensorValue:
        return _pointwise(ctx, lambda s, x, y: s.cmp(pred, x, y), a, b, compute=result_dtype(a, b))
    rule.__name__ = f"lower_{pred}"
    return rule


for _pred in ("eq", "ne", "lt", "le", "gt", "ge"):
    _packet = getattr(aten, _pred)
    register_lowering(_packet.Tensor, _packet.Scalar)(_comparison(_pred))


def _logical(fn_name: str):
    def rule(ctx: LoweringContext, a, b) -> TensorValue:
        return _pointwise(ctx, lambda s, x, y: getattr(s, fn_name)(x, y), a, b, compute=torch.bool)
    rule.__name__ = f"lower_{fn_name}"
    return rule


register_lowering(aten.logical_and.default)(_logical("logical_and"))
register_lowering(aten.logical_or.default)(_logical("logical_or"))
register_lowering(aten.logical_xor.default)(_logical("logical_xor"))


@register_lowering(aten.logical_not.default)
def lower_logical_not(ctx: LoweringContext, a) -> TensorValue:
    return _pointwise(ctx, lambda s, x: s.logical_not(x), a, compute=torch.bool)


def _bitwise(op: str):
    def rule(ctx: LoweringContext, a, b) -> TensorValue:
        return _pointwise(ctx, lambda s, x, y: s.bitwise(op, x, y), a, b)
    rule.__name__ = f"lower_bitwise_{op}"
    return rule


for _op in ("and", "or", "xor"):
    _packet = getattr(aten, f"bitwise_{_op}")
    register_lowering(_packet.Tensor, _packet.Scalar)(_bitwise(_op))


def _shift(left: bool):
    def rule(ctx: LoweringContext, a, b) -> TensorValue:
        _, dtype = ctx.out_spec()
        if dtype.is_floating_point or dtype == torch.bool:
            raise RuleDeclined(f"shifts of {dtype} (eager: not implemented for this dtype)")
        return _pointwise(ctx, lambda s, x, y: s.shift(left, x, y), a, b)
    rule.__name__ = f"lower_{'left' if left else 'right'}_shift"
    return rule


register_lowering(aten.__lshift__.Tensor, aten.__lshift__.Scalar, aten.bitwise_left_shift.Tensor,
                  aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor)(_shift(True))
register_lowering(aten.__rshift__.Tensor, aten.__rshift__.Scalar, aten.bitwise_right_shift.Tensor,
                  aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor)(_shift(False))


@register_lowering(aten.bitwise_not.default)
def lower_bitwise_not(ctx: LoweringContext, a) -> TensorValue:
    def fn(s, x):
        if x.dtype == torch.bool:
            return s.logical_not(x)
        return s.bitwise("xor", x, s.const(-1, x.dtype))
    return _pointwise(ctx, fn, a)


@register_lowering(aten.where.self)
def lower_where(ctx: LoweringContext, cond, a, b) -> TensorValue:
    shape, dtype = ctx.out_spec()
    return ctx.elementwise(lambda s, c, x, y: s.select(c, x, y), [cond, a, b], shape, dtype,
                           compute_dtype=[torch.bool, dtype, dtype])


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def lower_clamp(ctx: LoweringContext, a, min=None, max=None) -> TensorValue:  # noqa: A002
    operands = [a] + [v for v in (min, max) if v is not None]

    def fn(s, x, *bounds):
        it = iter(bounds)
        if min is not None:
            x = s.max_keep_first(x, next(it))
        if max is not None:
            x = s.min_keep_first(x, next(it))
        return x
    return _pointwise(ctx, fn, *operands)


@register_lowering(aten.clamp_min.default)
def lower_clamp_min(ctx: LoweringContext, a, m) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.max_keep_first(x, y), a, m)


@register_lowering(aten.clamp_max.default)
def lower_clamp_max(ctx: LoweringContext, a, m) -> TensorValue:
    return _pointwise(ctx, lambda s, x, y: s.min_keep_first(x, y), a, m)


# -- unary math -------------------------------------------------------------------------------------
_UNARY_MATH = {
    aten.exp.default: "math.exp", aten.log.default: "math.log", aten.sqrt.default: "math.sqrt",
    aten.rsqrt.default: "math.rsqrt", aten.tanh.default: "math.tanh", aten.erf.default: "math.erf",
    aten.sin.default: "math.sin", aten.cos.default: "math.cos", aten.floor.default: "math.floor",
    aten.ceil.default: "math.ceil", aten.trunc.default: "math.trunc", aten.log1p.default: "math.log1p",
    aten.expm1.default: "math.expm1", aten.exp2.default: "math.exp2", aten.log2.default: "math.log2",
    aten.round.default: "math.roundeven", aten.acos.default: "math.acos", aten.asin.default: "math.asin",
    aten.atan.default: "math.atan", aten.acosh.default: "math.acosh", aten.asinh.default: "math.asinh",
    aten.atanh.default: "math.atanh", aten.cosh.default: "math.cosh", aten.sinh.default: "math.sinh",
    aten.tan.default: "math.tan", aten.log10.default: "math.log10", aten.erfc.default: "math.erfc",
}


# The sign bit of the NaN eager returns for an argument outside the op's domain (``sqrt(-1)``,
# ``acos(2)``, ``log1p(-3)``), per output dtype: True is a set sign bit. Measured on torch 2.13 and
# 2.14's CPU kernels (tests/e2e/test_ieee_details.py compares with eager); MLIR's math ops give the x86
# default NaN (sign set) or libm's (sign clear), which differ from these for the ops listed. float16
# and bfloat16 are computed in float32 and truncated, and LLVM keeps no NaN's sign through that.
_DOMAIN_NAN_NEGATIVE: dict[str, dict[torch.dtype, bool]] = {
    "math.sqrt": {torch.float32: False, torch.float64: False},
    "math.log2": {torch.float32: False, torch.float64: False},
    "math.acos": {torch.float32: True, torch.float64: True},
    "math.asin": {torch.float32: True, torch.float64: True},
    "math.log1p": {torch.float32: True, torch.float64: False},
}


def _unary(opname: str):
    def rule(ctx: LoweringContext, a) -> TensorValue:
        _, dtype = ctx.out_spec()
        if not dtype.is_floating_point:  # floor/ceil/round/trunc of integers are identities
            return _pointwise(ctx, lambda s, x: x, a)
        if opname in ("math.exp", "math.erf", "math.log", "math.tanh", "math.log1p", "math.expm1"):
            # accurate or inline (vectorizable) forms in the builder
            compute = lambda s, x: getattr(s, opname[5:])(x)  # noqa: E731
        else:
            compute = lambda s, x: s.unary(opname, x)  # noqa: E731
        negative = _DOMAIN_NAN_NEGATIVE.get(opname, {}).get(dtype)
        if negative is None:
            return _pointwise(ctx, compute, a)

        def with_eager_nan(s, x):
            r = compute(s, x)
            return s.domain_nan(r, s.fresh_nan(r, x), negative)
        return _pointwise(ctx, with_eager_nan, a)
    rule.__name__ = f"lower_{opname.split('.')[1]}"
    return rule


for _op, _name in _UNARY_MATH.items():
    register_lowering(_op)(_unary(_name))


@register_lowering(aten.neg.default)
def lower_neg(ctx: LoweringContext, a) -> TensorValue:
    return _pointwise(ctx, lambda s, x: s.neg(x), a)


@register_lowering(aten.abs.default)
def lower_abs(ctx: LoweringContext, a) -> TensorValue:
    return _pointwise(ctx, lambda s, x: s.abs(x), a)


@register_lowering(aten.reciprocal.default)
def lower_reciprocal(ctx: LoweringContext, a) -> TensorValue:
    return _pointwise(ctx, lambda s, x: s.div(s.const(1.0, x.dtype), x), a)


@register_lowering(aten.sigmoid.default)
def lower_sigmoid(ctx: LoweringContext, a) -> TensorValue:
    return _pointwise(ctx, lambda s, x: s.sigmoid(x), a)


@register_lowering(aten.relu.default)
def lower_relu(ctx: LoweringContext, a) -> TensorValue:
    return _pointwise(ctx, lambda s, x: s.max_keep_first(x, s.const(0, x.dtype)), a)


@register_lowering(aten.sign.default)
def lower_sign(ctx: LoweringContext, a) -> TensorValue:
    def fn(s, x):
        if x.dtype == torch.bool:
            return x
        zero = s.const(0, x.dtype)
        pos = s.cast(s.cmp("gt", x, zero), x.dtype)
        neg = s.cast(s.cmp("lt", x, zero), x.dtype)
        return s.sub(pos, neg)
    return _pointwise(ctx, fn, a)


@register_lowering(aten.signbit.default)
def lower_signbit(ctx: LoweringContext, a) -> TensorValue:
    """Whether the sign bit is set (so ``signbit(-0.0)`` is true): the float's bits as a signed
    integer, compared with 0; ``x < 0`` for integers."""
    def fn(s, x):
        if x.dtype == torch.bool or x.dtype in UNSIGNED:
            return s.const(False, torch.bool)
        if not x.dtype.is_floating_point:
            return s.cmp("lt", x, s.const(0, x.dtype))
        idt = {16: torch.int16, 32: torch.int32, 64: torch.int64}[x.dtype.itemsize * 8]
        bits = s._emit(f"arith.bitcast {x.name} : {x.type} to i{x.dtype.itemsize * 8}", idt)
        return s.cmp("lt", bits, s.const(0, idt))
    return _pointwise(ctx, fn, a, compute=a.dtype)


@register_lowering(aten.round.decimals)
def lower_round_decimals(ctx: LoweringContext, a, *, decimals=0) -> TensorValue:
    """Round half to even at ``decimals`` digits: ``round(x·10^d)/10^d`` (d ≥ 0) or
    ``round(x/10^-d)·10^-d`` (d < 0), as ATen's CPU kernel."""
    def fn(s, x):
        ten = s.const(10.0 ** abs(decimals), x.dtype)
        if decimals >= 0:
            return s.div(s.unary("math.roundeven", s.mul(x, ten)), ten)
        return s.mul(s.unary("math.roundeven", s.div(x, ten)), ten)
    return _pointwise(ctx, fn, a)


@register_lowering(aten.isnan.default)
def lower_isnan(ctx: LoweringContext, a) -> TensorValue:
    def fn(s, x):
        return s.isnan(x)
    return _pointwise(ctx, fn, a, compute=a.dtype)


@register_lowering(aten.gelu.default)
def lower_gelu(ctx: LoweringContext, a, approximate="none") -> TensorValue:
    """GELU (Hendrycks & Gimpel 2016): ``x/2 (1 + erf(x/√2))``, or the tanh form
    ``x/2 (1 + tanh(√(2/π)(x + 0.044715 x³)))`` when ``approximate='tanh'``; as ATen's CPU kernel."""
    def fn(s, x):
        half, one = s.const(0.5, x.dtype), s.const(1.0, x.dtype)
        if approximate == "tanh":
            k = s.const(math.sqrt(2.0 / math.pi), x.dtype)
            c = s.const(0.044715, x.dtype)
            inner = s.mul(k, s.add(x, s.mul(c, s.mul(x, s.mul(x, x)))))
            return s.mul(s.mul(half, x), s.add(one, s.tanh(inner)))
        return s.mul(s.mul(half, x), s.add(one, s.erf(s.mul(x, s.const(math.sqrt(0.5), x.dtype)))))
    return _pointwise(ctx, fn, a)


# -- dtype conversion and copies --------------------------------------------------------------------
@register_lowering(aten._to_copy.default)
def lower_to_copy(ctx: LoweringContext, a, *, dtype=None, layout=None, device=None, pin_memory=None,
                  non_blocking=False, memory_format=None) -> TensorValue:
    if device is not None and torch.device(device).type != "cpu":
        raise ctx.unsupported(f"device {device} is not supported (host CPU target)")
    _, out_dtype = ctx.out_spec()
    return ctx.cast(a, out_dtype) if out_dtype != a.dtype else a


@register_lowering(prims.convert_element_type.default)
def lower_convert_element_type(ctx: LoweringContext, a, dtype) -> TensorValue:
    return ctx.cast(a, dtype)


@register_lowering(aten.copy.default)
def lower_copy(ctx: LoweringContext, dst, src, non_blocking=False) -> TensorValue:
    """Functional ``copy``: ``src`` broadcast to ``dst``'s shape and cast to its dtype (``Tensor.copy_``)."""
    shape, dtype = ctx.out_spec()
    if isinstance(src, (TensorValue, LazyTensor)):
        return ctx.elementwise(lambda s, x: x, [src], shape, dtype, compute_dtype=src.dtype)
    return ctx.fill(shape, dtype, src)


@register_lowering(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def lower_clone(ctx: LoweringContext, a, *, memory_format=None) -> TensorValue:
    # Values are immutable on tensors; strides of outputs are set when results are written.
    return a
