"""``dce``: dead-code elimination of pure nodes (``torch.fx.Graph.eliminate_dead_code``).

Random ops are kept even when unused: eager PyTorch draws their numbers, so dropping them would
shift the random stream of everything after them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def _impure(n: torch.fx.Node) -> bool:
    return n.is_impure() or torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())


def eliminate_dead_code(gm: torch.fx.GraphModule) -> bool:
    """Remove unused pure nodes (random ops stay); True if anything was removed."""
    return gm.graph.eliminate_dead_code(is_impure_node=_impure)


@dataclass(frozen=True)
class DeadCodeElimination:
    name: str = "dce"

    def run(self, gm: torch.fx.GraphModule) -> bool:
        return eliminate_dead_code(gm)
