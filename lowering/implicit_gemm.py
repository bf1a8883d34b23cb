"""Unit-stride 2-D convolutions as an *implicit* GEMM: the ``matmul`` strategy's packed B panels are
copied straight from the zero-padded input, so no im2col matrix is ever stored.

On a padded input of width ``Wp`` flattened per channel, the window of output position
``p = oh·Wp + ow`` at kernel offset ``(kh, kw)`` starts at ``p + kh·dh·Wp + kw·dw``: a *linear*
index. Computing the output on the padded grid (``OH × Wp`` columns, the ``Wp - OW`` extra ones
cropped afterwards) makes every operand an affine view:

    y[n, oc, p] = Σ_{c, kh, kw} W[oc, c, kh, kw] · xf[n, c, p + kh·dh·Wp + kw·dw]

one contraction over loops (n, m1, n1, c, kh, kw, m0, n0) whose B micro-panels ``Bp[n, n1, c, kh,
kw, n0]`` are packed by a windowed copy that the schedule fuses into the k-block loop, as the
GEMM's own B pack (GotoBLAS). This is the layout trick of "indirect"/"implicit GEMM" convolutions
(Dukhan, *The Indirect Convolution Algorithm*, 2019; cuDNN's IMPLICIT_GEMM): the packs read the
input from cache, where a stored im2col matrix is 9× the input for a 3×3 kernel and streams from
memory twice (written, then packed). Output channels and columns are padded to whole register
tiles (zero weights, cropped columns), so the GEMM has one region and no edge tiles.

Measured (2026-12-03, Sapphire Rapids, 1 thread, 3×3 64→64 at 56×56, batch 8): forward 158
GFLOP/s, input gradient 150, weight gradient 154, against 100–115, 71 and 87 for im2col + GEMM
(which also stores a 58 MB im2col matrix per call); :mod:`lowering.conv_gemm` has the comparison.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.gemm import _Writer, _its, _map
from neuron_compile.lowering.ir import TensorValue, storage_type
from neuron_compile.lowering.lazy import LazyTensor


def _round_up(v: int, q: int) -> int:
    return -(-v // q) * q


def _group_loop(groups: int) -> tuple[list[int], list[str]]:
    """A grouped kernel's group loop as (its extent, its loop name), one entry each, or two empty
    lists for one group (whose kernel keeps the ungrouped loops and maps)."""
    return ([groups], ["g"]) if groups > 1 else ([], [])


def padded_rows(hp: int, wp: int, cols: int, kh: int, kw: int, dh: int, dw: int) -> int:
    """Rows of a padded input of width ``wp`` (``hp`` rows with their padding) so that the windows
    of ``cols`` positions of its flattened plane stay inside it: rows of zeros below the image
    hold the last columns' wrapped windows."""
    reach = (cols - 1) + (kh - 1) * dh * wp + (kw - 1) * dw + 1
    return max(hp, -(-reach // wp))


def padded_plane(hp: int, wp: int, cols: int, kh: int, kw: int, dh: int, dw: int) -> tuple[int, int]:
    """(rows, width) of the padded plane whose flattened windows of ``cols`` positions stay inside
    it: :func:`padded_rows` rows of ``wp``, except for one-row images (1-D convolutions), which
    take one row as long as the last window reaches: whole padded rows below them were mostly
    zeros written and never read (a Conv1d's 258-wide row took a second one for 16 wrapped
    columns: its pad kernel 0.13 → 0.09 ms, 16×64×256; AMD Zen 3, 1 thread)."""
    rows = padded_rows(hp, wp, cols, kh, kw, dh, dw)
    if hp == 1 < rows:
        return 1, (cols - 1) + (kw - 1) * dw + 1
    return rows, wp


def schedule(ctx: LoweringContext, n: int, oc: int, cols: int, c: int, kk: int, dtype: torch.dtype
             ) -> dict[str, Any] | None:
    """The GEMM schedule for the implicit product (``None`` when the tiled GEMM does not take it):
    the ``matmul`` plan of the [OC, C·KK] × [C·KK, cols] product per image, plus ``conv`` facts:
    ``kc_c`` channels per k-block (the largest divisor of C with ``kc_c·KK`` at most 1.5 KC: a
    k-block takes every kernel offset of its channels); ``pack_b`` the target's choice
    (``CONV_PACK_B`` in :data:`~neuron_compile.codegen.strategies.matmul.ISA_TABLE`): without the
    pack the micro-kernel loads its B rows straight from the padded input."""
    from neuron_compile.codegen.strategies import matmul as gemm
    target = ctx.body.target
    if target is None or dtype not in (torch.float32, torch.float64):
        return None
    ov = ctx.body.overrides
    forced = ov.get(str(ctx.body.next_kernel_id())) or ov.get("matmul") or ov.get("*")
    if forced is not None and forced.strategy != gemm.MatmulTiled.name:
        return None
    p = gemm.GemmProblem(oc, cols, c * kk, n, str(dtype).replace("torch.", ""), False, False, True, True, True)
    if not gemm.applies(p, target):
        return None
    q = dict(gemm.plan(p, target, forced.params if forced else None).params)
    mp, np_ = _round_up(oc, q["MR"]), _round_up(cols, q["NR"])
    kc_c = max(d for d in range(1, c + 1) if c % d == 0 and (d * kk <= max(kk, 3 * q["KC"] // 2)))
    q.update(MC=mp, NC=min(q["NC"], np_), pack_a=False, transpose_a=False,
             pack_b=gemm.ISA_TABLE[target.isa].get("CONV_PACK_B", True), fuse_pack_b=True,
             problem={**q["problem"], "m": mp, "n": np_},
             conv={"c": c, "kk": kk, "kc_c": kc_c})
    q.update(forced.params if forced else {})
    return q


def forward(ctx: LoweringContext, x: TensorValue, w: TensorValue, bias: TensorValue | None,
            padding: Sequence[int], dilation: Sequence[int], groups: int = 1) -> "LazyTensor | TensorValue | None":
    """``conv2d(x, w, bias, groups=groups)`` with unit stride as one implicit-GEMM kernel, or
    ``None`` where it does not apply (the caller then uses im2col + GEMM or the direct contraction).

    Grouped (``groups`` > 1): the groups are one more parallel loop of the same kernel, its B
    pack reading channel ``g·C/G + c`` and its A group g's weight block (cuDNN's and oneDNN's
    grouped convolutions are likewise a GEMM per group), where an im2col matrix per group, the
    GEMM and a permute to NCHW were three passes (4 groups of 16 channels at 16×16, batch 16:
    3.4 ms, eager 2.3; AMD Zen 3, 1 thread).

    Args:
        x: [N, C, H, W]; w: [OC, C/groups, KH, KW] (same dtype, float32/float64); bias: [OC] or None.
        padding, dilation: per spatial dim (2 each).
    Returns:
        [N, OC, OH, OW] with OH = H + 2·ph - dh·(KH-1), OW likewise: lazy (a pointwise consumer
        reads the crop in its own loop) for one group, stored for several.
    """
    dtype = x.dtype
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    (ph, pw), (dh, dw) = padding, dilation
    hp, wp = h + 2 * ph, wd + 2 * pw
    oh, ow = hp - dh * (kh - 1), wp - dw * (kw - 1)
    if oh <= 0 or ow <= 0 or c != cg * groups or oc % groups:
        return None
    if kh * kw == 1 or w.dtype != dtype:
        return None   # (a 1×1 kernel's im2col is the input itself: the plain GEMM)
    ocg = oc // groups
    q = schedule(ctx, n * groups, ocg, oh * wp, cg, kh * kw, dtype)
    if q is None:
        return None
    if groups > 1:
        q["conv"]["groups"] = groups
    mr, nr = q["MR"], q["NR"]
    mp, np_ = q["problem"]["m"], q["problem"]["n"]
    # rows of zeros below the image so the last padded column's windows stay inside the input
    rows, width = padded_plane(hp, wp, np_, kh, kw, dh, dw)
    xf = ctx.reshape(ctx.padded(x, [n, c, rows, width], [0, 0, ph, pw]), (n, c, rows * width))
    g_, gd = _group_loop(groups)
    lead = len(gd)
    wt = ctx.reshape(w, (*g_, ocg, cg, kh, kw))
    if mp > ocg:
        wt = ctx.padded(wt, [*g_, mp, cg, kh, kw], [0] * (len(g_) + 4))
    bp = None
    if bias is not None:
        bias = ctx.reshape(ctx.materialize(bias), (*g_, ocg))
        bp = ctx.padded(bias, [*g_, mp], [0] * (len(g_) + 1)) if mp > ocg else bias
    kid = ctx.body.next_kernel_id()
    wr = _Writer(ctx, kid, dtype)
    m1, n1 = mp // mr, np_ // nr
    et = storage_type(dtype)
    a5 = wr.expand(wt, [*[[0]] * lead, [lead, lead + 1], [lead + 2], [lead + 3], [lead + 4]],
                   [*g_, m1, mr, cg, kh, kw])
    bp_shape = [n, *g_, n1, cg, kh, kw, nr]
    dest = wr.line(f"tensor.empty() : {wr.ty(bp_shape)}", bp_shape)
    pdims = ["b", *gd, "n1", "c", "kh", "kw", "n0"]
    window = f"n1 * {nr} + n0 + kh * {dh * wp} + kw * {dw}"
    chan = f"g * {cg} + c" if gd else "c"
    packed = wr.line(
        f"linalg.generic {{indexing_maps = [{_map(pdims, ['b', chan, window])}, {_map(pdims, pdims)}], "
        f"iterator_types = [{_its(['parallel'] * len(pdims))}], {wr.tag('packB_r0')}}} "
        f"ins({xf.name} : {xf.type}) outs({dest.name} : {dest.type}) {{\n"
        f"    ^bb0(%x: {et}, %o: {et}):\n      linalg.yield %x : {et}\n    }} -> {dest.type}", bp_shape) \
        if q["pack_b"] else xf
    b_map = ["b", *gd, "n1", "c", "kh", "kw", "n0"] if q["pack_b"] else ["b", chan, window]
    c4 = [n, *g_, m1, mr, n1, nr]
    cdims = ["b", *gd, "m1", "m0", "n1", "n0"]
    view = wr.line(f"tensor.empty() : {wr.ty(c4)}", c4)
    if bp is not None:
        bv = wr.expand(bp, [*[[0]] * lead, [lead, lead + 1]], [*g_, m1, mr])
        acc0 = wr.line(f"linalg.generic {{indexing_maps = [{_map(cdims, [*gd, 'm1', 'm0'])}, {_map(cdims, cdims)}], "
                       f"iterator_types = [{_its(['parallel'] * len(cdims))}], {wr.tag('init_r0')}}} "
                       f"ins({bv.name} : {bv.type}) outs({view.name} : {view.type}) {{\n"
                       f"    ^bb0(%bi: {et}, %bo: {et}):\n      linalg.yield %bi : {et}\n    }} -> {view.type}", c4)
    else:
        acc0 = wr.zero_fill(view, "init_r0")
    dims = ["b", *gd, "m1", "n1", "c", "kh", "kw", "m0", "n0"]
    its = ["parallel"] * (3 + lead) + ["reduction"] * 3 + ["parallel"] * 2
    prod = wr.contraction(a5, packed, acc0, dims, ([*gd, "m1", "m0", "c", "kh", "kw"], b_map, cdims), its, "gemm_r0")
    flat = wr.collapse(prod, [[0], list(range(1, 3 + lead)), [3 + lead, 4 + lead]], [n, groups * mp, np_])
    ops = ctx._provenance()
    operands = [ctx.body.operand(xf), ctx.body.operand(wt)] + ([ctx.body.operand(bp)] if bp is not None else [])
    ctx.body.add_kernel(KernelInfo(kid, "matmul", (n * groups, ocg, oh * ow, cg * kh * kw), (), tuple(operands) + (
        ctx.body.operand(flat, output=True),), *ops, attrs={
            "batch": n * groups, "m": ocg, "n": oh * ow, "k": cg * kh * kw, "trans_a": False, "trans_b": False,
            "shared_a": groups == 1, "conv": True, "gemm": q}))
    if groups == 1:
        wide = ctx.reshape(ctx.extract_slice(flat, [0, 0, 0], [n, oc, oh * wp], [1, 1, 1]), (n, oc, oh, wp))
        crop = ctx.extract_slice(wide, [0, 0, 0, 0], [n, oc, oh, ow], [1, 1, 1, 1])
        # lazy: a pointwise consumer (ReLU) reads the crop in its own loop; stored (a graph output) it
        # is a vectorized copy, not memref.copy of a strided view (the runtime's element-wise copy:
        # 2.4 ms for 3 MB, measured)
        return ctx.elementwise(lambda b, v: v, [crop], crop.shape, dtype)
    grid = ctx.extract_slice(ctx.reshape(flat, (n, groups, mp, np_)), [0] * 4, [n, groups, ocg, oh * wp], [1] * 4)
    crop = ctx.extract_slice(ctx.reshape(grid, (n, groups, ocg, oh, wp)), [0] * 5, [n, groups, ocg, oh, ow], [1] * 5)
    return ctx.reshape(ctx.elementwise(lambda b, v: v, [crop], crop.shape, dtype), (n, oc, oh, ow))


def applies_to(x_rank: int, stride: Sequence[int], groups: int) -> bool:
    """2-D, unit stride, one group: the geometry :func:`forward` handles."""
    return x_rank == 4 and all(s == 1 for s in stride) and groups == 1



def image_k_blocks(positions: int, kc: int) -> tuple[int, int]:
    """(KC, padded positions) of a weight gradient's k-blocks, which never span two images: the
    image's ``positions`` grid columns in equal blocks of at most about ``kc`` (one block up to
    ``2 kc``, never two or three: :func:`~neuron_compile.codegen.strategies.matmul.fit_kc`), each
    a multiple of 8. Rounding the image up to whole blocks of the plan's KC (the rule until
    2026-12) made 4×4 images (24 grid columns) 384 k steps on AVX2 tiles: 16× the work, 97 ms
    for a 256-channel 3×3 training step where eager took 13 (AMD Zen 3, 1 thread)."""
    blocks = 1 if positions <= 2 * kc else max(4, -(-positions // kc))
    block = _round_up(-(-positions // blocks), 8)
    return block, block * blocks


def weight_grad(ctx: LoweringContext, g: TensorValue, x: TensorValue, w_shape: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], groups: int = 1) -> TensorValue | None:
    """The weight gradient [OC, C/groups, KH, KW] of a unit-stride ``conv2d(x, w, groups=groups)``
    given its output gradient ``g`` [N, OC, OH, OW], as one implicit-GEMM kernel (``None`` where it
    does not apply):

        gW[kh, kw][c, oc] = Σ_{n, p} xf[n, c, p + kh·dh·Wp + kw·dw] · gw[n, oc, p]

    with ``gw`` the gradient on the padded grid (zero in the ``Wp - OW`` extra columns). The
    windowed input is the GEMM's A, read in place (MR channels broadcast per k step, as an
    unpacked A); ``gw`` is B, packed per k-block; K = (image, grid position) and the kernel offsets
    are loops around the micro-kernel, so a packed panel of B serves all of them. Grouped, the
    groups are an outer parallel loop: group g's channels of ``x`` against its output channels
    of ``g`` (as :func:`forward`; the im2col form was 3.1 ms of a 4-group 64-channel step at
    16×16, batch 16, its GEMM at 33 GFLOP/s; AMD Zen 3, 1 thread).
    """
    from neuron_compile.codegen.strategies import matmul as gemm
    dtype = g.dtype
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w_shape
    (ph, pw), (dh, dw) = padding, dilation
    hp, wp = h + 2 * ph, wd + 2 * pw
    oh, ow = g.shape[2], g.shape[3]
    target = ctx.body.target
    if kh * kw == 1 or x.dtype != dtype or target is None or dtype not in (torch.float32, torch.float64):
        return None
    if c != cg * groups or oc % groups:
        return None
    ocg = oc // groups
    ov = ctx.body.overrides
    forced = ov.get("matmul") or ov.get("*")
    if forced is not None and forced.strategy != gemm.MatmulTiled.name:
        return None
    p = gemm.GemmProblem(cg, ocg, n * oh * wp, groups if groups > 1 else 0, str(dtype).replace("torch.", ""),
                         False, True, True, False)
    if not gemm.applies(p, target):
        return None
    q = dict(gemm.plan(p, target, forced.params if forced else None).params)
    mr, nr = q["MR"], q["NR"]
    cp, ocp = _round_up(cg, mr), _round_up(ocg, nr)
    if cp == mr and cg <= 8:
        # one register tile of a few input channels (a 3-channel image's first layer): the kernel ran at
        # 1.5–2.6 GFLOP/s (3 or 4 → 16 channels at 8×64×64: 14.5 ms, where im2col + a GEMM per
        # image took 1.6; AMD Zen 3, 1 thread); the caller's im2col form takes it
        return None
    kc, pp = image_k_blocks(oh * wp, q["KC"])
    # the windowed input's plane, and the output gradient's on the padded grid (a 1×1 window)
    rx, rg = padded_plane(hp, wp, pp, kh, kw, dh, dw), padded_plane(oh, wp, pp, 1, 1, 1, 1)
    g_, gd = _group_loop(groups)
    lead = len(gd)
    xg = ctx.reshape(x, (n, *g_, cg, h, wd))
    xf = ctx.reshape(ctx.padded(xg, [n, *g_, cp, *rx], [0] * (lead + 2) + [ph, pw]),
                     (n, groups * cp, rx[0] * rx[1]))
    gg = ctx.reshape(g, (n, *g_, ocg, oh, ow))
    gw = ctx.reshape(ctx.padded(gg, [n, *g_, ocp, *rg], [0] * (lead + 4)),
                     (n, *g_, ocp, rg[0] * rg[1]))
    gw = ctx.extract_slice(gw, [0] * (lead + 3), [n, *g_, ocp, pp], [1] * (lead + 3))
    m1, n1 = cp // mr, ocp // nr
    q.update(MC=cp, NC=ocp, KC=kc, pack_a=False, transpose_a=False, pack_b=True, fuse_pack_b=True,
             problem={**q["problem"], "m": cp, "n": ocp, "k": pp},
             conv_wgrad={"kh": kh, "kw": kw, "images": n, **({"groups": groups} if lead else {})})
    kid = ctx.body.next_kernel_id()
    wr = _Writer(ctx, kid, dtype)
    pk_shape = [n, *g_, n1, pp, nr]
    dest = wr.line(f"tensor.empty() : {wr.ty(pk_shape)}", pk_shape)
    packed = wr.line(f"linalg.pack {gw.name} inner_dims_pos = [{1 + lead}] inner_tiles = [{nr}] into {dest.name} "
                     f"{{{wr.tag('packB_r0')}}} : {gw.type} -> {dest.type}", pk_shape)
    c6 = [*g_, kh, kw, m1, mr, n1, nr]
    view = wr.line(f"tensor.empty() : {wr.ty(c6)}", c6)
    acc0 = wr.zero_fill(view, "init_r0")
    dims = [*gd, "m1", "n1", "b", "p", "kh", "kw", "m0", "n0"]
    its = ["parallel"] * lead + ["parallel", "parallel", "reduction", "reduction"] + ["parallel"] * 4
    chan = f"g * {cp} + m1 * {mr} + m0" if gd else f"m1 * {mr} + m0"
    a_map = ["b", chan, f"p + kh * {dh * wp} + kw * {dw}"]
    prod = wr.contraction(xf, packed, acc0, dims, (a_map, ["b", *gd, "n1", "p", "n0"],
                                                   [*gd, "kh", "kw", "m1", "m0", "n1", "n0"]), its, "gemm_r0")
    flat = wr.collapse(prod, [*[[0]] * lead, [lead], [lead + 1], [lead + 2, lead + 3], [lead + 4, lead + 5]],
                       [*g_, kh, kw, cp, ocp])
    ops = ctx._provenance()
    ctx.body.add_kernel(KernelInfo(kid, "matmul", (groups * kh * kw, cg, ocg, n * oh * ow), (), (
        ctx.body.operand(xf), ctx.body.operand(gw), ctx.body.operand(flat, output=True)), *ops, attrs={
            "batch": groups * kh * kw, "m": cg, "n": ocg, "k": n * oh * ow, "trans_a": False, "trans_b": True,
            "conv": True, "gemm": q}))
    grad = ctx.extract_slice(flat, [0] * (lead + 4), [*g_, kh, kw, cg, ocg], [1] * (lead + 4))
    if not lead:
        return ctx.permute(grad, [3, 2, 0, 1])
    return ctx.reshape(ctx.permute(grad, [0, 4, 3, 1, 2]), tuple(w_shape))
