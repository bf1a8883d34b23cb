"""Lowering rules for ``aten.convolution`` (any number of spatial dims, groups; transposed too) and its backward.

One contraction ``linalg.generic`` over (n, oc, out spatial..., ic per group, kernel spatial...):
the input is read at ``o·stride + k·dilation`` (affine maps express strides and dilation) from a
zero-padded copy, the group of an output channel is ``oc floordiv (OC/groups)``, and the bias is the
accumulator's initial value. Semantics: ATen ``convolution`` (cross-correlation, NCHW).
"""
from __future__ import annotations

import torch

from neuron_compile.lowering import conv_gemm, implicit_gemm
from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue, affine_map, tensor_type
from neuron_compile.lowering.lazy import (FROM_CHANNELS_LAST, TO_CHANNELS_LAST, LazyTensor, channels_last_backed,
                                          permuted)
from neuron_compile.lowering.registry import register_lowering

aten = torch.ops.aten
FUSION_KIND = "matmul"
LAYOUT = "neuron_layout"   # node.meta key: "channels_last" where passes/conv_layout.py chose it


def _geometry(ctx: LoweringContext, x: TensorValue, w: TensorValue, stride, padding, dilation, groups: int):
    """The zero-padded input and the indexing maps (input, weight, output) of the convolution's loop
    nest: (n, oc, out spatial..., ic per group, kernel spatial...)."""
    k = x.rank - 2
    stride, padding, dilation = _per_dim(k, stride, padding, dilation)
    return (conv_gemm.pad_spatial(ctx, x, padding), padding, *_maps(k, w, stride, dilation, groups))


def _per_dim(k: int, stride, padding, dilation) -> tuple[list[int], list[int], list[int]]:
    """``stride``, ``padding``, ``dilation`` with one entry per spatial dim (ATen passes one for all)."""
    return tuple(list(v) * (k if len(v) == 1 else 1) for v in (stride, padding, dilation))


def _maps(k: int, w: TensorValue, stride, dilation, groups: int):
    oc, icg = w.shape[0], w.shape[1]
    n_loops = 2 + k + 1 + k
    o = [f"d{2 + i}" for i in range(k)]
    ic = f"d{2 + k}"
    kk = [f"d{3 + k + i}" for i in range(k)]
    if groups == 1:
        chan = ic
    elif oc == groups:   # one output channel per group (depthwise): a plain window term
        chan = f"d1 * {icg} + {ic}"
    else:
        chan = f"(d1 floordiv {oc // groups}) * {icg} + {ic}"
    x_map = affine_map(n_loops, ["d0", chan] + [f"{o[i]} * {stride[i]} + {kk[i]} * {dilation[i]}" for i in range(k)])
    w_map = affine_map(n_loops, ["d1", ic] + kk)
    out_map = affine_map(n_loops, ["d0", "d1"] + o)
    return x_map, w_map, out_map


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulator dtype: float16/bfloat16 convolutions sum in float32 and round once, as
    ATen's CPU kernels (a bfloat16 accumulator rounded every product: 1.4 ulp off on 27 terms)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _mac(dtype: torch.dtype):
    """The contraction body ``acc + u·v`` with both operands cast to ``dtype``."""
    def body(b, args):
        u, v, a = args
        return b.add(a, b.mul(b.cast(u, dtype), b.cast(v, dtype)))
    return body


def _transposed(ctx: LoweringContext, x: TensorValue, w: TensorValue, bias, stride, padding, dilation,
                groups: int) -> TensorValue:
    """Transposed convolution (``conv_transposeNd``): the input gradient of the convolution whose
    weight is ``w`` (IC, OC/groups, k...) and whose input has this op's output shape, i.e. every
    input element scattered through the kernel into a zero-padded output, then the padding cropped
    (``output_padding`` is already in the output shape)."""
    shape, dtype = ctx.out_spec()
    k = x.rank - 2
    stride, padding, dilation = _per_dim(k, stride, padding, dilation)
    x_map, w_map, g_map = _maps(k, w, stride, dilation, groups)
    padded = list(shape[:2]) + [shape[2 + i] + 2 * padding[i] for i in range(k)]
    acc = _acc(dtype)
    out = ctx.generic([x, w], [g_map, w_map], ctx.fill(padded, acc, 0), x_map,
                      ["parallel", "reduction"] + ["reduction"] * (2 * k + 1), _mac(acc))
    if any(padding):
        out = ctx.extract_slice(out, [0, 0] + padding, list(shape), [1] * len(shape))
    if bias is None:
        return ctx.cast(out, dtype)
    b = ctx.reshape(ctx.materialize(bias), (shape[1],) + (1,) * k)
    return ctx.elementwise(lambda s, o, bb: s.add(o, bb), [out, b], shape, dtype, compute_dtype=acc)


