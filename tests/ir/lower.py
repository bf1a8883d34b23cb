"""Trace a function the way AOTAutograd does (our decomposition table, fake tensors), run the FX
pass pipeline and lower it: the IR tests check what each stage produces."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.compiler import run_fx_passes
from neuron_compile.debug import Dumper
from neuron_compile.lowering.emit import lower_graph
from neuron_compile.passes.decompose import decomposition_table
from neuron_compile.passes.registry import build_passes, parse_pass_spec


def trace(fn, *args) -> torch.fx.GraphModule:
    return make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)


def run_pass(name: str, fn, *args) -> tuple[torch.fx.GraphModule, bool]:
    gm = trace(fn, *args)
    (p,) = build_passes((name,), "test")
    changed = p.run(gm)
    gm.recompile()
    return gm, changed


def lower(fn, *args, passes: str = "default"):
    gm = run_fx_passes(trace(fn, *args), "test", Dumper(None, "test"), {}, parse_pass_spec(passes))
    return gm, lower_graph(gm, "test")


def targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
