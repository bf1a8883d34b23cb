"""The transform library of one graph: one ``transform.named_sequence`` per scheduled kernel and a
``@__transform_main`` including them in kernel order (MLIR transform dialect docs; applied by
``transform-preload-library`` + ``transform-interpreter`` before bufferization)."""
from __future__ import annotations

from typing import Sequence

from neuron_compile.codegen import streaming
from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategy import Schedule, strategy_named

ANY = "!transform.any_op"

# run after ``inline`` and ``eliminate-empty-tensors`` (:func:`neuron_compile.phases.linalg_to_llvm`):
# a kernel writing a slice of a larger ``tensor.empty`` (a ``cat`` piece: extract_slice of the
# empty, the copy, insert_slice back) keeps its init on the empty after the pass replaced the
# insert's destination by the graph's output buffer (it replaces only the uses on the output's
# chain), so bufferization allocated the whole destination and copied the piece over: 9.4 MB
# allocated and copied per call for 3 × (8, 128, 768), 1.8 ms against 0.1 for the other pieces.
# Folding the extract_slice of a single-use empty into an empty of the slice's shape and
# eliminating again makes the piece write into the output in place (MLIR's tensor
# ``FoldEmptyTensorWithExtractSliceOp`` pattern and ``transform.bufferization.eliminate_empty_tensors``).
SLICED_EMPTIES = "__neuron_sliced_empties"
_SLICED_EMPTIES_SEQUENCE = (
    f"  transform.named_sequence @{SLICED_EMPTIES}(%root: {ANY} {{transform.readonly}}) {{\n"
    f'    %f = transform.structured.match ops{{["func.func"]}} in %root : ({ANY}) -> {ANY}\n'
    f"    transform.apply_patterns to %f {{\n"
    f"      transform.apply_patterns.tensor.fold_tensor_empty {{fold_single_use_only = true}}\n"
    f"    }} : {ANY}\n"
    f"    transform.bufferization.eliminate_empty_tensors %f : {ANY}\n"
    f"    transform.yield\n  }}")


def build_library(kernels: Sequence[KernelInfo], schedules: Sequence[Schedule]) -> tuple[str, list[list[int]]]:
    """The library text (``""`` when no kernel's schedule has a transform, pure ``loops``) and the
    kernel ids each sequence schedules (one group per sequence, in kernel order; a fused-rows
    chain is one group), which :func:`~neuron_compile.codegen.outline.outline_kernels` outlines."""
    seqs, calls, cleanups, groups, streamed = [], [], [], [], []
    # a strategy with a higher ``order`` runs after the others, and so does its clean-up (which
    # may rewrite the whole function)
    ordered = sorted(zip(kernels, schedules), key=lambda ks: getattr(strategy_named(ks[1].strategy), "order", 0))
    for k, s in ordered:
        strategy = strategy_named(s.strategy)
        if strategy.cleanup and strategy.cleanup not in cleanups:
            cleanups.append(strategy.cleanup)
        body = strategy.transform(k, s)
        if not body:
            continue
        groups.append(sorted(s.params.get("group", [k.id])))
        if s.params.get("stream"):
            streamed.append(k.id)  # the kernel carrying the transform tags the forall neuron.root
        name = f"@kernel_{k.id}_{s.strategy.replace('-', '_')}"
        seqs.append(f"  transform.named_sequence {name}(%root: {ANY} {{transform.readonly}}) {{\n"
                    f"{body.rstrip()}\n    transform.yield\n  }}")
        calls.append(f"    transform.include {name} failures(propagate) (%root) : ({ANY}) -> ()")
    if not seqs:
        return "", []
    main = (f"  transform.named_sequence @__transform_main(%root: {ANY} {{transform.readonly}}) {{\n"
            + "\n".join(calls + cleanups) + "\n    transform.yield\n  }")
    post = streaming.sequence(streamed)  # run after bufferization (streaming.INTERPRETER)
    text = ("module attributes {transform.with_named_sequence} {\n" + "\n".join(seqs) + "\n" + main + "\n"
            + (post + "\n" if post else "") + _SLICED_EMPTIES_SEQUENCE + "\n}\n")
    return text, sorted(groups)


def match_kernel(kernel_id: int, result: str = "%k") -> str:
    """A transform op binding ``result`` to the payload op tagged ``neuron.kernel = kernel_id``."""
    return (f"    {result} = transform.structured.match attributes {{neuron.kernel = {kernel_id} : i64}} "
            f"in %root : ({ANY}) -> {ANY}")
