"""Per-kernel code generation: select a :class:`~neuron_compile.codegen.strategy.Schedule` for every
kernel the emitter tagged, then apply them all as one transform library plus pass fragments.

See :mod:`neuron_compile.codegen.strategy` for the seam and ``strategies/`` for the strategies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from neuron_compile.codegen import streaming
from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.library import build_library
from neuron_compile.codegen.strategy import (Schedule, Slot, TargetInfo, parse_overrides, select_all,
                                             strategy_named)


@dataclass
class CodegenPlan:
    """The schedules of one graph's kernels and what applying them takes.

    Attributes:
        schedules: one per kernel (index = kernel id).
        library: transform library text (``""`` if no kernel has a transform).
        fragments: pass fragments per :class:`Slot`, in strategy order, deduplicated.
        in_place_outputs: graph outputs are written in place (``eliminate-empty-tensors``); off
            when one value initialises two ops (:attr:`LoweredGraph.shares_inits`).
        groups: the kernel ids each transform sequence schedules, outlined into one function
            each while the schedules run (:mod:`neuron_compile.codegen.outline`).
        prefetch: some schedule marks a loop for :func:`neuron_compile.codegen.prefetch.rewrite`
            (the ``linalg`` → ``llvm`` pipeline then runs in two stages around it).
        streams: some schedule streams its stores; between the same two stages
            :func:`neuron_compile.codegen.streaming.align_stores` gives them an aligned form.
    """

    kernels: list[KernelInfo]
    schedules: list[Schedule]
    target: TargetInfo
    library: str = ""
    fragments: dict[Slot, list[str]] = field(default_factory=dict)
    in_place_outputs: bool = True
    groups: list[list[int]] = field(default_factory=list)
    prefetch: bool = False
    streams: bool = False

    @property
    def rewrites(self) -> bool:
        """Whether the ``linalg`` → ``llvm`` pipeline stops for text rewrites (prefetch, streaming)."""
        return self.prefetch or self.streams

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target.to_json(), "in_place_outputs": self.in_place_outputs,
                "kernels": [{**k.to_json(), "schedule": s.to_json()} for k, s in zip(self.kernels, self.schedules)]}


def plan_codegen(kernels: Sequence[KernelInfo], target: TargetInfo, overrides: str | Mapping[str, Schedule] = "",
                 in_place_outputs: bool = True, uses: Mapping[str, int] | None = None) -> CodegenPlan:
    """Select every kernel's schedule (overrides as :func:`parse_overrides` reads them) and build
    the transform library and pass fragments that apply them.

    Raises:
        NeuronCompileError: a malformed override.
    """
    ov = parse_overrides(overrides) if isinstance(overrides, str) else dict(overrides)
    return _apply(list(kernels), select_all(kernels, target, ov, uses), target, in_place_outputs)


def plan_from_json(d: Mapping[str, Any]) -> CodegenPlan:
    """The plan a compile recorded (``NN.schedule.json``), with the same schedules (no selection
    runs), e.g. to rerun the MLIR phases on a dumped file (``neuron-compile compile --schedule``)."""
    kernels = [KernelInfo.from_json(k) for k in d["kernels"]]
    schedules = [Schedule(k["schedule"]["strategy"], k["schedule"].get("params", {})) for k in d["kernels"]]
    return _apply(kernels, schedules, TargetInfo(**d["target"]), d.get("in_place_outputs", True))


def _apply(kernels: list[KernelInfo], schedules: list[Schedule], target: TargetInfo,
           in_place_outputs: bool) -> CodegenPlan:
    fragments: dict[Slot, list[str]] = {}
    for s in schedules:
        for slot, frag in strategy_named(s.strategy).fragments.items():
            if frag not in fragments.setdefault(slot, []):
                fragments[slot].append(frag)
    library, groups = build_library(kernels, schedules)
    if streaming.ENTRY in library:  # first after bufferization: it matches the kernels' scf.forall
        fragments.setdefault(Slot.POST_BUFFERIZE, []).insert(0, streaming.INTERPRETER)
    return CodegenPlan(kernels, schedules, target, library, fragments, in_place_outputs, groups,
                       prefetch=any("prefetch" in s.params for s in schedules), streams=streaming.ENTRY in library)


__all__ = ["CodegenPlan", "KernelInfo", "Schedule", "Slot", "TargetInfo", "plan_codegen", "plan_from_json"]