def _forward(ctx: LoweringContext, x: TensorValue, w: TensorValue, acc: TensorValue, stride, padding, dilation,
             groups: int) -> TensorValue:
    """``acc + conv(x, w)``: one contraction over (n, oc, out spatial..., ic per group, kernel...)."""
    k = x.rank - 2
    x, _, x_map, w_map, out_map = _geometry(ctx, x, w, stride, padding, dilation, groups)
    iters = ["parallel"] * (2 + k) + ["reduction"] * (1 + k)
    return ctx.generic([x, w], [x_map, w_map], acc, out_map, iters, _mac(acc.dtype))


def _depthwise_rows(ctx: LoweringContext, x: "TensorValue | LazyTensor", w: TensorValue, bias, stride, padding,
                    dilation, shape, acc_dtype: torch.dtype) -> "LazyTensor | None":
    """A 2-D depthwise convolution [N, C, OH, OW] whose output rows are too short for
    ``window-stencil`` (a row under half a register: 4×4 planes) or read the input at a stride
    (stride 2), computed with unit-stride rows. A stored input at stride 2 along an even W: over
    its column phases (:func:`_depthwise_phases`). Otherwise strided along W: every column of the
    row at unit stride, then every ``sw``-th kept (``sw``× the multiply-adds, vectorized). Short
    rows at unit stride: the plane flattened with its padded width (as the implicit GEMM does),
    rows of ``OH·Wp`` positions, the ``Wp - OW`` wrapped columns of each row cropped. Both ran on
    scalar loops (MobileNetV2-style training b16: 16x96x16x16 at stride 2, 0.74 ms; 16x384x4x4,
    0.28 ms; AMD Zen 4, 1 thread). ``None`` where neither form applies (half precision, a row
    under half a register even at unit stride). ``x`` may be lazy (computed into its padded copy)."""
    if x.rank != 4 or acc_dtype not in (torch.float32, torch.float64) or x.dtype != acc_dtype:
        return None
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = _per_dim(2, stride, padding, dilation)
    oh, ow = shape[2], shape[3]
    hp, wp = h + 2 * ph, wd + 2 * pw
    full = wp - dw * (kw - 1)   # output columns at unit stride
    bits = ctx.body.target.vector_bits if ctx.body.target is not None else 512
    half = bits // (2 * (32 if acc_dtype == torch.float32 else 64))   # window-stencil's shortest row
    if sw == 2 and dw == 1 and wd % 2 == 0 and isinstance(x, TensorValue) and ow >= half:
        # (a lazy input keeps the cropped form: computed into its padded copy, one pass; materialised
        # for the phases, within noise either way on MobileNetV2, AMD Zen 3)
        crop = _depthwise_phases(ctx, x, w, sh, ph, pw, dh, shape, acc_dtype)
        if bias is None:
            return crop   # (no crop: a kernel's output, no view of one)
    elif sw > 1 and full >= half:
        xp = conv_gemm.pad_spatial(ctx, x, [ph, pw])
        x_map = affine_map(6, ["d0", "d1", f"d2 * {sh} + d4 * {dh}", f"d3 + d5 * {dw}"])
        out = ctx.generic([xp, w], [x_map, affine_map(6, ["d1", "0", "d4", "d5"])],
                          ctx.fill([n, c, oh, full], acc_dtype, 0), affine_map(6, ["d0", "d1", "d2", "d3"]),
                          ["parallel"] * 4 + ["reduction"] * 2, _mac(acc_dtype))
        crop = ctx.extract_slice(out, [0, 0, 0, 0], [n, c, oh, ow], [1, 1, 1, sw])
    elif sh == sw == 1 and ow < half <= oh * wp:
        hx = implicit_gemm.padded_rows(hp, wp, oh * wp, kh, kw, dh, dw)
        xf = ctx.reshape(ctx.padded(x, [n, c, hx, wp], [0, 0, ph, pw]), (n, c, hx * wp))
        x_map = affine_map(5, ["d0", "d1", f"d2 + d3 * {dh * wp} + d4 * {dw}"])
        out = ctx.generic([xf, w], [x_map, affine_map(5, ["d1", "0", "d3", "d4"])],
                          ctx.fill([n, c, oh * wp], acc_dtype, 0), affine_map(5, ["d0", "d1", "d2"]),
                          ["parallel"] * 3 + ["reduction"] * 2, _mac(acc_dtype))
        crop = ctx.extract_slice(ctx.reshape(out, (n, c, oh, wp)), [0, 0, 0, 0], [n, c, oh, ow], [1, 1, 1, 1])
    else:
        return None
    # the crop read by its consumer, the bias added there. Never a bare copy: an identity body is
    # folded into ``memref.copy`` of the strided view, the runtime's element-by-element copy (a
    # stride-2 crop stored as a graph output: 1.6 ms, 2 GB/s). The sums start at +0.0, so they are
    # never -0.0 and adding +0.0 changes no value
    if bias is None:
        return ctx.elementwise(lambda b, v: b.add(v, b.const(0.0, acc_dtype)), [crop], crop.shape, acc_dtype)
    bc = ctx.reshape(ctx.materialize(bias), (c, 1, 1))
    return ctx.elementwise(lambda b, v, bb: b.add(v, bb), [crop, bc], crop.shape, acc_dtype, compute_dtype=acc_dtype)


