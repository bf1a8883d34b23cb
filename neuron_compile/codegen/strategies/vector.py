"""Explicit SIMD for fused pointwise chains and reductions: tile, peel, vectorize (``linalg``
vectorizer), with the outer loop an ``scf.forall`` that threads run.

Three strategies, chosen from the kernel's iterators and which loop dim walks memory contiguously:

- ``pointwise`` (every iterator parallel): ``scf.forall`` over the outermost non-contiguous dim
  (about ``CHUNKS`` pieces of at least ``MIN_CHUNK`` elements), then rows of 1 and steps of
  ``step = lanes × unroll`` along the contiguous dim. A partial last step is peeled; canonicalizing
  the function then folds the one-trip remainder loop so both parts have static shapes (a 50257
  row becomes 1570 full steps and one ``vector<17xf32>``). Broadcast operands become
  ``vector.transfer_read`` + broadcast, and ``vector.sink_ops`` + LICM hoist row-invariant math
  (layer_norm's ``rsqrt``) out of the inner loop, which LLVM did not do through memref descriptors.
- ``row-reduction`` (the contiguous dim is reduced: softmax's max/sum, layer_norm's mean/var): the
  forall over rows with the ``linalg.fill`` init fused in, one row at a time,
  ``tile_reduction_using_for`` with ``step`` partial accumulators (kept in registers by
  ``hoist_loop_invariant_subsets``) and one horizontal reduction per row. A row that ``step`` does not
  divide is first split at the last multiple (``structured.split``): peeling the partial-reduction
  loop instead left the accumulator in memory, 2× slower.
- ``column-reduction`` (an outer dim is reduced, the contiguous one kept: bias gradients): the forall
  over blocks of ``BLOCK`` columns, then column chunks of ``step`` outside and rows inside, so the
  ``step`` accumulators stay in registers (1.5–2× faster than rows outside).

Vector width follows the target (:class:`~neuron_compile.codegen.strategy.TargetInfo`): 8 float32
lanes with AVX2, 16 with AVX-512; ``unroll`` is 4 registers per step (2 for bodies over 150 ops:
register pressure). Kernels that read at computed indices (gathers) or are tiny keep the ``loops``
strategy. Measured on Zen 1 (1 thread, ms, this machine): softmax 4096×1024 amax 11.8 → 2.6, exp
22.8 → 12.9, div 11.3 → 4.0; layer_norm normalize 7–12 → 4–8; bias-gradient column sums 0.054 → 0.033.
"""
from __future__ import annotations

import math
from typing import ClassVar, Mapping, Sequence

import torch

from neuron_compile.codegen import streaming
from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategy import Schedule, Slot, TargetInfo
from neuron_compile.codegen.transform import VECTOR_CLEANUP, SequenceWriter
from neuron_compile.phases import MEMREF_TO_LLVM

CHUNKS = 64          # scf.forall iterations to aim for (threads × load balance)
MIN_CHUNK = 16384    # elements: do not split work finer than this per forall iteration
MIN_ELEMENTS = 64    # smaller kernels stay plain loops (nothing to gain, compile time to lose)
BLOCK = 256          # columns per forall iteration of a column reduction
LONG_BODY = 150      # region ops above which a step is 2 vectors instead of 4
WINDOW_ROW = 512     # a windowed copy's contiguous extent, vectorized whole (one vector per row)
# registers a copied row's vector may take: half of AVX2's 16. A 256-float row as one vector is 32
# AVX2 registers, loaded before any is stored, so it spilled; and ``opt`` unrolled 64 such copies
# into one block of 6,205 instructions, where llc's post-RA scheduler (quadratic in a block)
# spent 3 of a grouped convolution's 4.5 s compile (AMD Zen 3)
COPY_REGISTERS = 8

_BITS = {"float64": 64, "int64": 64, "float32": 32, "int32": 32, "float16": 16, "bfloat16": 16, "int16": 16,
         "int8": 8, "uint8": 8, "bool": 8}

