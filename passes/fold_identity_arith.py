"""``fold-identity-arith``: ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0``, ``x ** 1`` → ``x``.

Only when the result has ``x``'s shape and dtype (no broadcast or type promotion is dropped) and
no graph output would start aliasing an input.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_compile.passes.analysis import graph_outputs, replace_node

aten = torch.ops.aten
_IDENTITY = {
    aten.mul.Tensor: 1, aten.mul.Scalar: 1, aten.div.Tensor: 1, aten.div.Scalar: 1,
    aten.add.Tensor: 0, aten.add.Scalar: 0, aten.sub.Tensor: 0, aten.sub.Scalar: 0,
    aten.pow.Tensor_Scalar: 1,
}


@dataclass(frozen=True)
class FoldIdentityArith:
    name: str = "fold-identity-arith"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        outputs = graph_outputs(gm)
        changed = False
        for n in list(gm.graph.nodes):
            if n.op != "call_function" or n.target not in _IDENTITY or len(n.args) < 2:
                continue
            x, other = n.args[0], n.args[1]
            if not isinstance(x, torch.fx.Node) or isinstance(other, torch.fx.Node) or n.kwargs.get("alpha", 1) != 1:
                continue
            if isinstance(other, bool) or other != _IDENTITY[n.target]:
                continue
            xv, nv = x.meta["val"], n.meta["val"]
            if tuple(xv.shape) != tuple(nv.shape) or xv.dtype != nv.dtype:
                continue
            if n in outputs and x.op == "placeholder":
                continue
            replace_node(gm, n, x)
            changed = True
        return changed