def _grad_weight(ctx: LoweringContext, g: TensorValue, x: TensorValue, w: TensorValue, stride, padding, dilation,
                 groups: int) -> TensorValue:
    """The weight gradient of ``conv(x, w)`` given the gradient ``g`` of its output, where no GEMM
    form applies (fewer output channels than a vector: a 1×1 head's 16 → 4): one window sum per
    weight element, the weight's dims outside and the image's inside (loops (oc, ic, kernel...,
    n, out spatial...)), so the innermost loop walks a row of both ``g`` and ``x`` and the
    ``window-reduction`` strategy vectorizes it (with the weight's dims innermost it ran on
    ``loops``: 8×16×64×64 → 4 channels, 1.9 ms at 1.4 GB/s; AMD Zen 4, 1 thread)."""
    k = x.rank - 2
    stride, padding, dilation = _per_dim(k, stride, padding, dilation)
    x_pad = conv_gemm.pad_spatial(ctx, x, padding)
    oc, icg = w.shape[0], w.shape[1]
    loops = 3 + 2 * k
    kk = [f"d{2 + i}" for i in range(k)]
    n, o = f"d{2 + k}", [f"d{3 + k + i}" for i in range(k)]
    chan = "d1" if groups == 1 else f"(d0 floordiv {oc // groups}) * {icg} + d1"
    x_map = affine_map(loops, [n, chan] + [f"{o[i]} * {stride[i]} + {kk[i]} * {dilation[i]}" for i in range(k)])
    g_map = affine_map(loops, [n, "d0"] + o)
    w_map = affine_map(loops, ["d0", "d1"] + kk)
    acc = _acc(g.dtype)
    out = ctx.generic([g, x_pad], [g_map, x_map], ctx.fill(w.shape, acc, 0), w_map,
                      ["parallel"] * (2 + k) + ["reduction"] * (1 + k), _mac(acc), attrs={"combiner": True})
    return ctx.cast(out, g.dtype)


def _depthwise(x: TensorValue, groups: int) -> bool:
    """One input channel per group (MobileNet's 3×3 layers): each gradient is a small per-channel
    window sum, written as a gather below (the GEMM forms do not apply: a 1×KK product per channel)."""
    return groups > 1 and x.shape[1] == groups


