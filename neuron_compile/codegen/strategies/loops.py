"""``loops``: no schedule; ``convert-linalg-to-loops`` lowers the kernel to plain loops in its
iteration order and LLVM's loop vectorizer does what it can. Applies to every kind; the fallback
when no other strategy selects a kernel."""
from __future__ import annotations

import re
from typing import ClassVar, Mapping

from neuron_compile.codegen.kernels import KINDS, KernelInfo
from neuron_compile.codegen.strategies.vector import FRAGMENTS, _forall_over
from neuron_compile.codegen.strategy import Schedule, Slot, TargetInfo
from neuron_compile.codegen.transform import SequenceWriter


class Loops:
    name: ClassVar[str] = "loops"
    kinds: ClassVar[frozenset[str]] = frozenset(KINDS)
    fragments: ClassVar[Mapping[Slot, str]] = {}
    cleanup: ClassVar[str] = ""

    def select(self, kernel: KernelInfo, target: TargetInfo) -> Schedule:
        return Schedule(self.name)

    def transform(self, kernel: KernelInfo, schedule: Schedule) -> str:
        return ""


class LoopsForall:
    """``loops-forall``: ``loops`` on the thread pool. A linalg kernel no vector strategy takes (a
    depthwise convolution with a stride along its rows or rows of 4) ran on one thread however
    many the graph had (MobileNet at 2 threads: 28 % of inference in such kernels, 0.60x the
    better of eager and Inductor); here its leading parallel dims are tiled into an
    ``scf.forall`` and each tile is the same plain loops. Only dims that index every output as a
    plain dim and appear in no compound index of any operand are split: tiles then write disjoint
    outputs and read through maps that tile exactly. Still unscheduled code: the profile and the
    benchmarks count it with ``loops``."""

    name: ClassVar[str] = "loops-forall"
    kinds: ClassVar[frozenset[str]] = frozenset({"pointwise", "reduction"})
    fragments: ClassVar[Mapping[Slot, str]] = FRAGMENTS
    cleanup: ClassVar[str] = ""

    def select(self, kernel: KernelInfo, target: TargetInfo) -> Schedule | None:
        if kernel.kind not in self.kinds or not kernel.ranges:
            return None
        if any(re.search(r"-|floordiv|mod|ceildiv", e) for o in kernel.operands for e in o.exprs):
            # MLIR's tiling asserts on a negative coefficient (a flipped kernel ``2 - d2``: "nonpositive
            # multiplying coefficient", mlir-opt aborted on a UNet's backward graph) and composes
            # floordiv/mod maps wrongly at tile offsets the divisor does not divide: plain loops
            return None
        outs = [o for o in kernel.operands if o.output]
        # a dim inside a window index (``d2 + d5``) of any operand is never split: an output
        # window would let two tiles add into one element
        windows = set().union(*(o.window_dims() for o in kernel.operands))
        plain = set.intersection(*(set(d for d in o.dims() if d is not None) for o in outs)) if outs else set()
        dims = []
        for d, it in enumerate(kernel.iterators):
            if it != "parallel" or d not in plain or d in windows:
                break
            dims.append(d)
        forall = _forall_over(kernel, dims)
        return Schedule(self.name, {"forall": forall}) if any(forall) else None

    def transform(self, kernel: KernelInfo, schedule: Schedule) -> str:
        w = SequenceWriter()
        op = w.match_kernel(kernel.id)
        fills = w.init_producers(op, len(kernel.inputs), kernel.fill_inits)
        _, loop = w.tile_forall(op, list(schedule.params["forall"]))
        w.annotate(loop, "neuron.root", kernel.id)
        w.fuse_into(fills, loop)
        return w.text()


class ForallLoop:
    """``forall-loop``: a kernel its lowering rule wrote as an ``scf.forall`` (``attrs["forall"]``:
    the row gather of ``embedding``) runs on the thread pool: no transform, only the passes that
    turn a forall into OpenMP (under ``loops`` it becomes a sequential ``scf.for``)."""

    name: ClassVar[str] = "forall-loop"
    kinds: ClassVar[frozenset[str]] = frozenset({"loop"})
    fragments: ClassVar[Mapping[Slot, str]] = FRAGMENTS
    cleanup: ClassVar[str] = ""

    def select(self, kernel: KernelInfo, target: TargetInfo) -> Schedule | None:
        return Schedule(self.name) if kernel.attrs.get("forall") else None

    def transform(self, kernel: KernelInfo, schedule: Schedule) -> str:
        return ""
