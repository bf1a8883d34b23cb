"""Code-generation strategies: per kernel, a pure *selection* returns a :class:`Schedule` (data), and
the strategy *applies* it as a transform-dialect sequence plus the pass fragments it needs.

This is IREE's split (``KernelDispatch.cpp`` selects a lowering strategy and records it;
``LLVMCPULowerExecutableTarget`` applies it) and tinygrad's schedule-as-data: selection sees only a
:class:`~neuron_compile.codegen.kernels.KernelInfo` and the :class:`TargetInfo` and emits no MLIR,
so schedules can be dumped, put in the manifest, overridden (``options={"schedule": ...}`` /
``NEURON_SCHEDULE``) and tested on their own.
"""
from __future__ import annotations

import enum
import json
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Protocol, Sequence

from neuron_compile.codegen.kernels import KINDS, KernelInfo
from neuron_compile.errors import NeuronCompileError

log = logging.getLogger("neuron_compile")


class Slot(str, enum.Enum):
    """Where a strategy's pass fragment goes in the ``linalg`` → ``llvm`` pipeline."""

    POST_BUFFERIZE = "post-bufferize"   # after one-shot bufferization, before linalg → loops
    PRE_LLVM = "pre-llvm"               # after linalg → loops, before the conversion to LLVM
    PARALLEL = "parallel"               # after PRE_LLVM: parallel loops to OpenMP, memref to LLVM; the
                                        # text rewrites of the scheduled IR (codegen.prefetch, codegen.streaming) run before it


@dataclass(frozen=True)
class TargetInfo:
    """What schedule selection may know about the target.

    Attributes:
        isa: ``avx512``, ``avx2`` or ``sse`` (x86), from the host's CPU flags.
        vector_bits: width of a SIMD register (512, 256, 128).
        vector_registers: architectural SIMD registers (32 with AVX-512, else 16).
        l2_bytes: level-2 cache per core.
        l1_bytes, l1_ways: the level-1 data cache per core and its associativity (the GEMM's k-block
            follows from them: :func:`~neuron_compile.codegen.strategies.matmul.l1_kc`).
        llc_bytes: the last-level cache (0: unknown); sse4a: 8-byte non-temporal stores of vector
            lanes (:mod:`neuron_compile.codegen.streaming`).
        stack_bytes: the smallest stack a parallel loop body runs on (the main thread's or an OpenMP
            worker's: :func:`neuron_compile.target.thread_stack_bytes`), which bounds the
            temporaries a schedule puts on the stack.
    """

    isa: str = "avx2"
    vector_bits: int = 256
    vector_registers: int = 16
    l2_bytes: int = 512 << 10
    l1_bytes: int = 32 << 10
    l1_ways: int = 8
    llc_bytes: int = 0
    sse4a: bool = False
    stack_bytes: int = 8 << 20

    def lanes(self, element_bytes: int) -> int:
        """Elements of ``element_bytes`` bytes in one SIMD register."""
        return max(1, self.vector_bits // (8 * element_bytes))

    def to_json(self) -> dict[str, Any]:
        return {"isa": self.isa, "vector_bits": self.vector_bits, "vector_registers": self.vector_registers,
                "l2_bytes": self.l2_bytes, "l1_bytes": self.l1_bytes, "l1_ways": self.l1_ways,
                "llc_bytes": self.llc_bytes, "sse4a": self.sse4a, "stack_bytes": self.stack_bytes}


@dataclass(frozen=True)
class Schedule:
    """A strategy's decision for one kernel, as data: ``strategy`` name and its ``params`` (tile
    sizes, vector width, ...). Dumped (``NN.schedule.json``), stored in the manifest, overridable."""

    strategy: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "params": dict(self.params)}


class Strategy(Protocol):
    """One way of generating code for some kernel kinds.

    ``select`` is pure (no MLIR) and returns ``None`` where the strategy does not apply;
    ``transform`` returns the body of a ``transform.named_sequence`` taking ``%root`` (the payload
    module) that finds the kernel by its ``neuron.kernel`` attribute, or ``""`` for none.
    ``fragments`` are pass-pipeline pieces the applied schedule needs, per :class:`Slot`;
    ``cleanup`` transform ops to run once per function after every kernel's sequence (or ``""``).
    """

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]
    fragments: ClassVar[Mapping[Slot, str]]
    cleanup: ClassVar[str]

    def select(self, kernel: KernelInfo, target: TargetInfo) -> Schedule | None: ...

    def transform(self, kernel: KernelInfo, schedule: Schedule) -> str: ...


