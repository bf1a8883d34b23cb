"""Per-graph IR dumps (``NEURON_DUMP_DIR`` / ``options={"dump_dir": ...}``).

Layout: ``<dump_dir>/<graph>/<NN>.<phase>.<ext>``, numbered in the order written, plus a runnable
``repro.py`` of the FX graph. When dumping is off the :class:`Dumper` does nothing, so call sites
need no ``if``.
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch


class Dumper:
    """Writes numbered per-phase files for one graph; a no-op when ``root`` is ``None``."""

    def __init__(self, root: str | None, graph_name: str):
        self.dir = Path(root) / graph_name if root else None
        self._n = itertools.count()
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def write(self, phase: str, ext: str, text: str) -> Path | None:
        if self.dir is None:
            return None
        path = self.dir / f"{next(self._n):02d}.{phase}.{ext}"
        path.write_text(text)
        return path

    def fx(self, phase: str, gm: torch.fx.GraphModule) -> Path | None:
        if self.dir is None:
            return None
        return self.write(phase, "fx.txt", gm.print_readable(print_output=False, include_stride=True,
                                                           include_device=False))

    def repro(self, gm: torch.fx.GraphModule) -> Path | None:
        """A script that rebuilds the inputs from metadata and runs the graph eagerly and compiled."""
        if self.dir is None:
            return None
        specs = [(tuple(n.meta["val"].shape), n.meta["val"].stride(), str(n.meta["val"].dtype))
                 for n in gm.graph.nodes if n.op == "placeholder"]
        code = gm.code
        text = f'''"""Repro of one neuron-compile graph: python {self.dir / "repro.py"}"""
import torch
from torch import device  # noqa: F401  (printed graph code may name it)
from neuron_compile.compiler import compile_graph

aten = torch.ops.aten
prims = torch.ops.prims
inf, nan = float("inf"), float("nan")


class Repro(torch.nn.Module):
{os.linesep.join("    " + ln for ln in code.splitlines())}


specs = {specs!r}
args = [torch.empty_strided(s, st, dtype=eval(dt)).normal_() if eval(dt).is_floating_point
        else torch.zeros(s, dtype=eval(dt)) for s, st, dt in specs]
gm = torch.fx.symbolic_trace(Repro())
print(gm(*args))
'''
        path = self.dir / "repro.py"
        path.write_text(text)
        return path
