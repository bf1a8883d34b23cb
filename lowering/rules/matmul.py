"""Lowering rules for contractions: ``linalg.matmul`` / ``linalg.batch_matmul`` into a zero fill.

Semantics: ``aten.addmm(bias, a, b, beta, alpha) = beta*bias + alpha*(a@b)`` (ATen native_functions).
"""
from __future__ import annotations

import torch

from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten
FUSION_KIND = "matmul"


@register_lowering(aten.mm.default)
def lower_mm(ctx: LoweringContext, a: TensorValue, b: TensorValue) -> TensorValue:
    _, dtype = ctx.out_spec()
    return ctx.matmul(a, b, dtype)


@register_lowering(aten.bmm.default)
def lower_bmm(ctx: LoweringContext, a: TensorValue, b: TensorValue) -> TensorValue:
    _, dtype = ctx.out_spec()
    return ctx.matmul(a, b, dtype)


@register_lowering(aten.addmm.default)
def lower_addmm(ctx: LoweringContext, bias: TensorValue, a: TensorValue, b: TensorValue, *, beta=1,
                alpha=1) -> TensorValue:
    shape, dtype = ctx.out_spec()
    prod = ctx.matmul(a, b, dtype)

    def epilogue(s, p, c):
        if alpha != 1:
            p = s.mul(p, s.const(alpha, dtype))
        if beta == 0:
            return p
        if beta != 1:
            c = s.mul(c, s.const(beta, dtype))
        return s.add(p, c)
    return ctx.elementwise(epilogue, [prod, bias], shape, dtype, compute_dtype=dtype)