def _grad_input_as_forward(ctx: LoweringContext, grad: TensorValue, w: TensorValue, in_shape, stride, padding,
                           dilation, groups: int) -> TensorValue | None:
    """The input gradient of a grouped convolution as a forward grouped convolution (a gather:
    every input element reads its window; the scatter form, a col2im, ran as sequential loops):
    ``grad`` spread to stride 1 (zeros between its elements) and zero-padded by ``d·(K-1) - p`` on
    the left, convolved with the kernel flipped in space and each group's [OC/g, C/g] block
    transposed (the transposed convolution's identity, as in :func:`lower_convolution_backward`).
    Depthwise (one input channel per group) at any stride; other groupings at unit stride, as one
    GEMM per group (4 groups of 16 channels at 16×16, batch 16: the col2im alone was 3.8 ms at
    2.8 GB/s; AMD Zen 4, 1 thread). ``None`` where the padding exceeds ``d·(K-1)`` (a crop would
    be needed; the scatter is kept)."""
    k = grad.rank - 2
    stride, padding, dilation = _per_dim(k, stride, padding, dilation)
    ks, c, oc, icg = list(w.shape[2:]), in_shape[1], w.shape[0], w.shape[1]
    ocg = oc // groups
    left = [d * (kk - 1) - p for d, kk, p in zip(dilation, ks, padding)]
    if min(left) < 0 or (icg > 1 and any(s != 1 for s in stride)):
        return None
    # w_flip[c, o, kk] = w[(c // icg)·ocg + o, c % icg, K-1-kk]: [C, OC/g, K...]
    flip = affine_map(2 + k, [f"(d0 floordiv {icg}) * {ocg} + d1", f"d0 mod {icg}"]
                      + [f"{ks[i] - 1} - d{2 + i}" for i in range(k)])
    w_flip = ctx.generic([w], [flip], ctx.empty([c, ocg, *ks], w.dtype), ctx.identity_map(2 + k),
                         ["parallel"] * (2 + k), lambda b, args: args[0])
    # unit stride: the spread gradient is ``grad`` padded by ``left`` on both sides, which the GEMM
    # forms pad themselves (one copy of the gradient, not two)
    if icg > 1 and (y := conv_gemm.forward(ctx, grad, w_flip, None, [1] * k, left, dilation, groups,
                                           out_shape=in_shape)) is not None:
        return ctx.materialize(y)
    full = [in_shape[2 + i] + dilation[i] * (ks[i] - 1) for i in range(k)]
    spread = _spread(ctx, grad, full, left, stride)
    acc = _acc(grad.dtype)
    if icg == 1 and ocg == 1 and (y := _depthwise_rows(ctx, spread, w_flip, None, [1] * k, [0] * k, dilation,
                                                       in_shape, acc)) is not None:
        return ctx.materialize(ctx.cast(y, grad.dtype))
    out = _forward(ctx, spread, w_flip, ctx.fill(list(in_shape), acc, 0), [1] * k, [0] * k, dilation, groups)
    return ctx.cast(out, grad.dtype)


def _zeros(shape: list[int]) -> str:
    """A zero block of ``shape`` as a ``dense<...>`` literal (nested lists, outermost first)."""
    out = "0.0"
    for n in shape:
        out = "[" + ", ".join([out] * n) + "]"
    return out


def _spread(ctx: LoweringContext, grad: TensorValue, full: list[int], at: list[int],
            stride: list[int]) -> TensorValue:
    """``grad`` [N, C, O...] spread to stride 1 in a zero buffer [N, C, full...]: element ``o``
    lands at ``at + o·s``, zeros between. Where the interleaved block ``O·s`` fits, one vectorized
    pass writes it whole: the buffer's slice viewed as [N, C, O₁, s₁, O₂, s₂, ...], ``grad`` at
    phase 0 and zero elsewhere, and only the border around it filled. Otherwise a zero fill and a
    strided copy, which stores one scalar at a time on ``loops`` (a depthwise stride-2 input
    gradient's spread, 16×96×16×16 into 34×34: 1.76 ms, 4.5% of MobileNetV2's backward; AMD Zen 3,
    1 thread)."""
    k = grad.rank - 2
    shape = [*grad.shape[:2], *full]
    block = [o * s for o, s in zip(grad.shape[2:], stride)]
    if set(stride) <= {1}:
        # zero padding: written plane by plane in one parallel loop (``pad-planes``); a zero fill
        # then a copy filled the whole buffer in the graph's serial code (a depthwise 3×3 input
        # gradient, 16×128×28×28: 0.5 ms of serial fill before the copy; AMD Zen 3, 1 thread)
        return ctx.padded(grad, shape, [0, 0] + at)
    if any(a + b > f for a, b, f in zip(at, block, full)):
        return ctx.insert_slice(grad, ctx.fill(shape, grad.dtype, 0), [0, 0] + at, [1, 1] + stride)
    sizes = [*grad.shape[:2], *block]
    dest = ctx.border(shape, grad.dtype, 0, [0, 0] + at, sizes)
    ctx.body.used_as_init(dest)
    where = f"[0, 0, {', '.join(map(str, at))}] [{', '.join(map(str, sizes))}] [{', '.join(['1'] * (2 + k))}]"
    part = ctx.emit(f"tensor.extract_slice {dest.name}{where} : {dest.type} to {tensor_type(sizes, grad.dtype)}",
                    tuple(sizes), grad.dtype)
    phased = [*grad.shape[:2], *[d for o, s in zip(grad.shape[2:], stride) for d in (o, s)]]
    groups = "[[0], [1], " + ", ".join(f"[{2 + 2 * i}, {3 + 2 * i}]" for i in range(k)) + "]"
    view = ctx.emit(f"tensor.expand_shape {part.name} {groups} output_shape [{', '.join(map(str, phased))}] : "
                    f"{part.type} into {tensor_type(phased, grad.dtype)}", tuple(phased), grad.dtype)
    g_map = affine_map(2 + 2 * k, ["d0", "d1"] + [f"d{2 + 2 * i}" for i in range(k)])
    # which phase holds ``grad``: a constant [s...] mask, 1 at phase 0, read like any operand (loop
    # indices in the body would make the kernel a gather, which only ``loops`` runs)
    mask = "1.0"
    for i, s in enumerate(reversed(stride)):
        mask = "[" + ", ".join([mask] + [_zeros(list(reversed(stride))[:i])] * (s - 1)) + "]"
    m = ctx.emit(f"arith.constant dense<{mask}> : {tensor_type(tuple(stride), grad.dtype)}", tuple(stride),
                 grad.dtype)
    m_map = affine_map(2 + 2 * k, [f"d{3 + 2 * i}" for i in range(k)])
    phases = ctx.generic([grad, m], [g_map, m_map], view, ctx.identity_map(2 + 2 * k), ["parallel"] * (2 + 2 * k),
                         lambda b, args: b.select(b.cmp("ne", args[1], b.const(0, grad.dtype)), args[0],
                                                  b.const(0, grad.dtype)))
    written = ctx.emit(f"tensor.collapse_shape {phases.name} {groups} : {phases.type} into {part.type}",
                       tuple(sizes), grad.dtype)
    return ctx.emit(f"tensor.insert_slice {written.name} into {dest.name}{where} : {written.type} into "
                    f"{dest.type}", dest.shape, dest.dtype)


