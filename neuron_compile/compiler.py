"""The compile driver: one FX graph → an :class:`~neuron_compile.runtime.Executable`.

First the cache key (:mod:`neuron_compile.cache_key`); on a miss the phases run from an ordered
table (:mod:`neuron_compile.phases`): FX passes (``fx`` → ``fx-opt``), lowering to MLIR on tensors
(``linalg``), the MLIR pass pipeline (``llvm``) and the target's codegen (``obj``). Each external
stage runs in a child process (see :mod:`neuron_compile.toolchain`).
"""
from __future__ import annotations

import functools
import itertools
import json
import operator
import logging
import shutil
import tempfile
import time
from pathlib import Path

import torch

from neuron_compile import counters
from neuron_compile.cache import ArtifactCache, compile_without_disk, default_root
from neuron_compile.cache_key import make_cache_key
from neuron_compile.codegen import CodegenPlan, plan_codegen
from neuron_compile.codegen.strategy import parse_overrides
from neuron_compile.config import Config
from neuron_compile.debug import Dumper
from neuron_compile.errors import UnsupportedOpsError
from neuron_compile.executable import LLVM_MLIR, NATIVE, Build
from neuron_compile.kernel_runtime import entry_source
from neuron_compile.plan import CallPlan
from neuron_compile.phases import Phase, linalg_to_llvm
from neuron_compile.runtime import KERNEL_SYMBOL, Executable
from neuron_compile.target import HostCPU
from neuron_compile.toolchain import run_stage, tool

log = logging.getLogger("neuron_compile")
_graph_ids = itertools.count()


def run_fx_passes(gm: torch.fx.GraphModule, graph_name: str, dumper: Dumper, seconds: dict[str, float],
                  pass_names: tuple[str, ...]) -> torch.fx.GraphModule:
    """``fx`` → ``fx-opt``: the pass pipeline with a callback that verifies, dumps and times."""
    from neuron_compile.passes.pipeline import Pipeline, verify_fx_contract
    from neuron_compile.passes.registry import build_passes

    def callback(p, g, changed, secs):
        verify_fx_contract(g)
        seconds[f"pass:{p.name}"] = seconds.get(f"pass:{p.name}", 0.0) + secs
        if changed:
            dumper.fx(f"{Phase.FX.value}.{p.name}", g)

    return Pipeline(build_passes(pass_names, graph_name), callback).run(gm)


