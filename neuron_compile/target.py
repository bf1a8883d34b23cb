"""Compilation targets.

A :class:`Target` names what the executable runs on and owns the last phase (``obj``): how the
LLVM-dialect module becomes loadable native code. Today there is one: :class:`HostCPU` (LLVM →
object → shared library, run through ``ctypes`` on the machine that compiled it). A Trainium target
would lower the ``linalg`` phase to StableHLO for ``neuronx-cc`` instead; it does not exist yet and
nothing here pretends it does.
"""
from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from neuron_compile.toolchain import run_stage, tool


@functools.lru_cache(maxsize=1)
def _host_cpu() -> tuple[str, str]:
    out = subprocess.run([tool("llc"), "--version"], capture_output=True, text=True, check=True).stdout
    triple = re.search(r"Default target: (\S+)", out)
    cpu = re.search(r"Host CPU: (\S+)", out)
    return (triple.group(1) if triple else "unknown"), (cpu.group(1) if cpu else "generic")


@dataclass(frozen=True)
class HostCPU:
    """The host CPU through LLVM. ``triple`` and ``cpu`` are what ``llc`` detects (e.g. znver4)."""

    triple: str
    cpu: str
    name: str = "host-cpu"

    @staticmethod
    def detect() -> "HostCPU":
        triple, cpu = _host_cpu()
        return HostCPU(triple, cpu)

    def key(self) -> str:
        """The target's part of a cache key."""
        return f"{self.name}:{self.triple}:{self.cpu}"

    def codegen(self, llvm_mlir: Path, workdir: Path, opt_level: int, timeout: float) -> Path:
        """LLVM-dialect MLIR → LLVM IR → object (``llc``) → shared object (``cc -shared``)."""
        ll, obj, so = workdir / "kernel.ll", workdir / "kernel.o", workdir / "kernel.so"
        run_stage("obj", [tool("mlir-translate"), "--mlir-to-llvmir", str(llvm_mlir), "-o", str(ll)],
                  llvm_mlir, timeout)
        run_stage("obj", [tool("llc"), f"-O{opt_level}", f"-mcpu={self.cpu}", f"-mtriple={self.triple}",
                          "--relocation-model=pic", "-filetype=obj", str(ll), "-o", str(obj)], ll, timeout)
        run_stage("obj", [tool("cc"), "-shared", "-o", str(so), str(obj), "-lm"], obj, timeout)
        return so
