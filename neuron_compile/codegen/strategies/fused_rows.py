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
chain reads a graph input larger than L2 twice, the member that re-reads it first also prefetches
the next block's rows (:func:`prefetch_member`, :mod:`neuron_compile.codegen.prefetch`).

A chain qualifies when every kernel is a pointwise or row-reduction kernel over the same leading
(parallel) dim with the contiguous dim last, and every result but the last one's is used only by
later kernels of the chain, reading it at row ``d0`` (so a block of rows needs only that block).
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


def _row_kernel(k: KernelInfo) -> bool:
    return (vector.classify(k) in _INNER and len(k.ranges) >= 2 and k.iterators[0] == "parallel"
            and k.contiguous_dim == len(k.ranges) - 1)


def _closed(group: Sequence[KernelInfo], uses: Mapping[str, int]) -> bool:
    """Every result of a non-last member is used only by later members, at their row ``d0``."""
    for i, k in enumerate(group[:-1]):
        for r in k.results:
            reads = [o for later in group[i + 1:] for o in later.inputs if o.value == r]
            if not reads or uses.get(r, 0) != len(reads) or any(not o.exprs or o.exprs[0] != "d0" for o in reads):
                return False
    return True


def find_groups(kernels: Sequence[KernelInfo], uses: Mapping[str, int], skip: set[int] = frozenset()
                ) -> list[list[KernelInfo]]:
    """Maximal runs of consecutive kernels forming a closed row-wise chain (2 or more)."""
    groups, i = [], 0
    while i < len(kernels):
        k = kernels[i]
        best = None
        if _row_kernel(k) and k.id not in skip:
            j = i + 1
            while j < len(kernels) and _row_kernel(kernels[j]) and kernels[j].id not in skip \
                    and kernels[j].ranges[0] == k.ranges[0]:
                if _closed(kernels[i:j + 1], uses):
                    best = j
                j += 1
        if best is not None:
            groups.append(list(kernels[i:best + 1]))
            i = best + 1
        else:
            i += 1
    return groups


def _row_bytes(kernels: Sequence[KernelInfo]) -> int:
    return sum(math.prod(o.shape[1:]) * o.dtype.itemsize for k in kernels for o in k.outputs if len(o.shape) > 1)


def block_plan(group: Sequence[KernelInfo], target: TargetInfo) -> tuple[int, bool]:
    """(rows per forall iteration, whether the block's temporaries live on the stack).

    Small blocks first: the chain's row outputs fill an eighth of L2 and the temporaries (every
    member's outputs but the last's) go on the stack, at most :data:`STACK_BYTES` and an eighth of
    the smallest thread stack (``OMP_STACKSIZE=256K`` leaves 32 KB: a deeper stack than the
    threads have would crash the caller's process). Then the
    hardware prefetcher streams the next rows while a block is computed, which a large block
    defeats (its first pass alone reads from memory, its exp pass alone computes), and no block
    pays a ``malloc`` and ``free`` for its temporaries. Measured on Zen 5, 1 thread, input read
    from memory, ours/eager in one process: softmax 4096×1024 0.87–0.92 → 0.96–0.99 (16 rows),
    layer_norm 1.22 → 1.33 (32 rows); a C model of the softmax kernel: 64-row blocks 1.52 ms,
    one row 1.19. Rows whose temporaries do not fit: blocks whose row outputs fill half of L2, on
    the heap, as before. The block count always divides the rows (static tiles), with at least
    four blocks for the threads."""
    n = group[0].ranges[0]
    row = max(1, _row_bytes(group))

    def rows_filling(l2_share: int) -> int:  # rows whose outputs fill 1/l2_share of L2
        return vector.divisor_tile(n, max(1, min(n // 4 or 1, target.l2_bytes // l2_share // row)))
    rows = rows_filling(8)
    if rows * _row_bytes(group[:-1]) <= min(STACK_BYTES, target.stack_bytes // STACK_SHARE):
        return rows, True
    return rows_filling(2), False


def prefetch_member(group: Sequence[KernelInfo], rows: int, target: TargetInfo) -> int | None:
    """The member whose row loop prefetches the next block (:mod:`neuron_compile.codegen.prefetch`),
    or ``None``: the first member to re-read a graph input (strides known) that is indexed by row
    (``d0`` first, rank ≥ 2), row-major contiguous (the layout the rewrite handles) and larger than
    L2, i.e. one the first pass streams from memory and the next block will stream again. Blocks of
    one row have no row loop to mark."""
    if rows < 2:
        return None
    made = {r for k in group for r in k.results}
    readers: dict[str, list[int]] = {}
    for k in group:
        for o in k.inputs:
            row_major = o.strides is not None and tuple(o.strides) == contiguous_strides(tuple(o.shape))
            if o.value not in made and row_major and len(o.shape) >= 2 and o.exprs[:1] == ("d0",) \
                    and o.nbytes > target.l2_bytes and k.id not in readers.get(o.value, ()):
                readers.setdefault(o.value, []).append(k.id)
    second = [ids[1] for ids in readers.values() if len(ids) > 1]
    return min(second) if second else None


def plan_groups(kernels: Sequence[KernelInfo], target: TargetInfo, uses: Mapping[str, int],
                skip: set[int] = frozenset()) -> dict[int, Schedule]:
    """The ``fused-rows`` schedule of every kernel in a qualifying chain (pure)."""
    out = {}
    for group in find_groups(kernels, uses, skip):
        rows, stack = block_plan(group, target)
        params: dict[str, Any] = {"group": [k.id for k in group], "rows": rows,
                                  "steps": {str(k.id): vector.step(k, target) for k in group},
                                  "members": [k.to_json() for k in group]}
        if stack:
            params["stack"] = True
        if streaming.streams(group, target):
            params["stream"] = True
        ahead = prefetch_member(group, rows, target)
        if ahead is not None:
            params["prefetch"] = ahead
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
        rows = int(s.params["rows"])
        w = SequenceWriter()
        ops = {m.id: w.match_kernel(m.id) for m in members}
        fills = {m.id: w.init_producers(ops[m.id], len(m.inputs), m.fill_inits) for m in members}
        root = members[-1]
        tiled, loop = w.tile_forall(ops[root.id], [rows] + [0] * (len(root.ranges) - 1))
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
                    for p in w.init_producers(h, len(m.inputs), m.fill_inits):
                        w.stack_buffer(p)
                else:
                    w.stack_buffer(h)
        for m in members:
            ext = [rows] + list(m.ranges[1:])
            h = w.match_kernel(m.id, loop)
            if m.id == s.params.get("prefetch"):  # its own row loop, marked for the prefetch rewrite
                h, (row_loop,) = w.tile_for(h, [1] + [0] * (len(m.ranges) - 1))
                w.annotate(row_loop, prefetch.MARK, rows)
                ext[0] = 1
            strategy = _INNER[vector.classify(m)]
            strategy.inner(w, m, int(s.params["steps"][str(m.id)]), h, ext, loop)
        return w.text()
