"""Graph analysis for the FX passes, on networkx.

The dataflow graph has one vertex per FX node and an edge producer → user. A kernel partition
assigns nodes to kernels; its quotient (the kernel graph) must stay acyclic, or no order could run
the kernels.
"""
from __future__ import annotations

from typing import Hashable, Iterable, Mapping

import networkx as nx
import torch


def graph_outputs(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes the graph returns."""
    return set(next(n for n in gm.graph.nodes if n.op == "output").all_input_nodes)


def returned_storages(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes whose storage the graph returns: each output and, through ATen view ops (an
    ``OpOverload`` whose schema says it aliases its input, and ``_unsafe_view``, which is one
    without saying so: ``reshape`` of a fresh ``clone``), the node it is a view of."""
    seen: set[torch.fx.Node] = set()
    stack = list(graph_outputs(gm))
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and (getattr(n.target, "is_view", False)
                                        or n.target is torch.ops.aten._unsafe_view.default) \
                and n.args and isinstance(n.args[0], torch.fx.Node):
            stack.append(n.args[0])
    return seen


def replace_node(gm: torch.fx.GraphModule, old: torch.fx.Node, new: torch.fx.Node) -> None:
    """Point every user of ``old`` at ``new`` and erase ``old``."""
    old.replace_all_uses_with(new)
    gm.graph.erase_node(old)


def dataflow_graph(gm: torch.fx.GraphModule) -> nx.DiGraph:
    """Vertices: FX nodes (except the output node); edges: producer → user."""
    g = nx.DiGraph()
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        g.add_node(n)
        for u in n.users:
            if u.op != "output":
                g.add_edge(n, u)
    return g


def merge_creates_cycle(g: nx.DiGraph, members: Iterable[torch.fx.Node]) -> bool:
    """True if fusing ``members`` into one kernel would make the kernel graph cyclic: some node
    outside the set lies on a path from one member to another."""
    s = set(members)
    below: set = set()
    above: set = set()
    for m in s:
        below |= nx.descendants(g, m)
        above |= nx.ancestors(g, m)
    return bool((below - s) & (above - s))


def kernel_graph(g: nx.DiGraph, kernel_of: Mapping[torch.fx.Node, Hashable]) -> nx.DiGraph:
    """The quotient graph: one vertex per kernel, an edge where data flows between kernels."""
    k = nx.DiGraph()
    for n in g.nodes:
        if n in kernel_of:
            k.add_node(kernel_of[n])
    for a, b in g.edges:
        ka, kb = kernel_of.get(a), kernel_of.get(b)
        if ka is not None and kb is not None and ka != kb:
            k.add_edge(ka, kb)
    return k


def partition_text(gm: torch.fx.GraphModule, kernel_of: Mapping[torch.fx.Node, int]) -> str:
    """One line per kernel: its id and member nodes with their ATen ops, in graph order."""
    members: dict[int, list[torch.fx.Node]] = {}
    for n in gm.graph.nodes:
        if n in kernel_of:
            members.setdefault(kernel_of[n], []).append(n)
    lines = [f"{len(members)} kernels for {sum(len(v) for v in members.values())} ops"]
    for k, nodes in members.items():
        ops = ", ".join(f"{n.name}={getattr(n.target, '__name__', n.target)}" for n in nodes)
        lines.append(f"kernel {k}: {ops}")
    return "\n".join(lines)


def partition_dot(gm: torch.fx.GraphModule, kernel_of: Mapping[torch.fx.Node, int]) -> str:
    """Graphviz DOT: one cluster per kernel, edges of the dataflow graph."""
    g = dataflow_graph(gm)
    lines = ["digraph partition {", "  rankdir=TB; node [shape=box, fontsize=10];"]
    clusters: dict[int, list[torch.fx.Node]] = {}
    for n in g.nodes:
        if n in kernel_of:
            clusters.setdefault(kernel_of[n], []).append(n)
        else:
            lines.append(f'  "{n.name}" [style=dashed];')
    for k, nodes in clusters.items():
        lines.append(f"  subgraph cluster_{k} {{ label=\"kernel {k}\";")
        for n in nodes:
            lines.append(f'    "{n.name}" [label="{n.name}\\n{getattr(n.target, "__name__", n.target)}"];')
        lines.append("  }")
    for a, b in g.edges:
        lines.append(f'  "{a.name}" -> "{b.name}";')
    lines.append("}")
    return "\n".join(lines)