def _depthwise_grad_weight(ctx: LoweringContext, grad: TensorValue, x: TensorValue, w_shape, stride, padding,
                           dilation, groups: int) -> TensorValue:
    """The weight gradient of a depthwise convolution, one window sum per (channel, kernel offset)
    with the weight's dims outside and the image's inside (the innermost loop walks a row of both
    operands, where :func:`_grad_weight`'s order keeps the weight's dims innermost)."""
    k = x.rank - 2
    stride, padding, dilation = _per_dim(k, stride, padding, dilation)
    x_pad = conv_gemm.pad_spatial(ctx, x, padding)
    m = w_shape[0] // groups
    if stride[-1] > 1 and dilation[-1] == 1:
        return _depthwise_grad_weight_phases(ctx, grad, x_pad, w_shape, stride, dilation, m)
    loops = 2 + 2 * k   # (oc, kernel spatial..., n, out spatial...)
    kk = [f"d{1 + i}" for i in range(k)]
    o = [f"d{2 + k + i}" for i in range(k)]
    n = f"d{1 + k}"
    g_map = affine_map(loops, [n, "d0"] + o)
    x_map = affine_map(loops, [n, f"d0 floordiv {m}" if m > 1 else "d0"]
                       + [f"{o[i]} * {stride[i]} + {kk[i]} * {dilation[i]}" for i in range(k)])
    w_map = affine_map(loops, ["d0"] + kk)
    acc = _acc(grad.dtype)
    out = ctx.generic([grad, x_pad], [g_map, x_map], ctx.fill([w_shape[0], *w_shape[2:]], acc, 0), w_map,
                      ["parallel"] * (1 + k) + ["reduction"] * (1 + k), _mac(acc), attrs={"combiner": True})
    return ctx.reshape(ctx.cast(out, grad.dtype), tuple(w_shape))