# what a vectorized schedule needs around it: sequential foralls become scf.parallel for the OpenMP
# conversion (the loops strategy never creates one); vector ops are unrolled to 1-D and lowered
# (without full-unroll a kernel segfaulted in-process: design notes, Appendix A).
# OpenMP's outlined bodies need memref.alloca_scope lowered before scf → cf (toolchain trap 9).
FRAGMENTS: Mapping[Slot, str] = {
    Slot.POST_BUFFERIZE: "func.func(scf-forall-to-parallel)",
    Slot.PRE_LLVM: "convert-vector-to-scf{full-unroll=true},canonicalize,cse",
    Slot.PARALLEL: f"convert-scf-to-openmp,expand-strided-metadata,lower-affine,{MEMREF_TO_LLVM}",
}


def classify(k: KernelInfo) -> str | None:
    """``pointwise``, ``row-reduction``, ``column-reduction``, or ``None``: what the linalg
    vectorizer handles. Not: gathers and loop-index arithmetic, windowed reads (``d2 + d5``:
    convolutions, pools), and reductions other than one plain combiner per output (argmax-style
    value+index pairs, counting sorts: "Failed to analyse the reduction operation")."""
    if k.kind not in ("pointwise", "reduction") or k.gather or not k.ranges or math.prod(k.ranges) < MIN_ELEMENTS:
        return None
    if not all(o.affine for o in k.operands):
        # a windowed copy (im2col): vectorized a row at a time (see Pointwise.inner)
        c = k.contiguous_dim
        if k.kind == "pointwise" and k.ranges[c] <= WINDOW_ROW and all(o.unit_window(c) for o in k.operands):
            return "pointwise"
        return None
    if len({d for o in k.operands for d in o.dims() if d is not None}) < len(k.ranges):
        # a loop dim no operand reads (a unit dim of a keepdim view): "invalid indexing maps are
        # non-invertible" once tiled
        return None
    if any(o.dtype in (torch.float16, torch.bfloat16) for o in k.operands):
        # LLVM legalises bf16 vector ops by promoting through float32 and rounding back with
        # __truncsfbf2, a libgcc helper GCC 12 lacks (a link error): half-precision stays scalar
        return None
    if k.kind == "pointwise":
        return "pointwise"
    if not k.attrs.get("combiner") or any("0" in o.exprs for o in k.inputs):
        # (a reduction reading an input at a constant index failed to vectorize: "Attempted to
        # vectorize, but failed")
        return None
    c = k.contiguous_dim
    if k.iterators[c] == "reduction" and len(k.reduction_dims) > 1 and c != len(k.ranges) - 1:
        # the contiguous dim reduced with others before a kept dim (a sum over (0, 1) of a transposed
        # (B, N, C) view): the masked vector step fails to verify ("inferred mask type
        # 'vector<16xi1>' and mask operand type 'vector<1xi1>' don't match"; found by a new user)
        return None
    return "row-reduction" if k.iterators[c] == "reduction" else "column-reduction"


def element_bits(dtype: torch.dtype) -> int:
    """Bits of one element of ``dtype`` (32 for a type not listed)."""
    return _BITS.get(str(dtype).replace("torch.", ""), 32)


