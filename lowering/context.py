"""The lowering context: what a rule sees, and the builders it composes MLIR from.

A rule gets a :class:`LoweringContext` for one FX node plus the node's arguments, with tensor
arguments replaced by :class:`~lowering.ir.TensorValue`. It returns a ``TensorValue`` (or a tuple for
multi-result ops). Builders emit ``linalg``/``tensor``/``arith`` ops on tensors; broadcasting is an
indexing map (never a materialised copy), following the linalg "structured ops" design
(MLIR docs, *Linalg dialect rationale*).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from neuron_compile.codegen.kernels import KernelInfo, parse_map_results
from neuron_compile.codegen.strategy import Schedule, TargetInfo
from neuron_compile.codegen.kernels import Operand as KernelOperand
from neuron_compile.lowering.lazy import (FROM_CHANNELS_LAST, TO_CHANNELS_LAST, LazyTensor, Leaf, channels_last_backed,
                                          permuted, pointwise)
from neuron_compile.lowering.locations import op_name
from neuron_compile.lowering.ir import (Namer, Scalar, TensorValue, affine_map, numel, reassociation, storage_type,
                                        tensor_type)
from neuron_compile.lowering.scalar import ScalarBuilder
from neuron_compile.errors import LoweringError, RuleDeclined

Operand = TensorValue | LazyTensor | float | int | bool
BodyFn = Callable[..., Scalar]


class BodyBuilder(ScalarBuilder):
    """A :class:`ScalarBuilder` inside a ``linalg.generic`` region; adds loop indices."""

    def index(self, dim: int) -> Scalar:
        """The current iteration index of loop ``dim`` as an ``i64`` scalar."""
        raw = self.namer("i")
        self.lines.append(f"{self.indent}{raw} = linalg.index {dim} : index{self.loc}")
        out = self._emit(f"arith.index_cast {raw} : index to i64", torch.int64)
        self._loop_indices[out.name] = raw
        return out

    @property
    def _loop_indices(self) -> dict[str, str]:
        """The ``i64`` scalars that are loop indices, each with the ``linalg.index`` it came from."""
        return self.__dict__.setdefault("_loop_index_names", {})

    def extract(self, t: TensorValue, indices: Sequence[Scalar]) -> Scalar:
        """``tensor.extract`` of ``t`` at i64 ``indices`` (a gather; caller guarantees bounds)."""
        idx = []
        for s in indices:
            if s.name in self._loop_indices:  # a loop index as is (the vectorizer sees a contiguous read)
                idx.append(self._loop_indices[s.name])
                continue
            name = self.namer("x")
            self.lines.append(f"{self.indent}{name} = arith.index_cast {s.name} : i64 to index{self.loc}")
            idx.append(name)
        if t.dtype == torch.bool:
            raw = self._emit(f"tensor.extract {t.name}[{', '.join(idx)}] : {t.type}", torch.uint8)
            return self.from_storage(raw.name, torch.bool)
        return self._emit(f"tensor.extract {t.name}[{', '.join(idx)}] : {t.type}", t.dtype)

    def from_storage(self, name: str, dtype: torch.dtype) -> Scalar:
        """A scalar read from a tensor: ``bool`` is stored as ``i8`` and becomes ``i1`` here."""
        if dtype == torch.bool:
            return self._emit(f"arith.trunci {name} : i8 to i1", torch.bool)
        return Scalar(name, dtype)

    def to_storage(self, s: Scalar) -> Scalar:
        """The value to store into a tensor (``i1`` → ``i8`` for ``bool``)."""
        if s.dtype == torch.bool:
            out = self._emit(f"arith.extui {s.name} : i1 to i8", torch.uint8)
            return Scalar(out.name, torch.bool)
        return s


@dataclass(frozen=True)
class RegionView:
    """One region of a GEMM's C (:func:`neuron_compile.lowering.gemm.emit_gemm`): its register-tile
    view was written at ``body.lines[line]`` as ``name``; ``value`` (type ``shape``, 4-D or
    batched 5-D) is its result, at ``offsets`` of the 2-D (or batched) C, grouped into C's dims
    by ``groups``."""

    line: int
    name: str
    value: TensorValue
    offsets: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]


@dataclass
class FunctionBody:
    """The growing body of the one ``func.func`` a graph lowers to.

    ``kernels`` lists the loop nests over data emitted so far (accumulator fills and inits
    excluded), in order; ``strides`` holds the memory strides of tensors bound to graph inputs
    (the rest are allocated contiguous); ``fused_ops`` the ATen ops of each FX fusion group; with
    ``profile`` every kernel is followed by a call that records its time
    (:mod:`neuron_compile.profile`).
    """

    namer: Namer = field(default_factory=Namer)
    lines: list[str] = field(default_factory=list)
    kernels: list[KernelInfo] = field(default_factory=list)
    strides: dict[str, tuple[int, ...]] = field(default_factory=dict)
    fused_ops: dict[int, tuple[str, ...]] = field(default_factory=dict)
    profile: bool = False
    fills: set[str] = field(default_factory=set)  # tensors produced by linalg.fill (a kernel's init)
    unit_views: dict[str, tuple[TensorValue, tuple[str, ...]]] = field(default_factory=dict)  # see reshape()
    # a value that is a collapse_shape of a value computed in its expanded form (a GEMM's C4): a
    # graph output is then materialized as that value into the output memref's expand_shape, so
    # eliminate-empty-tensors (which follows same-type values only) writes it in place
    # (``None`` groups: a reshape of such a value, stored through the flattened destination)
    collapsed_views: dict[str, tuple[TensorValue, list[list[int]] | None]] = field(default_factory=dict)
    # a GEMM's C assembled from several regions (edge tiles): C, and per region what storing it as a
    # graph output in place needs (lowering/emit.py _store_output)
    region_views: dict[str, tuple[TensorValue, list["RegionView"]]] = field(default_factory=dict)
    # the links a graph output can reach such a C through (lowering/emit.py _store_output): a
    # row-major reshape (result → source), and a loop updating its init in place (result → the init
    # and the ``lines`` index of its ``scf.for``: an ``index_put`` into a weight gradient)
    views: dict[str, TensorValue] = field(default_factory=dict)
    # a ``cat``'s result → its pieces (values, lazy ones too, and their offsets in it): a copy of the
    # result into a larger buffer (a convolution's zero padding) is then the pieces written into it
    concats: dict[str, list[tuple[Any, list[int]]]] = field(default_factory=dict)
    updates: dict[str, tuple[TensorValue, int]] = field(default_factory=dict)
    init_uses: dict[str, int] = field(default_factory=dict)  # value → times used as a destination (outs)
    # lazy values already written to memory (by object: LazyTensor compares by identity), so a rule
    # that tries one path with a lazy input and falls back to another stores it once
    stored: dict[int, tuple[LazyTensor, TensorValue]] = field(default_factory=dict)
    target: TargetInfo | None = None  # for strategies that shape the payload (matmul)
    overrides: dict[str, Schedule] = field(default_factory=dict)  # parsed NEURON_SCHEDULE

    def next_kernel_id(self) -> int:
        return len(self.kernels)

    def used_as_init(self, *values: TensorValue) -> None:
        """Record destination (``outs``) uses: one value initialising two ops is what MLIR's
        eliminate-empty-tensors miscompiles (:attr:`shares_inits`)."""
        for v in values:
            name = v.name.split("#")[0]
            self.init_uses[name] = self.init_uses.get(name, 0) + 1

    @property
    def shares_inits(self) -> bool:
        return any(n > 1 for n in self.init_uses.values())

    def add_kernel(self, info: KernelInfo) -> None:
        """Record a kernel whose root op (tagged with ``info.id``) was just appended."""
        assert info.id == len(self.kernels), (info.id, len(self.kernels))
        self.kernels.append(info)
        if self.profile:
            c = self.namer("prof")
            self.lines += [f"    {c} = arith.constant {info.id} : i64",
                           f"    func.call @{PROFILE_TICK}({c}) : (i64) -> ()"]
            # the glue before the kernel (its operands' untagged inits, padding fills, copies) in
            # a slot of its own: counted in the kernel's, serial scalar loops hid there (a
            # convolution's bias broadcast: 2 ms of a 3 ms layer at 2 threads)
            tag = re.compile(rf"^    %[\w.$#:]+ = .*neuron\.kernel = {info.id} : i64")
            tick = f"func.call @{PROFILE_TICK}("
            since = next((i + 1 for i in range(len(self.lines) - 3, -1, -1) if tick in self.lines[i]), 0)
            at = next((i for i in range(since, len(self.lines)) if tag.match(self.lines[i])), None)
            if at is not None:   # prefixed to the op's line: rules keep indices into ``lines``
                g = self.namer("prof")
                self.lines[at] = (f"    {g} = arith.constant {GLUE_SLOT + info.id} : i64\n"
                                  f"    func.call @{PROFILE_TICK}({g}) : (i64) -> ()\n{self.lines[at]}")

    def operand(self, v: TensorValue, exprs: Sequence[str] = (), output: bool = False) -> KernelOperand:
        return KernelOperand(v.shape, v.dtype, tuple(exprs), self.strides.get(v.name.split("#")[0]), output, v.name)


PROFILE_TICK = "neuron_profile_tick"
# profile slot of the glue before kernel k: GLUE_SLOT + k (neuron_compile/profile.py)
GLUE_SLOT = 1 << 15


@dataclass
class LoweringContext:
    """Per-node view onto the function being emitted.

    Attributes:
        body: the function body lines and SSA namer.
        node: the FX node being lowered (``None`` for graph-level glue).
        loc: its MLIR location (``loc(...)``), attached to every op the rule emits.
    """

    body: FunctionBody
    node: torch.fx.Node | None
    loc: str

    # -- metadata --------------------------------------------------------------------------------
    @property
    def out_meta(self) -> Any:
        """The node's ``meta['val']`` (a FakeTensor or a tuple of them)."""
        return self.node.meta["val"]

    def out_spec(self, i: int | None = None) -> tuple[tuple[int, ...], torch.dtype]:
        v = self.out_meta if i is None else self.out_meta[i]
        return tuple(int(s) for s in v.shape), v.dtype

    def unsupported(self, reason: str) -> RuleDeclined:
        """For a rule to decline a case of its op: reported with every other unsupported op."""
        return RuleDeclined(reason)

    def fail(self, message: str) -> LoweringError:
        return LoweringError(message, op=str(getattr(self.node, "target", "")),
                             node=getattr(self.node, "name", ""), location=self.loc)

    # -- raw emission ----------------------------------------------------------------------------
    def emit(self, text: str, shape: tuple[int, ...], dtype: torch.dtype, prefix: str = "t") -> TensorValue:
        """Append ``%new = <text> loc(...)``; ``text`` must produce a tensor of (shape, dtype)."""
        name = self.body.namer(prefix)
        self.body.lines.append(f"    {name} = {text} {self.loc}")
        return TensorValue(name, tuple(shape), dtype)

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> TensorValue:
        shape = tuple(int(s) for s in shape)
        return self.emit(f"tensor.empty() : {tensor_type(shape, dtype)}", shape, dtype)

    def scalar_const(self, value: float | int | bool, dtype: torch.dtype) -> Scalar:
        """A constant in storage form (``bool`` as an ``i8`` 0/1)."""
        sb = ScalarBuilder(self.body.namer, self.body.lines, indent="    ", loc=self.loc)
        if dtype == torch.bool:
            return Scalar(sb.const(int(bool(value)), torch.int8).name, torch.bool)
        return sb.const(value, dtype)

    def fill(self, shape: Sequence[int], dtype: torch.dtype, value: float | int | bool) -> TensorValue:
        """A tensor of ``shape`` filled with ``value`` (``linalg.fill``)."""
        e = self.empty(shape, dtype)
        c = self.scalar_const(value, dtype)
        out = self.emit(f"linalg.fill ins({c.name} : {storage_type(dtype)}) outs({e.name} : {e.type}) -> {e.type}",
                        e.shape, dtype)
        self.body.fills.add(out.name)
        return out

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
        shape, dtype = list(out.shape), out.dtype
        lead = len(shape) - 2
        plane_t = tensor_type(tuple(shape[lead:]), dtype)
        tag, info = self.tagged_kernel("loop", [], [out])
        info.attrs["forall"] = True
        self.body.used_as_init(out)
        nm, lines, loc = self.body.namer, self.body.lines, self.loc
        ivs, shared, res, plane = [nm("i") for _ in range(lead)], nm("acc"), nm("t"), nm("t")
        where = (f"[{', '.join(ivs)}, 0, 0] [{', '.join(['1'] * lead)}, {shape[-2]}, {shape[-1]}] "
                 f"[{', '.join(['1'] * len(shape))}]")
        lines += [f"    {res} = scf.forall ({', '.join(ivs)}) in ({', '.join(map(str, shape[:lead]))}) "
                  f"shared_outs({shared} = {out.name}) -> ({out.type}) {{",
                  f"      {plane} = tensor.extract_slice {shared}{where} : {out.type} to {plane_t} {loc}"]
        filled = self._border_into(TensorValue(plane, tuple(shape[lead:]), dtype), c, at, box)
        lines += ["      scf.forall.in_parallel {",
                  f"        tensor.parallel_insert_slice {filled.name} into {shared}{where} : {plane_t} into {out.type}",
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
        plane_shape = shape[lead:]
        out = self.empty(shape, dtype)
        c = self.scalar_const(value, dtype)
        nm, lines, loc = self.body.namer, self.body.lines, self.loc
        plane_t, st = tensor_type(tuple(plane_shape), dtype), storage_type(dtype)
        ones, unit = ", ".join(["1"] * len(shape)), ", ".join(["1"] * k)
        for piece, offs in pieces:
            src_shape = list(piece.shape[lead:])
            box_shape = [src_shape[p] for p in perm] if perm else src_shape
            src_t, box_t = tensor_type(tuple(src_shape), dtype), tensor_type(tuple(box_shape), dtype)
            tag, info = self.tagged_kernel("loop", [piece], [out])
            info.attrs.update(forall=True, pad_planes=k, transposed=bool(perm))   # (pad-planes, else forall-loop)
            self.body.used_as_init(out)
            ivs = [nm("i") for _ in range(lead)]
            shared, res, plane, filled, src, box, copied, new = (nm("acc"), nm("t"), nm("t"), nm("t"), nm("t"),
                                                                 nm("t"), nm("t"), nm("t"))
            dest, applies = [], []
            for iv, o in zip(ivs, offs):
                dest.append(nm("x") if o else iv)
                if o:
                    applies.append(f"      {dest[-1]} = affine.apply affine_map<(d0) -> (d0 + {o})>({iv}) {loc}")
            lead1, zeros = ", ".join(["1"] * lead), ", ".join(["0"] * k)
            where = f"[{', '.join(dest)}, {zeros}] [{lead1}, {', '.join(map(str, plane_shape))}] [{ones}]"
            src_where = f"[{', '.join(ivs)}, {zeros}] [{lead1}, {', '.join(map(str, src_shape))}] [{ones}]"
            box_where = f"[{', '.join(map(str, at))}] [{', '.join(map(str, box_shape))}] [{unit}]"
            op = (f"linalg.transpose ins({src} : {src_t}) outs({box} : {box_t}) permutation = "
                  f"[{', '.join(map(str, perm))}]" if perm else
                  f"linalg.copy ins({src} : {src_t}) outs({box} : {box_t}) -> {box_t}")
            body = [f"      {plane} = tensor.extract_slice {shared}{where} : {out.type} to {plane_t} {loc}",
                    f"      {filled} = linalg.fill ins({c.name} : {st}) outs({plane} : {plane_t}) -> {plane_t} {loc}",
                    f"      {src} = tensor.extract_slice {piece.name}{src_where} : {piece.type} to {src_t} {loc}",
                    f"      {box} = tensor.extract_slice {filled}{box_where} : {plane_t} to {box_t} {loc}",
                    f"      {copied} = {op} {loc}",
                    f"      {new} = tensor.insert_slice {copied} into {filled}{box_where} : {box_t} into {plane_t} {loc}"]
            head = (f"    {res} = scf.forall ({', '.join(ivs)}) in ({', '.join(map(str, piece.shape[:lead]))}) "
                    f"shared_outs({shared} = {out.name}) -> ({out.type}) {{")
            lines += [head, *applies, *body,
                      "      scf.forall.in_parallel {",
                      f"        tensor.parallel_insert_slice {new} into {shared}{where} : {plane_t} into {out.type}",
                      "      }",
                      f"    }} {tag} {loc}"]
            self.body.add_kernel(info)
            out = TensorValue(res, tuple(shape), dtype)
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

    # -- linalg.generic --------------------------------------------------------------------------
    def generic(self, ins: Sequence[TensorValue], in_maps: Sequence[str], init: TensorValue,
                out_map: str, iterators: Sequence[str], body: Callable[[BodyBuilder, list[Scalar]], Scalar],
                kernel: bool = True, kind: str | None = None, attrs: dict | None = None) -> TensorValue:
        """One ``linalg.generic`` with a single output (see :meth:`generic_multi`); float adds and
        multiplies of a generic with ``reduction`` iterators may be reassociated."""
        return self.generic_multi(ins, in_maps, [init], [out_map], iterators,
                                  lambda b, args: [body(b, args)], kernel, kind, attrs)[0]

    def generic_multi(self, ins: Sequence[TensorValue], in_maps: Sequence[str], inits: Sequence[TensorValue],
                      out_maps: Sequence[str], iterators: Sequence[str],
                      body: Callable[[BodyBuilder, list[Scalar]], list[Scalar]], kernel: bool = True,
                      kind: str | None = None, attrs: dict | None = None) -> list[TensorValue]:
        """One ``linalg.generic`` with several outputs (e.g. a value and its index).

        ``body(b, [in scalars..., out scalars...])`` returns the values to yield, one per output.
        ``inits`` are the outputs' initial values (read in the region only for reductions).
        With ``kernel`` (a loop nest over data, not an accumulator init) the op is tagged
        ``neuron.kernel``/``neuron.kind`` and recorded as a :class:`KernelInfo`; ``kind`` defaults
        to ``pointwise`` or ``reduction`` from the iterators, ``attrs`` are kind-specific facts.
        """
        ins = [self.materialize(v) for v in ins]
        if numel(inits[0].shape) == 0:
            return list(inits)
        ins, in_maps = zip(*[self._drop_broadcast_units(v, m, len(iterators)) for v, m in zip(ins, in_maps)]) \
            if ins else ((), ())
        self.body.used_as_init(*inits)
        args = [Scalar(self.body.namer("a"), v.dtype) for v in ins]
        accs = [Scalar(self.body.namer("a"), v.dtype) for v in inits]
        region: list[str] = []
        b = BodyBuilder(self.body.namer, region, loc=self.loc, reassociate="reduction" in iterators)
        results = [b.to_storage(r) for r in body(b, [b.from_storage(a.name, a.dtype) for a in args + accs])]
        maps = ", ".join(list(in_maps) + list(out_maps))
        its = ", ".join(f'"{t}"' for t in iterators)
        kind = kind or ("reduction" if "reduction" in iterators else "pointwise")
        kid = self.body.next_kernel_id()
        tag = f', neuron.kernel = {kid} : i64, neuron.kind = "{kind}"' if kernel else ""
        ins_txt = ""
        if ins:
            ins_txt = f"ins({', '.join(v.name for v in ins)} : {', '.join(v.type for v in ins)}) "
        outs_txt = f"outs({', '.join(v.name for v in inits)} : {', '.join(v.type for v in inits)})"
        head = f"linalg.generic {{indexing_maps = [{maps}], iterator_types = [{its}]{tag}}} {ins_txt}{outs_txt} {{"
        bb_args = ", ".join(f"{a.name}: {storage_type(a.dtype)}" for a in args + accs)
        name = self.body.namer("t")
        yields = ", ".join(r.name for r in results)
        ytypes = ", ".join(storage_type(r.dtype) for r in results)
        result_name = f"{name}:{len(inits)}" if len(inits) > 1 else name
        lines = [f"    {result_name} = {head}", f"    ^bb0({bb_args}):", *region,
                 f"      linalg.yield {yields} : {ytypes} {self.loc}",
                 f"    }} -> {inits[0].type if len(inits) == 1 else '(' + ', '.join(v.type for v in inits) + ')'}"
                 f" {self.loc}"]
        self.body.lines.extend(lines)
        if kernel:
            ranges = _loop_ranges(list(ins) + list(inits), [parse_map_results(m) for m in list(in_maps) + list(out_maps)],
                                  len(iterators))
            operands = tuple(self.body.operand(v, parse_map_results(m), output=i >= len(ins))
                             for i, (v, m) in enumerate(zip(list(ins) + list(inits), list(in_maps) + list(out_maps))))
            self.body.add_kernel(KernelInfo(
                kid, kind, ranges, tuple(iterators), operands, *self._provenance(), attrs=dict(attrs or {}),
                gather=any("tensor.extract " in ln or "linalg.index " in ln or "scf.while " in ln for ln in region), body_ops=len(region),
                fill_inits=tuple(v.name in self.body.fills and o.covers(ranges)
                                 for v, o in zip(inits, operands[len(ins):])),
                results=(name,) if len(inits) == 1 else tuple(f"{name}#{k}" for k in range(len(inits)))))
        if len(inits) == 1:
            return [TensorValue(name, inits[0].shape, inits[0].dtype)]
        return [TensorValue(f"{name}#{k}", v.shape, v.dtype) for k, v in enumerate(inits)]

    def _provenance(self) -> tuple[str, tuple[str, ...]]:
        """(FX node name, ATen ops of its fusion group) for a kernel this node's rule emits."""
        if self.node is None:
            return "", ()
        group = self.node.meta.get("neuron_kernel")
        ops = self.body.fused_ops.get(group) if group is not None else None
        return self.node.name, ops or (op_name(self.node),)

    def tagged_kernel(self, kind: str, ins: Sequence[TensorValue], outs: Sequence[TensorValue]
                      ) -> tuple[str, KernelInfo]:
        """A non-generic kernel (transpose, copy, a rule's loop) about to be emitted: its attribute
        text ``{neuron.kernel = N : i64, neuron.kind = "..."}`` and its :class:`KernelInfo`, which the
        caller passes to :meth:`FunctionBody.add_kernel` after the kernel's last line."""
        kid = self.body.next_kernel_id()
        info = KernelInfo(kid, kind, tuple(outs[0].shape) if outs else (), (),
                          tuple(self.body.operand(v) for v in ins)
                          + tuple(self.body.operand(v, output=True) for v in outs), *self._provenance())
        return f'{{neuron.kernel = {kid} : i64, neuron.kind = "{kind}"}}', info

    def identity_map(self, rank: int) -> str:
        return affine_map(rank, [f"d{i}" for i in range(rank)])

    def elementwise(self, fn: BodyFn, operands: Sequence[Operand], out_shape: Sequence[int],
                    out_dtype: torch.dtype, compute_dtype: torch.dtype | Sequence[torch.dtype] | None = None
                    ) -> LazyTensor:
        """``out = fn(b, *scalars)`` elementwise over broadcast operands, as a :class:`LazyTensor`.

        Python numbers become constants of ``compute_dtype``; tensor operands are cast to
        ``compute_dtype`` (one dtype, or one per operand) before ``fn`` and the result is cast to
        ``out_dtype``. Nothing is emitted until the value is materialised (by a consumer that needs
        memory, or by the emitter at a kernel boundary).
        """
        n = len(operands)
        cdts = list(compute_dtype) if isinstance(compute_dtype, (list, tuple)) else [compute_dtype] * n
        operands = [self._see_through(o) for o in operands]
        try:
            return pointwise(fn, operands, out_shape, out_dtype, cdts, _py_dtype)
        except ValueError as exc:
            raise self.fail(str(exc)) from None

    def materialize(self, v: "TensorValue | LazyTensor", kernel: bool = True,
                    into: TensorValue | None = None) -> TensorValue:
        """Write a lazy value to a tensor: one ``linalg.generic`` reading its leaves, into a new
        tensor or into ``into`` (same shape and dtype: a destination's slice)."""
        if not isinstance(v, LazyTensor):
            return v
        cached = into is None and kernel
        if cached and id(v) in self.body.stored:
            return self.body.stored[id(v)][1]
        if into is None and v.ops == 0 and len(v.leaves) == 1 and v.leaves[0].value.shape == v.shape \
                and v.leaves[0].exprs == tuple(f"d{i}" for i in range(v.rank)) and v.leaves[0].value.dtype == v.dtype:
            return v.leaves[0].value   # a read of a stored tensor as it is (a layout view read back): no copy
        if cached and channels_last_backed(v):
            # read channels-last, stored [N, C, H, W]: computed channels-last (contiguous reads),
            # then one tiled transpose (``transpose-tiles``)
            out = self.permute(self.stored_channels_last(v), FROM_CHANNELS_LAST)
            self.body.stored[id(v)] = (v, out)
            return out
        init = into if into is not None else self.empty(v.shape, v.dtype)
        maps = [affine_map(v.rank, list(lf.exprs)) for lf in v.leaves]
        out = self.generic([lf.value for lf in v.leaves], maps, init, self.identity_map(v.rank),
                           ["parallel"] * v.rank, lambda b, args: v.fn(b, args[:-1]), kernel=kernel)
        if cached:
            self.body.stored[id(v)] = (v, out)
        return out

    def stored_channels_last(self, v: "TensorValue | LazyTensor") -> TensorValue:
        """An [N, C, H, W] value written as an [N, H, W, C] tensor (contiguous reads where ``v`` is
        read from channels-last tensors: :func:`~neuron_compile.lowering.lazy.channels_last_backed`)."""
        return self.materialize(permuted(v, TO_CHANNELS_LAST))

    def cast(self, v: "TensorValue | LazyTensor", dtype: torch.dtype) -> "TensorValue | LazyTensor":
        if v.dtype == dtype:
            return v
        return self.elementwise(lambda b, x: x, [v], v.shape, dtype, compute_dtype=v.dtype)

    def broadcast_to(self, v: "TensorValue | LazyTensor", shape: Sequence[int]) -> "TensorValue | LazyTensor":
        """``v`` broadcast to ``shape`` (lazy: an indexing map, never a copy unless materialised)."""
        if tuple(shape) == v.shape:
            return v
        return self.elementwise(lambda b, x: x, [v], shape, v.dtype, compute_dtype=v.dtype)

    # -- reductions ------------------------------------------------------------------------------
    def reduce(self, v: "TensorValue | LazyTensor", dims: Sequence[int], keepdim: bool,
               init_value: float | int | bool, combine: Callable[[BodyBuilder, Scalar, Scalar], Scalar],
               acc_dtype: torch.dtype, pre: Callable[[BodyBuilder, Scalar], Scalar] | None = None) -> TensorValue:
        """Reduce ``v`` over ``dims`` with ``combine(b, acc, x)`` starting from ``init_value``.

        ``pre`` maps each element before combining (e.g. a cast or a square). Result dtype is
        ``acc_dtype``; with ``keepdim`` reduced dims stay as size 1.
        """
        dims = sorted({d % v.rank for d in dims}) if v.rank else []
        full_shape, reduced = v.shape, list(dims)
        if len(dims) > 1 and dims == list(range(v.rank - len(dims), v.rank)):
            if isinstance(v, TensorValue):
                v, dims = self._collapse_trailing(v, len(dims))
            elif (flat := self._collapse_trailing_lazy(v, len(dims))) is not None:
                v, dims = flat, [v.rank - len(dims)]
        kept = [i for i in range(v.rank) if i not in dims]
        out_shape = tuple(v.shape[i] for i in kept)
        init = self.fill(out_shape, acc_dtype, init_value)
        if numel(v.shape) == 0:
            red = init
        else:
            iters = ["reduction" if i in dims else "parallel" for i in range(v.rank)]
            if isinstance(v, LazyTensor) and not all(
                    any(re.search(rf"\bd{i}\b", e) for lf in v.leaves for e in lf.exprs) for i in dims):
                # a reduced dim no leaf reads (a unit dim of a seen-through view) would leave that
                # loop without bounds: "invalid indexing maps are non-invertible"
                v = self.materialize(v)
            if isinstance(v, LazyTensor):  # prologue fusion: the producer chain runs inside the reduction
                ins = [lf.value for lf in v.leaves]
                maps = [affine_map(v.rank, list(lf.exprs)) for lf in v.leaves]
                load = v.fn
            else:
                ins, maps = [v], [self.identity_map(v.rank)]
                load = lambda b, xs: xs[0]  # noqa: E731

            def body(b: BodyBuilder, args: list[Scalar]) -> Scalar:
                x, acc = load(b, args[:-1]), args[-1]
                x = pre(b, x) if pre else b.cast(x, acc_dtype)
                return combine(b, acc, x)

            # a plain combiner (add, max, ...) on a non-bool accumulator: the linalg vectorizer
            # recognises it as a reduction (bool accumulators are stored as i8 and converted)
            red = self.generic(ins, maps, init, affine_map(v.rank, [f"d{i}" for i in kept]), iters, body,
                               attrs={"combiner": acc_dtype != torch.bool})
        if keepdim:
            return self.reshape(red, tuple(1 if i in reduced else n for i, n in enumerate(full_shape)))
        return red

    def _collapse_trailing(self, v: TensorValue, n: int) -> tuple[TensorValue, list[int]]:
        """``v`` with its last ``n`` dims collapsed into one, and that dim: a reduction over
        trailing dims (global average pooling's ``mean((2, 3))``, a ``layer_norm`` over several
        dims) becomes one contiguous row reduction, vectorized along the whole row instead of one
        short vector step per row of the last dim (``(32, 64, 56, 56)``: 0.33-0.39x eager)."""
        lead = v.rank - n
        groups = [[i] for i in range(lead)] + [list(range(lead, v.rank))]
        shape = tuple(v.shape[:lead]) + (numel(v.shape[lead:]),)
        out = self.emit(f"tensor.collapse_shape {v.name} {reassociation(groups)} : {v.type} into "
                        f"{tensor_type(shape, v.dtype)}", shape, v.dtype)
        return out, [lead]

    def _collapse_trailing_lazy(self, v: LazyTensor, n: int) -> LazyTensor | None:
        """:meth:`_collapse_trailing` for a fused prologue (ReLU6 before a global average pool):
        each leaf that reads the last ``n`` dims reads them as its own last ``n`` dims, in order, and
        is collapsed the same way; ``None`` if a leaf reads them otherwise (a broadcast along one of
        them). Without it, MobileNet's ``clamp`` + ``mean((2, 3))`` over 4×4 planes ran as masked
        16-lane steps over rows of 4: 0.39 ms, eager 0.04 (AMD Zen 4, 1 thread)."""
        lead = v.rank - n
        trailing = tuple(f"d{i}" for i in range(lead, v.rank))
        leaves = []
        for lf in v.leaves:
            reads = [j for j, e in enumerate(lf.exprs) if any(re.search(rf"\b{t}\b", e) for t in trailing)]
            if not reads:
                leaves.append(lf)
                continue
            m = len(lf.exprs)
            if tuple(lf.exprs[m - n:]) != trailing or reads != list(range(m - n, m)):
                return None
            leaves.append(Leaf(self._collapse_trailing(lf.value, n)[0], tuple(lf.exprs[:m - n]) + (f"d{lead}",)))
        return LazyTensor(tuple(v.shape[:lead]) + (numel(v.shape[lead:]),), v.dtype, tuple(leaves), v.fn, v.ops)

    def _drop_broadcast_units(self, v: TensorValue, in_map: str, rank: int) -> tuple[TensorValue, str]:
        """An input read at a constant 0 in a unit dim (a ``[B, 1]`` graph input broadcast along a
        row, ``(d0, 0)``) as the collapsed ``[B]`` read at ``(d0)``: the linalg vectorizer fails
        on a reduction whose input map has a constant ("Attempted to vectorize, but failed"), so
        such a kernel stayed scalar loops (LayerNorm's backward sums over the saved mean/rstd)."""
        exprs = parse_map_results(in_map)
        drop = [i for i, e in enumerate(exprs) if e == "0" and v.shape[i] == 1]
        if not drop or len(exprs) != v.rank:
            return v, in_map
        keep = [i for i in range(v.rank) if i not in drop]
        groups: list[list[int]] = []
        pending: list[int] = []
        for i in range(v.rank):  # a dropped dim joins the next kept dim, trailing ones the last
            pending.append(i)
            if i in keep:
                groups.append(pending)
                pending = []
        if groups:
            groups[-1].extend(pending)
        shape = tuple(v.shape[k] for k in keep)
        out = self.emit(f"tensor.collapse_shape {v.name} {reassociation(groups)} : {v.type} into {tensor_type(shape, v.dtype)}",
                        shape, v.dtype)
        return out, affine_map(rank, [exprs[k] for k in keep])

    # -- shape ops -------------------------------------------------------------------------------
    def reshape(self, v: TensorValue, shape: Sequence[int]) -> TensorValue:
        """Row-major reshape (``aten.view`` on values): collapse to 1-D, expand to ``shape``.
        A reshape that only adds unit dims (a reduction's ``keepdim``) is also recorded as a view of
        ``v``, so lazy consumers read ``v`` directly (:meth:`_see_through`)."""
        v = self.materialize(v)
        shape = tuple(int(s) for s in shape)
        if shape == v.shape:
            return v
        out = self._reshape(v, shape)
        self.body.views[out.name] = v
        if v.name in self.body.collapsed_views:   # a GEMM's C reshaped (a convolution's NCHW output)
            self.body.collapsed_views[out.name] = (self.body.collapsed_views[v.name][0], None)
        if len(shape) > v.rank and [s for s in shape if s != 1] == [s for s in v.shape if s != 1]:
            self.body.unit_views[out.name] = (v, _unit_view_exprs(v.shape, shape))
        return out

    def _see_through(self, o: Any) -> Any:
        """A unit-dim view (``keepdim`` of a reduction) as a lazy read of its source: consumers then
        index the reduced value as ``(d0)`` instead of through an ``expand_shape`` as ``(d0, 0)``,
        and the reduction can be fused into the consumer's loop (``fused-rows``)."""
        if isinstance(o, TensorValue) and o.name in self.body.unit_views:
            src, exprs = self.body.unit_views[o.name]
            return LazyTensor(o.shape, o.dtype, (Leaf(src, exprs),), lambda b, xs: xs[0], ops=0)
        return o

    def _reshape(self, v: TensorValue, shape: tuple[int, ...]) -> TensorValue:
        if numel(shape) != numel(v.shape):
            raise self.fail(f"cannot reshape {v.shape} to {shape}")
        if numel(shape) == 0:
            return self.empty(shape, v.dtype)
        flat = v
        if v.rank != 1:
            groups = f"[[{', '.join(str(i) for i in range(v.rank))}]]" if v.rank else "[]"
            flat_shape = (numel(v.shape),)
            if v.rank == 0:
                flat = self.emit(f"tensor.expand_shape {v.name} [] output_shape [1] : {v.type} into "
                                 f"{tensor_type(flat_shape, v.dtype)}", flat_shape, v.dtype)
            else:
                flat = self.emit(f"tensor.collapse_shape {v.name} {groups} : {v.type} into "
                                 f"{tensor_type(flat_shape, v.dtype)}", flat_shape, v.dtype)
        if len(shape) == 1:
            return flat
        out_t = tensor_type(shape, v.dtype)
        if len(shape) == 0:
            return self.emit(f"tensor.collapse_shape {flat.name} [] : {flat.type} into {out_t}", shape, v.dtype)
        groups = f"[[{', '.join(str(i) for i in range(len(shape)))}]]"
        return self.emit(f"tensor.expand_shape {flat.name} {groups} output_shape "
                         f"[{', '.join(map(str, shape))}] : {flat.type} into {out_t}", shape, v.dtype)

    def permute(self, v: TensorValue, perm: Sequence[int]) -> TensorValue:
        """``linalg.transpose`` with ``permutation = perm`` (out dim i = in dim perm[i])."""
        v = self.materialize(v)
        perm = [p % v.rank for p in perm] if v.rank else []
        if perm == list(range(v.rank)):
            return v
        shape = tuple(v.shape[p] for p in perm)
        init = self.empty(shape, v.dtype)
        if numel(shape) == 0:
            return init
        tag, info = self.tagged_kernel("transpose", [v], [init])
        info.attrs["perm"] = list(perm)
        out = self.emit(f"linalg.transpose ins({v.name} : {v.type}) outs({init.name} : {init.type}) "
                        f"permutation = [{', '.join(map(str, perm))}] {tag}", shape, v.dtype)
        self.body.add_kernel(info)
        return out

    def extract_slice(self, v: TensorValue, offsets: Sequence[int], sizes: Sequence[int],
                      strides: Sequence[int]) -> TensorValue:
        v = self.materialize(v)
        shape = tuple(int(s) for s in sizes)
        if numel(shape) == 0:
            return self.empty(shape, v.dtype)
        if tuple(offsets) == (0,) * v.rank and shape == v.shape and set(strides) <= {1}:
            return v
        return self.emit(
            f"tensor.extract_slice {v.name}[{', '.join(map(str, offsets))}] [{', '.join(map(str, shape))}] "
            f"[{', '.join(map(str, strides))}] : {v.type} to {tensor_type(shape, v.dtype)}", shape, v.dtype)

    def insert_slice(self, src: TensorValue, dest: TensorValue, offsets: Sequence[int],
                     strides: Sequence[int] | None = None) -> TensorValue:
        dest = self.materialize(dest)
        if numel(src.shape) == 0:
            return dest
        strides = strides or [1] * dest.rank
        if isinstance(src, TensorValue) and src.name in self.body.concats and set(strides) <= {1}:
            # a cat copied into a larger buffer (the UNet's skip cat into its convolution's zero
            # padding: the cat written, then copied; 1.4 ms of a 30 ms inference, AMD Zen 3, 1
            # thread): its pieces written straight into their places in the buffer
            for piece, at in self.body.concats[src.name]:
                dest = self.insert_slice(piece, dest, [o + a for o, a in zip(offsets, at)])
            return dest
        where = f"[{', '.join(map(str, offsets))}] [{', '.join(map(str, src.shape))}] [{', '.join(map(str, strides))}]"
        if isinstance(src, LazyTensor) and set(strides) <= {1} and src.rank == dest.rank and src.dtype == dest.dtype:
            # a lazy (pointwise) value is computed straight into the destination's slice: one
            # kernel, where materialising it and copying the temporary in was two passes over
            # memory (the pieces of a cat, a padded ReLU: lowering.registry.LAZY_INPUT_OPS). A
            # value two pieces read is computed by each (pointwise: cheaper than a stored copy)
            self.body.used_as_init(dest)
            part = self.emit(f"tensor.extract_slice {dest.name}{where} : {dest.type} to "
                             f"{tensor_type(tuple(src.shape), src.dtype)}", src.shape, src.dtype)
            written = self.materialize(src, into=part)
            return self.emit(f"tensor.insert_slice {written.name} into {dest.name}{where} : {written.type} into "
                             f"{dest.type}", dest.shape, dest.dtype)
        src = self.materialize(src)
        tag, info = self.tagged_kernel("copy", [src], [dest])  # a copy loop
        if not set(strides) <= {1}:
            info.attrs["slice_strides"] = list(strides)   # (copy-rows declines: scalar strided stores)
        self.body.used_as_init(dest)
        # the copy as linalg.copy into the destination's slice, inserted back at the same place:
        # bufferization writes it in place and it lowers to loops LLVM vectorizes; a bare
        # insert_slice became memref.copy → the runtime's element-by-element memrefCopy (cat of
        # attention's q/k/v gradients: 1.7 GB/s, 21% of the backward; with strides, a depthwise
        # stride-2 input gradient's spread: 2.3 ms, then 1.2 as a copy loop; AMD Zen 3, 1 thread)
        part = self.emit(f"tensor.extract_slice {dest.name}{where} : {dest.type} to {src.type}", src.shape,
                         src.dtype)
        src = self.emit(f"linalg.copy {tag} ins({src.name} : {src.type}) outs({part.name} : {part.type}) "
                        f"-> {src.type}", src.shape, src.dtype)
        out = self.emit(
            f"tensor.insert_slice {src.name} into {dest.name}{where} : {src.type} into {dest.type}",
            dest.shape, dest.dtype)
        self.body.add_kernel(info)
        return out

    # -- contractions ----------------------------------------------------------------------------
    def _tiled_matmul(self, a: TensorValue, b: TensorValue, out_dtype: torch.dtype, trans_a: bool, trans_b: bool,
                      acc_init: "TensorValue | LazyTensor | None", m: int, n: int, k: int) -> TensorValue | None:
        """The ``matmul`` strategy's payload (:mod:`lowering.gemm`) when its plan applies, else
        ``None`` (the plain contraction generic below)."""
        from neuron_compile.codegen.strategies import matmul as gemm
        from neuron_compile.lowering.gemm import emit_gemm
        target = self.body.target
        shared_a = a.rank == 2 and b.rank == 3   # one A for every batch (convolution as GEMM)
        if target is None or a.dtype != out_dtype or b.dtype != out_dtype or b.rank > 3 or \
                (a.rank != b.rank and not shared_a):
            return None
        sa, sb = self.body.strides.get(a.name), self.body.strides.get(b.name)
        problem = gemm.GemmProblem(m, n, k, b.shape[0] if b.rank == 3 else 0, str(out_dtype).replace("torch.", ""),
                                   trans_a, trans_b, _k_contiguous(sa, -2 if trans_a else -1, -1 if trans_a else -2),
                                   not _k_contiguous(sb, -1 if trans_b else -2, -2 if trans_b else -1), shared_a)
        ov = self.body.overrides
        forced = ov.get(str(self.body.next_kernel_id())) or ov.get("matmul") or ov.get("*")
        if (forced is not None and forced.strategy != gemm.MatmulTiled.name) or not gemm.applies(problem, target):
            return None
        params = gemm.plan(problem, target, forced.params if forced else None).params
        bias = init = None
        row_bias = False
        if acc_init is not None:
            acc_init = self.cast(acc_init, out_dtype)
            if (a.rank == 2 or shared_a) and isinstance(acc_init, TensorValue) and acc_init.shape in ((n,), (1, n)):
                bias = self.reshape(acc_init, (n,)) if acc_init.rank == 2 else acc_init
            elif (a.rank == 2 or shared_a) and isinstance(acc_init, TensorValue) and acc_init.shape == (m, 1):
                bias, row_bias = self.reshape(acc_init, (m,)), True
            else:
                init = self.materialize(self.broadcast_to(acc_init, (*b.shape[:-2], m, n)), kernel=False)
        return emit_gemm(self, a, b, problem, params, out_dtype, bias, init, row_bias)

    def matmul(self, a: "TensorValue | LazyTensor", b: "TensorValue | LazyTensor", out_dtype: torch.dtype,
               trans_a: bool = False, trans_b: bool = False,
               acc_init: "TensorValue | LazyTensor | None" = None) -> TensorValue:
        """``op(a) @ op(b) (+ acc_init)`` for 2-D or batched 3-D operands (a 2-D ``a`` with a 3-D
        ``b``: the same A for every batch).

        Plain operands use ``linalg.matmul``/``linalg.batch_matmul``; transposed ones a contraction
        ``linalg.generic`` whose indexing map reads the operand transposed (no copy). The
        accumulator starts at ``acc_init`` broadcast to the output (a fused bias add) or zero.
        float16/bfloat16 products accumulate in float32 and round once at the end, as ATen's CPU
        matmul (mkldnn / the reduced-precision gemm) does.
        """
        if out_dtype in (torch.float16, torch.bfloat16):
            wide = self.matmul(a, b, torch.float32, trans_a, trans_b, acc_init)
            return self.materialize(self.cast(wide, out_dtype))
        a, b = self.materialize(a), self.materialize(b)
        batch = b.shape[:-2]   # a 2-D A with a batched B is one A for every batch
        m = a.shape[-1] if trans_a else a.shape[-2]
        k = a.shape[-2] if trans_a else a.shape[-1]
        n = b.shape[-2] if trans_b else b.shape[-1]
        shape = (*batch, m, n)
        tiled = self._tiled_matmul(a, b, out_dtype, trans_a, trans_b, acc_init, m, n, k)
        if tiled is not None:
            return tiled
        if acc_init is not None:
            # the accumulator's initial value belongs to the matmul kernel, like a zero fill
            acc = self.materialize(self.broadcast_to(self.cast(acc_init, out_dtype), shape), kernel=False)
        else:
            acc = self.fill(shape, out_dtype, 0)
        if numel(shape) == 0 or k == 0:
            return acc
        # A contraction generic whose loop order puts the contiguous dimension innermost: (m, k, n)
        # when B is row-major (a vectorizable axpy over n), (m, n, k) when B is read transposed
        # (a dot product over contiguous k). Loops lower in the order of the iteration dims.
        nb = len(batch)
        bd = [f"d{i}" for i in range(nb)]
        if trans_b:
            dm, dn, dk = f"d{nb}", f"d{nb + 1}", f"d{nb + 2}"
            iters = ["parallel"] * (nb + 2) + ["reduction"]
        else:
            dm, dk, dn = f"d{nb}", f"d{nb + 1}", f"d{nb + 2}"
            iters = ["parallel"] * (nb + 1) + ["reduction", "parallel"]
        amap = affine_map(nb + 3, bd[:a.rank - 2] + ([dk, dm] if trans_a else [dm, dk]))
        bmap = affine_map(nb + 3, bd + ([dn, dk] if trans_b else [dk, dn]))
        cmap = affine_map(nb + 3, bd + [dm, dn])

        def body(bb: BodyBuilder, args: list[Scalar]) -> Scalar:
            x, y, c = args
            return bb.add(c, bb.mul(bb.cast(x, out_dtype), bb.cast(y, out_dtype)))
        return self.generic([a, b], [amap, bmap], acc, cmap, iters, body, kind="matmul",
                            attrs={"batch": math.prod(batch), "m": m, "n": n, "k": k,
                                   "trans_a": trans_a, "trans_b": trans_b})


def _k_contiguous(strides: tuple[int, ...] | None, k_dim: int, other_dim: int) -> bool:
    """Whether the K dim of a stored matmul operand is its unit-stride one (``None``: contiguous)."""
    if strides is None:
        return k_dim == -1
    return strides[k_dim] <= strides[other_dim]


def _loop_ranges(values: Sequence[TensorValue], exprs: Sequence[tuple[str, ...]], rank: int) -> tuple[int, ...]:
    """Static trip count of each loop dim of a generic, read off the operands indexed by it."""
    ranges = [1] * rank
    for v, ex in zip(values, exprs):
        for size, e in zip(v.shape, ex):
            if e.startswith("d") and e[1:].isdigit():
                ranges[int(e[1:])] = size
    return tuple(ranges)


def _py_dtype(x: Any) -> torch.dtype:
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    return torch.float32


def result_dtype(a: Any, b: Any) -> torch.dtype:
    """torch's type promotion of two operands (tensor values or Python scalars), as
    ``torch.result_type``: 0-d tensors and scalars only promote across categories."""
    def proxy(o: Any) -> Any:
        if isinstance(o, (TensorValue, LazyTensor)):
            return torch.empty((1,) if o.rank else (), dtype=o.dtype)
        return o
    pa, pb = proxy(a), proxy(b)
    if not isinstance(pa, torch.Tensor) and not isinstance(pb, torch.Tensor):
        return torch.result_type(torch.tensor(pa), pb)
    return torch.result_type(pa, pb) if isinstance(pa, torch.Tensor) else torch.result_type(pb, pa)


def _unit_view_exprs(src: Sequence[int], view: Sequence[int]) -> tuple[str, ...]:
    """How a view that only adds unit dims to ``src`` reads it: each source dim as the view dim it
    stays (``(1, 12, 128)`` viewed as ``(1, 12, 128, 1)``: ``(d0, d1, d2)``), a unit source dim
    with no unit view dim at its place as ``0``. Reading a unit dim at ``d0`` rather than ``0``
    keeps the read an identity on the rows, so a reduction over ``(B, H, S, S)`` stays fusable
    with its consumers (``fused-rows``) instead of being read through a ``collapse_shape``."""
    exprs, j = [], 0
    for s in src:
        if s != 1:
            while view[j] == 1:
                j += 1
            exprs.append(f"d{j}")
            j += 1
        elif j < len(view) and view[j] == 1:
            exprs.append(f"d{j}")
            j += 1
        else:
            exprs.append("0")
    return tuple(exprs)
