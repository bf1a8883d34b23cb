"""Lowering rules for pooling gradients that a decomposition would make quadratic.

``max_pool{2,3}d_with_indices_backward``: torch's reference decomposition scatters the output
gradient to the recorded argmax positions (``scatter_add``), which lowers to a dense loop nest over
(input positions × output positions): 0.008× eager at 56→28. Here each input position gathers
instead: it lies in at most ``prod(ceil(k / s))`` windows, found by inverting ``o·s - p + k·d``
per kernel offset, and takes the gradient of each window whose argmax is this position.

Semantics and summation order as ATen's CPU kernel (``cpu_max_pool_backward``): the gradients of
the windows that picked a position are added in increasing output-position order onto zero, in
the op's dtype (float16/bfloat16 round after every add, as eager's ``+=`` on ``scalar_t``).
"""
from __future__ import annotations

import math

import torch

from neuron_compile.lowering.context import BodyBuilder, LoweringContext
from neuron_compile.lowering.ir import TensorValue
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten


def _per_dim(v, k: int, default) -> list[int]:
    v = list(v) if v else list(default)
    return v * (k if len(v) == 1 else 1)


def _max_pool_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, k: int, kernel_size, stride,
                       padding, dilation, indices: TensorValue) -> TensorValue:
    """grad_input [..., in spatial (k dims)] of a max pool over the last ``k`` dims, given the
    output gradient and argmax ``indices`` [..., out spatial] (flat positions in the input's plane)."""
    grad, indices = ctx.materialize(grad), ctx.materialize(indices)
    shape, dtype = ctx.out_spec()
    ks = _per_dim(kernel_size, k, ())
    st = _per_dim(stride, k, ks)
    pad, dil = _per_dim(padding, k, [0]), _per_dim(dilation, k, [1])
    lead, rank = len(shape) - k, len(shape)
    in_sp, out_sp = list(shape[lead:]), list(grad.shape[lead:])
    init = ctx.empty(list(shape), dtype)
    acc_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if math.prod(shape) == 0:
        return init

    def body(b: BodyBuilder, args):
        i64 = torch.int64
        zero = b.const(0, i64)
        pos = [b.index(lead + d) for d in range(k)]
        flat = zero
        for d in range(k):   # this position's index in its plane, as the argmax records it
            flat = b.add(b.mul(flat, b.const(in_sp[d], i64)), pos[d])
        # per dim, the output index of each kernel offset whose window holds this position;
        # offsets descending so output indices ascend (ATen's order)
        cand = []
        for d in range(k):
            opts = []
            for kk in reversed(range(ks[d])):
                num = b.sub(b.add(pos[d], b.const(pad[d], i64)), b.const(kk * dil[d], i64))
                safe = b.maximum(num, zero)
                o = b.floordiv(safe, b.const(st[d], i64))
                ok = b.logical_and(b.logical_and(b.cmp("ge", num, zero),
                                                 b.cmp("eq", b.rem(safe, b.const(st[d], i64)), zero)),
                                   b.cmp("lt", o, b.const(out_sp[d], i64)))
                opts.append((b.select(ok, o, zero), ok))
            cand.append(opts)
        acc = b.const(0, acc_dtype)
        lead_idx = [b.index(d) for d in range(lead)]

        def visit(d, chosen, valid):
            nonlocal acc
            if d == k:
                at = lead_idx + chosen
                hit = b.logical_and(valid, b.cmp("eq", b.extract(indices, at), flat))
                acc = b.add(acc, b.select(hit, b.cast(b.extract(grad, at), acc_dtype), b.const(0, acc_dtype)))
                if acc_dtype != dtype:   # rounded after every add, written out (a bf16 add is not)
                    acc = b.cast(b.cast(acc, dtype), acc_dtype)
                return
            for o, ok in cand[d]:
                visit(d + 1, chosen + [o], ok if valid is None else b.logical_and(valid, ok))
        visit(0, [], None)
        return b.cast(acc, dtype)
    return ctx.generic([], [], init, ctx.identity_map(rank), ["parallel"] * rank, body)


@register_lowering(aten.max_pool2d_with_indices_backward.default)
def lower_max_pool2d_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, kernel_size, stride, padding,
                              dilation, ceil_mode: bool, indices: TensorValue) -> TensorValue:
    return _max_pool_backward(ctx, grad, x, 2, kernel_size, stride, padding, dilation, indices)


@register_lowering(aten.max_pool3d_with_indices_backward.default)
def lower_max_pool3d_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, kernel_size, stride, padding,
                              dilation, ceil_mode: bool, indices: TensorValue) -> TensorValue:
    return _max_pool_backward(ctx, grad, x, 3, kernel_size, stride, padding, dilation, indices)
