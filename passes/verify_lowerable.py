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