def mlir_to_llvm(linalg_path: Path, workdir: Path, timeout: float, codegen: CodegenPlan | None = None) -> Path:
    """``linalg`` → ``llvm``: run :func:`~neuron_compile.phases.linalg_to_llvm` with ``mlir-opt``,
    applying ``codegen``'s schedules (written to ``kernel.schedule.mlir`` next to the output) to
    the module with each scheduled kernel outlined (``kernel.outlined.mlir``; see
    :mod:`neuron_compile.codegen.outline`). When a schedule asks for prefetches or streamed
    stores, in two stages with :func:`neuron_compile.codegen.prefetch.rewrite` and
    :func:`neuron_compile.codegen.streaming.align_stores` between them (``kernel.vector.mlir`` →
    ``kernel.rewritten.mlir``)."""
    from neuron_compile.codegen import prefetch, streaming
    from neuron_compile.codegen.outline import outline_kernels
    out = workdir / LLVM_MLIR
    library = None
    if codegen is not None and codegen.library:
        library = workdir / "kernel.schedule.mlir"
        library.write_text(codegen.library)
        outlined = workdir / "kernel.outlined.mlir"
        outlined.write_text(outline_kernels(linalg_path.read_text(), codegen.groups))
        linalg_path = outlined
    split = codegen is not None and codegen.rewrites
    stages = linalg_to_llvm(library, codegen.fragments if codegen else None,
                            codegen.in_place_outputs if codegen else True, split=split)
    if split:
        vector = workdir / "kernel.vector.mlir"
        run_stage(Phase.LLVM.value, [tool("mlir-opt"), str(linalg_path), f"--pass-pipeline={stages[0]}",
                                     "-o", str(vector)], linalg_path, timeout)
        linalg_path = workdir / "kernel.rewritten.mlir"
        linalg_path.write_text(streaming.align_stores(prefetch.rewrite(vector.read_text()),
                                                      codegen.target.vector_bits // 8))
    run_stage(Phase.LLVM.value, [tool("mlir-opt"), str(linalg_path), f"--pass-pipeline={stages[-1]}",
                                 "-o", str(out)], linalg_path, timeout)
    return out


def linalg_to_native(linalg_path: Path, workdir: Path, plan: CallPlan, codegen: CodegenPlan | None, target: HostCPU,
                     config: Config, seconds: dict[str, float], dumper: Dumper | None = None) -> dict[str, Path]:
    """``linalg`` → ``llvm`` → ``obj`` for one graph's kernel module: the executable's payloads
    (:data:`NATIVE` ``kernel.so`` with the graph's entry point for ``plan``, and the LLVM dialect
    :data:`LLVM_MLIR`) in ``workdir``; each phase's seconds added to ``seconds``.

    Raises:
        PipelineError: a stage failed, crashed or timed out (with a command reproducing it).
    """
    t0 = time.perf_counter()
    llvm_path = mlir_to_llvm(linalg_path, workdir, config.compile_timeout, codegen)
    seconds[Phase.LLVM.value] = time.perf_counter() - t0
    if dumper is not None:
        if codegen is not None and codegen.library:
            dumper.copy("schedule", workdir / "kernel.schedule.mlir")
        dumper.copy(Phase.LLVM.value, llvm_path)
    if config.stop_after == Phase.LLVM:
        return {LLVM_MLIR: llvm_path}
    t0 = time.perf_counter()
    entry = entry_source(KERNEL_SYMBOL, [*plan.input_specs, *plan.host_specs, *plan.output_specs])
    so = target.codegen(llvm_path, workdir, config.opt_level, config.compile_timeout, config.profile, entry,
                        config.jobs)
    seconds[Phase.OBJ.value] = time.perf_counter() - t0
    if dumper is not None:
        dumper.copy(Phase.OBJ.value, workdir / "kernel.ll")
    return {NATIVE: so, LLVM_MLIR: llvm_path}


def build_graph(gm: torch.fx.GraphModule, config: Config, name: str, dumper: Dumper, target: HostCPU,
                workdir: Path) -> Build:
    """Run every phase for ``gm`` (a cache miss); payload files land in ``workdir``."""
    from neuron_compile.lowering.emit import lower_graph
    from neuron_compile.passes.aten_checks import check_arguments
    from neuron_compile.passes.host_checks import split_host_checks
    build_seconds: dict[str, float] = {}
    ops_in = sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem)
    dumper.fx(Phase.FX.value, gm)
    dumper.repro(gm)
    check_arguments(gm)  # ATen's CPU-kernel argument checks that fake tensors skip: eager's error
    checks = split_host_checks(gm)  # torch.linalg's error checks: run on the host after the kernel
    gm = run_fx_passes(gm, name, dumper, build_seconds, config.pass_names)
    dumper.fx(Phase.FX_OPT.value, gm)
    dumper.partition(gm)

    t0 = time.perf_counter()
    overrides = parse_overrides(config.schedule)
    lowered = lower_graph(gm, name, profile=config.profile, target=target.info(), overrides=overrides)
    codegen = plan_codegen(lowered.kernels, target.info(), overrides, in_place_outputs=not lowered.shares_inits,
                           uses=lowered.value_uses)
    build_seconds[Phase.LINALG.value] = time.perf_counter() - t0
    dumper.write("schedule", "json", json.dumps(codegen.to_json(), indent=1))
    lowered.plan.checks = checks
    # with the linalg file and the schedules, what `neuron-compile compile --from linalg` needs to
    # rebuild this graph's executable
    dumper.write("plan", "json", json.dumps({"name": name, "ops": ops_in, "plan": lowered.plan.to_json()}, indent=1))
    build = Build(name, lowered.plan, seconds=build_seconds, ops=ops_in)
    stop = config.stop_after
    if lowered.mlir and stop not in (Phase.FX, Phase.FX_OPT):
        linalg_path = workdir / "kernel.linalg.mlir"
        linalg_path.write_text(lowered.mlir)
        dumper.copy(Phase.LINALG.value, linalg_path)
    if lowered.mlir and stop not in (Phase.FX, Phase.FX_OPT, Phase.LINALG):
        build.payloads = linalg_to_native(linalg_path, workdir, lowered.plan, codegen, target, config, build_seconds,
                                          dumper)
    counters.bump("graphs_compiled")
    counters.bump("aten_ops", ops_in)
    counters.bump("kernels", len(lowered.kernels))
    for phase, secs in build_seconds.items():
        counters.add_seconds(phase, secs)
    build.kernels = codegen.to_json()["kernels"]
    log.info("neuron-compile %s: %d ATen ops in, %d kernels out, %s of intermediates kept out of memory; %s",
             name, build.ops, len(lowered.kernels), _human_bytes(lowered.bytes_avoided),
             ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in build_seconds.items()))
    return build


def _human_bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


@functools.lru_cache(maxsize=None)
def _cache(root: str, max_bytes: int) -> ArtifactCache:
    return ArtifactCache(Path(root), max_bytes)


def cache_for(config: Config) -> ArtifactCache:
    """The :class:`ArtifactCache` for ``config`` (one object per root and bound)."""
    return _cache(str(Path(config.cache_dir or default_root()).expanduser().resolve()), config.cache_max_bytes)