def lanes(k: KernelInfo, target: TargetInfo) -> int:
    """One register of the narrowest element type among the operands spanning the contiguous dim."""
    c = k.contiguous_dim
    bits = [element_bits(o.dtype) for o in k.operands if c in o.dims()]
    return max(1, target.vector_bits // min(bits or [32]))


def step(k: KernelInfo, target: TargetInfo, unroll: int | None = None) -> int:
    """Elements per vector step along the contiguous dim (``lanes × unroll``, halved to fit the dim)."""
    vl = lanes(k, target)
    e = vl * (unroll or (4 if k.body_ops <= LONG_BODY else 2))
    n = k.ranges[k.contiguous_dim]
    while e > vl and e > n:
        e //= 2
    return e


def divisor_tile(n: int, want: int, quantum: int = 1) -> int:
    """The largest multiple of ``quantum`` that divides ``n`` and is at most ``want`` (0 if
    none): every forall tile is then full and static (a partial last tile made every inner tile
    dynamic, which needs masks and failed to vectorize in places)."""
    t = (min(want, n) // quantum) * quantum
    while t >= quantum:
        if n % t == 0:
            return t
        t -= quantum
    return 0


def block_tiles(lead: Sequence[int], rows: int) -> list[int]:
    """Tile sizes over the dims ``lead`` (outermost first) for blocks of about ``rows`` points of
    them, filled innermost first: whole inner dims while they fit, then a divisor of the next
    (:func:`divisor_tile`), then 1 (``(8, 512)`` and 16: ``[1, 16]``; ``(64, 16)`` and 32:
    ``[2, 16]``). Every tile divides its dim, so every block is full and static."""
    tiles, left = [1] * len(lead), rows
    for d in reversed(range(len(lead))):
        t = divisor_tile(lead[d], max(1, left)) or 1
        tiles[d] = t
        if t < lead[d]:
            break
        left //= t
    return tiles


def chunk_tiles(lead: Sequence[int], elements: int) -> list[int]:
    """Forall tile sizes over the dims ``lead`` of a kernel of ``elements`` elements: about
    :data:`CHUNKS` blocks of at least :data:`MIN_CHUNK` elements (:func:`block_tiles`), 0 for a
    dim a block covers whole (not tiled)."""
    n = math.prod(lead)
    chunks = max(1, min(n, CHUNKS, elements // MIN_CHUNK))
    return [t if t < m else 0 for t, m in zip(block_tiles(lead, math.ceil(n / chunks)), lead)]


def _forall_over(k: KernelInfo, dims: list[int]) -> list[int]:
    """Tile the parallel dims from ``dims[0]`` on (the run of consecutive ones in ``dims``, unit
    dims between them included) into about CHUNKS blocks of at least MIN_CHUNK elements. Over the
    whole run, not its first dim alone: a ``(2, 2048, 1024)`` row sum is 64 blocks, not 2."""
    sizes = [0] * len(k.ranges)
    if not dims:
        return sizes
    run = [dims[0]]
    while run[-1] + 1 < len(k.ranges) and (run[-1] + 1 in dims or k.ranges[run[-1] + 1] == 1) \
            and k.iterators[run[-1] + 1] == "parallel" and run[-1] + 1 != k.contiguous_dim:
        run.append(run[-1] + 1)
    for d, t in zip(run, chunk_tiles([k.ranges[d] for d in run], math.prod(k.ranges))):
        sizes[d] = t
    return sizes


def _extent_in_tile(k: KernelInfo, forall: list[int]) -> list[int | None]:
    """Each dim's extent inside one forall tile (``None``: dynamic, the last tile is partial)."""
    return [n if not s else (s if n % s == 0 else None) for n, s in zip(k.ranges, forall)]


class _VectorStrategy:
    kinds: ClassVar[frozenset[str]] = frozenset({"pointwise", "reduction"})
    fragments: ClassVar[Mapping[Slot, str]] = FRAGMENTS
    cleanup: ClassVar[str] = VECTOR_CLEANUP
    name: ClassVar[str]

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        if classify(k) != self.name:
            return None
        forall = self.forall(k, target)
        params = {"step": step(k, target), "forall": forall}
        if not all(o.affine for o in k.operands):
            params["window"] = True
        if any(forall) and streaming.streams([k], target):
            params["stream"] = True  # the stores of the forall annotated neuron.root = k.id
        return Schedule(self.name, params)

    def forall(self, k: KernelInfo, target: TargetInfo) -> list[int]:
        raise NotImplementedError

    def transform(self, k: KernelInfo, s: Schedule) -> str:
        w = SequenceWriter()
        op = w.match_kernel(k.id)
        scope = w.kernel_func(op)
        fills = w.init_producers(op, len(k.inputs), k.fill_inits)
        forall = list(s.params["forall"])
        if any(forall):
            op, loop = w.tile_forall(op, forall)
            w.annotate(loop, "neuron.root", k.id)
            # each tile initialises its own slice; canonicalizing only this loop (not the whole
            # function once per kernel) keeps the interpreter linear in the graph's size
            scope = w.fuse_into(fills, loop)
        self.inner(w, k, int(s.params["step"]), op, _extent_in_tile(k, forall), scope)
        return w.text()

    def inner(self, w: SequenceWriter, k: KernelInfo, e: int, op: str, ext: list[int | None], scope: str,
              mark: Mapping[str, int] | None = None) -> None:
        """Tile ``op`` (extents ``ext`` inside ``scope``) into vector steps of ``e`` elements along
        the contiguous dim and vectorize it; ``mark``: attributes put on the loop over the
        contiguous dim (the prefetch rewrite's, :mod:`neuron_compile.codegen.prefetch`), if there
        is one."""
        raise NotImplementedError

    @staticmethod
    def _vectorize_peeled(w: SequenceWriter, k: KernelInfo, scope: str, main: str, rem: str,
                          masked: list[int] | None) -> None:
        """Vectorize both parts of a peeled loop. Static remainder: canonicalize the function first
        (folds the one-trip remainder loop and the peeled ``affine.min``; before that both tiles are
        dynamic and vectorizing fails: "Attempted to vectorize, but failed"), then vectorize every
        tile of the kernel. Dynamic remainder (partial forall tile): the main part static, the rest
        masked."""
        if masked is None:
            w.canonicalize(scope)
            # matched in the function: canonicalization may replace the scope loop itself (a row
            # loop of 3 iterations: "requires exactly one target handle", measured)
            w.vectorize(w.match_kernel(k.id, w.fn))
        else:
            gm, gr = w.match_kernel(k.id, main), w.match_kernel(k.id, rem)
            w.canonicalize(scope)
            w.vectorize(gm)
            w.vectorize(gr, masked)


class Pointwise(_VectorStrategy):
    name: ClassVar[str] = "pointwise"
    kinds: ClassVar[frozenset[str]] = frozenset({"pointwise"})

    def forall(self, k: KernelInfo, target: TargetInfo) -> list[int]:
        c, nd = k.contiguous_dim, len(k.ranges)
        # (a windowed accumulation, col2im, has sequential kernel-offset loops: never split them, nor
        # the output positions they combine with (``o + k``): two threads' slices of o write the same
        # elements through different k. Split over o, a Conv3d input gradient raced: 0.3-0.7 relative
        # error, different on every call; a new user's trial)
        shared = k.operands[-1].window_dims()
        outer = [d for d in range(nd) if d != c and k.ranges[d] > 1 and k.iterators[d] == "parallel"
                 and d not in shared]
        if outer:
            return _forall_over(k, outer)
        sizes = [0] * nd  # one long dim: chunks of whole vector steps
        if c in shared:
            return sizes
        n, vl = k.ranges[c], lanes(k, target)
        chunks = max(1, min(CHUNKS, n // max(MIN_CHUNK, vl)))
        want = math.ceil(n / chunks)
        sizes[c] = divisor_tile(n, want, 4 * vl)
        if sizes[c] == 0 and chunks > 1:  # no divisor (an odd length): whole vector steps, a partial last tile
            sizes[c] = math.ceil(want / (4 * vl)) * 4 * vl
        if sizes[c] >= n:
            sizes[c] = 0
        return sizes

    def inner(self, w, k, e, op, ext, scope, mark=None):
        c, nd = k.contiguous_dim, len(k.ranges)
        sizes = [1 if d != c and (ext[d] is None or ext[d] > 1) else 0 for d in range(nd)]
        if not all(o.affine for o in k.operands):
            # windowed reads (im2col: the input at ow + kw): rows of one, the unit dims folded
            # (the window's other terms become constants of the slice), then the whole row is
            # one vector. Folding rebuilds the generic without its tags: matched inside the loop.
            _, loops = w.tile_for(op, sizes)
            where = loops[-1] if loops else scope
            w(f"transform.apply_patterns to {where} {{ transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices }} "
              f": !transform.any_op")
            # (no canonicalization before vectorizing: it folds a copy generic into tensor slices,
            # which bufferize into scalar memref copies: 56 scalar loads and stores per row)
            lin = w.fresh("win")
            w(f"{lin} = transform.structured.match interface{{LinalgOp}} in {where} : (!transform.any_op) -> "
              f"!transform.any_op")
            w.vectorize(lin)
            return
        n_c = ext[c]
        tile_c = n_c is None or n_c > e
        if tile_c:
            sizes[c] = e
        op, loops = w.tile_for(op, sizes)
        if tile_c:
            w.annotate_all(loops[-1], mark)
        if tile_c and (n_c is None or n_c % e):
            main, rem = w.peel(loops[-1])
            if len(loops) > 1:
                scope = loops[0]  # the peeled loop and its remainder sit inside the row loop
            self._vectorize_peeled(w, k, scope, main, rem,
                                   None if n_c is not None else [1 if d != c else e for d in range(nd)])
            return
        w.vectorize(op)


class RowReduction(_VectorStrategy):
    name: ClassVar[str] = "row-reduction"
    kinds: ClassVar[frozenset[str]] = frozenset({"reduction"})

    def forall(self, k: KernelInfo, target: TargetInfo) -> list[int]:
        par = [d for d, it in enumerate(k.iterators) if it == "parallel" and k.ranges[d] > 1]
        return _forall_over(k, par)

    def inner(self, w, k, e, op, ext, scope, mark=None):
        c, nd = k.contiguous_dim, len(k.ranges)
        red = k.reduction_dims
        rows = [1 if it == "parallel" and (ext[d] is None or ext[d] > 1) else 0 for d, it in enumerate(k.iterators)]
        op, _ = w.tile_for(op, rows)
        n_c = k.ranges[c]
        if n_c <= e and len(red) == 1:
            w.vectorize(op)
            return
        # several reduction dims (a full sum of a 4-D tensor): one vector step along the contiguous
        # dim per iteration of the others; vectorizing the op whole unrolled every element
        # (2x3x32x32: 11.6 MB of LLVM dialect, minutes in opt)
        rsizes = [(e if d == c else 1) if d in red else 0 for d in range(nd)]
        tail = None
        if n_c % e and len(red) == 1:
            parts, main, tail = w.fresh("parts"), w.fresh("rmain"), w.fresh("rtail")
            w(f"{parts} = transform.structured.split {op} after {n_c - n_c % e} {{dimension = {c}}} "
              f": !transform.any_op")
            w(f"{main}, {tail} = transform.split_handle {parts} : (!transform.any_op) -> "
              f"(!transform.any_op, !transform.any_op)")
            op = main
        fill, part, comb, loop = w.fresh("pfill"), w.fresh("part"), w.fresh("comb"), w.fresh("rloop")
        w(f"{fill}, {part}, {comb}, {loop} = transform.structured.tile_reduction_using_for {op} by tile_sizes = "
          f"{rsizes} : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, "
          f"!transform.any_op)")
        w.annotate_all(loop, mark)
        w.vectorize(fill)
        w.vectorize(comb)
        if tail is not None:
            w.vectorize(part)
            w.vectorize(tail)
        elif n_c % e:  # several reduction dims: masked
            w.vectorize(part, [1 if d != c else e for d in range(nd)])
        else:
            w.vectorize(part)


class ColumnReduction(_VectorStrategy):
    name: ClassVar[str] = "column-reduction"
    kinds: ClassVar[frozenset[str]] = frozenset({"reduction"})

    def forall(self, k: KernelInfo, target: TargetInfo) -> list[int]:
        c, e = k.contiguous_dim, step(k, target)
        sizes = [0] * len(k.ranges)
        n_c = k.ranges[c]
        block = divisor_tile(n_c, BLOCK, e)
        if 0 < block < n_c:
            sizes[c] = block
        for d, it in enumerate(k.iterators):
            if d != c and it == "parallel" and k.ranges[d] > 1:
                sizes[d] = 1
        return sizes

    def inner(self, w, k, e, op, ext, scope, mark=None):
        c, nd = k.contiguous_dim, len(k.ranges)
        red = k.reduction_dims
        ec = ext[c]
        cols = [0] * nd
        cols[c] = e if (ec is None or ec > e) else 0
        op, loops = w.tile_for(op, cols)
        op2, _ = w.tile_for(op, [1 if d in red else 0 for d in range(nd)])
        if loops and (ec is None or ec % e):
            main, rem = w.peel(loops[0])
            self._vectorize_peeled(w, k, scope, main, rem,
                                   [1 if d in red else (e if d == c else 1) for d in range(nd)] if ec is None else None)
        else:
            w.vectorize(op2)


class CopyRows:
    """``copy-rows``: a ``linalg.copy`` into a slice (zero padding, concatenation), or a
    ``linalg.transpose`` that keeps the last dim last (attention's head split and merge), in rows
    of the contiguous dim, each one vector (up to :data:`COPY_REGISTERS` registers; longer rows
    in pieces of at most that many, the last one peeled), an ``scf.forall`` over blocks of the outer
    dims. As ``loops`` these copies ran at 3.4–11 GB/s (scalar loads and stores; the padded inputs
    of a ResNet block's convolutions took 19 ms of a 134 ms training step, the attention block's
    transposes 2 ms of 23; GPT-2's ``cat`` of 768-wide rows 0.13–0.2× eager)."""

    name: ClassVar[str] = "copy-rows"
    kinds: ClassVar[frozenset[str]] = frozenset({"copy", "transpose"})
    fragments: ClassVar[Mapping[Slot, str]] = FRAGMENTS
    cleanup: ClassVar[str] = VECTOR_CLEANUP

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        if len(k.operands) != 2 or k.attrs.get("slice_strides"):
            return None   # (a strided slice_scatter is a bare tensor.insert_slice: no linalg.copy to tile)
        src = k.operands[0]
        shape = src.shape
        if k.kind == "transpose":
            perm = k.attrs.get("perm")
            if not perm or perm[-1] != len(perm) - 1:
                return None   # (a transpose of the contiguous dim: transpose-tiles)
            shape = k.operands[1].shape   # the op's loops are the output's dims
        contiguous_last = src.strides is None or (src.strides[-1] == 1 if src.strides else False)
        if not shape or shape[-1] < 2 or not contiguous_last or math.prod(shape) < MIN_CHUNK \
                or any(o.dtype in (torch.float16, torch.bfloat16) for o in k.operands):
            return None
        outer = list(shape[:-1])
        if math.prod(outer) < 2:
            return None
        forall = chunk_tiles(outer, math.prod(shape)) + [0]
        params: dict = {"forall": forall}
        vl = max(1, target.vector_bits // element_bits(src.dtype))
        longest = min(WINDOW_ROW, COPY_REGISTERS * vl)
        if shape[-1] > longest:   # pieces of whole vectors, dividing the row where some do
            params["piece"] = divisor_tile(shape[-1], longest, vl) or longest
        return Schedule(self.name, params)

    def transform(self, k: KernelInfo, s: Schedule) -> str:
        w = SequenceWriter()
        name = "linalg.transpose" if k.kind == "transpose" else "linalg.copy"
        op = w.match_kernel(k.id, op=name)
        scope = w.kernel_func(op)
        shape = k.operands[1 if k.kind == "transpose" else 0].shape
        forall = list(s.params["forall"])
        if any(forall):
            op, scope = w.tile_forall(op, forall)
            w.annotate(scope, "neuron.root", k.id)
        ext = [t or m for t, m in zip(forall, shape)]
        piece = int(s.params.get("piece", 0))
        op, loops = w.tile_for(op, [1 if e > 1 else 0 for e in ext[:-1]] + [piece])
        if piece and shape[-1] % piece:
            w.peel(loops[-1])
            w.canonicalize(scope)   # folds the one-trip remainder: a static last piece
            w.vectorize(w.match_kernel(k.id, w.fn, op=name))
            return w.text()
        w.vectorize(op)
        return w.text()
