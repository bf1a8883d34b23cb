"""Window strategies: reductions that read windows (``oh·s + kh·d``), as convolutions do.

``window-reduction``: a reduction that reads windows (``oh·s + kh·d``) and reduces along the
contiguous dim, as a depthwise convolution's weight gradient does (``Σ_{n,oh,ow} g·x`` per
channel and kernel offset). The :mod:`vector <neuron_compile.codegen.strategies.vector>`
strategies decline windowed reads, and on ``loops`` such a kernel accumulated one scalar at a
time through memory (MobileNet's 3×3 depthwise weight gradient, 128 channels at 28×28, batch 16:
12 ms at 1.15 GB/s, 85 % of the layer's backward; AMD Zen 4, 1 thread).

The schedule: an ``scf.forall`` over blocks of the parallel dims (as ``row-reduction``), each
parallel dim then tiled to 1, and ``tile_reduction_using_for`` with every reduction dim 1 except
the contiguous one, taken whole (at most :data:`~neuron_compile.codegen.strategies.vector.WINDOW_ROW`
elements): a partial accumulator of one row, kept in registers across the other reduction dims,
and one horizontal sum per output element. Inside that loop the unit dims are folded into slice
offsets (the windows become plain reads of one row, as ``pointwise`` does for im2col copies) and
the row is vectorized.

``window-stencil``: a reduction over a window whose contiguous dim is kept (a depthwise
convolution, forward or as its input gradient: ``Σ_k x[.., o + k]·w[c, k]`` per output row). On
``loops`` these ran one scalar multiply-add at a time (MobileNet's 3×3 depthwise layers, 3.5-12
GB/s). The schedule: the same ``scf.forall``, every other parallel dim tiled to 1 and every
reduction dim to 1 (``scf.for`` loops over the kernel offsets), so what is left is a row update
``out[.., :] += x[.., o + k : ...]·w`` that the unit-dim folding makes a plain vector
multiply-add over the row.
"""
from __future__ import annotations

import math
from typing import ClassVar, Mapping

import torch

from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategies.vector import (MIN_ELEMENTS, WINDOW_ROW, _forall_over, _VectorStrategy,
                                                      divisor_tile, lanes)
from neuron_compile.codegen.strategy import Schedule, TargetInfo
from neuron_compile.codegen.transform import ANY, SequenceWriter

# registers a stencil's row piece may take: its accumulator, the input row and the weights are
# three such pieces, within AVX2's 16. A channels-last depthwise row taken whole (144-384 floats:
# 18-48 registers each) spilled on every multiply-add: MobileNetV2's 16x4x4x384 depthwise at 2.5
# GFLOP/s, 0.7 ms (AMD Zen 3, 1 thread)
STENCIL_REGISTERS = 4


def _fold_and_vectorize(w: SequenceWriter, loop: str) -> None:
    """Inside ``loop``: the unit dims folded into slice offsets (a window becomes a plain read of
    one row), then the linalg op left there vectorized."""
    w(f"transform.apply_patterns to {loop} {{ transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices }} "
      f": {ANY}")
    lin = w.fresh("win")
    w(f"{lin} = transform.structured.match interface{{LinalgOp}} in {loop} : ({ANY}) -> {ANY}")
    w.vectorize(lin)


