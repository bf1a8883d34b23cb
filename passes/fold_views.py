"""``fold-views``: remove views that do nothing and transposes of transposes.

- ``view``/``reshape``/``_unsafe_view``/``expand``/``alias`` to the input's own shape;
- ``permute`` by the identity; ``permute``/``transpose``/``t`` of the same, when the two compose
  to the identity (``x.t().t()``), or to one permute otherwise.

A node that is a graph output is kept when folding would make the output alias an input that it
did not alias before (AOTAutograd's output-aliasing contract), or make it the very tensor another
output is (``return v.view(2, 3), v``: two tensor objects sharing storage in eager).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_compile.passes.analysis import graph_outputs, replace_node, returned_storages

from neuron_compile.passes.dce import eliminate_dead_code

aten = torch.ops.aten
_SAME_SHAPE = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
               aten.alias.default}


def permutation(n: torch.fx.Node) -> list[int] | None:
    """The permutation a permute-like node applies, or None."""
    if n.op != "call_function" or not isinstance(n.meta.get("val"), torch.Tensor):
        return None
    rank = n.meta["val"].dim()
    if rank == 0:  # permuting a 0-d tensor (dims 0 / -1 name its one pseudo-dim) is the identity
        return [] if n.target in (aten.permute.default, aten.t.default, aten.transpose.int) else None
    if n.target == aten.permute.default:
        return [d % rank for d in n.args[1]]
    if n.target == aten.t.default and rank == 2:
        return [1, 0]
    if n.target == aten.transpose.int:
        perm = list(range(rank))
        a, b = n.args[1] % rank, n.args[2] % rank
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    return None


def _shape(n: torch.fx.Node):
    return tuple(n.meta["val"].shape)


@dataclass(frozen=True)
class FoldViews:
    name: str = "fold-views"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        outputs = graph_outputs(gm)
        returned = returned_storages(gm)
        changed = False
        for n in list(gm.graph.nodes):
            if n.op != "call_function" or not n.args or not isinstance(n.args[0], torch.fx.Node) \
                    or not isinstance(n.meta.get("val"), torch.Tensor) \
                    or not isinstance(n.args[0].meta.get("val"), torch.Tensor):
                continue
            src = n.args[0]
            replacement = None
            perm = permutation(n)
            if n.target in _SAME_SHAPE and _shape(n) == _shape(src) and n.meta["val"].dtype == src.meta["val"].dtype:
                replacement = src
            elif perm is not None and perm == sorted(perm):
                replacement = src
            elif perm is not None and permutation(src) is not None:
                inner = permutation(src)
                composed = [inner[p] for p in perm]
                base = src.args[0]
                if composed == sorted(composed):
                    replacement = base
                else:
                    with gm.graph.inserting_before(n):
                        replacement = gm.graph.call_function(aten.permute.default, (base, composed))
                    replacement.meta.update(n.meta)
            if replacement is None:
                continue
            if n in outputs and (replacement.op == "placeholder" or replacement in returned):
                continue
            replace_node(gm, n, replacement)
            changed = True
        if changed:
            eliminate_dead_code(gm)
        return changed
