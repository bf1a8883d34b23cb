"""Grouped convolutions (``groups`` > 1, more than one input channel per group) as one batched GEMM
over the groups, forward and both gradients, where the implicit GEMM with a group loop
(:mod:`lowering.implicit_gemm`, unit-stride 2-D) does not take them.

Per group ``g`` the convolution is ``y_g = W_g[OC/G, C/G·KK] @ cols_g`` where ``cols_g``
[C/G·KK, N·out] holds the group's windows for every image: the batch's output positions are the
GEMM's columns (cuDNN's and oneDNN's grouped convolutions are likewise a GEMM per group). The
gradients are the same products transposed: ``gcols_g = W_gᵀ @ g_g`` then col2im, and
``gW_g = g_g @ cols_gᵀ``. Depthwise convolutions (one channel per group: an [OC/G, KK] × [KK, ·]
product per channel) keep the direct contraction.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue, affine_map


def _im2col(ctx: LoweringContext, x: TensorValue, groups: int, ks, out_spatial, stride, padding,
            dilation) -> TensorValue:
    """[G, C/G·prod(ks), N·prod(out_spatial)]: row ``(c, kk)`` of group g, column ``(n, o)``, the
    zero-padded input at channel ``g·C/G + c``, position ``o·stride + kk·dilation``."""
    from neuron_compile.lowering.conv_gemm import pad_spatial
    n, c, k = x.shape[0], x.shape[1], len(ks)
    cg = c // groups
    xp = pad_spatial(ctx, x, padding)
    loops = 3 + 2 * k   # (g, c, kernel..., n, out...)
    read = affine_map(loops, [f"d{2 + k}", f"d0 * {cg} + d1"]
                      + [f"d{3 + k + i} * {stride[i]} + d{2 + i} * {dilation[i]}" for i in range(k)])
    col = ctx.generic([xp], [read], ctx.empty([groups, cg, *ks, n, *out_spatial], x.dtype), ctx.identity_map(loops),
                      ["parallel"] * loops, lambda b, args: args[0])
    return ctx.reshape(col, (groups, cg * math.prod(ks), n * math.prod(out_spatial)))


def _col2im(ctx: LoweringContext, cols: TensorValue, groups: int, ks, out_spatial, in_shape, stride, padding,
            dilation) -> TensorValue:
    """The adjoint of :func:`_im2col`: summed into an input-shaped [N, C, in spatial...] tensor."""
    from neuron_compile.lowering.conv_gemm import _window
    n, c, k = in_shape[0], in_shape[1], len(ks)
    cg = c // groups
    padded = list(in_shape[:2]) + [in_shape[2 + i] + 2 * p for i, p in enumerate(padding)]
    col = ctx.reshape(cols, (groups, cg, *ks, n, *out_spatial))
    loops = 2 + 2 * k   # (n, c, kernel..., out...)
    read = affine_map(loops, [f"d1 floordiv {cg}", f"d1 mod {cg}"] + [f"d{2 + i}" for i in range(k)] + ["d0"]
                      + [f"d{2 + k + i}" for i in range(k)])
    iters = ["parallel", "parallel"] + ["reduction"] * k + ["parallel"] * k
    acc = ctx.generic([col], [read], ctx.fill(padded, cols.dtype, 0), _window(k, stride, dilation), iters,
                      lambda b, args: b.add(args[1], args[0]), kind="pointwise")
    if any(padding):
        acc = ctx.extract_slice(acc, [0, 0] + list(padding), list(in_shape), [1] * len(in_shape))
    return acc


def _by_group(ctx: LoweringContext, g: TensorValue, groups: int) -> TensorValue:
    """An output (gradient) [N, OC, out...] as [G, OC/G, N·out]."""
    n, oc, cols = g.shape[0], g.shape[1], math.prod(g.shape[2:])
    g4 = ctx.reshape(g, (n, groups, oc // groups, cols))
    return ctx.reshape(ctx.permute(g4, (1, 2, 0, 3)), (groups, oc // groups, n * cols))


def applies(ctx: LoweringContext, groups: int, c: int, oc: int, kk: int, positions: int,
            dtype: torch.dtype) -> bool:
    """Whether the grouped GEMM form takes a convolution (``positions``: N·prod(out spatial))."""
    from neuron_compile.lowering.conv_gemm import gemm_applies
    return groups > 1 and c // groups > 1 and gemm_applies(ctx, oc // groups, positions, c // groups * kk, groups,
                                                            dtype)


def forward(ctx: LoweringContext, x: TensorValue, w: TensorValue, bias: TensorValue | None, shape: Sequence[int],
            groups: int, ks, stride, padding, dilation) -> TensorValue:
    """``conv(x, w, groups) + bias`` [N, OC, out...]: one GEMM per group over the batch's positions."""
    n, oc, dtype = shape[0], shape[1], x.dtype
    cols = math.prod(shape[2:])
    w3 = ctx.reshape(w, (groups, oc // groups, math.prod(w.shape[1:])))
    out = ctx.matmul(w3, _im2col(ctx, x, groups, ks, shape[2:], stride, padding, dilation), dtype)
    y = ctx.reshape(ctx.permute(ctx.reshape(out, (groups, oc // groups, n, cols)), (2, 0, 1, 3)), tuple(shape))
    if bias is None:
        return y
    b = ctx.reshape(ctx.materialize(bias), (oc,) + (1,) * (len(shape) - 2))
    return ctx.elementwise(lambda s, v, bb: s.add(v, bb), [y, b], shape, dtype)


def grad_input(ctx: LoweringContext, g: TensorValue, w: TensorValue, in_shape: Sequence[int], groups: int, ks,
               stride, padding, dilation) -> TensorValue:
    """The input gradient [N, C, in...]: ``col2im(W_gᵀ @ g_g)`` per group."""
    oc = w.shape[0]
    w3 = ctx.reshape(w, (groups, oc // groups, math.prod(w.shape[1:])))
    gcols = ctx.matmul(w3, _by_group(ctx, g, groups), g.dtype, trans_a=True)
    return _col2im(ctx, gcols, groups, ks, g.shape[2:], in_shape, stride, padding, dilation)


def grad_weight(ctx: LoweringContext, g: TensorValue, x: TensorValue, w_shape: Sequence[int], groups: int, ks,
                stride, padding, dilation) -> TensorValue:
    """The weight gradient [OC, C/G, k...]: ``g_g @ cols_gᵀ`` per group."""
    cols = _im2col(ctx, x, groups, ks, g.shape[2:], stride, padding, dilation)
    gw = ctx.matmul(_by_group(ctx, g, groups), cols, g.dtype, trans_b=True)
    return ctx.reshape(gw, tuple(w_shape))
