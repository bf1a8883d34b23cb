"""Convolutions as GEMMs: im2col (or col2im) copies around the tiled ``matmul`` strategy.

A convolution ``y[n] = W[OC, C·KK] @ cols(x[n])`` is one product per image over the *im2col*
matrix ``cols(x[n])`` [C·KK, OH·OW] (Chellapilla, Puri, Simard, *High Performance Convolutional
Neural Networks for Document Processing*, 2006; Caffe's layout, so the product is NCHW), and its
gradients are products too (PyTorch's ``convolution_backward`` semantics):

- grad_weight ``= Σ_n g[n] @ cols(x[n])ᵀ`` (a batched ``A @ Bᵀ``, then a sum over images);
- grad_input ``= col2im(Wᵀ @ g[n])``: every column entry added back to the input position it was
  copied from (the adjoint of im2col).

The im2col and col2im copies are windowed ``linalg.generic`` ops (``o·stride + k·dilation``);
with unit stride the ``pointwise`` strategy vectorizes them a row at a time.

The choice, measured (2026-12-03, Sapphire Rapids, 1 thread, a 3×3 64→64 convolution at 56×56,
batch 8, eager 14–17 ms): the single direct contraction on ``loops`` took 250 ms; im2col + GEMM
28 ms (the GEMM 18 ms at 100–115 GFLOP/s, the 58 MB im2col matrix 7.5 ms, the GEMM's packs
streaming it back from memory); the implicit GEMM (:mod:`lowering.implicit_gemm`) 15 ms, its GEMM
at 158 GFLOP/s. Unit-stride 2-D convolutions (and their gradients) take the implicit form; the
rest take im2col, or the direct contraction where the GEMM does not apply.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from neuron_compile.lowering import conv_grouped, implicit_gemm
from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import TensorValue, affine_map


def _per_dim(v: Sequence[int], k: int) -> list[int]:
    return list(v) * (k if len(v) == 1 else 1)


def _window(k: int, stride: Sequence[int], dilation: Sequence[int]) -> str:
    """The map from loops (n, c, kernel spatial..., out spatial...) to the padded input."""
    return affine_map(2 + 2 * k, ["d0", "d1"] + [f"d{2 + k + i} * {stride[i]} + d{2 + i} * {dilation[i]}"
                                                 for i in range(k)])


def pad_spatial(ctx: LoweringContext, x: TensorValue, padding: Sequence[int]) -> TensorValue:
    """``x`` [N, C, spatial...] zero-padded by ``padding[i]`` on both sides of spatial dim i, as a
    stored tensor; a lazy ``x`` (a fused pointwise producer) is computed straight into the padded
    buffer, one pass where storing it and copying it in were two."""
    if not any(padding):
        return ctx.materialize(x)
    shape = list(x.shape[:2]) + [x.shape[2 + i] + 2 * p for i, p in enumerate(padding)]
    return ctx.padded(x, shape, [0, 0] + list(padding))


def _plain(ks: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> bool:
    """A 1×1 kernel with unit stride and no padding: the im2col matrix is the input itself."""
    return all(s == 1 for s in ks) and all(s == 1 for s in stride) and not any(padding)


def im2col(ctx: LoweringContext, x: TensorValue, ks: Sequence[int], out_spatial: Sequence[int],
           stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> TensorValue:
    """The im2col matrices of ``x`` [N, C, in spatial...] for a kernel of spatial size ``ks``:
    [N, C·prod(ks), prod(out_spatial)], row ``(c, kk)`` column ``o`` holding the zero-padded input
    at ``o·stride + kk·dilation``. Per-dim lists (``stride`` etc.) have one entry per spatial dim."""
    n, c, k = x.shape[0], x.shape[1], len(ks)
    rows, cols = c * math.prod(ks), math.prod(out_spatial)
    if _plain(ks, stride, padding):
        return ctx.reshape(x, (n, rows, cols))
    if k == 2 and stride[1] == 2 and dilation[1] == 1 and x.shape[3] % 2 == 0:
        return ctx.reshape(_im2col_phases(ctx, x, ks, out_spatial, stride[0], padding, dilation[0]), (n, rows, cols))
    xp = pad_spatial(ctx, x, padding)
    shape = [n, c, *ks, *out_spatial]
    col = ctx.generic([xp], [_window(k, stride, dilation)], ctx.empty(shape, x.dtype), ctx.identity_map(2 + 2 * k),
                      ["parallel"] * (2 + 2 * k), lambda b, args: args[0])
    return ctx.reshape(col, (n, rows, cols))


def column_phases(width: int, kw: int, pw: int, ow: int) -> tuple[int, dict[int, list[int]], dict[int, int], int]:
    """A window of ``kw`` taps read at stride 2 along a dim of even ``width`` zero-padded by ``pw``
    on the left, for ``ow`` outputs, as unit-stride windows of the dim's two phases
    (:meth:`LoweringContext.phase_planes`, each padded by ``lp = ceil(pw/2)`` on the left): tap
    ``kw`` of output ``o`` reads padded column ``2·o + kw`` = input column ``2·(o + t) + q``, phase
    ``q = (kw − pw) mod 2`` at ``o + t + lp``. Returns (``lp``, the taps of each phase, the phase
    column output 0's first tap of each phase reads, the columns a phase plane needs)."""
    lp = -(-pw // 2)
    phases: dict[int, list[int]] = {}
    for k in range(kw):
        phases.setdefault((k - pw) % 2, []).append(k)
    starts = {q: (taps[0] - pw - q) // 2 + lp for q, taps in phases.items()}
    cols = max(lp + width // 2, max(starts[q] + ow - 1 + len(taps) for q, taps in phases.items()))
    return lp, phases, starts, cols


def _im2col_phases(ctx: LoweringContext, x: TensorValue, ks: Sequence[int], out_spatial: Sequence[int], sh: int,
                   padding: Sequence[int], dh: int) -> TensorValue:
    """:func:`im2col` of a 2-D input at stride 2 along W (unit dilation there, W even), as
    [N, C, KH, KW, OH, OW]: read from the input's two column phases (:func:`column_phases`), so
    the taps of one phase are a unit-stride window (one copy per phase, written in place into
    every other tap of the matrix). Read at stride 2 from the padded input the copy was a gather,
    scalar on ``loops-forall`` (a ResNet stem, 7×7/2 3→64 at 16×3×64×64: 15–17 % of the layer)."""
    n, c, h, w = x.shape
    kh, kw = ks
    oh, ow = out_spatial
    lp, phases, starts, cols = column_phases(w, kw, padding[1], ow)
    rows = (oh - 1) * sh + (kh - 1) * dh + 1
    xq = ctx.phase_planes(ctx.materialize(x), (padding[0], max(0, rows - padding[0] - h)), lp, cols)
    col = ctx.empty([n, c, kh, kw, oh, ow], x.dtype)
    for q, taps in sorted(phases.items()):
        # the phase's columns from output 0's first tap on (a unit dim and no constant offsets in
        # the read: the pointwise strategy folds unit dims and vectorizes each row)
        view = ctx.extract_slice(xq, [0, 0, 0, q, starts[q]], [n, c, xq.shape[2], 1, ow + len(taps) - 1],
                                 [1] * 5)
        read = affine_map(6, ["d0", "d1", f"d4 * {sh} + d2 * {dh}", "0", "d5 + d3"])
        col = ctx.generic_into_slice(col, [0, 0, 0, taps[0], 0, 0], [n, c, kh, len(taps), oh, ow],
                                     [1, 1, 1, 2, 1, 1], [view], [read], lambda b, args: args[0])
    return col


def im2col_rows(ctx: LoweringContext, x: TensorValue, ks: Sequence[int], out_spatial: Sequence[int],
                stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> TensorValue:
    """The transposed im2col matrix of the whole batch, [N·prod(out_spatial), C·prod(ks)]: row
    ``(n, o)`` holds image n's window at output position o (the rows of a channels-last GEMM, so
    the batch adds rows where a small output plane gives few columns)."""
    n, c, k = x.shape[0], x.shape[1], len(ks)
    xp = pad_spatial(ctx, x, padding)
    shape = [n, *out_spatial, c, *ks]
    window = affine_map(2 + 2 * k, ["d0", f"d{1 + k}"] + [f"d{1 + i} * {stride[i]} + d{2 + k + i} * {dilation[i]}"
                                                          for i in range(k)])
    col = ctx.generic([xp], [window], ctx.empty(shape, x.dtype), ctx.identity_map(2 + 2 * k),
                      ["parallel"] * (2 + 2 * k), lambda b, args: args[0])
    return ctx.reshape(col, (n * math.prod(out_spatial), c * math.prod(ks)))


def col2im(ctx: LoweringContext, cols: TensorValue, c: int, ks: Sequence[int], out_spatial: Sequence[int],
           in_shape: Sequence[int], stride: Sequence[int], padding: Sequence[int],
           dilation: Sequence[int], rows: bool = False) -> TensorValue:
    """The adjoint of :func:`im2col`: ``cols`` [N, C·prod(ks), prod(out_spatial)] (or, with
    ``rows``, :func:`im2col_rows`' [N·prod(out_spatial), C·prod(ks)]) summed into an input-shaped
    [N, C, in spatial...] tensor (each entry added where im2col read it; padding cropped). One
    generic whose kernel loops are sequential (reductions) and whose (n, c) and output-position
    loops are parallel: for fixed kernel offsets the window map is injective."""
    n, k = in_shape[0], len(ks)
    if _plain(ks, stride, padding) and not rows:
        return ctx.reshape(cols, tuple(in_shape))
    padded = list(in_shape[:2]) + [in_shape[2 + i] + 2 * p for i, p in enumerate(padding)]
    if list(stride) == list(ks) and set(dilation) == {1} and not rows:
        return _tile_windows(ctx, ctx.reshape(cols, (n, c, *ks, *out_spatial)), padded, in_shape, padding)
    loops = 2 + 2 * k   # (n, c, kernel spatial..., out spatial...)
    if rows:
        col6 = ctx.reshape(cols, (n, *out_spatial, c, *ks))
        read = affine_map(loops, ["d0"] + [f"d{2 + k + i}" for i in range(k)] + ["d1"] + [f"d{2 + i}" for i in range(k)])
    else:
        col6 = ctx.reshape(cols, (n, c, *ks, *out_spatial))
        read = ctx.identity_map(loops)
    iters = ["parallel", "parallel"] + ["reduction"] * k + ["parallel"] * k
    acc = ctx.generic([col6], [read], ctx.fill(padded, cols.dtype, 0),
                      _window(k, stride, dilation), iters, lambda b, args: b.add(args[1], args[0]), kind="pointwise")
    if any(padding):
        acc = ctx.extract_slice(acc, [0, 0] + list(padding), list(in_shape), [1] * len(in_shape))
    return acc


def _tile_windows(ctx: LoweringContext, col6: TensorValue, padded: Sequence[int], in_shape: Sequence[int],
                  padding: Sequence[int]) -> TensorValue:
    """:func:`col2im` where the windows tile the input exactly (stride = kernel, no dilation: a
    2×2/2 transposed convolution): no position takes two entries, so it is a permutation,
    ``[N, C, k..., o...]`` → ``[N, C, (o_0, k_0), ...]``, then the padding cropped (positions past
    the last window, an ``output_padding``, are zero). As one accumulating loop nest it ran on
    ``loops`` at 2.8 GB/s, stride-2 scalar stores (a UNet's 32→16 up-convolution at 8×16×64×64:
    1.5 ms; AMD Zen 4, 1 thread); as a transpose the kernel offset is innermost."""
    k = len(padding)
    tiled = ctx.permute(col6, [0, 1] + [d for i in range(k) for d in (2 + k + i, 2 + i)])
    full = [col6.shape[2 + k + i] * col6.shape[2 + i] for i in range(k)]
    tiled = ctx.reshape(tiled, (*col6.shape[:2], *full))
    covered = [min(f, p) for f, p in zip(full, padded[2:])]
    if covered != full:
        tiled = ctx.extract_slice(tiled, [0] * (2 + k), [*col6.shape[:2], *covered], [1] * (2 + k))
    if covered != list(padded[2:]):
        tiled = ctx.padded(tiled, padded, [0] * (2 + k))
    if any(padding):
        tiled = ctx.extract_slice(tiled, [0, 0] + list(padding), list(in_shape), [1] * len(in_shape))
    return tiled


def gemm_applies(ctx: LoweringContext, m: int, n: int, k: int, batch: int, dtype: torch.dtype,
                 trans_b: bool = False) -> bool:
    """Whether the ``matmul`` strategy takes a convolution's product (else the caller keeps its
    direct contraction: no im2col copy for a product the tiled GEMM would not run)."""
    from neuron_compile.codegen.strategies import matmul as gemm
    target = ctx.body.target
    if target is None or dtype not in (torch.float32, torch.float64):
        return False
    ov = ctx.body.overrides
    forced = ov.get("matmul") or ov.get("*")
    if forced is not None and forced.strategy != gemm.MatmulTiled.name:
        return False
    return gemm.applies(gemm.GemmProblem(m, n, k, batch, str(dtype).replace("torch.", ""), False, trans_b, True,
                                         not trans_b, batch > 1), target)


# the least share of useful columns for which the implicit GEMM is kept over the rows form
IMPLICIT_MIN_USE = 0.6


def _folds_batch(ctx: LoweringContext, cols: int, dtype: torch.dtype, grid: int | None = None) -> bool:
    """Whether a convolution's products take the rows form (the batch's output positions as the
    GEMM's rows): where one image has fewer output positions (``cols``) than a register tile has
    columns, so a product per image would not run on the tiled GEMM (forward) or would have
    K = OH·OW; or where the implicit GEMM's padded grid (``grid`` = OH·Wp columns, rounded up to
    whole register tiles) would be less than :data:`IMPLICIT_MIN_USE` useful columns. On AVX2
    tiles (16 columns) a 4×4 image is 24 grid columns in 32: the implicit forms computed twice
    the product, and ResNet-18's 256-channel 3×3 training step took 21 ms where eager took 13
    (AMD Zen 3, 1 thread); AVX-512 tiles (32 columns) had sent 4×4 images to the rows form by
    the first rule."""
    tile = _register_tile(ctx, dtype)
    if tile is None:
        return False
    nr = tile[1]
    return cols < nr or (grid is not None and cols < IMPLICIT_MIN_USE * (-(-grid // nr) * nr))


def _register_tile(ctx: LoweringContext, dtype: torch.dtype) -> tuple[int, int] | None:
    """(most rows, columns) of the tiled GEMM's register tiles on this target for ``dtype``
    (float64 halves the columns), or ``None`` where the target has no GEMM table."""
    from neuron_compile.codegen.strategies import matmul as gemm
    target = ctx.body.target
    if target is None or target.isa not in gemm.ISA_TABLE:
        return None
    t = gemm.ISA_TABLE[target.isa]
    return max(t["MR_alt"]), t["NR"] // (2 if dtype == torch.float64 else 1)


def _one_register_tile(ctx: LoweringContext, m: int, n: int, dtype: torch.dtype) -> bool:
    """Whether an M×N product fits in one register tile: a weight gradient that small is one window
    sum per element (the direct form, ``window-reduction``); as a GEMM per image it spent its time
    packing B (1×1 16 → 4 channels at 8×16×64×64: 0.47 ms as a GEMM, eager 0.23; AMD Zen 3, AVX2
    tiles of 6×16, 1 thread)."""
    tile = _register_tile(ctx, dtype)
    return tile is not None and m * n <= tile[0] * tile[1]


def _geometry(x: TensorValue, w_shape: Sequence[int], stride, padding, dilation):
    k = x.rank - 2
    return k, _per_dim(stride, k), _per_dim(padding, k), _per_dim(dilation, k), list(w_shape[2:])


def _rows_of_one(ctx: LoweringContext, v):
    """A 1-D convolution's tensor [N, C, L] (or shape) as a 2-D one's [N, C, 1, L]: the 2-D forms,
    the implicit GEMM first, take 1-D convolutions as images of one row (oneDNN likewise runs
    1-D convolutions as 2-D; Conv1d k3 64ch at 256, batch 16: the im2col training step took 10.5
    ms, eager 7.3; AMD Zen 3, 1 thread)."""
    if isinstance(v, (list, tuple)):
        return [*v[:2], 1, *v[2:]]
    return ctx.reshape(v, (*v.shape[:2], 1, *v.shape[2:]))


def _one_row(stride, padding, dilation) -> tuple[list[int], list[int], list[int]]:
    """Per-dim (stride, padding, dilation) of a 1-D convolution seen as 2-D with one row."""
    return [1, *stride], [0, *padding], [1, *dilation]


def _images(ctx: LoweringContext, t: TensorValue) -> TensorValue:
    """[1, R, C] → [R, C]: one image is a plain GEMM (a batch of one is one forall block, one thread)."""
    return ctx.reshape(t, t.shape[1:]) if t.shape[0] == 1 else t


def forward(ctx: LoweringContext, x: TensorValue, w: TensorValue, bias, stride, padding, dilation,
            groups: int, out_shape: Sequence[int] | None = None) -> TensorValue | None:
    """``conv(x, w) + bias`` [N, OC, out spatial...] as im2col + the tiled GEMM, the bias the
    accumulator's initial value per output channel; ``None`` where the caller's direct
    contraction is kept (groups, half precision, a product the GEMM strategy does not take).
    ``out_shape``: the result's shape where the node's is not it (a transposed convolution's
    input gradient); default the node's output.
    ``x`` may be lazy (a fused pointwise producer): the implicit GEMM computes it into its padded
    input, the other paths store it first."""
    shape, dtype = ctx.out_spec() if out_shape is None else (list(out_shape), x.dtype)
    k, stride, padding, dilation, ks = _geometry(x, w.shape, stride, padding, dilation)
    if k == 1:
        y = forward(ctx, _rows_of_one(ctx, x), _rows_of_one(ctx, w), bias, *_one_row(stride, padding, dilation),
                    groups, out_shape=_rows_of_one(ctx, shape))
        return None if y is None else ctx.reshape(y, tuple(shape))
    n, oc = shape[0], shape[1]
    rows, cols = x.shape[1] * math.prod(ks), math.prod(shape[2:])
    if x.dtype != dtype or w.dtype != dtype:
        return None
    unit = implicit_gemm.applies_to(x.rank, stride, 1)
    grid = shape[2] * (x.shape[3] + 2 * padding[1]) if unit else None
    if groups != 1:
        if unit and x.shape[1] > groups and not _folds_batch(ctx, cols, dtype, grid) and (
                y := implicit_gemm.forward(ctx, x, w, ctx.materialize(bias) if bias is not None else None,
                                           padding, dilation, groups)) is not None:
            return _cropped(ctx, y, shape)
        if not conv_grouped.applies(ctx, groups, x.shape[1], oc, math.prod(ks), n * cols, dtype):
            return None
        return conv_grouped.forward(ctx, ctx.materialize(x), w, bias, shape, groups, ks, stride, padding, dilation)
    if _folds_batch(ctx, cols, dtype, grid) and \
            (y := _rows_forward(ctx, x, w, bias, shape, stride, padding, dilation, ks)) is not None:
        return y
    if unit and (y := implicit_gemm.forward(ctx, x, w, ctx.materialize(bias) if bias is not None else None,
                                            padding, dilation)) is not None:
        return _cropped(ctx, y, shape)
    if not gemm_applies(ctx, oc, cols, rows, n if n > 1 else 0, dtype):
        return _rows_forward(ctx, x, w, bias, shape, stride, padding, dilation, ks)
    x = ctx.materialize(x)  # a lazy input (a fused producer) is read in place only by the implicit GEMM
    col = _images(ctx, im2col(ctx, x, ks, shape[2:], stride, padding, dilation))
    acc = ctx.reshape(ctx.materialize(bias), (oc, 1)) if bias is not None else None
    out = ctx.matmul(ctx.reshape(w, (oc, rows)), col, dtype, acc_init=acc)
    return ctx.reshape(out, tuple(shape))


def _cropped(ctx: LoweringContext, y: TensorValue, shape: Sequence[int]) -> TensorValue:
    """The implicit GEMM's output ``y`` (all the positions the geometry gives) cut to ``shape``
    where that asks for fewer: a transposed convolution's input gradient, the convolution of its
    gradient, which has ``output_padding`` more positions per dim than the input at stride 1
    (dilation 2, ``output_padding`` 1: 17×17 stored into a 16×16 result failed in ``mlir-opt``; a
    new user's trial). The positions past the input are the ones cut (the formula for the first
    ones is the input gradient's)."""
    if tuple(y.shape) == tuple(shape):
        return y
    return ctx.extract_slice(y, [0] * len(shape), list(shape), [1] * len(shape))


def _rows_forward(ctx: LoweringContext, x: TensorValue, w: TensorValue, bias, shape: Sequence[int], stride,
                  padding, dilation, ks: Sequence[int]) -> TensorValue | None:
    """:func:`forward` in the rows form, or ``None`` where the tiled GEMM does not take it: few
    output positions per image (late ResNet stages: 4×4, 2×2), the batch's positions are the rows
    of one channels-last GEMM [N·OH·OW, C·KK] @ Wᵀ, transposed back to NCHW."""
    dtype = x.dtype
    n, oc = shape[0], shape[1]
    rows, cols = x.shape[1] * math.prod(ks), math.prod(shape[2:])
    if not gemm_applies(ctx, n * cols, oc, rows, 0, dtype, trans_b=True):
        return None
    a = im2col_rows(ctx, ctx.materialize(x), ks, shape[2:], stride, padding, dilation)
    if n * cols < oc and gemm_applies(ctx, oc, n * cols, rows, 0, dtype, trans_b=True):
        # fewer rows than output channels (ResNet-18's 512-channel stage at 2×2, batch 16:
        # 64 rows): W [OC, C·KK] @ rowsᵀ streams the weight as stored, where rows @ Wᵀ
        # packed (transposed) all of it on every call (64×512 by K = 4608: 6.6 → 4.0 ms, eager
        # 5.0; AMD Zen 4, 1 thread)
        acc = ctx.reshape(ctx.materialize(bias), (oc, 1)) if bias is not None else None
        out = ctx.matmul(ctx.reshape(w, (oc, rows)), a, dtype, trans_b=True, acc_init=acc)
        return ctx.reshape(ctx.permute(ctx.reshape(out, (oc, n, cols)), (1, 0, 2)), tuple(shape))
    out = ctx.matmul(a, ctx.reshape(w, (oc, rows)), dtype, trans_b=True,
                     acc_init=ctx.materialize(bias) if bias is not None else None)
    return ctx.reshape(ctx.permute(ctx.reshape(out, (n, cols, oc)), (0, 2, 1)), tuple(shape))


def grad_input(ctx: LoweringContext, g: TensorValue, w: TensorValue, in_shape: Sequence[int], stride, padding,
               dilation, groups: int) -> TensorValue | None:
    """The input gradient [N, C, in spatial...] of ``conv(x, w)`` given its output gradient ``g``
    [N, OC, out spatial...]: ``col2im(W[OC, C·KK]ᵀ @ g[n])``; ``None`` where not applicable (as
    :func:`forward`). Also a transposed convolution's forward (``g`` its input, ``w`` [IC, OC, k...])."""
    dtype = g.dtype
    k, stride, padding, dilation, ks = _geometry(g, w.shape, stride, padding, dilation)
    if k == 1:
        gx = grad_input(ctx, _rows_of_one(ctx, g), _rows_of_one(ctx, w), _rows_of_one(ctx, in_shape),
                        *_one_row(stride, padding, dilation), groups)
        return None if gx is None else ctx.reshape(gx, tuple(in_shape))
    n, oc, c = g.shape[0], w.shape[0], w.shape[1]
    rows, cols = c * math.prod(ks), math.prod(g.shape[2:])
    if w.dtype != dtype:
        return None
    if groups != 1:
        if not conv_grouped.applies(ctx, groups, in_shape[1], oc, math.prod(ks), n * cols, dtype):
            return None
        return conv_grouped.grad_input(ctx, g, w, in_shape, groups, ks, stride, padding, dilation)
    full = [d * (s - 1) - p for s, p, d in zip(ks, padding, dilation)]
    unit = implicit_gemm.applies_to(g.rank, stride, groups)
    fold = _folds_batch(ctx, cols, dtype, in_shape[2] * (g.shape[3] + 2 * full[1]) if unit else None)
    if unit and not fold and min(full) >= 0 and math.prod(ks) > 1:
        # unit stride: the input gradient is the full convolution of g with the flipped, transposed
        # kernel (padding d·(k-1) - p), an implicit GEMM like the forward
        flipped = ctx.generic([w], [affine_map(4, ["d1", "d0", f"{ks[0] - 1} - d2", f"{ks[1] - 1} - d3"])],
                              ctx.empty([c, oc, *ks], dtype), ctx.identity_map(4), ["parallel"] * 4,
                              lambda b, args: args[0])
        gx = implicit_gemm.forward(ctx, g, flipped, None, full, dilation)
        if gx is not None and tuple(gx.shape) == tuple(in_shape):
            return gx
    if fold:
        if not gemm_applies(ctx, n * cols, rows, oc, 0, dtype):
            return None
        # the rows form (see forward): [N·OH·OW, OC] @ W[OC, C·KK], then col2im from rows
        g_rows = ctx.reshape(ctx.permute(ctx.reshape(g, (n, oc, cols)), (0, 2, 1)), (n * cols, oc))
        gcols = ctx.matmul(g_rows, ctx.reshape(w, (oc, rows)), dtype)
        return col2im(ctx, gcols, c, ks, g.shape[2:], in_shape, stride, padding, dilation, rows=True)
    if not gemm_applies(ctx, rows, cols, oc, n if n > 1 else 0, dtype):
        return None
    gcols = ctx.matmul(ctx.reshape(w, (oc, rows)), _images(ctx, ctx.reshape(g, (n, oc, cols))), dtype, trans_a=True)
    return col2im(ctx, ctx.reshape(gcols, (n, rows, cols)), c, ks, g.shape[2:], in_shape, stride, padding, dilation)


def grad_weight(ctx: LoweringContext, g: TensorValue, x: TensorValue, w_shape: Sequence[int], stride, padding,
                dilation, groups: int) -> TensorValue | None:
    """The weight gradient [OC, C, k...] of ``conv(x, w)`` given its output gradient ``g``:
    ``Σ_n g[n] @ im2col(x[n])ᵀ``, a batched ``A @ Bᵀ`` and a sum over images; ``None`` where
    not applicable."""
    dtype = g.dtype
    k, stride, padding, dilation, ks = _geometry(x, w_shape, stride, padding, dilation)
    if k == 1:
        gw = grad_weight(ctx, _rows_of_one(ctx, g), _rows_of_one(ctx, x), _rows_of_one(ctx, w_shape),
                         *_one_row(stride, padding, dilation), groups)
        return None if gw is None else ctx.reshape(gw, tuple(w_shape))
    n, oc, c = g.shape[0], w_shape[0], w_shape[1]
    rows, cols = c * math.prod(ks), math.prod(g.shape[2:])
    if x.dtype != dtype:
        return None
    unit = implicit_gemm.applies_to(x.rank, stride, 1)
    grid = g.shape[2] * (x.shape[3] + 2 * padding[1]) if unit else None
    if groups != 1:
        if unit and x.shape[1] > groups and not _folds_batch(ctx, cols, dtype, grid) and (
                gw := implicit_gemm.weight_grad(ctx, g, x, w_shape, padding, dilation, groups)) is not None:
            return gw
        if not conv_grouped.applies(ctx, groups, x.shape[1], oc, math.prod(ks), n * cols, dtype):
            return None
        return conv_grouped.grad_weight(ctx, g, x, w_shape, groups, ks, stride, padding, dilation)
    if _folds_batch(ctx, cols, dtype, grid):
        # the rows form (see forward): one GEMM over the batch's positions, K = N·OH·OW, where a
        # product per image would have K = OH·OW and a sum over images after it
        cols_rows = im2col_rows(ctx, x, ks, g.shape[2:], stride, padding, dilation)
        if gemm_applies(ctx, oc, rows, n * cols, 0, dtype):
            g_t = ctx.reshape(ctx.permute(ctx.reshape(g, (n, oc, cols)), (1, 0, 2)), (oc, n * cols))
            return ctx.reshape(ctx.matmul(g_t, cols_rows, dtype), tuple(w_shape))
        if not gemm_applies(ctx, rows, oc, n * cols, 0, dtype):
            return None
        # fewer input rows than a register tile's columns: the transposed product, transposed back
        g_rows = ctx.reshape(ctx.permute(ctx.reshape(g, (n, oc, cols)), (0, 2, 1)), (n * cols, oc))
        gw_t = ctx.matmul(cols_rows, g_rows, dtype, trans_a=True)
        return ctx.reshape(ctx.permute(gw_t, (1, 0)), tuple(w_shape))
    if unit and (gw := implicit_gemm.weight_grad(ctx, g, x, w_shape, padding, dilation)) is not None:
        return gw
    if _one_register_tile(ctx, oc, rows, dtype):
        return None
    swap = not gemm_applies(ctx, oc, rows, cols, n if n > 1 else 0, dtype)
    if swap and not gemm_applies(ctx, rows, oc, cols, n if n > 1 else 0, dtype, trans_b=True):
        return None
    col = _images(ctx, im2col(ctx, x, ks, g.shape[2:], stride, padding, dilation))
    g_images = _images(ctx, ctx.reshape(g, (n, oc, cols)))
    # fewer input rows (C·KK) than a register tile has columns (MobileNet's 1×1 expansions, 16 or
    # 24 channels in): the transposed product cols @ gᵀ [C·KK, OC], transposed back after the sum
    per_image = (ctx.matmul(col, g_images, dtype, trans_b=True) if swap
                 else ctx.matmul(g_images, col, dtype, trans_b=True))
    if per_image.rank == 3:
        per_image = ctx.materialize(ctx.cast(ctx.reduce(per_image, [0], False, 0, lambda b, a, v: b.add(a, v),
                                                        dtype), dtype))
    if swap:
        per_image = ctx.permute(per_image, (1, 0))
    return ctx.reshape(per_image, tuple(w_shape))
