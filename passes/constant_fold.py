"""``constant-fold``: evaluate small subgraphs whose inputs are all constants, with torch, at
compile time (e.g. an attention mask ``~tril(ones(T, T))``), and replace them by one constant.

A node folds when it is pure, every tensor input is a constant (a graph attribute or a folded
node), no input is a graph placeholder, and its result has at most ``max_numel`` elements.
Factories alone (``full``, ``arange``) fold only when a folded consumer needs them.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from neuron_compile.passes.analysis import replace_node

from neuron_compile.passes.dce import eliminate_dead_code

_ids = itertools.count()


def _fetch(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class ConstantFold:
    name: str = "constant-fold"
    max_numel: int = 1 << 16

    def run(self, gm: torch.fx.GraphModule) -> bool:
        values: dict[torch.fx.Node, Any] = {}
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                values[n] = _fetch(gm, n.target)
        changed = False
        for n in list(gm.graph.nodes):
            if n.op != "call_function" or n.is_impure() or \
                    torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
                continue
            inputs = n.all_input_nodes
            if any(i not in values and not _is_factory(i) for i in inputs):
                continue
            val = n.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.numel() > self.max_numel:
                continue
            for i in inputs:
                if i not in values:
                    values[i] = _evaluate(i, values)
            if not inputs:
                continue  # a lone factory: fold it only through a consumer
            values[n] = _evaluate(n, values)
            name = f"_neuron_const_{next(_ids)}"
            gm.register_buffer(name, values[n])
            with gm.graph.inserting_before(n):
                const = gm.graph.get_attr(name)
            const.meta.update(n.meta)
            replace_node(gm, n, const)
            values[const] = values.pop(n)
            changed = True
        if changed:
            eliminate_dead_code(gm)
        return changed


def _is_factory(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and not n.all_input_nodes and isinstance(n.meta.get("val"), torch.Tensor) \
        and n.meta["val"].numel() <= (1 << 16) and \
        torch.Tag.nondeterministic_seeded not in getattr(n.target, "tags", ())


def _evaluate(n: torch.fx.Node, values: dict) -> Any:
    args = torch.fx.node.map_arg(n.args, lambda a: values[a])
    kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: values[a])
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return n.target(*args, **kwargs)
