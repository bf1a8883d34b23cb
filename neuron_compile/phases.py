"""Named compilation phases and the MLIR pass pipeline, in one pinned table.

``fx`` (the graph AOTAutograd hands us) → ``fx-opt`` (after our FX passes) → ``linalg`` (our MLIR
on tensors) → ``llvm`` (LLVM dialect, after :data:`LINALG_TO_LLVM`) → ``obj`` (native shared
object). Pass option names drift between LLVM versions, so every pipeline string lives here, for
LLVM 22 (MLIR ``Passes.md``; bufferization per the MLIR "Bufferization" doc).
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Mapping, Sequence

from neuron_compile.codegen.strategy import Slot


class Phase(str, enum.Enum):
    FX = "fx"
    FX_OPT = "fx-opt"
    LINALG = "linalg"
    LLVM = "llvm"
    OBJ = "obj"

    @staticmethod
    def parse(name: str) -> "Phase":
        try:
            return Phase(name)
        except ValueError:
            raise ValueError(f"unknown phase {name!r}; phases are {[p.value for p in Phase]}") from None


PHASE_ORDER = [Phase.FX, Phase.FX_OPT, Phase.LINALG, Phase.LLVM, Phase.OBJ]

# linalg on tensors → loops → LLVM dialect. Fusion is decided by our `fuse` pass and done by the
# emitter; MLIR's linalg-fuse-elementwise-ops is NOT run: it fused pointwise producers into
# contraction generics, recomputing e.g. GELU once per multiply-add (measured 6x slower).
# eliminate-empty-tensors makes the kernel producing a graph output write straight into the output
# buffer (no temporary + copy). It must run BEFORE CSE: after CSE merged two identical linalg.fill
# inits, it rewrote the shared init into one output buffer and the second reduction read the first
# one's result (measured miscompile in LLVM 22.1.8, tests/unit/test_bufferization_regression.py).
ELIMINATE_EMPTY = "eliminate-empty-tensors"
TENSOR_OPT = "canonicalize,cse"
BUFFERIZE = ("empty-tensor-to-alloc-tensor,"
             "one-shot-bufferize{bufferize-function-boundaries=0},canonicalize,"
             "buffer-deallocation-pipeline,convert-bufferization-to-memref")
# (an scf.forall no strategy turned into OpenMP, e.g. a rule's forall under ``loops``, runs in order)
LOOPS = "func.func(convert-linalg-to-loops,scf-forall-to-for),canonicalize,cse"
# allocations go through the kernel runtime's caching allocator (neuron_compile/kernel_runtime.py)
MEMREF_TO_LLVM = "finalize-memref-to-llvm{use-generic-functions=true}"
TO_LLVM = ("arith-emulate-unsupported-floats{source-types=bf16 target-type=f32},"
           f"arith-expand{{include-bf16=true}},convert-scf-to-cf,expand-strided-metadata,lower-affine,{MEMREF_TO_LLVM},"
           "convert-math-to-funcs,convert-math-to-llvm{approximate-log1p=false},convert-math-to-libm,convert-vector-to-llvm{reassociate-fp-reductions=true},convert-arith-to-llvm,"
           "convert-index-to-llvm,"
           "convert-ub-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,convert-openmp-to-llvm,reconcile-unrealized-casts")
LINALG_TO_LLVM = f"builtin.module({ELIMINATE_EMPTY},{TENSOR_OPT},{BUFFERIZE},{LOOPS},{TO_LLVM})"
# the kernels' schedules (neuron_compile.codegen) run first, on the emitter's IR as written
TRANSFORM = "transform-preload-library{{transform-library-paths={library}}},transform-interpreter"
# the outlined kernels (neuron_compile.codegen.outline) back into the graph's function
INLINE = "inline,symbol-dce"


def linalg_to_llvm(library: Path | None = None, fragments: Mapping[Slot, Sequence[str]] | None = None,
                   eliminate_empty: bool = True, split: bool = False) -> list[str]:
    """The ``linalg`` → ``llvm`` pass pipeline: one pipeline string, or two when ``split``.

    Args:
        library: the graph's transform library (:func:`neuron_compile.codegen.library.build_library`),
            applied before bufferization; ``None`` when every kernel uses the ``loops`` strategy.
        fragments: pass fragments the chosen strategies need, per slot, in strategy order (each
            appears once).
        eliminate_empty: write graph outputs in place (``False`` when one value initialises two
            ops, which eliminate-empty-tensors miscompiles: ``unique``'s scatters, measured).
        split: end the first pipeline after the :attr:`Slot.PRE_LLVM` fragments, where the
            scheduled kernels are vector loads and stores in ``scf`` loops, and start the second
            with the :attr:`Slot.PARALLEL` ones; text rewrites of the IR run in between
            (:mod:`neuron_compile.codegen.prefetch`, :func:`neuron_compile.codegen.streaming.align_stores`).
    """
    fragments = fragments or {}

    def slot(s: Slot) -> str:
        return "".join(f"{f}," for f in dict.fromkeys(fragments.get(s, ())))
    # the schedules run on kernels outlined into functions of their own; inlining them back comes
    # before eliminate-empty-tensors, which must see the graph's outputs and the kernels together
    from neuron_compile.codegen.library import SLICED_EMPTIES
    head = TRANSFORM.format(library=library) + f",{INLINE}," if library else ""
    first = f"{ELIMINATE_EMPTY}," if eliminate_empty else ""
    if library and eliminate_empty:   # (the library's sequence: see codegen.library.SLICED_EMPTIES)
        first += f"transform-interpreter{{entry-point={SLICED_EMPTIES}}},"
    before = f"{head}{first}{TENSOR_OPT},{BUFFERIZE},{slot(Slot.POST_BUFFERIZE)}{LOOPS},{slot(Slot.PRE_LLVM)}"
    after = f"{slot(Slot.PARALLEL)}{TO_LLVM}"
    if split:
        return [f"builtin.module({before.rstrip(',')})", f"builtin.module({after})"]
    return [f"builtin.module({before}{after})"]
