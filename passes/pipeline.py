"""Pass infrastructure: small named passes composed into a :class:`Pipeline` with one callback.

Modelled on xDSL's ``ModulePass``/``PassPipeline``: a pass is a frozen object with a kebab-case
``name`` and ``run(gm) -> changed``; the pipeline's single callback verifies, dumps and times after
every pass, so no pass does its own bookkeeping.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch


class FxPass(Protocol):
    name: str

    def run(self, gm: torch.fx.GraphModule) -> bool: ...


Callback = Callable[[FxPass, torch.fx.GraphModule, bool, float], None]


@dataclass(frozen=True)
class Pipeline:
    """Run ``passes`` in order; after each, call ``callback(pass, gm, changed, seconds)``."""

    passes: Sequence[FxPass]
    callback: Callback | None = None

    def run(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        for p in self.passes:
            t0 = time.perf_counter()
            changed = p.run(gm)
            if changed:
                gm.recompile()
            if self.callback is not None:
                self.callback(p, gm, changed, time.perf_counter() - t0)
        return gm


def verify_fx_contract(gm: torch.fx.GraphModule) -> None:
    """The FX contract between passes: every value node carries ``meta['val']``, no in-place ops.

    Raises:
        AssertionError: naming the first node that breaks it (a pass bug).
    """
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "call_function") and "val" not in n.meta:
            raise AssertionError(f"FX node {n.name} ({n.target}) has no meta['val']")
        if n.op == "call_function" and hasattr(n.target, "_schema") and n.target._schema.is_mutable:
            raise AssertionError(f"FX node {n.name} calls mutating op {n.target}; graphs must be functional")
