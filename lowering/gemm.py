"""The payload of a tiled GEMM: packs, a 4-D view of C and one contraction per region.

Written for the ``matmul`` strategy (:mod:`neuron_compile.codegen.strategies.matmul`, which holds
the reasoning and the measurements); every op is tagged ``neuron.kernel`` (the kernel) and
``neuron.part`` (its role: ``gemm_r0``, ``init_r0``, ``packB_r0``, ``packA``, ``packB``) so the
schedule finds it. Dims of each region's contraction: ``(batch?, m1, n1, k, m0, n0)`` with
``m = mlo + m1·mr + m0`` and ``n = nlo + n1·nr + n0``:

    A[m, k]  = Ap(m1, k, m0)   packed    or A4(m1, m0, k) / At4(k, m1, m0)   a view
    B[k, n]  = Bp(n1, k, n0)   packed    or B4(k, n1, n0) / Bt4(n1, n0, k)   a view
    C[m, n]  = C4(m1, m0, n1, n0)          a view of C's region (expand_shape: free)
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategies.matmul import GemmProblem, regions
from neuron_compile.lowering.context import RegionView
from neuron_compile.lowering.ir import TensorValue, reassociation, storage_type, tensor_type


class _Writer:
    """Appends tagged lines to the function body for one GEMM kernel."""

    def __init__(self, ctx: Any, kernel_id: int, dtype: torch.dtype):
        self.ctx, self.kid, self.dtype = ctx, kernel_id, dtype

    def tag(self, part: str) -> str:
        return f'neuron.kernel = {self.kid} : i64, neuron.kind = "matmul", neuron.part = "{part}"'

    def ty(self, shape: Sequence[int]) -> str:
        return tensor_type(tuple(shape), self.dtype)

    def line(self, text: str, shape: Sequence[int], prefix: str = "t") -> TensorValue:
        return self.ctx.emit(text, tuple(shape), self.dtype, prefix)

    def slice(self, v: TensorValue, offsets: Sequence[int], sizes: Sequence[int]) -> TensorValue:
        if list(offsets) == [0] * len(offsets) and tuple(sizes) == v.shape:
            return v
        return self.line(f"tensor.extract_slice {v.name}[{_j(offsets)}] [{_j(sizes)}] [{_j([1] * len(sizes))}] : "
                         f"{v.type} to {self.ty(sizes)}", sizes)

    def expand(self, v: TensorValue, groups: Sequence[Sequence[int]], shape: Sequence[int]) -> TensorValue:
        if tuple(shape) == v.shape:
            return v
        return self.line(f"tensor.expand_shape {v.name} {reassociation(groups)} output_shape [{_j(shape)}] : {v.type} "
                         f"into {self.ty(shape)}", shape)

    def collapse(self, v: TensorValue, groups: Sequence[Sequence[int]], shape: Sequence[int]) -> TensorValue:
        if tuple(shape) == v.shape:
            return v
        return self.line(f"tensor.collapse_shape {v.name} {reassociation(groups)} : {v.type} into {self.ty(shape)}", shape)

    def zero_fill(self, view: TensorValue, part: str) -> TensorValue:
        """A zero accumulator over ``view`` (the register tiles' initial value), tagged ``part``."""
        et = storage_type(self.dtype)
        zero = self.ctx.scalar_const(0, self.dtype)
        return self.line(f"linalg.fill {{{self.tag(part)}}} ins({zero.name} : {et}) outs({view.name} : {view.type}) "
                         f"-> {view.type}", view.shape)

    def contraction(self, a: TensorValue, b: TensorValue, acc: TensorValue, dims: Sequence[str],
                    maps: Sequence[str], iterators: Sequence[str], part: str) -> TensorValue:
        """``acc += a·b`` as one ``linalg.generic`` over loops ``dims`` with ``maps`` (result exprs
        of a, b, acc; affine expressions of ``dims``), its multiply-add free to contract into FMAs."""
        et = storage_type(self.dtype)
        a_m, b_m, c_m = maps
        return self.line(
            f"linalg.generic {{indexing_maps = [{_map(dims, a_m)}, {_map(dims, b_m)}, {_map(dims, c_m)}], "
            f"iterator_types = [{_its(iterators)}], {self.tag(part)}}} "
            f"ins({a.name}, {b.name} : {a.type}, {b.type}) outs({acc.name} : {acc.type}) {{\n"
            f"    ^bb0(%x: {et}, %y: {et}, %acc: {et}):\n"
            f"      %p = arith.mulf %x, %y fastmath<reassoc,contract> : {et}\n"
            f"      %s = arith.addf %acc, %p fastmath<reassoc,contract> : {et}\n"
            f"      linalg.yield %s : {et}\n    }} -> {acc.type}", acc.shape)

    def pack(self, src: TensorValue, part: str, outer_perm: Sequence[int] | None, inner_pos: int, tile: int,
             shape: Sequence[int]) -> TensorValue:
        dest = self.line(f"tensor.empty() : {self.ty(shape)}", shape)
        perm = f"outer_dims_perm = [{_j(outer_perm)}] " if outer_perm else ""
        return self.line(f"linalg.pack {src.name} {perm}inner_dims_pos = [{inner_pos}] inner_tiles = [{tile}] into "
                         f"{dest.name} {{{self.tag(part)}}} : {src.type} -> {dest.type}", shape)


def emit_gemm(ctx: Any, a: TensorValue, b: TensorValue, p: GemmProblem, params: Mapping[str, Any],
              out_dtype: torch.dtype, bias: TensorValue | None, init: TensorValue | None,
              row_bias: bool = False) -> TensorValue:
    """Write the GEMM ``op(a) @ op(b)`` (plus ``bias`` over N, or a full ``init`` of C's shape) as
    the ``matmul`` strategy's payload and record it as one kernel.

    Args:
        a: [*batch, M, K] (or [*batch, K, M] when ``p.trans_a``), no batch dim when ``p.shared_a``;
            b: [*batch, K, N] (or [N, K]).
        params: the schedule from :func:`~neuron_compile.codegen.strategies.matmul.plan`.
        bias: [N], or [M] when ``row_bias`` (a convolution's per-output-channel bias).
    Returns:
        C [*batch, M, N] in ``out_dtype`` (float32 or float64).
    """
    kid = ctx.body.next_kernel_id()
    w = _Writer(ctx, kid, out_dtype)
    nb = 1 if p.batch else 0
    bp = [p.batch] if p.batch else []
    m, n, k = p.m, p.n, p.k
    mr, nr = params["MR"], params["NR"]
    m1, n1 = m // mr, n // nr
    mm, nm = m1 * mr, n1 * nr
    zero_b = [0] * nb
    keep_b = [[i] for i in range(nb)]
    # A's batch dims: none when one A serves every batch (p.shared_a)
    na = 0 if p.shared_a else nb
    bpa, zero_a, keep_a, bda = bp[:na], zero_b[:na], keep_b[:na], (["b"] if na else [])

    trans_a = p.trans_a
    if params.get("transpose_a"):   # At [K, M] → A [M, K], K contiguous (see matmul.a_layout)
        dims2 = bd2 = bda + ["m", "k"]
        a_shape = bpa + [m, k]
        dest = w.line(f"tensor.empty() : {w.ty(a_shape)}", a_shape)
        et = storage_type(a.dtype)
        a = w.line(f"linalg.generic {{indexing_maps = [{_map(dims2, bd2[:na] + ['k', 'm'])}, {_map(dims2, bd2)}], "
                   f"iterator_types = [{_its(['parallel'] * len(dims2))}], {w.tag('transA')}}} "
                   f"ins({a.name} : {a.type}) outs({dest.name} : {dest.type}) {{\n"
                   f"    ^bb0(%x: {et}, %o: {et}):\n      linalg.yield %x : {et}\n    }} -> {dest.type}", a_shape)
        trans_a = False
    packed_a = packed_b = None
    if params["pack_a"] and m1:
        if trans_a:   # At [K, M] → Ap [M/MR, K, MR]
            src = w.slice(a, zero_a + [0, 0], bpa + [k, mm])
            packed_a = w.pack(src, "packA", list(range(na)) + [na + 1, na], na + 1, mr, bpa + [m1, k, mr])
        else:           # A [M, K] → Ap
            src = w.slice(a, zero_a + [0, 0], bpa + [mm, k])
            packed_a = w.pack(src, "packA", None, na, mr, bpa + [m1, k, mr])

    def pack_b(part: str) -> TensorValue:
        if p.trans_b:   # Bt [N, K] → Bp [N/NR, K, NR]
            src = w.slice(b, zero_b + [0, 0], bp + [nm, k])
            return w.pack(src, part, None, nb, nr, bp + [n1, k, nr])
        src = w.slice(b, zero_b + [0, 0], bp + [k, nm])
        return w.pack(src, part, list(range(nb)) + [nb + 1, nb], nb + 1, nr, bp + [n1, k, nr])

    if params["pack_b"] and n1 and not params["fuse_pack_b"]:
        packed_b = pack_b("packB")

    dims = (["b"] if nb else []) + ["m1", "n1", "k", "m0", "n0"]
    bd = ["b"] if nb else []
    c_shape = bp + [m, n]
    c = w.line(f"tensor.empty() : {w.ty(c_shape)}", c_shape)
    if init is not None:  # a full initial C (baddbmm-style): computed into C before the regions
        c = init
        ctx.body.used_as_init(init)
    regs = regions(m, n, params)
    views: list[RegionView] = []
    # one region covering C and no initial C: C is created in its 4-D register-tile view, so a
    # graph output can be written in place (FunctionBody.collapsed_views)
    whole = len(regs) == 1 and init is None and (regs[0].m1 * regs[0].mr, regs[0].n1 * regs[0].nr) == (m, n)
    for r in regs:
        rows, cols = r.m1 * r.mr, r.n1 * r.nr
        if r.a_packed:
            a_op, a_map = packed_a, bda + ["m1", "k", "m0"]
        elif trans_a:
            s = w.slice(a, zero_a + [0, r.mlo], bpa + [k, rows])
            a_op, a_map = w.expand(s, keep_a + [[na], [na + 1, na + 2]], bpa + [k, r.m1, r.mr]), bda + ["k", "m1", "m0"]
        else:
            s = w.slice(a, zero_a + [r.mlo, 0], bpa + [rows, k])
            a_op, a_map = w.expand(s, keep_a + [[na, na + 1], [na + 2]], bpa + [r.m1, r.mr, k]), bda + ["m1", "m0", "k"]
        if r.b_packed:
            b_op = pack_b(f"packB_r{r.idx}") if params["fuse_pack_b"] else packed_b
            b_map = bd + ["n1", "k", "n0"]
        elif p.trans_b:
            s = w.slice(b, zero_b + [r.nlo, 0], bp + [cols, k])
            b_op, b_map = w.expand(s, keep_b + [[nb, nb + 1], [nb + 2]], bp + [r.n1, r.nr, k]), bd + ["n1", "n0", "k"]
        else:
            s = w.slice(b, zero_b + [0, r.nlo], bp + [k, cols])
            b_op, b_map = w.expand(s, keep_b + [[nb], [nb + 1, nb + 2]], bp + [k, r.n1, r.nr]), bd + ["k", "n1", "n0"]
        c_off, c2, c4 = zero_b + [r.mlo, r.nlo], bp + [rows, cols], bp + [r.m1, r.mr, r.n1, r.nr]
        c4_groups = keep_b + [[nb, nb + 1], [nb + 2, nb + 3]]
        region_c = w.slice(c, c_off, c2)
        view = w.line(f"tensor.empty() : {w.ty(c4)}", c4) if whole else w.expand(region_c, c4_groups, c4)
        view_line = len(ctx.body.lines) - 1
        c_map = bd + ["m1", "m0", "n1", "n0"]
        if bias is not None:
            if row_bias:
                bv, bmap = w.expand(w.slice(bias, [r.mlo], [rows]), [[0, 1]], [r.m1, r.mr]), ["m1", "m0"]
            else:
                bv, bmap = w.expand(w.slice(bias, [r.nlo], [cols]), [[0, 1]], [r.n1, r.nr]), ["n1", "n0"]
            cdims = bd + ["m1", "m0", "n1", "n0"]
            acc0 = w.line(f"linalg.generic {{indexing_maps = [{_map(cdims, bmap)}, {_map(cdims, cdims)}], "
                          f"iterator_types = [{_its(['parallel'] * len(cdims))}], {w.tag(f'init_r{r.idx}')}}} "
                          f"ins({bv.name} : {bv.type}) outs({view.name} : {view.type}) {{\n"
                          f"    ^bb0(%bi: {storage_type(out_dtype)}, %bo: {storage_type(out_dtype)}):\n"
                          f"      linalg.yield %bi : {storage_type(out_dtype)}\n    }} -> {view.type}", c4)
        elif init is not None:
            cdims = bd + ["m1", "m0", "n1", "n0"]
            acc0 = w.line(f"linalg.generic {{indexing_maps = [{_map(cdims, cdims)}], iterator_types = "
                          f"[{_its(['parallel'] * len(cdims))}], {w.tag(f'init_r{r.idx}')}}} outs({view.name} : "
                          f"{view.type}) {{\n    ^bb0(%bo: {storage_type(out_dtype)}):\n"
                          f"      linalg.yield %bo : {storage_type(out_dtype)}\n    }} -> {view.type}", c4)
        else:
            acc0 = w.zero_fill(view, f"init_r{r.idx}")
        its = (["parallel"] if nb else []) + ["parallel", "parallel", "reduction", "parallel", "parallel"]
        prod = w.contraction(a_op, b_op, acc0, dims, (a_map, b_map, c_map), its, f"gemm_r{r.idx}")
        flat = w.collapse(prod, c4_groups, c2)
        if whole and flat is not prod:
            ctx.body.collapsed_views[flat.name] = (prod, c4_groups)
        elif init is None and view is not region_c:
            views.append(RegionView(view_line, view.name, prod, tuple(c_off), tuple(map(tuple, c4_groups))))
        if region_c is c:
            c = flat
        else:
            c = w.line(f"tensor.insert_slice {flat.name} into {c.name}[{_j(c_off)}] [{_j(c2)}] [{_j([1] * len(c2))}] "
                       f": {flat.type} into {c.type}", c_shape)
    if len(views) == len(regs) > 1:
        ctx.body.region_views[c.name] = (c, views)
    ops = ctx._provenance()
    operands = [ctx.body.operand(a), ctx.body.operand(b)] + ([ctx.body.operand(bias)] if bias is not None else [])
    ctx.body.add_kernel(KernelInfo(kid, "matmul", (p.batch or 1, m, n, k), (), tuple(operands) + (
        ctx.body.operand(c, output=True),), *ops, attrs={
            "batch": p.batch or 1, "m": m, "n": n, "k": k, "trans_a": p.trans_a, "trans_b": p.trans_b,
            "shared_a": p.shared_a,
            "gemm": dict(params)}))
    return c


def _j(xs: Sequence[Any]) -> str:
    return ", ".join(map(str, xs))


def _its(its: Sequence[str]) -> str:
    return ", ".join(f'"{t}"' for t in its)


def _map(dims: Sequence[str], results: Sequence[str]) -> str:
    return f"affine_map<({', '.join(dims)}) -> ({', '.join(results)})>"
