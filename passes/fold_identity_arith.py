"""``fold-identity-arith``: ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0``, ``x ** 1`` → ``x``.

Only when the result has ``x``'s shape and dtype (no broadcast or type promotion is dropped), for
floats only where IEEE arithmetic is the identity (``x + (-0.0)`` and ``x - 0.0``: ``-0.0 + 0.0``
is ``+0.0``), and only for values the graph does not return, directly or through a view: eager's
result is a fresh tensor, and ``x`` may be an input, a view of one, or another output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_compile.passes.analysis import replace_node, returned_storages

aten = torch.ops.aten
_IDENTITY = {
    aten.mul.Tensor: 1, aten.mul.Scalar: 1, aten.div.Tensor: 1, aten.div.Scalar: 1,
    aten.add.Tensor: 0, aten.add.Scalar: 0, aten.sub.Tensor: 0, aten.sub.Scalar: 0,
    aten.pow.Tensor_Scalar: 1,
}


def _exact_for_floats(op, other) -> bool:
    """Whether ``x op other`` is ``x`` bit for bit, signed zeros included."""
    if op in (aten.add.Tensor, aten.add.Scalar):
        return math.copysign(1.0, other) < 0     # x + (-0.0)
    if op in (aten.sub.Tensor, aten.sub.Scalar):
        return math.copysign(1.0, other) > 0     # x - (+0.0)
    return True


@dataclass(frozen=True)
class FoldIdentityArith:
    name: str = "fold-identity-arith"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        returned = returned_storages(gm)
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
            if n in returned or (nv.is_floating_point() and not _exact_for_floats(n.target, other)):
                continue
            replace_node(gm, n, x)
            changed = True
        return changed
