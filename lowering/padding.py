"""Zero-padded buffers for :class:`~neuron_compile.lowering.context.LoweringContext` (a mixin: its
methods emit through the context): a border filled around a box another op writes (in loops LLVM
does not unroll, per plane on the thread pool where the box spans the leading dims), a stored
input padded plane by plane (``pad-planes``: each plane filled and copied while in cache), and an
input written as its two column phases for a window read at stride 2."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch

from neuron_compile.lowering.ir import Scalar, TensorValue, numel, storage_type, tensor_type

if TYPE_CHECKING:
    from neuron_compile.lowering.lazy import LazyTensor


class Padding:
    """Padding methods of the lowering context (``self`` is a ``LoweringContext``)."""

    def border(self, shape: Sequence[int], dtype: torch.dtype, value: float | int | bool, offsets: Sequence[int],
               sizes: Sequence[int]) -> TensorValue:
        """A tensor of ``shape`` holding ``value`` outside the box ``[offsets, offsets + sizes)`` and
        undefined inside it, for a caller that writes the whole box next (a zero-padded copy: the
        padding filled, not the whole buffer, which the copy then wrote again; 16×96×34×34
        float32, 7 MB stored twice). The complement of the box as at most two strips per dim: dim
        ``d``'s strips span the box along the dims before ``d`` and the whole tensor after it, each
        a fill of one contiguous run per index of those dims (:meth:`_fill_runs`)."""
        shape, offsets, sizes = [int(s) for s in shape], [int(o) for o in offsets], [int(s) for s in sizes]
        out = self.empty(shape, dtype)
        if sizes == shape or math.prod(shape) == 0:
            return out
        if math.prod(sizes) == 0:
            return self.fill(shape, dtype, value)
        c = self.scalar_const(value, dtype)
        lead = len(shape) - 2
        if lead >= 1 and offsets[:lead] == [0] * lead and sizes[:lead] == shape[:lead] and math.prod(shape[:lead]) >= 2:
            return self._border_planes(out, c, offsets[lead:], sizes[lead:])
        return self._border_into(out, c, offsets, sizes)

    def _border_planes(self, out: TensorValue, c: Scalar, at: list[int], box: list[int]) -> TensorValue:
        """:meth:`border` of a box that spans the leading dims, padded in the last two: the same
        fills per plane, in one ``scf.forall`` over the planes (``forall-loop``: on the thread
        pool, where the graph's serial code filled every plane's border on one thread: a
        stride-2 depthwise input gradient's spread, 0.44 ms of serial fills at 2 threads, AMD Zen 3)."""
        lead = out.rank - 2
        return self._over_planes(out, [], list(out.shape[:lead]), [0] * lead, {"forall": True},
                                 lambda plane, ivs: self._border_into(plane, c, at, box).name)

    def _over_planes(self, out: TensorValue, ins: list[TensorValue], counts: list[int], offs: list[int],
                     attrs: dict, plane_fn) -> TensorValue:
        """``out`` with the planes (its trailing dims after ``len(counts)`` leading ones) at leading
        indices ``offs + i`` for ``i`` in ``counts`` rewritten in parallel: one ``scf.forall`` kernel
        (kind ``loop``, ``attrs``; reading ``ins``) whose iteration ``ivs`` extracts its plane and
        inserts back the tensor named by ``plane_fn(plane, ivs)`` (which emits its body)."""
        shape, dtype, lead = list(out.shape), out.dtype, len(counts)
        plane_shape = tuple(shape[lead:])
        plane_t = tensor_type(plane_shape, dtype)
        tag, info = self.tagged_kernel("loop", ins, [out])
        info.attrs.update(attrs)
        self.body.used_as_init(out)
        nm, lines, loc = self.body.namer, self.body.lines, self.loc
        ivs, shared, res, plane = [nm("i") for _ in counts], nm("acc"), nm("t"), nm("t")
        dest, applies = [], []
        for iv, o in zip(ivs, offs):
            dest.append(nm("x") if o else iv)
            if o:
                applies.append(f"      {dest[-1]} = affine.apply affine_map<(d0) -> (d0 + {o})>({iv}) {loc}")
        where = (f"[{', '.join(dest + ['0'] * len(plane_shape))}] [{', '.join(['1'] * lead + list(map(str, plane_shape)))}] "
                 f"[{', '.join(['1'] * len(shape))}]")
        lines += [f"    {res} = scf.forall ({', '.join(ivs)}) in ({', '.join(map(str, counts))}) "
                  f"shared_outs({shared} = {out.name}) -> ({out.type}) {{", *applies,
                  f"      {plane} = tensor.extract_slice {shared}{where} : {out.type} to {plane_t} {loc}"]
        new = plane_fn(TensorValue(plane, plane_shape, dtype), ivs)
        lines += ["      scf.forall.in_parallel {",
                  f"        tensor.parallel_insert_slice {new} into {shared}{where} : {plane_t} into {out.type}",
                  "      }",
                  f"    }} {tag} {loc}"]
        self.body.add_kernel(info)
        return TensorValue(res, out.shape, dtype)

    def _border_into(self, out: TensorValue, c: Scalar, offsets: list[int], sizes: list[int]) -> TensorValue:
        """``out`` with ``c`` outside the box (:meth:`border`)."""
        shape = list(out.shape)
        last = len(shape) - 1
        for d in range(len(shape)):
            lo, hi = int(offsets[d]), int(offsets[d]) + int(sizes[d])
            if d == last and d >= 1 and (lo or hi < shape[d]):
                out = self._fill_row_ends(out, c, [int(o) for o in offsets[:d]], [int(z) for z in sizes[:d]],
                                          lo, shape[d] - hi)
                continue
            for start, size in ((0, lo), (hi, shape[d] - hi)):
                if size > 0:
                    out = self._fill_runs(out, c, [int(o) for o in offsets[:d]], [int(z) for z in sizes[:d]],
                                          start, size)
        return out

    # Filled as one ``linalg.fill`` per strip, the strips became loop nests of ``memset``s which
    # ``opt`` unrolled into hundreds of inlined ``memset``s in one basic block, and ``llc``'s
    # schedulers are quadratic in a block's size (UNet b8 training: 5.8 s of ``llc`` for one
    # 512-``memset`` block, the cold compile 17 → 53 s): the runs are filled in ``scf.for`` loops
    # marked not to unroll, one loop per dim (no div/mod per run).
    _NO_UNROLL = "{loop_annotation = #llvm.loop_annotation<unroll = <disable = true>>}"

    def _open_loops(self, acc: str, ty: str, bounds: Sequence[tuple[int, int]], depth: int
                    ) -> tuple[list[str], list[str], str]:
        """Open one ``scf.for`` per ``(lo, hi)`` of ``bounds`` carrying the tensor ``acc`` of type
        ``ty``; returns (induction variables, the loops' results outermost first, the innermost
        iteration's tensor). ``depth`` is the nesting the first loop is emitted at."""
        nm, lines, loc = self.body.namer, self.body.lines, self.loc
        c1 = nm("c")
        lines.append(f"    {'  ' * depth}{c1} = arith.constant 1 : index {loc}")
        ivs, results = [], []
        for k, (lo, hi) in enumerate(bounds):
            indent, a, b, iv, inner, r = "    " + "  " * (depth + k), nm("c"), nm("c"), nm("i"), nm("acc"), nm("t")
            lines += [f"{indent}{a} = arith.constant {lo} : index {loc}", f"{indent}{b} = arith.constant {hi} : index {loc}",
                      f"{indent}{r} = scf.for {iv} = {a} to {b} step {c1} iter_args({inner} = {acc}) -> ({ty}) {{"]
            ivs.append(iv)
            results.append(r)
            acc = inner
        return ivs, results, acc

    def _close_loops(self, upd: str, ty: str, results: list[str], depth: int) -> None:
        for k in reversed(range(len(results))):
            indent = "    " + "  " * (depth + k)
            self.body.lines += [f"{indent}  scf.yield {upd} : {ty} {self.loc}", f"{indent}}} {self._NO_UNROLL} {self.loc}"]
            upd = results[k]

    def _fill_slice(self, acc: str, ty: str, c: Scalar, dtype: torch.dtype, at: Sequence[str | int],
                    sizes: Sequence[int], run: tuple[int, ...], depth: int) -> str:
        """``acc[at : at + sizes]`` (unit sizes dropped: the run's shape ``run``) filled with ``c``."""
        nm, loc, indent = self.body.namer, self.loc, "    " + "  " * depth
        run_t = tensor_type(run, dtype)
        where = f"[{', '.join(map(str, at))}] [{', '.join(map(str, sizes))}] [{', '.join(['1'] * len(sizes))}]"
        part, filled, upd = nm("t"), nm("t"), nm("t")
        self.body.lines += [
            f"{indent}{part} = tensor.extract_slice {acc}{where} : {ty} to {run_t} {loc}",
            f"{indent}{filled} = linalg.fill ins({c.name} : {storage_type(dtype)}) outs({part} : {run_t}) -> {run_t} {loc}",
            f"{indent}{upd} = tensor.insert_slice {filled} into {acc}{where} : {run_t} into {ty} {loc}"]
        return upd

    def _fill_runs(self, out: TensorValue, c: Scalar, lead_at: list[int], lead_sizes: list[int], start: int,
                   size: int) -> TensorValue:
        """``out`` with ``c`` in ``out[lead box, start:start + size, ...]``: one ``linalg.fill`` of the
        contiguous run ``[start:start + size, ...]`` per index of the leading box."""
        shape, dtype, d = out.shape, out.dtype, len(lead_at)
        rest = (size,) + tuple(shape[d + 1:])
        tail = [start] + [0] * (len(shape) - d - 1)
        if math.prod(lead_sizes) == 1:
            name = self._fill_slice(out.name, out.type, c, dtype, lead_at + tail, [1] * d + list(rest), rest, 0)
            return TensorValue(name, shape, dtype)
        ivs, results, acc = self._open_loops(out.name, out.type, [(o, o + z) for o, z in zip(lead_at, lead_sizes)], 0)
        upd = self._fill_slice(acc, out.type, c, dtype, ivs + tail, [1] * d + list(rest), rest, d)
        self._close_loops(upd, out.type, results, 0)
        return TensorValue(results[0], shape, dtype)

    def _fill_row_ends(self, out: TensorValue, c: Scalar, lead_at: list[int], lead_sizes: list[int], left: int,
                       right: int) -> TensorValue:
        """``out`` with ``c`` in the ``left`` first and ``right`` last elements of each row of the
        leading box (dims before the last). Two column strips would sweep every row's cache lines
        twice before the copy into the box sweeps them again; here a row's right end and the next
        row's left end are one run of ``right + left`` elements of the plane viewed flat, one sweep
        (the top and bottom strips, already filled, absorb the runs past the box's first and last
        rows where they exist)."""
        shape, dtype = out.shape, out.dtype
        d, wp, hp = len(shape) - 1, shape[-1], shape[-2]
        w = wp - left - right
        oh, sh = lead_at[-1], lead_sizes[-1]
        flat_shape = tuple(shape[:-2]) + (hp * wp,)
        flat_t = tensor_type(flat_shape, dtype)
        groups = ", ".join([f"[{k}]" for k in range(d - 1)] + [f"[{d - 1}, {d}]"])
        flat = self.emit(f"tensor.collapse_shape {out.name} [{groups}] : {out.type} into {flat_t}", flat_shape, dtype)
        outer = list(zip(lead_at[:-1], lead_sizes[:-1]))
        ivs, results, acc = self._open_loops(flat.name, flat_t, [(o, o + z) for o, z in outer], 0) if outer \
            else ([], [], flat.name)
        depth = len(outer)
        ones = [1] * (d - 1)

        def run(acc: str, start: "int | str", n: int, depth: int) -> str:
            return self._fill_slice(acc, flat_t, c, dtype, ivs + [start], ones + [n], (n,), depth) if n else acc
        first = oh - 1 if oh >= 1 else oh       # the run after row h: [h*wp + left + w, (h+1)*wp + left)
        if oh == 0:
            acc = run(acc, 0, left, depth)
        whole = oh + sh < hp or left == 0        # the last box row's run fits before the plane's end
        stop = oh + sh if whole else oh + sh - 1
        if stop > first:
            (h,), inner_results, inner = self._open_loops(acc, flat_t, [(first, stop)], depth)
            at = self.body.namer("x")
            self.body.lines.append(f"    {'  ' * (depth + 1)}{at} = affine.apply affine_map<(d0) -> "
                                   f"(d0 * {wp} + {left + w})>({h}) {self.loc}")
            upd = run(inner, at, left + right, depth + 1)
            self._close_loops(upd, flat_t, inner_results, depth)
            acc = inner_results[0]
        if not whole:
            acc = run(acc, (oh + sh - 1) * wp + left + w, right, depth)
        if outer:
            self._close_loops(acc, flat_t, results, 0)
            acc = results[0]
        expanded = self.emit(f"tensor.expand_shape {acc} [{groups}] output_shape [{', '.join(map(str, shape))}] : "
                             f"{flat_t} into {out.type}", shape, dtype)
        return expanded

    def padded(self, x: "TensorValue | LazyTensor", shape: Sequence[int], offsets: Sequence[int],
               value: float | int | bool = 0) -> TensorValue:
        """``x`` written at ``offsets`` of a ``shape`` tensor holding ``value`` elsewhere (constant
        padding). A stored ``x`` (or a ``cat`` of stored pieces) padded in its last two dims is
        written plane by plane (:meth:`_padded_planes`); otherwise the border is filled
        (:meth:`border`), then ``x`` copied or computed into the box (a lazy ``x``: computed
        there, one pass)."""
        pieces = self._stored_planes(x, shape, offsets)
        if pieces is not None:
            return self._padded_planes(pieces, [int(s) for s in shape], [int(o) for o in offsets[-2:]], value)
        return self.insert_slice(x, self.border(shape, x.dtype, value, offsets, x.shape), offsets)

    def _stored_planes(self, x: "TensorValue | LazyTensor", shape: Sequence[int], offsets: Sequence[int]
                       ) -> "list[tuple[TensorValue, list[int]]] | None":
        """``x`` as stored pieces and their offsets in the leading dims of ``shape`` when it is
        padded in its last two dims only (a stored value: one piece; a ``cat`` along a leading
        dim: its pieces, each stored), else ``None``."""
        if x.rank < 3 or numel(shape) == 0 or numel(x.shape) == 0 or numel(shape[:-2]) < 2 \
                or list(offsets[:-2]) != [0] * (x.rank - 2) or list(x.shape[:-2]) != list(shape[:-2]):
            return None
        if isinstance(x, TensorValue) and x.name in self.body.concats:
            pieces = [(p, list(at[:-2])) for p, at in self.body.concats[x.name]]
            if all(isinstance(p, TensorValue) and p.name not in self.body.concats and list(at[-2:]) == [0, 0]
                   and list(p.shape[-2:]) == list(x.shape[-2:]) for p, at in self.body.concats[x.name]):
                return pieces
            return None
        return [(x, [0] * (x.rank - 2))] if isinstance(x, TensorValue) else None

    def _padded_planes(self, pieces: "list[tuple[TensorValue, list[int]]]", shape: list[int], at: list[int],
                       value: float | int | bool, perm: Sequence[int] | None = None) -> TensorValue:
        """:meth:`padded` of stored pieces (each at its offsets in the leading dims) padded in
        the last ``len(at)`` dims (a plane): per piece one ``scf.forall`` over its planes
        (``pad-planes``), each plane of the result filled whole with ``value`` and the piece's
        plane copied into its box at ``at`` while the plane is in cache; with ``perm``, the
        piece's plane transposed by ``perm`` into the box (:meth:`phase_planes`). Filled as a
        separate pass (:meth:`border`: serial loops before a copy kernel), each border run missed
        its cache line once more before the copy wrote it again (a depthwise stride-2 layer's
        16×96×34×34 input at 2 threads: 0.22 ms of serial fills before a 0.30 ms copy, AMD Zen 3)."""
        dtype, k = pieces[0][0].dtype, len(at)
        lead = len(shape) - k
        out = self.empty(shape, dtype)
        c = self.scalar_const(value, dtype)
        nm, loc = self.body.namer, self.loc
        st, unit = storage_type(dtype), ", ".join(["1"] * k)
        for piece, offs in pieces:
            src_shape = list(piece.shape[lead:])
            box_shape = [src_shape[p] for p in perm] if perm else src_shape
            src_t, box_t = tensor_type(tuple(src_shape), dtype), tensor_type(tuple(box_shape), dtype)
            box_where = f"[{', '.join(map(str, at))}] [{', '.join(map(str, box_shape))}] [{unit}]"

            def fill_and_copy(plane: TensorValue, ivs: list[str], piece=piece, src_shape=src_shape, src_t=src_t,
                              box_t=box_t, box_where=box_where) -> str:
                filled, src, box, copied, new = nm("t"), nm("t"), nm("t"), nm("t"), nm("t")
                src_where = (f"[{', '.join(ivs + ['0'] * k)}] [{', '.join(['1'] * lead + list(map(str, src_shape)))}] "
                             f"[{', '.join(['1'] * len(shape))}]")
                op = (f"linalg.transpose ins({src} : {src_t}) outs({box} : {box_t}) permutation = "
                      f"[{', '.join(map(str, perm))}]" if perm else
                      f"linalg.copy ins({src} : {src_t}) outs({box} : {box_t}) -> {box_t}")
                self.body.lines.extend([
                    f"      {filled} = linalg.fill ins({c.name} : {st}) outs({plane.name} : {plane.type}) -> "
                    f"{plane.type} {loc}",
                    f"      {src} = tensor.extract_slice {piece.name}{src_where} : {piece.type} to {src_t} {loc}",
                    f"      {box} = tensor.extract_slice {filled}{box_where} : {plane.type} to {box_t} {loc}",
                    f"      {copied} = {op} {loc}",
                    f"      {new} = tensor.insert_slice {copied} into {filled}{box_where} : {box_t} into "
                    f"{plane.type} {loc}"])
                return new
            # (pad-planes vectorizes the fill and the copy, else forall-loop)
            out = self._over_planes(out, [piece], list(piece.shape[:lead]), offs,
                                    {"forall": True, "pad_planes": True, "plane_rank": k, "transposed": bool(perm)},
                                    fill_and_copy)
        return out

    def phase_planes(self, x: TensorValue, rows: tuple[int, int], left: int, cols: int) -> TensorValue:
        """``x`` [..., H, W] (W even) as its two column phases, zero-padded: [..., top + H + bottom,
        2, cols] with ``[..., top + h, q, left + i] = x[..., h, 2i + q]`` and zeros elsewhere
        (``rows = (top, bottom)``). A window read at stride 2 along W is a unit-stride window of
        one phase (a stride-2 depthwise convolution: :func:`~neuron_compile.lowering.rules.conv`).
        One ``pad-planes`` kernel: each plane filled, then ``x``'s plane viewed [H, W/2, 2]
        transposed into the box."""
        *lead, h, w = x.shape
        pairs = self.reshape(x, (*lead, h, w // 2, 2))
        shape = [*lead, rows[0] + h + rows[1], 2, cols]
        return self._padded_planes([(pairs, [0] * len(lead))], shape, [rows[0], 0, left], 0, perm=(0, 2, 1))
