"""``pad-planes``: a zero-padded copy its lowering rule wrote as one ``scf.forall`` over planes
(:meth:`~neuron_compile.lowering.padding.Padding.padded`: each plane filled whole, then the
input's plane copied into its box while the plane is in cache), with the fill and the copy
vectorized row by row. As ``forall-loop`` (plain loops left to LLVM) the planes were written at
20–28 GB/s, below the ``copy-rows`` kernel they replaced (40–60 GB/s; a UNet's padded inputs at
2 threads, AMD Zen 3)."""
from __future__ import annotations

from typing import ClassVar, Mapping

import torch

from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategies.vector import FRAGMENTS, WINDOW_ROW
from neuron_compile.codegen.strategy import Schedule, Slot, TargetInfo
from neuron_compile.codegen.transform import ANY, VECTOR_CLEANUP, SequenceWriter

TYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


class PadPlanes:
    name: ClassVar[str] = "pad-planes"
    kinds: ClassVar[frozenset[str]] = frozenset({"loop"})
    fragments: ClassVar[Mapping[Slot, str]] = FRAGMENTS
    cleanup: ClassVar[str] = VECTOR_CLEANUP

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        if not k.attrs.get("pad_planes") or len(k.operands) != 2:
            return None
        src, out = k.operands
        if src.dtype != out.dtype or src.dtype not in TYPES or out.shape[-1] > WINDOW_ROW:
            return None   # (a row longer than that is one vector too many registers wide: forall-loop)
        return Schedule(self.name)

    def transform(self, k: KernelInfo, s: Schedule) -> str:
        w = SequenceWriter()
        loop = w.match_kernel(k.id, op="scf.forall")
        rank = int(k.attrs["plane_rank"])
        for op in ("linalg.fill", "linalg.transpose" if k.attrs.get("transposed") else "linalg.copy"):
            h = w.fresh("op")
            w(f'{h} = transform.structured.match ops{{["{op}"]}} in {loop} : ({ANY}) -> {ANY}')
            row, _ = w.tile_for(h, [1] + [0] * (rank - 1))
            w.vectorize(row)
        return w.text()
