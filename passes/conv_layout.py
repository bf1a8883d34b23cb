"""``channels-last-convolutions``: the layout pass for chains of convolutions (the design's
"layout" stage). Chooses where a convolution is computed channels-last ([N, H, W, C]), written to
``node.meta['neuron_layout']`` and read by the convolution's lowering rule
(``lowering/rules/conv.py``).

A depthwise convolution in NCHW vectorizes along an image row; at the small planes and strides of
MobileNet's later blocks (8×8 at stride 2, 4×4) its rows are shorter than a register and it ran
scalar (``loops``, 3-12 GB/s). Channels-last, its contiguous dim is the channel (96-384), and the
1×1 convolutions around it are GEMMs with the batch's positions as rows. Converting costs a
transpose, so the choice is made per *chain* (as Inductor's and oneDNN's layout propagation do):
a connected group of 1×1 and depthwise convolutions joined by pointwise ops (batch norm,
activations, residual adds) is computed channels-last when it holds a depthwise convolution and at
least two convolutions, and at most one of its values is a graph output (a training graph's
forward saves many for the backward, in NCHW: a transpose per saved value). Values enter the chain
transposed once and leave it (to a pooling head, a graph output) transposed once.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import torch

from neuron_compile.passes.analysis import graph_outputs

aten = torch.ops.aten
LAYOUT = "neuron_layout"   # read by lowering/rules/conv.py


def chain_kind(n: torch.fx.Node) -> str | None:
    """``"depthwise"`` or ``"1x1"`` for a 2-D float32/float64 convolution the channels-last
    lowering computes (depthwise: one input and one output channel per group, any kernel,
    stride, padding, dilation; 1×1: one group, unit stride, no padding), else ``None``."""
    if n.op != "call_function" or n.target is not aten.convolution.default:
        return None
    xv, wv, ov = n.args[0].meta.get("val"), n.args[1].meta.get("val"), n.meta.get("val")
    if not all(isinstance(v, torch.Tensor) for v in (xv, wv, ov)) or xv.dim() != 4 \
            or xv.dtype not in (torch.float32, torch.float64) or not xv.dtype == wv.dtype == ov.dtype:
        return None
    stride, padding, _, transposed, _, groups = n.args[3:9]
    if transposed:
        return None
    if groups > 1 and groups == xv.shape[1] == wv.shape[0]:
        return "depthwise"
    if groups == 1 and tuple(wv.shape[2:]) == (1, 1) and set(stride) == {1} and not any(padding):
        return "1x1"
    return None


def _pointwise_4d(n: torch.fx.Node) -> bool:
    from neuron_compile.lowering.registry import fusion_kind
    v = n.meta.get("val")
    return n.op == "call_function" and isinstance(v, torch.Tensor) and v.dim() == 4 \
        and fusion_kind(n.target) == "pointwise"


@dataclass(frozen=True)
class ChannelsLastConvolutions:
    name: str = "channels-last-convolutions"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        kinds = {n: chain_kind(n) for n in gm.graph.nodes}
        member = {n for n in gm.graph.nodes if kinds[n] or _pointwise_4d(n)}
        chains = nx.Graph()
        chains.add_nodes_from(member)
        chains.add_edges_from((n, u) for n in member for u in n.users if u in member)
        outputs = graph_outputs(gm)
        changed = False
        for chain in nx.connected_components(chains):
            convs = [n for n in chain if kinds[n]]
            if len(convs) < 2 or "depthwise" not in {kinds[n] for n in convs} or len(chain & outputs) > 1:
                continue
            for n in convs:
                n.meta[LAYOUT] = "channels_last"
            changed = True
        return changed
