"""``fold-zeros-scatter``: ``x + scatter_acc(zeros, index, src)`` → ``scatter_acc(x, index, src)``.

A sparse gradient is built as an accumulating scatter into a fresh zero tensor and then added to a
dense one: the embedding backward (``_unsafe_index_put(new_zeros, [ids], grad, accumulate=True)``)
added to the LM head's weight gradient when the two share a weight (tied embeddings: GPT-2, BERT's
decoder), or ``index_add``/``scatter_add`` gradients summed with another use's. Eager does the same
(AOTAutograd's graph is eager's), so both write a zero tensor of the weight's size, scatter a few
rows into it, and read both full tensors to add them. Accumulating the rows into ``x`` itself is the
same sum (``x + (0 + v1 + v2)`` becomes ``(x + v1) + v2``: reassociated, as an accumulating
scatter with repeated indices already is) and touches only the scattered rows. Measured on GPT-2-2L's
training step (vocabulary 50257 x 768, 1 thread, Sapphire Rapids): the zero fill + scatter kernel
took 65 ms and the 154 MB add 79 ms of a 748 ms step.

Applies when the zero tensor and the scatter each have one user, ``x``, the zeros and the sum have
one shape and dtype (no broadcast, no type promotion), and ``add`` has ``alpha`` 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

aten = torch.ops.aten

# accumulating scatters: op -> position of the ``accumulate`` flag (None: always accumulates)
_SCATTERS = {aten._unsafe_index_put.default: 3, aten.index_put.default: 3, aten.scatter_add.default: None,
             aten.index_add.default: None}
_ZEROS = {aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default}
_FULLS = {aten.full.default: 1, aten.new_full.default: 2, aten.full_like.default: 1}  # op -> fill value arg


def _is_zeros(n: object) -> bool:
    if not isinstance(n, torch.fx.Node) or n.op != "call_function" or len(n.users) != 1:
        return False
    if n.target in _ZEROS:
        return True
    pos = _FULLS.get(n.target)
    return pos is not None and len(n.args) > pos and not isinstance(n.args[pos], bool) and n.args[pos] == 0


def _accumulating_scatter_into_zeros(n: object) -> bool:
    if not isinstance(n, torch.fx.Node) or n.op != "call_function" or n.target not in _SCATTERS:
        return False
    if len(n.users) != 1 or not _is_zeros(n.args[0]):
        return False
    if n.target is aten.index_add.default and n.kwargs.get("alpha", 1) != 1:
        return False
    pos = _SCATTERS[n.target]
    if pos is None:
        return True
    return bool(n.args[pos] if len(n.args) > pos else n.kwargs.get("accumulate", False))


def _same(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and tuple(va.shape) == tuple(vb.shape)
            and va.dtype == vb.dtype)


@dataclass(frozen=True)
class FoldZerosScatter:
    name: str = "fold-zeros-scatter"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        changed = False
        for n in list(gm.graph.nodes):
            if n.op != "call_function" or n.target is not aten.add.Tensor or len(n.args) != 2:
                continue
            if n.kwargs.get("alpha", 1) != 1 or not all(isinstance(a, torch.fx.Node) for a in n.args):
                continue
            scatter = next((a for a in n.args if _accumulating_scatter_into_zeros(a)), None)
            if scatter is None:
                continue
            x = n.args[1] if n.args[0] is scatter else n.args[0]
            zeros = scatter.args[0]
            if x is scatter or not (_same(x, n) and _same(zeros, n)):
                continue
            with gm.graph.inserting_before(n):
                folded = gm.graph.call_function(scatter.target, (x, *scatter.args[1:]), dict(scatter.kwargs))
            folded.meta = {**scatter.meta, "val": n.meta["val"]}
            n.replace_all_uses_with(folded)
            gm.graph.erase_node(n)
            gm.graph.erase_node(scatter)
            gm.graph.erase_node(zeros)
            changed = True
        return changed
