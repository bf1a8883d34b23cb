"""``transpose-tiles``: a ``linalg.transpose`` that moves the contiguous dim (``x.t().contiguous()``,
attention's ``K.transpose(-1, -2)``), in square register tiles.

Such a transpose reads one dim contiguously and writes another contiguously; element by element
(``loops``) every read or every write is a strided scalar access: 2048×2048 float32 took 26 ms
against eager's 2.8 (Zen 5, 1 thread). The classic fix (Intel's and ATen's ``transpose_mxn``
kernels; IREE's ``TransposeTileSizes`` for x86) is a tile of ``lanes × lanes`` elements: ``lanes``
contiguous vector reads, a register transpose, ``lanes`` contiguous vector writes. Here the output
loops are an ``scf.forall`` over about :data:`~.vector.CHUNKS` blocks, then ``scf.for`` loops
over tiles of ``T × T`` (``T`` = one register of the element type, or the largest power of two
below it that divides the dim; at least :data:`MIN_TILE`), each
vectorized into a 2-D ``vector.transfer_read`` with a permutation map; the transfer-permutation
patterns make that a contiguous read plus ``vector.transpose``, lowered as shuffles
(``lower_transpose``: MLIR's 16×16 shuffle network for 32-bit elements under AVX-512 (``shuffle_16x16``),
the AVX2 8×8 sequence otherwise), and ``convert-vector-to-scf{full-unroll}`` splits the 2-D transfers
into ``T`` row loads and stores.
"""
from __future__ import annotations

import math
from typing import ClassVar, Mapping

import torch

from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategy import Schedule, Slot, TargetInfo
from neuron_compile.codegen.strategies import vector
from neuron_compile.codegen.transform import ANY, VECTOR_CLEANUP, SequenceWriter

MIN_TILE = 4   # a dim no power-of-two tile of at least this many elements divides keeps ``loops``
TYPES = (torch.float32, torch.int32, torch.float64, torch.int64)   # (the shuffle lowerings' element types)


def _pow2_tile(n: int, lanes: int) -> int:
    """The largest power of two up to ``lanes`` dividing ``n`` (the shuffle lowerings take those)."""
    t = lanes
    while t > 1 and n % t:
        t //= 2
    return t


class TransposeTiles:
    name: ClassVar[str] = "transpose-tiles"
    kinds: ClassVar[frozenset[str]] = frozenset({"transpose"})
    fragments: ClassVar[Mapping[Slot, str]] = vector.FRAGMENTS
    cleanup: ClassVar[str] = VECTOR_CLEANUP

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        perm = k.attrs.get("perm")
        if len(k.operands) != 2 or not perm or perm[-1] == len(perm) - 1:
            return None   # (a transpose keeping the last dim last is copy-rows)
        src, dst = k.operands
        if src.dtype != dst.dtype or src.dtype not in TYPES or (src.strides is not None and src.strides[-1] != 1):
            return None
        shape, rank = list(dst.shape), len(perm)
        if math.prod(shape) < vector.MIN_CHUNK:
            return None
        a, b = perm.index(rank - 1), rank - 1   # output dims read / written contiguously
        lanes = max(1, target.vector_bits // vector.element_bits(src.dtype))
        tile = [_pow2_tile(shape[a], lanes), _pow2_tile(shape[b], lanes)]
        if min(tile) < MIN_TILE:
            return None
        outer = [d for d in range(rank) if d != b]
        forall = [0] * rank
        for d, t in zip(outer, vector.chunk_tiles([shape[d] for d in outer], math.prod(shape))):
            if d == a and t:   # whole register tiles per block
                t = vector.divisor_tile(shape[a], max(t, tile[0]), tile[0]) or tile[0]
            forall[d] = t if t < shape[d] else 0
        return Schedule(self.name, {"forall": forall, "tile": tile, "dims": [a, b],
                                    "shuffle_16x16": lanes == 16 and tile == [16, 16]})

    def transform(self, k: KernelInfo, s: Schedule) -> str:
        w = SequenceWriter()
        op = w.match_kernel(k.id, op="linalg.transpose")
        shape = list(k.operands[1].shape)
        forall, (a, b), (ta, tb) = list(s.params["forall"]), s.params["dims"], s.params["tile"]
        scope = "%root"
        if any(forall):
            op, scope = w.tile_forall(op, forall)
            w.annotate(scope, "neuron.root", k.id)
        ext = [t or n for t, n in zip(forall, shape)]
        sizes = [1 if ext[d] > 1 else 0 for d in range(len(shape))]
        sizes[a], sizes[b] = (ta if ext[a] > ta else 0), (tb if ext[b] > tb else 0)
        op, loops = w.tile_for(op, sizes)
        w.vectorize(op)
        where = loops[0] if loops else scope
        if where == "%root":
            where = w.kernel_func(op)
        strategy = "shuffle_16x16" if s.params.get("shuffle_16x16") else "eltwise"
        avx2 = "" if s.params.get("shuffle_16x16") else " avx2_lowering_strategy = true"
        w(f"transform.apply_patterns to {where} {{ transform.apply_patterns.vector.transfer_permutation_patterns }} "
          f": {ANY}")
        w(f'transform.apply_patterns to {where} {{ transform.apply_patterns.vector.lower_transpose '
          f'lowering_strategy = "{strategy}"{avx2} }} : {ANY}')
        return w.text()
