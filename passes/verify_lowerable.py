"""``verify-lowerable``: every call in the graph has a lowering rule, or compilation fails with
*one* :class:`~neuron_compile.errors.UnsupportedOpsError` listing every missing op (and every case
a rule declines) with its user source line. There is no silent fallback to eager.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from neuron_compile.errors import UnsupportedOp


def unsupported_ops(gm: torch.fx.GraphModule) -> list[UnsupportedOp]:
    """The nodes of ``gm`` with no lowering rule (random ops run on the host and need none)."""
    from neuron_compile.lowering.locations import op_name, user_location
    from neuron_compile.lowering.registry import get_lowering, rule_file_for
    from neuron_compile.lowering.emit import unrepresentable_nodes
    missing = unrepresentable_nodes(gm)
    seen = {u.node for u in missing}
    for n in gm.graph.nodes:
        if n.name in seen or n.op != "call_function" or n.target is operator.getitem:
            continue
        if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
            continue
        if get_lowering(n.target) is None:
            missing.append(UnsupportedOp(op_name(n), n.name, user_location(n), rule_file_for(n.target)))
    return missing


def control_flow_ops(gm: torch.fx.GraphModule) -> list[UnsupportedOp]:
    """The structured control flow in ``gm`` (``torch.cond``, ``while_loop``, ``scan`` and the other
    higher-order ops whose branches or bodies are subgraphs): neither lowered nor decomposed yet, so
    compilation refuses them with one :class:`~neuron_compile.errors.UnsupportedOpsError` (before,
    the cache key read the branch's subgraph as a tensor and crashed with an ``AttributeError``)."""
    from neuron_compile.lowering.locations import user_location
    return [UnsupportedOp(f"higher_order.{n.target.name()}", n.name,
                          user_location(n), "",
                          "structured control flow is not compiled yet: for torch.cond compute both branches and pick "
                          "with torch.where, or run this part outside the compiled function")
            for n in gm.graph.nodes if _takes_subgraph(gm, n)]


def _is_subgraph(gm: torch.fx.GraphModule, a: object) -> bool:
    return isinstance(a, torch.fx.Node) and a.op == "get_attr" and \
        isinstance(getattr(gm, str(a.target), None), torch.nn.Module)


def _takes_subgraph(gm: torch.fx.GraphModule, n: torch.fx.Node) -> bool:
    """A higher-order op with a branch or body (a ``get_attr`` of a submodule) among its arguments;
    ``with_effects`` (an effect token around an ATen op) has none and is handled by the host checks."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.HigherOrderOperator):
        return False
    found: list[bool] = []
    torch.fx.node.map_arg((n.args, n.kwargs), lambda a: found.append(_is_subgraph(gm, a)) or a)
    return any(found)


@dataclass(frozen=True)
class VerifyLowerable:
    name: str = "verify-lowerable"
    graph_name: str = "graph"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        if unsupported_ops(gm):
            # Lower anyway, with stand-ins for the missing ops, so the one error also lists the cases
            # that existing rules decline (e.g. index_put with a boolean mask and a values tensor). If lowering
            # succeeds, the ops were never needed by the kernel (e.g. `split` returning views of an
            # input, which the runtime rebuilds with as_strided).
            from neuron_compile.lowering.emit import lower_graph
            lower_graph(gm, self.graph_name)
        return False
