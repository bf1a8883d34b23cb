"""The compile driver: one FX graph → an :class:`~neuron_compile.runtime.Executable`.

Phases run from an ordered table (:mod:`neuron_compile.phases`): FX passes (``fx`` → ``fx-opt``),
lowering to MLIR on tensors (``linalg``), the MLIR pass pipeline (``llvm``) and the target's
codegen (``obj``). Each external stage runs in a child process (see :mod:`neuron_compile.toolchain`).
"""
from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from neuron_compile.config import Config
from neuron_compile.debug import Dumper
from neuron_compile.phases import LINALG_TO_LLVM, Phase
from neuron_compile.runtime import Executable, load_shared_object
from neuron_compile.target import HostCPU
from neuron_compile.toolchain import run_stage, tool

log = logging.getLogger("neuron_compile")
_graph_ids = itertools.count()


@dataclass
class CompileStats:
    """What one compile did: ops in, seconds per phase."""

    graph: str
    ops: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def default_passes(graph_name: str) -> list:
    from neuron_compile.passes.dce import DeadCodeElimination
    from neuron_compile.passes.verify_lowerable import VerifyLowerable
    return [DeadCodeElimination(), VerifyLowerable(graph_name=graph_name)]


def run_fx_passes(gm: torch.fx.GraphModule, graph_name: str, dumper: Dumper, stats: CompileStats
                  ) -> torch.fx.GraphModule:
    """``fx`` → ``fx-opt``: the pass pipeline with a callback that verifies, dumps and times."""
    from neuron_compile.passes.pipeline import Pipeline, verify_fx_contract

    def callback(p, g, changed, seconds):
        verify_fx_contract(g)
        stats.seconds[f"pass:{p.name}"] = stats.seconds.get(f"pass:{p.name}", 0.0) + seconds
        if changed:
            dumper.fx(f"{Phase.FX.value}.{p.name}", g)

    return Pipeline(default_passes(graph_name), callback).run(gm)


def mlir_to_llvm(linalg_path: Path, workdir: Path, timeout: float) -> Path:
    """``linalg`` → ``llvm``: run :data:`~neuron_compile.phases.LINALG_TO_LLVM` with ``mlir-opt``."""
    out = workdir / "kernel.llvm.mlir"
    run_stage(Phase.LLVM.value, [tool("mlir-opt"), str(linalg_path), f"--pass-pipeline={LINALG_TO_LLVM}",
                                 "-o", str(out)], linalg_path, timeout)
    return out


def compile_graph(gm: torch.fx.GraphModule, config: Config | None = None, kind: str = "graph") -> Executable:
    """Compile one ATen FX graph (static shapes, ``meta['val']`` on every node) to an executable.

    Args:
        gm: the graph (e.g. AOTAutograd's forward or backward graph).
        config: options; default :class:`Config()`.
        kind: ``forward``/``backward``/``inference``, used in names and dumps.
    Returns:
        An :class:`Executable` taking and returning lists of tensors (boxed convention is up to the caller).
    Raises:
        UnsupportedOpsError, DynamicShapeError, LoweringError, PipelineError.
    """
    from neuron_compile.lowering.emit import lower_graph
    config = config or Config()
    name = f"graph_{next(_graph_ids):03d}_{kind}"
    stats = CompileStats(name)
    dumper = Dumper(config.dump_dir, name)
    dumper.fx(Phase.FX.value, gm)
    dumper.repro(gm)
    gm = run_fx_passes(gm, name, dumper, stats)
    dumper.fx(Phase.FX_OPT.value, gm)

    t0 = time.perf_counter()
    lowered = lower_graph(gm, name)
    stats.ops = lowered.op_count
    stats.seconds[Phase.LINALG.value] = time.perf_counter() - t0
    library = None
    if lowered.mlir:
        workdir = dumper.dir if dumper.enabled else Path(tempfile.mkdtemp(prefix=f"neuron-{name}-"))
        ok = False
        try:
            linalg_path = workdir / "kernel.linalg.mlir"
            linalg_path.write_text(lowered.mlir)
            t0 = time.perf_counter()
            llvm_path = mlir_to_llvm(linalg_path, workdir, config.compile_timeout)
            stats.seconds[Phase.LLVM.value] = time.perf_counter() - t0
            t0 = time.perf_counter()
            library = HostCPU.detect().codegen(llvm_path, workdir, config.opt_level, config.compile_timeout)
            stats.seconds[Phase.OBJ.value] = time.perf_counter() - t0
            fn, lib = load_shared_object(library)
            exe = Executable(lowered.plan, fn, name, keepalive=lib)
            ok = True
        finally:
            if ok and not dumper.enabled and not config.keep_tmp:
                shutil.rmtree(workdir, ignore_errors=True)
    else:
        exe = Executable(lowered.plan, None, name)
    log.info("neuron-compile %s: %d ATen ops, %s", name, stats.ops,
             ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in stats.seconds.items()))
    exe.stats = stats
    return exe