def _depthwise_phases(ctx: LoweringContext, x: TensorValue, w: TensorValue, sh: int, ph: int, pw: int, dh: int,
                      shape, acc_dtype: torch.dtype) -> TensorValue:
    """A 2-D depthwise convolution at stride 2 along W (unit dilation there, W even) as
    unit-stride window sums over the input's two column phases (:meth:`LoweringContext.phase_planes`:
    zero-padded by ``ph`` rows and ``lp = ceil(pw/2)`` columns). Tap ``kw`` of output column
    ``ow`` reads padded column ``2·ow + kw`` = input column ``2·(ow + t) + q``: phase
    ``q = (kw − pw) mod 2`` at ``ow + t + lp``, a unit-stride window; one window sum per phase over
    its taps. Every multiply-add is one the convolution needs: unit-stride rows computed every
    column and kept every other (twice the work) and their crop read at stride 2 (a gather the
    vectorizer makes scalar inserts)."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    oh, ow = shape[2], shape[3]
    lp, phases, starts, cols = conv_gemm.column_phases(wd, kw, pw, ow)
    rows = (oh - 1) * sh + (kh - 1) * dh + 1
    xq = ctx.phase_planes(x, (ph, max(0, rows - ph - h)), lp, cols)
    out = ctx.fill([n, c, oh, ow], acc_dtype, 0)
    for q, taps in sorted(phases.items()):
        view = ctx.extract_slice(xq, [0, 0, 0, q, starts[q]], [n, c, xq.shape[2], 1, ow + len(taps) - 1],
                                 [1] * 5)
        wq = ctx.extract_slice(w, [0, 0, 0, taps[0]], [c, 1, kh, len(taps)], [1, 1, 1, 2])
        x_map = affine_map(6, ["d0", "d1", f"d2 * {sh} + d4 * {dh}", "0", "d3 + d5"])
        out = ctx.generic([view, wq], [x_map, affine_map(6, ["d1", "0", "d4", "d5"])], out,
                          affine_map(6, ["d0", "d1", "d2", "d3"]), ["parallel"] * 4 + ["reduction"] * 2,
                          _mac(acc_dtype))
    return out


def _strided_phase(ctx: LoweringContext, x: TensorValue, s: int, r: int) -> TensorValue:
    """Phase ``r`` of ``x``'s last dim at stride ``s``: the view ``x[..., r::s]``. A window read
    with stride ``s`` along the contiguous dim (``o·s + k``, a gather to the vectorizer) is, for
    the kernel offsets ``k = r + s·t``, a unit-stride window ``o + t`` of this view, which the
    window strategies take."""
    n = -(-(x.shape[-1] - r) // s)
    return ctx.extract_slice(x, [0] * (x.rank - 1) + [r], [*x.shape[:-1], n], [1] * (x.rank - 1) + [s])


def _depthwise_grad_weight_phases(ctx: LoweringContext, grad: TensorValue, x_pad: TensorValue, w_shape, stride,
                                  dilation, m: int) -> TensorValue:
    """:func:`_depthwise_grad_weight` with a stride ``s > 1`` along the last dim (MobileNet's
    stride-2 depthwise layers): the kernel offsets ``kw = r + s·t`` read phase ``r`` of that dim
    (:func:`_strided_phase`) at ``ow + t``, one unit-stride window sum per phase, interleaved back
    into the kernel's last dim. On ``loops`` (a strided row is a gather to the vectorizer) 96
    channels at 32→16, batch 16, took 4.0 ms at 2 GB/s; now 1.5 ms (AMD Zen 4, 1 thread)."""
    k = grad.rank - 2
    s, kw = stride[-1], w_shape[-1]
    acc = _acc(grad.dtype)
    out = ctx.fill([w_shape[0], *w_shape[2:]], acc, 0)
    loops = 2 + 2 * k   # (oc, kernel spatial... (the last: t), n, out spatial...)
    kk = [f"d{1 + i}" for i in range(k)]
    o = [f"d{2 + k + i}" for i in range(k)]
    n = f"d{1 + k}"
    g_map = affine_map(loops, [n, "d0"] + o)
    w_map = affine_map(loops, ["d0"] + kk)
    for r in range(min(s, kw)):
        taps = -(-(kw - r) // s)
        phase = _strided_phase(ctx, x_pad, s, r)
        x_map = affine_map(loops, [n, f"d0 floordiv {m}" if m > 1 else "d0"]
                           + [f"{o[i]} * {stride[i]} + {kk[i]} * {dilation[i]}" for i in range(k - 1)]
                           + [f"{o[-1]} + {kk[-1]}"])
        part = ctx.generic([grad, phase], [g_map, x_map], ctx.fill([w_shape[0], *w_shape[2:-1], taps], acc, 0), w_map,
                           ["parallel"] * (1 + k) + ["reduction"] * (1 + k), _mac(acc), attrs={"combiner": True})
        out = ctx.insert_slice(part, out, [0] * (1 + k - 1) + [r], [1] * k + [s])
    return ctx.reshape(ctx.cast(out, grad.dtype), tuple(w_shape))


def _to_channels_last(ctx: LoweringContext, x: "TensorValue | LazyTensor") -> "TensorValue | LazyTensor":
    """``x`` [N, C, H, W] as [N, H, W, C]: a lazy read of a channels-last-backed value (no copy),
    else a tiled transpose of the stored value (one ``transpose-tiles`` kernel: a pointwise kernel
    reading it transposed is scalar)."""
    if channels_last_backed(x):
        return permuted(x, TO_CHANNELS_LAST)
    return ctx.permute(ctx.materialize(x), TO_CHANNELS_LAST)


def _channels_last(ctx: LoweringContext, x: "TensorValue | LazyTensor", w: TensorValue, bias, stride, padding,
                   dilation, groups: int) -> LazyTensor:
    """A 2-D convolution computed channels-last ([N, H, W, C]), where ``passes/conv_layout.py`` chose
    it (a chain of 1×1 and depthwise convolutions, as MobileNet's blocks): a 1×1 convolution as
    one GEMM ``rows [N·H·W, C] @ Wᵀ``, a depthwise one as a window contraction whose contiguous
    dim is the channel (``window-stencil`` vectorizes it at any stride and plane size: NCHW
    planes of 4×4 or stride 2 stayed scalar). The result is a lazy [N, C, H, W] read of the
    channels-last tensor, so the chain's next convolution reads it as stored."""
    shape, dtype = ctx.out_spec()
    n, c, h, wd = x.shape
    oc = w.shape[0]
    b = ctx.materialize(bias) if bias is not None else None
    if groups == 1:   # 1×1, unit stride, no padding
        rows = ctx.reshape(ctx.materialize(_to_channels_last(ctx, x)), (n * h * wd, c))
        out = ctx.matmul(rows, ctx.reshape(w, (oc, c)), dtype, trans_b=True, acc_init=b)
        return permuted(ctx.reshape(out, (n, h, wd, oc)), FROM_CHANNELS_LAST)
    stride, padding, dilation = _per_dim(2, stride, padding, dilation)
    kh, kw = w.shape[2:]
    xt = _to_channels_last(ctx, x)
    padded = [n, h + 2 * padding[0], wd + 2 * padding[1], c]
    xp = ctx.padded(xt, padded, [0, padding[0], padding[1], 0]) if any(padding) \
        else ctx.materialize(xt)
    wt = ctx.permute(ctx.reshape(w, (c, kh, kw)), (1, 2, 0))
    out_shape = [n, shape[2], shape[3], oc]
    acc = ctx.materialize(ctx.broadcast_to(b, out_shape)) if b is not None \
        else ctx.fill(out_shape, dtype, 0)
    x_map = affine_map(6, ["d0", f"d1 * {stride[0]} + d4 * {dilation[0]}", f"d2 * {stride[1]} + d5 * {dilation[1]}",
                           "d3"])
    out = ctx.generic([xp, wt], [x_map, affine_map(6, ["d4", "d5", "d3"])], acc,
                      affine_map(6, ["d0", "d1", "d2", "d3"]), ["parallel"] * 4 + ["reduction"] * 2, _mac(dtype))
    return permuted(out, FROM_CHANNELS_LAST)


@register_lowering(aten.convolution.default)
def lower_convolution(ctx: LoweringContext, x: TensorValue, w: TensorValue, bias, stride, padding, dilation,
                      transposed: bool, output_padding, groups: int) -> TensorValue:
    w = ctx.materialize(w)
    if ctx.node is not None and ctx.node.meta.get(LAYOUT) == "channels_last":
        return _channels_last(ctx, x, w, bias, stride, padding, dilation, groups)
    if transposed:
        shape, dtype = ctx.out_spec()
        x = ctx.materialize(x)
        if (y := conv_gemm.grad_input(ctx, x, w, shape, stride, padding, dilation, groups)) is None:
            return _transposed(ctx, x, w, bias, stride, padding, dilation, groups)
        if bias is None:
            return y
        b = ctx.reshape(ctx.materialize(bias), (shape[1],) + (1,) * (x.rank - 2))
        return ctx.elementwise(lambda s, o, bb: s.add(o, bb), [y, b], shape, dtype)
    gemm = conv_gemm.forward(ctx, x, w, bias, stride, padding, dilation, groups)  # x may be lazy
    if gemm is not None:
        return gemm
    shape, dtype = ctx.out_spec()   # x may still be lazy: computed into its padded copy (_geometry)
    k, oc = x.rank - 2, w.shape[0]
    acc_dtype = _acc(dtype)
    if _depthwise(x, groups) and oc == groups and \
            (y := _depthwise_rows(ctx, x, w, bias, stride, padding, dilation, shape, acc_dtype)) is not None:
        return ctx.cast(y, dtype)
    if bias is not None:
        acc = ctx.materialize(ctx.broadcast_to(ctx.cast(ctx.reshape(ctx.materialize(bias), (oc,) + (1,) * k),
                                                        acc_dtype), shape))
    else:
        acc = ctx.fill(shape, acc_dtype, 0)
    return ctx.cast(_forward(ctx, x, w, acc, stride, padding, dilation, groups), dtype)


@register_lowering(aten.convolution_backward.default)
def lower_convolution_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, w: TensorValue, bias_sizes,
                               stride, padding, dilation, transposed: bool, output_padding, groups: int,
                               output_mask):
    """(grad_input, grad_weight, grad_bias) of :func:`lower_convolution`, each one contraction:
    grad_weight and grad_bias read like the forward; grad_input accumulates into the padded input
    through the forward's input map (an accumulating scatter, run as sequential loops), then the
    padding is cropped.

    A transposed convolution ``y = convT(x, w)`` is the input gradient of ``z = conv(u, w)`` with
    ``u`` shaped like ``y`` (PyTorch's ``ConvTranspose`` docs; ATen's ``convolution_backward``
    swaps the roles the same way): its input gradient is the plain convolution ``conv(grad, w)``
    (same stride, padding, dilation, groups; ``output_padding`` only chose y's size), and its weight
    gradient is conv's weight gradient with x as the output gradient and ``grad`` as the input."""
    grad, x, w = ctx.materialize(grad), ctx.materialize(x), ctx.materialize(w)
    k = x.rank - 2
    dtype = grad.dtype
    results = []
    acc = _acc(dtype)
    if output_mask[0] and transposed:
        gx = conv_gemm.forward(ctx, grad, w, None, stride, padding, dilation, groups, out_shape=x.shape)
        results.append(gx if gx is not None else ctx.cast(
            _forward(ctx, grad, w, ctx.fill(list(x.shape), acc, 0), stride, padding, dilation, groups), dtype))
    elif output_mask[0] and groups > 1 and not _depthwise(x, groups) and (
            gx := _grad_input_as_forward(ctx, grad, w, x.shape, stride, padding, dilation, groups)) is not None:
        results.append(gx)
    elif output_mask[0] and (gx := conv_gemm.grad_input(ctx, grad, w, x.shape, stride, padding, dilation,
                                                        groups)) is not None:
        results.append(gx)
    elif output_mask[0] and _depthwise(x, groups) and (
            gx := _grad_input_as_forward(ctx, grad, w, x.shape, stride, padding, dilation, groups)) is not None:
        results.append(gx)
    elif output_mask[0]:
        x_pad, pad, x_map, w_map, g_map = _geometry(ctx, x, w, stride, padding, dilation, groups)
        gx = ctx.generic([grad, w], [g_map, w_map], ctx.fill(list(x_pad.shape), acc, 0), x_map,
                         ["parallel", "reduction"] + ["reduction"] * (2 * k + 1), _mac(acc))
        results.append(ctx.cast(ctx.extract_slice(gx, [0, 0] + list(pad), list(x.shape), [1] * x.rank)
                                if any(pad) else gx, dtype))
    else:
        results.append(None)
    if output_mask[1] and not transposed and (gw := conv_gemm.grad_weight(ctx, grad, x, w.shape, stride, padding,
                                                                         dilation, groups)) is not None:
        results.append(gw)
    elif output_mask[1] and not transposed and _depthwise(x, groups):
        results.append(_depthwise_grad_weight(ctx, grad, x, w.shape, stride, padding, dilation, groups))
    elif output_mask[1] and transposed and (gw := conv_gemm.grad_weight(ctx, x, grad, w.shape, stride, padding,
                                                                       dilation, groups)) is not None:
        results.append(gw)   # conv's weight gradient with x as the output gradient, grad as the input
    elif output_mask[1]:
        results.append(_grad_weight(ctx, x, grad, w, stride, padding, dilation, groups) if transposed
                       else _grad_weight(ctx, grad, x, w, stride, padding, dilation, groups))
    else:
        results.append(None)
    if output_mask[2] and tuple(bias_sizes) != (grad.shape[1],):
        # no input channels: an empty output, a zero gradient for every bias element (eager's)
        results.append(ctx.fill(list(bias_sizes), dtype, 0))
    elif output_mask[2]:
        total = ctx.reduce(grad, [0] + list(range(2, grad.rank)), False, 0, lambda b, a, v: b.add(a, v),
                           torch.float64 if dtype == torch.float32 else acc)
        results.append(ctx.materialize(ctx.cast(total, dtype)))
    else:
        results.append(None)
    return tuple(results)
