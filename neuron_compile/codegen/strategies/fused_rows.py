"""``fused-rows``: a chain of row-wise kernels (softmax's max, exp, sum, divide; layer_norm's mean,
variance, normalize) run as one pass over blocks of rows.

Each kernel of such a chain reads whole rows that the previous ones produced; run one after
another, every kernel streams the whole tensor from DRAM again. Here the last kernel is tiled into
an ``scf.forall`` over blocks of rows (:func:`block_plan`: small blocks with their temporaries on
the stack where they fit), and the producers (with their ``linalg.fill`` inits) are fused into it, last first, with CSE
between steps so a value two consumers read is computed once (``fuse_into_containing_op``); each
op then gets its own vector schedule inside the block (:mod:`.vector`). The input is read from
DRAM once, and intermediates never leave the cache (Inductor's row-wise reductions and ATen's
softmax kernel get the same locality by looping per row). Measured by the schedule's research on
Zen 1: softmax 4096×1024 15.9 → 14.1 ms, layer_norm 128×768 0.234 → 0.179 ms, 1 thread. When the
chain reads a graph input larger than L2, one member prefetches (:func:`prefetch_member`,
:mod:`neuron_compile.codegen.prefetch`): in blocks of several rows the member that re-reads it first
prefetches the next block, in blocks of one row the member that reads it first prefetches rows ahead.

A chain qualifies when every kernel is a pointwise or row-reduction kernel over the same leading
(parallel) dims with the contiguous dim last, and every result but the last one's is used only by
later kernels of the chain, reading it at its row ``(d0, ..., d{p-1})`` (so a block of rows needs
only that block). The blocks span all ``p`` such row dims (:func:`row_dims`): softmax over attention
scores ``(B, H, S, S)`` is blocked like the ``B·H·S`` rows of a matrix (measured on Zen 5, eager/ours
at 1 | 2 threads: (8, 512, 1024) 0.81 | 0.72 → 1.10 | 1.04; (4, 2, 512, 1024) 0.68 | 0.62 → 1.11 |
1.11; (1, 12, 128, 128) 0.88 | 0.57 → 0.88 | 0.84, where Dynamo's ~15 µs per call is most of the gap).
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping, Sequence

from neuron_compile.codegen import prefetch, streaming
from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategy import Schedule, Slot, TargetInfo
from neuron_compile.codegen.strategies import vector
from neuron_compile.codegen.transform import VECTOR_CLEANUP, SequenceWriter
from neuron_compile.lowering.ir import contiguous_strides

_INNER = {"pointwise": vector.Pointwise(), "row-reduction": vector.RowReduction()}
STACK_BYTES = 128 << 10  # a block's temporaries on the stack, at most
STACK_SHARE = 8          # ... and at most this share of the smallest thread stack (OMP_STACKSIZE)
ROW_BLOCK_BYTES = 2 << 10  # rows a member writes this long or longer: blocks of one row
SHORT_ROWS = 4             # shorter rows: blocks of this many rows,
MIN_BLOCK_BYTES = 1 << 10  # or more, until the block's longest rows take this many bytes
# LLVM loop metadata (``llvm.loop.unroll.disable``) for the column loops of one-row blocks: the
# loops of all members then sit side by side in one block, and once ``opt`` unrolls them fully
# (768 columns: 12 trips) GVN reuses the first member's loads of the row in the later members, and
# keeps the whole row live in registers: 82 vector spills per row in layer_norm's backward (Zen 5,
# 8x128x768, 1 thread: its kernel 0.305 -> 0.172 ms without the unrolling). ``convert-scf-to-cf``
# moves the attribute from the ``scf.for`` to its back edge, which becomes the ``llvm.br``'s.
NO_UNROLL = "#llvm.loop_annotation<unroll = #llvm.loop_unroll<disable = true>>"
AHEAD_BYTES = 8 << 10  # blocks of one row: how far ahead of its row the first reader prefetches


def _row_kernel(k: KernelInfo) -> bool:
    return (vector.classify(k) in _INNER and len(k.ranges) >= 2 and k.iterators[0] == "parallel"
            and k.contiguous_dim == len(k.ranges) - 1)


def _lead(k: KernelInfo) -> int:
    """How many leading loop dims are parallel row dims (all but the contiguous last one, up to the
    first reduction)."""
    n = 0
    while n < len(k.ranges) - 1 and k.iterators[n] == "parallel":
        n += 1
    return n


def _rows_at(p: int) -> tuple[str, ...]:
    return tuple(f"d{i}" for i in range(p))


def row_dims(group: Sequence[KernelInfo], uses: Mapping[str, int]) -> int:
    """The leading dims the chain is blocked over (0: the chain does not qualify): the most that
    every member iterates in parallel with equal ranges, and at which every member reads the
    earlier ones' results (softmax over ``(B, H, S, S)``: 3, so blocks of rows span heads and
    batches instead of one block per batch), where every result of a non-last member is used only
    by later members."""
    chain = _Chain(group[0], uses)
    for k in group[1:]:
        chain.add(k)
    return chain.dims()


def find_groups(kernels: Sequence[KernelInfo], uses: Mapping[str, int], skip: set[int] = frozenset()
                ) -> list[list[KernelInfo]]:
    """Maximal runs of consecutive kernels forming a closed row-wise chain (2 or more).

    Each run from a start ``i`` is extended one kernel at a time with :func:`row_dims`'s test kept
    up to date (:class:`_Chain`), not recomputed: recomputing it made this quartic in the run's
    length (N independent softmaxes, one run of 3N kernels: 2 s at N = 50, 125 s at N = 200)."""
    groups, i = [], 0
    while i < len(kernels):
        k = kernels[i]
        best = None
        if _row_kernel(k) and k.id not in skip:
            chain = _Chain(k, uses)
            j = i + 1
            while j < len(kernels) and _row_kernel(kernels[j]) and kernels[j].id not in skip \
                    and kernels[j].ranges[0] == k.ranges[0]:
                if chain.add(kernels[j]):
                    best = j
                j += 1
        if best is not None:
            groups.append(list(kernels[i:best + 1]))
            i = best + 1
        else:
            i += 1
    return groups


class _Chain:
    """:func:`row_dims` of a run of kernels, updated as the run grows by one kernel at a time."""

    def __init__(self, first: KernelInfo, uses: Mapping[str, int]):
        self.uses, self.first, self.last = uses, first, first
        self.limit = _lead(first)      # p before the closedness test: leads and equal leading ranges
        self.aligned = self.limit      # the most leading dims every read inside the run is at the row of
        self.reads: dict[str, int] = {}   # a member's result → reads of it by later members
        self.open: set[str] = set()    # results of non-last members not (yet) read only by later members

    def _settle(self, r: str) -> None:
        n = self.reads.get(r, 0)
        if n and self.uses.get(r, 0) == n:
            self.open.discard(r)
        else:
            self.open.add(r)

    def add(self, k: KernelInfo) -> int:
        """Append ``k``; :func:`row_dims` of the run with it."""
        for r in self.last.results:   # the previous last member is no longer last
            self.reads.setdefault(r, 0)
            self._settle(r)
        for o in k.inputs:
            if o.value in self.reads:
                self.reads[o.value] += 1
                self._settle(o.value)
                q = 0
                while q < min(len(o.exprs), self.aligned) and o.exprs[q] == f"d{q}":
                    q += 1
                self.aligned = min(self.aligned, q)
        lead = 0
        while lead < min(_lead(k), self.limit) and k.ranges[lead] == self.first.ranges[lead]:
            lead += 1
        self.limit = min(self.limit, lead)
        self.last = k
        return self.dims()

    def dims(self) -> int:
        """:func:`row_dims` of the run."""
        return 0 if self.open else min(self.limit, self.aligned)


def _row_bytes(kernels: Sequence[KernelInfo], p: int) -> int:
    return sum(math.prod(o.shape[p:]) * o.dtype.itemsize for k in kernels for o in k.outputs if len(o.shape) > p)


def stack_bytes(group: Sequence[KernelInfo], tiles: Sequence[int]) -> int:
    """Bytes of a block's temporaries (every member's outputs but the last's) for blocks of
    ``tiles`` rows over the first ``len(tiles)`` dims."""
    return math.prod(tiles) * _row_bytes(group[:-1], len(tiles))


def block_plan(group: Sequence[KernelInfo], target: TargetInfo, p: int = 1) -> tuple[list[int], bool]:
    """(tile sizes of the forall over the ``p`` row dims, whether the block's temporaries live on
    the stack).

    Small blocks: then the hardware prefetcher streams the next rows while a block is computed,
    which a large block defeats (its first pass alone reads from memory, its exp pass alone
    computes), and where the temporaries (every member's outputs but the last's) fit in
    :data:`STACK_BYTES` and an eighth of the smallest thread stack (``OMP_STACKSIZE=256K`` leaves
    32 KB: a deeper stack than the threads have would crash the caller's process), they go on the
    stack and no block pays a ``malloc`` and ``free``; otherwise they go on the heap.

    - Rows of :data:`ROW_BLOCK_BYTES` or more (the longest row a member writes: softmax's and
      layer_norm's result rows): one row per block. A C model of layer_norm 4096×1024 (1 thread,
      eight inputs in turn, so every read comes from memory) took 1.02–1.15 ms in 32-row blocks,
      0.99–1.02 in 16-row blocks prefetching the next block and 0.92–0.96 in one-row blocks.
      One-row blocks prefetch rows ahead in the first member to read the input
      (:func:`prefetch_member`).
    - Shorter rows: blocks of :data:`SHORT_ROWS` rows (more when those rows take under
      :data:`MIN_BLOCK_BYTES`), over all ``p`` row dims (:func:`~.vector.block_tiles`), with at
      least four blocks for the threads. Their data stays in L1 between the members. Measured on
      Zen 5 against blocks whose outputs filled an eighth of L2 (the rule before), each variant
      compiled in one process and timed interleaved with eager, ms at 1 | 2 threads: softmax over
      (8, 12, 128, 128) 0.795 | 0.440 → 0.622 | 0.344 (eager 0.740 | 0.387), (32768, 64) 1.210 |
      0.911 → 0.879 | 0.671, (16384, 256) 1.941 | 1.258 → 1.511 | 1.033; layer_norm (16384, 256)
      1.453 | 0.781 → 1.053 | 0.598, (32768, 64) 0.760 | 0.632 → 0.543 | 0.450, (8192, 384) 0.687 |
      0.487 → 0.638 | 0.441; softmax forward and backward over (8, 12, 128, 128) 1.945 | 1.149 →
      1.724 | 1.037. Blocks of 2 to 16 rows all beat the old blocks there, 4 rows being best or
      within 10 % of best in each case; at 2 KB rows (layer_norm over 512 columns) one row per
      block stays better (0.743 | 0.573 against 0.860 | 0.617 in 4-row blocks)."""
    lead = group[0].ranges[:p]
    n = math.prod(lead)
    longest_row = max(1, max(_row_bytes([k], p) for k in group))   # of the rows a member writes
    budget = min(STACK_BYTES, target.stack_bytes // STACK_SHARE)
    if longest_row >= ROW_BLOCK_BYTES and n >= 4:
        return [1] * p, stack_bytes(group, [1] * p) <= budget
    rows = max(SHORT_ROWS, -(-MIN_BLOCK_BYTES // longest_row))
    tiles = vector.block_tiles(lead, max(1, min(n // 4 or 1, rows)))
    return tiles, stack_bytes(group, tiles) <= budget


def _large_row_inputs(group: Sequence[KernelInfo], p: int, target: TargetInfo) -> dict[str, tuple[list[int], int]]:
    """Graph inputs the chain streams from memory: value -> (ids of the members reading it, in
    order; bytes of one of its rows past the ``p`` row dims). Such an input is read by row
    (``d0, ..., d{p-1}`` first, rank > p), row-major contiguous (the layout the rewrite handles;
    strides known) and larger than L2."""
    made = {r for k in group for r in k.results}
    found: dict[str, tuple[list[int], int]] = {}
    for k in group:
        for o in k.inputs:
            row_major = o.strides is not None and tuple(o.strides) == contiguous_strides(tuple(o.shape))
            if o.value not in made and row_major and len(o.shape) > p and tuple(o.exprs[:p]) == _rows_at(p) \
                    and o.nbytes > target.l2_bytes:
                ids, _ = found.setdefault(o.value, ([], math.prod(o.shape[p:]) * o.dtype.itemsize))
                if k.id not in ids:
                    ids.append(k.id)
    return found


def prefetch_member(group: Sequence[KernelInfo], tiles: Sequence[int], target: TargetInfo) -> int | None:
    """The member whose loops prefetch rows ahead (:mod:`neuron_compile.codegen.prefetch`), or
    ``None`` when the chain streams no graph input from memory (:func:`_large_row_inputs`).

    - Blocks of several rows: the first member to re-read such an input; its row loop prefetches
      the next block while the block computes.
    - Blocks of one row: the first member to read such an input, when it reads every such input
      of the chain; its column loop prefetches the rows :func:`prefetch_rows` further on while it
      streams this one, so memory keeps working while the later members compute on the row in
      L1. Measured on Zen 5, each variant compiled in one process (at the thread count it is
      timed at) and timed interleaved with eager: layer_norm and softmax forward over 8192x512,
      4096x1024, 2048x2048 and 1024x4096, the input in L3 and read from memory (eight inputs in
      turn), and their forward and backward at 8x128x768, 4096x1024 and 1024x4096. Time with the
      prefetch over without, 1 thread: forward 0.818-1.009 (mean 0.918, 16 pairs), forward and
      backward 0.958-1.011 except layer_norm's backward at 4096x1024, 1.033-1.057 in three runs:
      its first member reads the gradient, a later one x, hence the rule that one member reads
      them all. 2 threads: 0.950-1.032 (mean 0.986, 22 pairs), for scale two builds of the
      *same* kernel timed this way differ by 0.925-1.014. Prefetching 8 KB ahead in the *last*
      member instead had been slower by up to 13 % in 39 of 46 pairs (an earlier session)."""
    found = _large_row_inputs(group, len(tiles), target)
    if math.prod(tiles) == 1:
        streamed = [ids for ids, row in found.values() if _ahead_fits(row, target)]
        first = min((ids[0] for ids in streamed), default=None)
        # only when that member reads them all: prefetching one input ahead of the others (the
        # gradient in layer_norm's backward, whose x a later member reads first) was slower
        return first if first is not None and all(first in ids for ids in streamed) else None
    second = [ids[1] for ids, _ in found.values() if len(ids) > 1]
    return min(second) if second else None


def _rows_ahead(row_bytes: int) -> int:
    return max(1, math.ceil(AHEAD_BYTES / row_bytes))


def _ahead_fits(row_bytes: int, target: TargetInfo) -> bool:
    """Whether the rows prefetched ahead and the row in use fit in a quarter of L2. Not for
    log_softmax over GPT-2's 50257-word vocabulary (rows of 201 KB), measured as in
    :func:`prefetch_member` at 128x50257, time with the prefetch over without: forward 0.969 |
    1.033 at 1 | 2 threads, forward and backward 1.009 | 1.048."""
    return (_rows_ahead(row_bytes) + 1) * row_bytes <= target.l2_bytes // 4


def prefetch_rows(group: Sequence[KernelInfo], member: int, p: int, target: TargetInfo) -> int:
    """How many rows ahead ``member`` prefetches in blocks of one row: :data:`AHEAD_BYTES` of the
    widest input it streams whose rows fit (:func:`_ahead_fits`), at least one row (rows of 4 KB: 2)."""
    row = max(b for ids, b in _large_row_inputs(group, p, target).values() if member in ids and _ahead_fits(b, target))
    return _rows_ahead(row)


def _step_dim(lead: Sequence[int], tiles: Sequence[int]) -> int:
    """The row dim consecutive blocks step along: the innermost one a block does not cover whole."""
    return max((d for d in range(len(tiles)) if tiles[d] < lead[d]), default=len(tiles) - 1)


def plan_groups(kernels: Sequence[KernelInfo], target: TargetInfo, uses: Mapping[str, int],
                skip: set[int] = frozenset()) -> dict[int, Schedule]:
    """The ``fused-rows`` schedule of every kernel in a qualifying chain (pure)."""
    out = {}
    for group in find_groups(kernels, uses, skip):
        p = row_dims(group, uses)
        tiles, stack = block_plan(group, target, p)
        params: dict[str, Any] = {"group": [k.id for k in group], "rows": math.prod(tiles), "block": tiles,
                                  "steps": {str(k.id): vector.step(k, target) for k in group},
                                  "members": [k.to_json() for k in group]}
        if stack:  # the block's temporaries, which the runtime checks the calling thread's stack for
            params["stack"] = True
            params["stack_bytes"] = stack_bytes(group, tiles)
        if math.prod(tiles) == 1:
            params["unroll"] = False
        if streaming.streams(group, target):
            params["stream"] = True
        member = prefetch_member(group, tiles, target)
        if member is not None:
            params["prefetch"] = member
            if math.prod(tiles) == 1:
                params["prefetch_rows"] = prefetch_rows(group, member, p, target)
        for k in group:
            out[k.id] = Schedule(FusedRows.name, params)
    return out


class FusedRows:
    """Selected for whole chains by :func:`plan_groups` (``select`` alone never picks it); the
    chain's last kernel carries the transform for all of them."""

    name: ClassVar[str] = "fused-rows"
    kinds: ClassVar[frozenset[str]] = frozenset({"pointwise", "reduction"})
    fragments: ClassVar[Mapping[Slot, str]] = vector.FRAGMENTS
    cleanup: ClassVar[str] = VECTOR_CLEANUP

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        return None

    def transform(self, k: KernelInfo, s: Schedule) -> str:
        ids = list(s.params["group"])
        if k.id != ids[-1]:
            return ""  # the chain's last kernel applies the whole chain's schedule
        members = [KernelInfo.from_json(m) for m in s.params["members"]]
        tiles = [int(t) for t in s.params.get("block", [s.params["rows"]])]
        p = len(tiles)
        lead = members[-1].ranges[:p]
        w = SequenceWriter()
        ops = {m.id: w.match_kernel(m.id) for m in members}
        fills = {m.id: w.init_producers(ops[m.id], len(m.inputs), m.fill_inits) for m in members}
        root = members[-1]
        forall = [t if t < n else 0 for t, n in zip(tiles, lead)]
        if not any(forall):
            forall[0] = tiles[0]   # one block: a forall of one iteration, as the chain's scope
        tiled, loop = w.tile_forall(ops[root.id], forall + [0] * (len(root.ranges) - p))
        w.annotate(loop, "neuron.root", root.id)
        loop = w.fuse_into(fills[root.id], loop)
        for m in reversed(members[:-1]):
            w(f"transform.apply_cse to {loop} : !transform.any_op")  # one slice of a value two members read
            _, loop = w.fuse(ops[m.id], loop)
            loop = w.fuse_into(fills[m.id], loop)
        w.canonicalize(loop)
        w(f"transform.apply_cse to {loop} : !transform.any_op")
        if s.params.get("stack"):
            for m in members[:-1]:  # each member's output buffer: its fill's, else its own
                h = w.match_kernel(m.id, loop)
                if m.fill_inits and all(m.fill_inits):
                    for q in w.init_producers(h, len(m.inputs), m.fill_inits):
                        w.stack_buffer(q)
                else:
                    w.stack_buffer(h)
        for m in members:
            ext = list(tiles) + list(m.ranges[p:])
            h = w.match_kernel(m.id, loop)
            mark: dict[str, int | str] = {} if s.params.get("unroll", True) else {"loop_annotation": NO_UNROLL}
            if m.id == s.params.get("prefetch") and math.prod(tiles) == 1:
                # its column loop, marked: it prefetches further along the innermost row dim
                mark = {**mark, prefetch.MARK: int(s.params["prefetch_rows"]), prefetch.DIM: p - 1}
            elif m.id == s.params.get("prefetch"):  # its own row loops, marked for the prefetch rewrite
                h, row_loops = w.tile_for(h, [1 if t > 1 else 0 for t in tiles] + [0] * (len(m.ranges) - p))
                d = _step_dim(lead, tiles)
                w.annotate_all(row_loops[0], {prefetch.MARK: tiles[d], prefetch.DIM: d})
                ext[:p] = [1] * p
            strategy = _INNER[vector.classify(m)]
            strategy.inner(w, m, int(s.params["steps"][str(m.id)]), h, ext, loop, mark)
        return w.text()
