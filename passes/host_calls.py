"""Which nodes of an ATen FX graph run as host calls (ATen on torch tensors) between kernel segments.

The sorting family and the scans have lowering rules written as counting reductions
(``lowering/rules/sorting.py``, ``lowering/rules/reduction.py``): parallel, fusible, and O(n²) in
the sorted or scanned length. ATen's CPU kernels are O(n log n) (sort, topk) and O(n) (scans). As
Inductor's ``FallbackKernel`` does for ``sort``, a node whose length along the op's dim exceeds
:data:`GENERATED_MAX_LENGTH` becomes a host call; shorter ones stay generated, fused into their
kernel (a segment boundary costs a kernel call and a materialized buffer).

Measured (2026-12-03, 1 thread, 64 rows of length n, our generated kernel / eager, both in one
process): ``topk(k=8)`` 6.2× at n=16, 8.1× at 64, 138× at 512; ``sort`` 5.6× / 5.0× / 35×;
``cumsum`` 23× / 18× / 93×; ``cummax`` 13× / 168× / 3920×. Below n=32 the compiled call's fixed
cost dominates both, so the generated form is kept there, where it can fuse; every longer row runs
on the host.
"""
from __future__ import annotations

import operator
from typing import Callable

import torch

aten = torch.ops.aten

GENERATED_MAX_LENGTH = 16  # longest sorted/scanned/searched row kept as a generated O(n²) kernel


def _dim_length(node: torch.fx.Node, dim_arg: int, default_dim: int = -1) -> int:
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return 1
    dim = node.args[dim_arg] if len(node.args) > dim_arg else node.kwargs.get("dim", default_dim)
    return int(val.shape[dim % val.dim()])


def _numel(node: torch.fx.Node) -> int:
    val = node.args[0].meta.get("val")
    return int(val.numel()) if isinstance(val, torch.Tensor) else 1


def _sequence_length(node: torch.fx.Node) -> int:
    seq = node.args[0].meta.get("val")
    return int(seq.shape[-1]) if isinstance(seq, torch.Tensor) and seq.dim() else 1


# op → the length its generated kernel is quadratic in
HOST_CALL_OPS: dict[object, Callable[[torch.fx.Node], int]] = {
    aten.sort.default: lambda n: _dim_length(n, 1),
    aten.sort.stable: lambda n: _dim_length(n, 99),
    aten.topk.default: lambda n: _dim_length(n, 2),
    aten.cumsum.default: lambda n: _dim_length(n, 1),
    aten.cumprod.default: lambda n: _dim_length(n, 1),
    aten.cummax.default: lambda n: _dim_length(n, 1),
    aten.cummin.default: lambda n: _dim_length(n, 1),
    aten.logcumsumexp.default: lambda n: _dim_length(n, 1),
    # order statistics: their decompositions (passes/decompose.py) leave long rows to these ops
    aten.median.dim: lambda n: _dim_length(n, 1),
    aten.nanmedian.dim: lambda n: _dim_length(n, 1),
    aten.kthvalue.default: lambda n: _dim_length(n, 2),
    aten.mode.default: lambda n: _dim_length(n, 1),
    aten.median.default: _numel,
    aten.nanmedian.default: _numel,
    aten.searchsorted.Tensor: _sequence_length,
    aten.searchsorted.Scalar: _sequence_length,
}


def _random_in_the_middle(node: torch.fx.Node) -> bool:
    """A random op that cannot run before the kernel (``lowering/emit.py`` runs those, with
    torch's generator, when they read only graph inputs and fresh tensors): it reads a value
    computed in the graph, or returns a tuple. As a host call it still draws from torch's
    generator in graph order, so its result matches eager for the same seed."""
    if torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    from neuron_compile.lowering.emit import EMPTY_FACTORIES
    computed = [a for a in node.all_input_nodes
                if a.op != "placeholder" and not (a.op == "call_function" and a.target in EMPTY_FACTORIES)]
    return bool(computed) or not isinstance(node.meta.get("val"), torch.Tensor)


BUILTIN_NAMESPACES = frozenset({"aten", "prims", "prim"})