def strategies() -> tuple[Strategy, ...]:
    """Every strategy, in selection order (the first whose ``select`` returns a schedule wins)."""
    from neuron_compile.codegen.strategies.loops import ForallLoop, Loops, LoopsForall
    from neuron_compile.codegen.strategies.fused_rows import FusedRows
    from neuron_compile.codegen.strategies.matmul import MatmulTiled
    from neuron_compile.codegen.strategies.pad_planes import PadPlanes
    from neuron_compile.codegen.strategies.transpose import TransposeTiles
    from neuron_compile.codegen.strategies.vector import ColumnReduction, CopyRows, Pointwise, RowReduction
    from neuron_compile.codegen.strategies.window import WindowReduction, WindowStencil
    return (MatmulTiled(), FusedRows(), Pointwise(), RowReduction(), ColumnReduction(), WindowReduction(),
            WindowStencil(), CopyRows(), TransposeTiles(), PadPlanes(), ForallLoop(), LoopsForall(), Loops())


def strategy_named(name: str) -> Strategy:
    for s in strategies():
        if s.name == name:
            return s
    raise NeuronCompileError(f"unknown codegen strategy {name!r}; strategies are "
                             f"{[s.name for s in strategies()]}")


def parse_overrides(text: str) -> dict[str, Schedule]:
    """Schedule overrides from ``options={"schedule": ...}`` / ``NEURON_SCHEDULE``.

    A JSON object keyed by a kernel id (``"3"``), a kernel kind (``"matmul"``) or ``"*"``; each value
    is a strategy name or ``{"strategy": name, "params": {...}}`` (params are merged over what the
    strategy would select). An id key beats a kind key, which beats ``"*"``.

    Raises:
        NeuronCompileError: not JSON, a key that is neither an id, a kind nor ``*``, or an unknown
            strategy.
    """
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise NeuronCompileError(f"schedule overrides must be a JSON object, e.g. "
                                 f"'{{\"matmul\": \"loops\"}}'; got {text!r} ({exc})") from None
    if not isinstance(raw, dict):
        raise NeuronCompileError(f"schedule overrides must be a JSON object, got {text!r}")
    out: dict[str, Schedule] = {}
    for key, value in raw.items():
        if key != "*" and key not in KINDS and not key.isdigit():
            raise NeuronCompileError(f"schedule override key {key!r} is not a kernel id, '*' or a kernel kind "
                                     f"({', '.join(KINDS)})")
        if isinstance(value, str):
            value = {"strategy": value}
        if not isinstance(value, dict) or "strategy" not in value:
            raise NeuronCompileError(f"schedule override {key!r}: expected a strategy name or "
                                     f"{{'strategy': ..., 'params': {{...}}}}, got {value!r}")
        strategy_named(value["strategy"])
        out[key] = Schedule(value["strategy"], dict(value.get("params", {})))
    return out


def select_all(kernels: Sequence[KernelInfo], target: TargetInfo,
               overrides: Mapping[str, Schedule] | None = None, uses: Mapping[str, int] | None = None
               ) -> list[Schedule]:
    """One schedule per kernel (list index = kernel id). Chains of row-wise kernels are scheduled
    together first (``fused-rows``; ``uses`` counts each SSA value's uses); an overridden kernel
    never joins a chain.

    An override by kind (or ``"*"``) that a kernel's strategy declines leaves that kernel on its
    default schedule, with a warning.

    Raises:
        NeuronCompileError: an override by kernel id names a strategy that does not handle that
            kernel's kind or declines the kernel.
    """
    from neuron_compile.codegen.strategies.fused_rows import plan_groups
    overrides = overrides or {}
    forced_ids = {k.id for k in kernels if str(k.id) in overrides or k.kind in overrides or "*" in overrides}
    grouped = plan_groups(kernels, target, uses, forced_ids) if uses is not None else {}
    chosen = []
    for k in kernels:
        if k.id in grouped:
            chosen.append(grouped[k.id])
            continue
        forced = overrides.get(str(k.id)) or overrides.get(k.kind) or overrides.get("*")
        if forced is not None:
            s = strategy_named(forced.strategy)
            base = s.select(k, target) if k.kind in s.kinds else None
            if base is not None and base.strategy == s.name:
                chosen.append(Schedule(s.name, {**base.params, **forced.params}))
                continue
            why = (f"strategy {s.name!r} handles {sorted(s.kinds)}, not {k.kind!r}" if k.kind not in s.kinds
                   else f"strategy {s.name!r} declines this {k.kind} kernel (its loops, maps or dtypes do not fit"
                        + (", and fused-rows is only planned for whole chains" if s.name == "fused-rows" else "")
                        + ")")
            if str(k.id) in overrides:
                raise NeuronCompileError(f"schedule override for kernel {k.id}: {why}; see NN.schedule.json in "
                                         "NEURON_DUMP_DIR for each kernel's kind and default strategy")
            log.warning("schedule override %r not applied to kernel %d: %s; it keeps its default schedule",
                        forced.strategy, k.id, why)
        chosen.append(next(sched for s in strategies() if k.kind in s.kinds and (sched := s.select(k, target))))
    return chosen