def compile_graph(gm: torch.fx.GraphModule, config: Config | None = None, kind: str = "graph") -> Executable:
    """Compile one ATen FX graph (static shapes, ``meta['val']`` on every node), or load it from the cache.

    Args:
        gm: the graph (e.g. AOTAutograd's forward or backward graph).
        config: options; default :class:`Config()`.
        kind: ``forward``/``backward``/``inference``, used in names and dumps.
    Returns:
        An :class:`Executable` taking and returning lists of tensors.
    Raises:
        UnsupportedOpsError, DynamicShapeError, LoweringError, PipelineError.

    A graph with host calls (:mod:`neuron_compile.passes.host_calls`) is compiled as a program of
    kernel segments, each compiled (and cached) by this function: see :func:`build_program`.
    """
    from neuron_compile.lowering.emit import static_spec, graph_input_specs
    from neuron_compile.passes.host_calls import host_call_nodes, opaque_inputs
    from neuron_compile.passes.verify_lowerable import control_flow_ops
    config = config or Config()
    control_flow = control_flow_ops(gm)
    if control_flow:
        raise UnsupportedOpsError(control_flow, f"the {kind} graph")
    host_nodes, fallbacks = host_call_nodes(gm, fallback=config.fallback == "eager")
    opaque = opaque_inputs(gm)
    as_program = bool(host_nodes or opaque)
    if fallbacks:
        _warn_fallbacks(fallbacks, kind)
    name = f"graph_{next(_graph_ids):03d}_{kind}"
    dumper = Dumper(config.dump_dir, name)
    t0 = time.perf_counter()
    target = HostCPU.detect()
    if opaque:  # a script object is keyed by its type; a program passes it through
        spec_json = [{"opaque": type(n.meta["val"]).__name__} if n in opaque else static_spec(n).to_json()
                     for n in gm.graph.nodes if n.op == "placeholder"]
    else:
        spec_json = [s.to_json() for s in graph_input_specs(gm)]
    key = make_cache_key(gm, spec_json, config.codegen_key(), target.key())
    counters.add_seconds("cache_key", time.perf_counter() - t0)
    dumper.key(key.digest, key.explain())

    workdirs: list[Path] = []

    def compile_fn() -> Build:
        if as_program:
            return build_program(gm, host_nodes, config, name, kind, dumper)
        workdir = dumper.workdir or Path(tempfile.mkdtemp(prefix=f"neuron-{name}-"))
        workdirs.append(workdir)
        return build_graph(gm, config, name, dumper, target, workdir)

    t0 = time.perf_counter()
    ok = False
    try:
        if config.cache:
            exe = cache_for(config).get_or_compile(key, compile_fn, target, lock_timeout=4 * config.compile_timeout,
                                                   strict=name if config.cache_strict else None)
        elif config.cache_strict:
            from neuron_compile.errors import CacheError
            raise CacheError(f"{name}: NEURON_CACHE_STRICT=1 forbids compiling, and the disk cache is off "
                             "(NEURON_CACHE=0): nothing can be loaded")
        else:
            exe = compile_without_disk(key, compile_fn)
        ok = True
    finally:
        if ok and not dumper.enabled and not config.keep_tmp:
            for w in workdirs:
                shutil.rmtree(w, ignore_errors=True)
        elif config.keep_tmp:
            for w in workdirs:
                log.warning("neuron-compile %s: work files kept in %s (NEURON_KEEP_TMP)", name, w)
        else:  # failed: keep what a reproduce command points at, drop directories left empty
            for w in workdirs:
                if w.is_dir() and not any(w.iterdir()):
                    w.rmdir()
    counters.add_seconds("total", time.perf_counter() - t0)
    exe.cache_key = key
    if as_program:  # compiled or loaded: each graph handed to us counts its host calls
        counters.bump("host_calls", exe.program.host_calls)
    return exe


def _warn_fallbacks(ops: list, kind: str) -> None:
    """One warning per graph listing the ops the eager fallback runs (``fallback="eager"``)."""
    import warnings
    counters.record_fallbacks(ops)
    listing = "\n".join(f"  {u.op} (node {u.node}) at {u.location}" for u in ops)
    warnings.warn(f"neuron-compile: {len(ops)} op(s) of a graph ({kind}) have no lowering rule and run in eager "
                  f"PyTorch (fallback='eager'):\n{listing}", RuntimeWarning, stacklevel=2)


def build_program(gm: torch.fx.GraphModule, host_nodes: list, config: Config, name: str, kind: str,
                  dumper: Dumper) -> Build:
    """A graph with host calls (a cache miss): ``gm`` cut at ``host_nodes`` into kernel segments and
    host calls (:func:`neuron_compile.segments.split_program`), each segment compiled by
    :func:`compile_graph` under its own cache key. The :class:`Build` carries no native code: its
    manifest holds the program and the segments' keys (loaded by
    :func:`~neuron_compile.executable.load_executable`)."""
    from neuron_compile.plan import CallPlan
    from neuron_compile.segments import split_program
    program, segments = split_program(gm, host_nodes)
    exes = [compile_graph(seg, config, f"{kind}_seg{i}") for i, seg in enumerate(segments)]
    log.info("neuron-compile %s: %d kernel segments, %d host calls", name, len(exes), program.host_calls)
    dumper.write("program", "json", json.dumps(program.to_json(), indent=1))
    build = Build(name, CallPlan([]), ops=len(host_nodes))  # the program checks its inputs' count
    build.program = {**program.to_json(), "segments": [e.cache_key.digest for e in exes]}
    build.segment_executables = exes
    return build
