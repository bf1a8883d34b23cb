"""Lowering rules for tensor factories (``full``, ``arange``, ``empty``, ``scalar_tensor``, ...).

Only CPU, strided, static shapes. ``empty`` is ``tensor.empty`` (contents undefined, as in eager).
"""
from __future__ import annotations

import torch

from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten


@register_lowering(aten.full.default, aten.full_like.default, aten.scalar_tensor.default,
                   aten.zeros.default, aten.ones.default, aten.zeros_like.default, aten.ones_like.default,
                   aten.new_zeros.default, aten.new_ones.default, aten.new_full.default)
def lower_full(ctx: LoweringContext, *args, **kwargs) -> TensorValue:
    shape, dtype = ctx.out_spec()
    target = ctx.node.target
    if target in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default):
        value = 0
    elif target in (aten.ones.default, aten.ones_like.default, aten.new_ones.default):
        value = 1
    elif target == aten.scalar_tensor.default:
        value = args[0]
    else:
        value = args[1] if target != aten.new_full.default else args[2]
    if dtype == torch.bool:
        value = bool(value)
    elif not dtype.is_floating_point:
        value = int(value)
    return ctx.fill(shape, dtype, value)


@register_lowering(aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
                   aten.new_empty.default, aten.new_empty_strided.default)
def lower_empty(ctx: LoweringContext, *args, **kwargs) -> TensorValue:
    shape, dtype = ctx.out_spec()
    return ctx.empty(shape, dtype)


@register_lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def lower_arange(ctx: LoweringContext, *args, **kwargs) -> TensorValue:
    """``out[i] = start + i*step`` computed in the output dtype (ATen computes in the
    accumulate type, which equals the output dtype for float32/int64)."""
    shape, dtype = ctx.out_spec()
    target = ctx.node.target
    if target == aten.arange.default:
        start, step = 0, 1
    else:
        start = args[0]
        step = args[2] if target == aten.arange.start_step and len(args) > 2 else kwargs.get("step", 1)
    init = ctx.empty(shape, dtype)

    def body(b, args):
        i = b.cast(b.index(0), dtype)
        return b.add(b.const(start, dtype), b.mul(i, b.const(step, dtype)))
    return ctx.generic([], [], init, ctx.identity_map(1), ["parallel"], body)
