"""Planning a graph's outputs from FX metadata alone, before anything is lowered.

An output that shares storage with a graph input is a view of it; one that shares storage with an
earlier computed node (its *owner*) is a view of that node's buffer: both are rebuilt by the
runtime with ``as_strided`` (AOTAutograd's aliasing contract) and not computed by the kernel.
Every other output is a kernel output, written with eager's strides when those are dense. A node
whose eager strides are not dense but do not overlap (a ``slice_scatter`` into a strided input keeps
the input's strides) is written dense and *placed* by the runtime into a storage with eager's
strides, so the node and its views share it as in eager (``OutputSlot.placed``). A view of a node
whose strides overlap is a kernel output of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from neuron_compile.errors import NeuronCompileError
from neuron_compile.lowering.ir import contiguous_strides
from neuron_compile.plan import OutputSlot, TensorSpec


def storage_of(t: Any):
    return StorageWeakRef(t.untyped_storage()) if isinstance(t, torch.Tensor) else None


def _dense(t: torch.Tensor) -> bool:
    return torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def _placement(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """Eager's (size, stride, offset) of a value that is not dense but whose strides nest (each
    larger than the span of the smaller ones: no two elements share memory); else ``None``."""
    if _dense(t) or any(not isinstance(v, int) for v in (*t.shape, *t.stride())):
        return None
    span = 0
    for n, st in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n > 1), key=lambda p: p[1]):
        if st <= span:
            return None
        span += (n - 1) * st
    return tuple(t.shape), tuple(t.stride()), int(t.storage_offset())


@dataclass
class OutputPlan:
    slots: list[OutputSlot] = field(default_factory=list)
    kernel_nodes: list[torch.fx.Node] = field(default_factory=list)   # in kernel-output order
    kernel_specs: list[TensorSpec] = field(default_factory=list)


def plan_outputs(gm: torch.fx.GraphModule, placeholders: list[torch.fx.Node],
                 host_index: dict[torch.fx.Node, int]) -> OutputPlan:
    """Decide, for every graph output, how the runtime produces it (see :class:`OutputSlot`)."""
    # several inputs can share one storage (views of one tensor: ``seq[:, :-1]``, ``seq[:, 1:]``);
    # a view is rebuilt from any of them (``as_strided`` takes the absolute storage offset), but an
    # input returned as it is must be that input itself
    input_storage = {storage_of(n.meta["val"]): i for i, n in enumerate(placeholders)}
    input_index = {n: i for i, n in enumerate(placeholders)}
    first_owner: dict[Any, torch.fx.Node] = {}
    for n in gm.graph.nodes:
        st = storage_of(n.meta.get("val"))
        if st is not None and st not in first_owner and n.op != "output":
            first_owner[st] = n
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0]
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    plan = OutputPlan()
    index: dict[torch.fx.Node, int] = {}

    def kernel_output(n: torch.fx.Node) -> int:
        if n not in index:
            val = n.meta["val"]
            stride = tuple(val.stride()) if _dense(val) else contiguous_strides(tuple(val.shape))
            index[n] = len(plan.kernel_nodes)
            plan.kernel_nodes.append(n)
            plan.kernel_specs.append(TensorSpec(tuple(val.shape), val.dtype, tuple(int(s) for s in stride)))
        return index[n]

    for o in outs:
        if not isinstance(o, torch.fx.Node):
            plan.slots.append(OutputSlot("const", value=o))
            continue
        val = o.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise NeuronCompileError(f"graph output {o.name} is not a tensor ({type(val).__name__})")
        st = storage_of(val)
        owner = first_owner.get(st)
        # the root of a chain of views names the buffer (two views of one value share it; the
        # first of them is not their owner)
        owner = _view_base(o) or (owner if owner is None or owner is o else _view_base(owner) or owner)
        view = dict(size=tuple(val.shape), stride=tuple(val.stride()), offset=int(val.storage_offset()),
                    dtype=val.dtype)
        if st in input_storage:
            plan.slots.append(OutputSlot("input", index=input_index[o]) if o.op == "placeholder"
                              else OutputSlot("view", base=("input", input_storage[st]), **view))
        elif o in host_index:
            plan.slots.append(OutputSlot("host", index=host_index[o]))
        elif owner is not None and owner is not o and owner.op != "placeholder" and \
                (owner in host_index or _dense(owner.meta["val"]) or _placement(owner.meta["val"])):
            base = ("host", host_index[owner]) if owner in host_index else ("kernel", kernel_output(owner))
            placed = None if owner in host_index else _placement(owner.meta["val"])
            plan.slots.append(OutputSlot("view", base=base, placed=placed, **view))
        else:
            plan.slots.append(OutputSlot("kernel", index=kernel_output(o), placed=_placement(val)))
    return plan


def _view_base(o: torch.fx.Node) -> torch.fx.Node | None:
    """The computed node ``o`` is a view of through ATen view ops (``None`` if ``o`` is no view, or a
    view of an input). A pass that replaces a node by an equal one (``cse`` merging ``x * 2`` computed
    twice, the layout pass) leaves the views' fake values on the old node's storage, so the storage
    alone no longer names their base (``return v2, v2.view(-1)`` gave two unrelated tensors)."""
    n = o
    while n.op == "call_function" and getattr(n.target, "is_view", False) and n.args \
            and isinstance(n.args[0], torch.fx.Node):
        n = n.args[0]
    return None if n is o or n.op == "placeholder" else n


def live_nodes(roots: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """``roots`` and everything they are computed from."""
    live: set[torch.fx.Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.all_input_nodes)
    return live
