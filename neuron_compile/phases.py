"""Named compilation phases and the MLIR pass pipeline, in one pinned table.

``fx`` (the graph AOTAutograd hands us) → ``fx-opt`` (after our FX passes) → ``linalg`` (our MLIR
on tensors) → ``llvm`` (LLVM dialect, after :data:`LINALG_TO_LLVM`) → ``obj`` (native shared
object). Pass option names drift between LLVM versions, so every pipeline string lives here, for
LLVM 22 (MLIR ``Passes.md``; bufferization per the MLIR "Bufferization" doc).
"""
from __future__ import annotations

import enum


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
TENSOR_OPT = "canonicalize,cse"
# No eliminate-empty-tensors: after CSE merges two identical linalg.fill inits, it rewrote the shared
# init into one output buffer and the second reduction read the first one's result (measured
# miscompile in LLVM 22.1.8, see tests/unit/test_bufferization_regression.py).
BUFFERIZE = ("empty-tensor-to-alloc-tensor,"
             "one-shot-bufferize{bufferize-function-boundaries=0},canonicalize,"
             "buffer-deallocation-pipeline,convert-bufferization-to-memref")
LOOPS = "func.func(convert-linalg-to-loops),canonicalize,cse"
TO_LLVM = ("arith-expand{include-bf16=true},convert-scf-to-cf,expand-strided-metadata,lower-affine,finalize-memref-to-llvm,"
           "convert-math-to-llvm{approximate-log1p=false},convert-math-to-libm,convert-arith-to-llvm,convert-index-to-llvm,"
           "convert-ub-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts")
LINALG_TO_LLVM = f"builtin.module({TENSOR_OPT},{BUFFERIZE},{LOOPS},{TO_LLVM})"


def linalg_to_llvm(fuse: bool = True) -> str:
    """The ``linalg`` → ``llvm`` pass pipeline string (fusion happens before MLIR, so ``fuse`` does
    not change it)."""
    return LINALG_TO_LLVM
