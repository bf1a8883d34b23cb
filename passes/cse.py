"""``cse``: common-subexpression elimination of pure nodes (same target, same arguments).

Random ops are never merged: two dropouts draw two masks. Two nodes whose storages the graph both
returns are never merged either: ``b = a * 2; c = a * 2; return b, c`` gives two tensors in eager,
and a caller's ``b.add_(1)`` must not change ``c``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from neuron_compile.passes.analysis import replace_node, returned_storages


def _key(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return ("node", a)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_key(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in a.items())))
    if isinstance(a, float):
        return ("float", repr(a))  # keeps -0.0 and nan distinct and hashable
    return (type(a).__name__, a)


@dataclass(frozen=True)
class CommonSubexpressionElimination:
    name: str = "cse"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        seen: dict[Any, torch.fx.Node] = {}
        returned = returned_storages(gm)
        changed = False
        for n in list(gm.graph.nodes):
            if n.op != "call_function" or n.is_impure() or \
                    torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
                continue
            try:
                key = (n.target, _key(n.args), _key(n.kwargs))
                hash(key)
            except TypeError:
                continue
            if key in seen and n in returned and seen[key] in returned:
                continue  # two outputs (or views of two outputs) stay two storages
            if key in seen:
                replace_node(gm, n, seen[key])
                changed = True
            else:
                seen[key] = n
        return changed
