"""Lowering rules for contractions: ``linalg.matmul`` / ``linalg.batch_matmul`` into a zero fill.

Semantics: ``aten.addmm(bias, a, b, beta, alpha) = beta*bias + alpha*(a@b)`` (ATen native_functions).
"""
from __future__ import annotations

import torch

from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue
from neuron_compile.lowering.registry import register_lowering
import neuron_compile.ops  # noqa: F401,E402  (defines torch.ops.neuron.matmul)

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
    if alpha == 1 and beta == 1:
        return ctx.matmul(a, b, dtype, acc_init=bias)  # bias add fused into the accumulator
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


@register_lowering(torch.ops.neuron.matmul.default)
def lower_neuron_matmul(ctx: LoweringContext, a, b, bias, trans_a: bool, trans_b: bool) -> TensorValue:
    """The layout pass's matmul: transposes are read through indexing maps, the bias is the
    accumulator's initial value (see :mod:`neuron_compile.ops`)."""
    _, dtype = ctx.out_spec()
    return ctx.matmul(a, b, dtype, trans_a=trans_a, trans_b=trans_b, acc_init=bias)
