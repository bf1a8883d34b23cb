"""``fold-transpose-into-matmul``: a ``permute``/``transpose``/``t`` of the last two dims feeding
``mm``/``bmm``/``addmm`` becomes a flag of ``neuron::matmul`` (:mod:`neuron_compile.ops`), read
through a transposed indexing map: no transposed copy is materialised (``x @ w.t()``, the layout of
``nn.Linear``). ``addmm``'s bias becomes the matmul accumulator's initial value.

Broadcasts are never materialised either: the lowering reads them through indexing maps. Outputs
keep eager's strides (the emitter writes them with the strides of the FX metadata).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_compile.passes.analysis import replace_node

from neuron_compile.passes.dce import eliminate_dead_code

from neuron_compile.passes.fold_views import permutation

aten = torch.ops.aten


def _swaps_last_two(n: torch.fx.Node) -> bool:
    perm = permutation(n)
    if perm is None or len(perm) < 2:
        return False
    k = len(perm)
    return perm == list(range(k - 2)) + [k - 1, k - 2]


@dataclass(frozen=True)
class FoldTransposeIntoMatmul:
    name: str = "fold-transpose-into-matmul"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        import neuron_compile.ops  # noqa: F401  (registers torch.ops.neuron.matmul)
        from torch._guards import detect_fake_mode
        changed = False
        for n in list(gm.graph.nodes):
            if n.op != "call_function":
                continue
            if n.target in (aten.mm.default, aten.bmm.default):
                bias, a, b = None, n.args[0], n.args[1]
            elif n.target == aten.addmm.default and n.kwargs.get("beta", 1) == 1 and n.kwargs.get("alpha", 1) == 1 \
                    and len(n.args) == 3:
                bias, a, b = n.args
            else:
                continue
            ta, tb = _swaps_last_two(a), _swaps_last_two(b)
            if not (ta or tb or bias is not None):
                continue
            a_src = a.args[0] if ta else a
            b_src = b.args[0] if tb else b
            with gm.graph.inserting_before(n):
                new = gm.graph.call_function(torch.ops.neuron.matmul.default, (a_src, b_src, bias, ta, tb))
            new.meta.update(n.meta)
            vals = [x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in new.args]
            fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
            if fake_mode is not None:
                with fake_mode:
                    val = torch.ops.neuron.matmul.default(*vals)
                old = n.meta.get("val")
                # the old value, when it fits, keeps its storage: views of it among the graph's
                # outputs must still be seen as views of the matmul (lowering/outputs.py)
                if not (isinstance(old, torch.Tensor) and old.shape == val.shape and old.dtype == val.dtype
                        and old.stride() == val.stride()):
                    new.meta["val"] = val
            replace_node(gm, n, new)
            changed = True
        if changed:
            eliminate_dead_code(gm)
        return changed
