"""``loops``: no schedule; ``convert-linalg-to-loops`` lowers the kernel to plain loops in its
iteration order and LLVM's loop vectorizer does what it can. Applies to every kind; the fallback
when no other strategy selects a kernel."""
from __future__ import annotations

from typing import ClassVar, Mapping

from neuron_compile.codegen.kernels import KINDS, KernelInfo
from neuron_compile.codegen.strategies.vector import FRAGMENTS
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
