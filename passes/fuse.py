"""``fuse``: partition the graph into kernels (written to ``node.meta['neuron_kernel']``).

Rules, as in Inductor's scheduler, on the networkx dataflow graph (:mod:`passes.analysis`):

1. *Matmul epilogue*: a chain of pointwise consumers of a ``mm``/``bmm``/``addmm`` with the matmul's
   output shape, each the only user of the previous, joins the matmul's kernel, unless the chain
   ends in an op that reads lazy inputs into its output (``lowering.registry.LAZY_INPUT_OPS``: a
   convolution's padded input, a cat), which then takes it by rule 2.
2. *Producer fusion* (walking the graph backwards): a pointwise node whose users all sit in one
   kernel of pointwise or reduction ops, or of ops in ``LAZY_INPUT_OPS``, joins it, so pointwise
   chains fuse, reductions get their pointwise prologue and a cat, a pad or a convolution computes
   its producers into its (padded) input. A node used by several kernels stays its own kernel (materialised once
   instead of recomputed).

A merge is refused if it would make the kernel graph cyclic or the kernel larger than
``max_ops``. The lowering keeps every fused intermediate unmaterialised (a ``LazyTensor``), so a
kernel becomes one ``linalg.generic`` (pointwise or reduction) or a matmul plus one epilogue generic.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import networkx as nx
import torch

from neuron_compile.passes.analysis import graph_outputs, dataflow_graph, kernel_graph, merge_creates_cycle

KERNEL = "neuron_kernel"
INLINE = "neuron_inline"
_aten = torch.ops.aten
# library calls or long polynomials: stored once, never recomputed in several kernels
EXPENSIVE = {_aten.exp.default, _aten.log.default, _aten.tanh.default, _aten.pow.Tensor_Tensor, _aten.sin.default,
             _aten.cos.default, _aten.log1p.default, _aten.expm1.default}


def _reads_lazy(n: torch.fx.Node, kind: str) -> bool:
    """Whether ``n``'s lowering takes fused (unmaterialised) inputs (``lowering.registry``); with
    ``kind="opaque"``: only as one of the ``LAZY_INPUT_OPS`` (cat, pad, convolution)."""
    from neuron_compile.lowering.registry import reads_lazy_inputs
    return reads_lazy_inputs(n.target, kind)


def _kind(n: torch.fx.Node) -> str:
    from neuron_compile.lowering.registry import fusion_kind
    if n.op == "call_function" and n.target is operator.getitem:
        return "pointwise"  # picks one result of a multi-result op; fuses like a pointwise op
    if n.op != "call_function" or torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
        return "opaque"
    return fusion_kind(n.target)


def _shape(n: torch.fx.Node):
    v = n.meta.get("val")
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


@dataclass(frozen=True)
class Fuse:
    name: str = "fuse"
    max_ops: int = 64
    max_inline_users: int = 4

    def run(self, gm: torch.fx.GraphModule) -> bool:
        g = dataflow_graph(gm)
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        kind = {n: _kind(n) for n in nodes}
        for n in nodes:
            n.meta.pop(INLINE, None)
        group = {n: {n} for n in nodes}      # node -> its kernel's member set (shared object)
        outputs = graph_outputs(gm)

        def merge(a: torch.fx.Node, b: torch.fx.Node) -> bool:
            ga, gb = group[a], group[b]
            if ga is gb:
                return True
            union = ga | gb
            if len(union) > self.max_ops or merge_creates_cycle(g, union):
                return False
            for m in union:
                group[m] = union
            return True

        for m in nodes:                       # 1. matmul epilogues
            if kind[m] != "matmul":
                continue
            chain, cur = [], m
            while cur not in outputs and len(cur.users) == 1:
                (u,) = cur.users
                if u.op != "call_function" or kind[u] != "pointwise" or _shape(u) != _shape(m):
                    break
                chain.append(u)
                cur = u
            if chain and cur not in outputs and all(_reads_lazy(u, "opaque") for u in cur.users):
                # the epilogue is a loop nest of its own either way: its consumer (the next
                # convolution's padded input, a cat) computes it straight into its own input (rule 2)
                continue
            for u in chain:
                if not merge(m, u):
                    break

        for p in reversed(nodes):            # 2. producers into their consumers' kernel
            if kind[p] != "pointwise" or p in outputs or len(group[p]) > 1:
                continue
            users = [u for u in p.users if u.op == "call_function"]
            if not users or len(users) != len(p.users):
                continue
            if not all(_reads_lazy(u, kind[u]) for u in users):
                continue
            if len({id(group[u]) for u in users}) != 1:
                if len({id(group[u]) for u in users}) <= self.max_inline_users and p.target not in EXPENSIVE:
                    p.meta[INLINE] = True  # recomputed inside each consumer kernel, never stored
                continue
            merge(users[0], p)

        ids: dict[int, int] = {}
        for n in nodes:
            if kind[n] == "opaque" and len(group[n]) == 1:
                n.meta.pop(KERNEL, None)
                continue
            n.meta[KERNEL] = ids.setdefault(id(group[n]), len(ids))
        kernels = kernel_graph(g, {n: n.meta[KERNEL] for n in nodes if KERNEL in n.meta})
        assert nx.is_directed_acyclic_graph(kernels), "fusion made the kernel graph cyclic"
        return True