class WindowReduction(_VectorStrategy):
    name: ClassVar[str] = "window-reduction"
    kinds: ClassVar[frozenset[str]] = frozenset({"reduction"})

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        if k.kind != "reduction" or k.gather or not k.attrs.get("combiner") or math.prod(k.ranges) < MIN_ELEMENTS:
            return None
        c = k.contiguous_dim
        if all(o.affine for o in k.operands) or c != len(k.ranges) - 1 or k.iterators[c] != "reduction" \
                or not 1 < k.ranges[c] <= WINDOW_ROW or not all(o.unit_window(c) for o in k.operands):
            return None
        if any(o.dtype in (torch.float16, torch.bfloat16) for o in k.operands):
            return None   # (half precision stays scalar: see vector.classify)
        return Schedule(self.name, {"step": k.ranges[c], "forall": self.forall(k, target)})

    def forall(self, k: KernelInfo, target: TargetInfo) -> list[int]:
        return _forall_over(k, [d for d, it in enumerate(k.iterators) if it == "parallel" and k.ranges[d] > 1])

    def inner(self, w: SequenceWriter, k: KernelInfo, e: int, op: str, ext: list[int | None], scope: str,
              mark: Mapping[str, int] | None = None) -> None:
        """Rows of one (``e``: the whole contiguous dim), partial sums of a row over the other
        reduction dims, the windows folded to plain reads of that row, then vectorized."""
        c = len(k.ranges) - 1
        op, _ = w.tile_for(op, [1 if it == "parallel" and (ext[d] is None or ext[d] > 1) else 0
                                for d, it in enumerate(k.iterators)])
        sizes = [(e if d == c else 1) if it == "reduction" else 0 for d, it in enumerate(k.iterators)]
        fill, part, comb, loop = w.fresh("pfill"), w.fresh("part"), w.fresh("comb"), w.fresh("rloop")
        w(f"{fill}, {part}, {comb}, {loop} = transform.structured.tile_reduction_using_for {op} by tile_sizes = "
          f"{sizes} : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})")
        _fold_and_vectorize(w, loop)
        w.vectorize(fill)
        w.vectorize(comb)


def _row_dim(k: KernelInfo) -> int | None:
    """The loop dim of the output's last (contiguous) dim (a weight's kernel offsets, innermost in
    memory too, make ``k.contiguous_dim`` a reduction dim)."""
    dims = k.operands[-1].dims()
    return dims[-1] if dims else None


class WindowStencil(_VectorStrategy):
    name: ClassVar[str] = "window-stencil"
    kinds: ClassVar[frozenset[str]] = frozenset({"reduction"})

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        if k.kind != "reduction" or k.gather or math.prod(k.ranges) < MIN_ELEMENTS \
                or all(o.affine for o in k.operands) or not any(k.ranges[d] > 1 for d in k.reduction_dims):
            return None
        c = _row_dim(k)
        # rows of at least half a register (a direct weight gradient, whose row is the kernel's
        # width, 3 or 7, and whose reduction is over the image, stays on loops) and at most
        # WINDOW_ROW unless cut into pieces (a channels-last depthwise row of 600 channels ran on
        # loops-forall: 1.56 ms at stride 2, 1.24 in pieces of 24; AMD Zen 3, 1 thread)
        if c is None or k.iterators[c] != "parallel" or not all(o.unit_window(c) for o in k.operands):
            return None
        row, vl = k.ranges[c], lanes(k, target)
        most = STENCIL_REGISTERS * vl
        # pieces of whole registers, else of half registers (600 channels on AVX-512: 16 lanes
        # divide no piece of at most 64, 8 lanes give 40)
        piece = (divisor_tile(row, most, vl) or divisor_tile(row, most, max(1, vl // 2))) if row > most else 0
        if not vl // 2 <= row or (row > WINDOW_ROW and not piece):
            return None
        if any(o.dtype in (torch.float16, torch.bfloat16) for o in k.operands):
            return None   # (half precision stays scalar: see vector.classify)
        return Schedule(self.name, {"step": piece or row, "forall": self.forall(k, target)})

    def forall(self, k: KernelInfo, target: TargetInfo) -> list[int]:
        c = _row_dim(k)
        return _forall_over(k, [d for d, it in enumerate(k.iterators)
                                if it == "parallel" and d != c and k.ranges[d] > 1])

    def inner(self, w: SequenceWriter, k: KernelInfo, e: int, op: str, ext: list[int | None], scope: str,
              mark: Mapping[str, int] | None = None) -> None:
        """Every dim but the contiguous one tiled to 1 (the reduction dims innermost, as
        ``scf.for`` loops over the kernel offsets), the unit dims folded into slice offsets, the
        row vectorized."""
        c = _row_dim(k)
        sizes = [1 if it == "parallel" and d != c and (ext[d] is None or ext[d] > 1) else 0
                 for d, it in enumerate(k.iterators)]
        sizes[c] = e if e < k.ranges[c] else 0
        op, _ = w.tile_for(op, sizes)
        op, loops = w.tile_for(op, [1 if it == "reduction" and k.ranges[d] > 1 else 0
                                    for d, it in enumerate(k.iterators)])
        _fold_and_vectorize(w, loops[-1] if loops else scope)
