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
from neuron_compile.lowering.padding import Padding
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
    # (``None`` groups: a row-major reshape of such a value or of any other value: stored as its
    # source through the flattened destination)
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
class LoweringContext(Padding):
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
        # the trailing run of reduced dims as one (a bias or batch-norm gradient's sum over (N, H, W)
        # of NCHW reduces the contiguous H·W rows: over rows of W alone, 28 wide, it ran at 12 GB/s)
        t = next((i for i in range(v.rank) if v.rank - 1 - i not in dims), v.rank)
        if t > 1:
            lead = [d for d in dims if d < v.rank - t]
            if isinstance(v, TensorValue):
                v = self._collapse_trailing(v, t)[0]
                dims = lead + [v.rank - 1]
            elif (flat := self._collapse_trailing_lazy(v, t)) is not None:
                v, dims = flat, lead + [flat.rank - 1]
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
        # a graph output that is this reshape is stored as its source into the output viewed in the
        # source's shape: materialized as the reshape, the kernel computing the source wrote a
        # temporary and a whole-output memcpy followed (eliminate-empty-tensors follows same-type
        # values only; a Conv1d's [N, C, 1, L] product returned as [N, C, L]: 0.12 of 1.8 ms)
        source = self.body.collapsed_views[v.name][0] if v.name in self.body.collapsed_views else v
        if source.rank > 1 and len(shape) > 0:   # (a 0-d output has no flattened view: its copy is
            self.body.collapsed_views[out.name] = (source, None)   # one element)
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

    def generic_into_slice(self, dest: TensorValue, offsets: Sequence[int], sizes: Sequence[int],
                           strides: Sequence[int], ins: Sequence[TensorValue], in_maps: Sequence[str],
                           body: Callable[[BodyBuilder, list[Scalar]], Scalar]) -> TensorValue:
        """``dest`` with its slice at (``offsets``, ``sizes``, ``strides``) written by one parallel
        ``linalg.generic`` over ``sizes`` (loop dims = the slice's dims) whose destination is
        that slice: bufferized in place, where computing a temporary and :meth:`insert_slice`
        copied it (an im2col's per-phase copies into every other kernel tap)."""
        dest = self.materialize(dest)
        sizes = tuple(int(s) for s in sizes)
        where = f"[{', '.join(map(str, offsets))}] [{', '.join(map(str, sizes))}] [{', '.join(map(str, strides))}]"
        self.body.used_as_init(dest)
        part = self.emit(f"tensor.extract_slice {dest.name}{where} : {dest.type} to {tensor_type(sizes, dest.dtype)}",
                         sizes, dest.dtype)
        part = self.generic(ins, in_maps, part, self.identity_map(len(sizes)), ["parallel"] * len(sizes), body)
        return self.emit(f"tensor.insert_slice {part.name} into {dest.name}{where} : {part.type} into {dest.type}",
                         dest.shape, dest.dtype)

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