def is_custom_op(node: torch.fx.Node) -> bool:
    """A functional op registered outside PyTorch's built-in namespaces (``torch.library.custom_op``
    with a fake kernel) that has no lowering rule: the user's opaque code. Inductor and TorchNeuron
    call such ops rather than refuse them; so do we, as a host call. (A custom op that mutates its
    inputs reaches us wrapped in ``auto_functionalized`` and stays refused.)"""
    from neuron_compile.lowering.registry import get_lowering
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and target.namespace not in BUILTIN_NAMESPACES
            and get_lowering(target) is None)


COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional"})


def is_collective(node: torch.fx.Node) -> bool:
    """A functional collective (``_c10d_functional.all_reduce``, ``all_gather_into_tensor``,
    ``reduce_scatter_tensor``, ``wait_tensor``, ...), as traced from DTensor, tensor parallelism or
    FSDP2's hooks. It runs as a host call: issuing one returns at once (torch registers the work)
    and ``wait_tensor`` blocks, so a kernel segment between the two overlaps the communication, as
    Inductor orders them."""
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace in COLLECTIVE_NAMESPACES


def opaque_inputs(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Placeholders that are not tensors (a process group or device mesh as a script object):
    only a program can pass them on; a kernel segment reading one is refused."""
    return [n for n in gm.graph.nodes if n.op == "placeholder" and n.meta.get("val") is not None
            and not isinstance(n.meta.get("val"), torch.Tensor)]


def is_host_call(node: torch.fx.Node) -> bool:
    """Whether ``node`` runs as a host call: an op of :data:`HOST_CALL_OPS` whose row is longer
    than :data:`GENERATED_MAX_LENGTH`, a random op reading a computed value
    (:func:`_random_in_the_middle`), a custom op (:func:`is_custom_op`), a collective
    (:func:`is_collective`), or ``getitem`` of a host call's tuple result."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        src = node.args[0]
        return isinstance(src, torch.fx.Node) and is_host_call(src)
    if _random_in_the_middle(node) or is_custom_op(node) or is_collective(node):
        return True
    length = HOST_CALL_OPS.get(node.target)
    return length is not None and length(node) > GENERATED_MAX_LENGTH


def _is_complex(node: torch.fx.Node) -> bool:
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in vals)


def host_call_nodes(gm: torch.fx.GraphModule, fallback: bool = False) -> tuple[list[torch.fx.Node], list]:
    """The nodes of ``gm`` that run as host calls, in graph order, and the eager-fallback ops among
    them (:class:`~neuron_compile.errors.UnsupportedOp`). Host calls are the nodes of
    :func:`is_host_call` and, when ``fallback``, every node with no lowering rule
    (:func:`neuron_compile.passes.verify_lowerable.unsupported_ops`) and the ``getitem``s of those."""
    fallbacks = []
    chosen: set[torch.fx.Node] = set()
    if fallback:
        from neuron_compile.errors import UnsupportedOp
        from neuron_compile.lowering.locations import op_name, user_location
        from neuron_compile.lowering.registry import rule_file_for
        from neuron_compile.passes.verify_lowerable import unsupported_ops
        missing = {u.node: u for u in unsupported_ops(gm)}
        # ops only: a value the kernels cannot hold that reaches a segment (a complex input) stays
        # the segment's UnsupportedOpsError
        chosen = {n for n in gm.graph.nodes if n.name in missing and n.op == "call_function"}
        for n in gm.graph.nodes:  # an op reading a complex value (an FFT's result) runs on the host too
            if n.op == "call_function" and n not in chosen and any(
                    a in chosen and _is_complex(a) for a in n.all_input_nodes):
                chosen.add(n)
                missing[n.name] = UnsupportedOp(op_name(n), n.name, user_location(n), rule_file_for(n.target),
                                                "reads a complex value")
        fallbacks = [missing[n.name] for n in gm.graph.nodes if n in chosen]
    nodes = []
    for n in gm.graph.nodes:
        if n in chosen or is_host_call(n) or (
                n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) and n.args[0] in chosen):
            chosen.add(n)
            nodes.append(n)
    return nodes, fallbacks
