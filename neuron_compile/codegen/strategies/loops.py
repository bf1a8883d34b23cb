"""``loops``: no schedule; ``convert-linalg-to-loops`` lowers the kernel to plain loops in its
iteration order and LLVM's loop vectorizer does what it can. Applies to every kind; the fallback
when no other strategy selects a kernel."""
from __future__ import annotations

from typing import ClassVar, Mapping

from neuron_compile.codegen.kernels import KINDS, KernelInfo
from neuron_compile.codegen.strategy import Schedule, Slot, TargetInfo


class Loops:
    name: ClassVar[str] = "loops"
    kinds: ClassVar[frozenset[str]] = frozenset(KINDS)
    fragments: ClassVar[Mapping[Slot, str]] = {}
    cleanup: ClassVar[str] = ""

    def select(self, kernel: KernelInfo, target: TargetInfo) -> Schedule:
        return Schedule(self.name)

    def transform(self, kernel: KernelInfo, schedule: Schedule) -> str:
        return ""
