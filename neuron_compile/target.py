"""Compilation targets.

A :class:`Target` names what the executable runs on and owns the last phase (``obj``): how the
LLVM-dialect module becomes loadable native code. Today there is one: :class:`HostCPU` (LLVM →
object → shared library, run through ``ctypes`` on the machine that compiled it). A Trainium target
would lower the ``linalg`` phase to StableHLO for ``neuronx-cc`` instead; it does not exist yet and
nothing here pretends it does.
"""
from __future__ import annotations

import functools
import hashlib
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from neuron_compile.kernel_runtime import runtime_object
from neuron_compile.toolchain import run_stage, tool


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        f = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return frozenset()
    return frozenset(f.group(1).split()) if f else frozenset()


def isa_of(flags: frozenset[str]) -> str:
    """``avx512`` (AVX-512 F+VL), ``avx2`` (AVX2+FMA) or ``sse`` (baseline x86-64), from CPU flags."""
    if {"avx512f", "avx512vl"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "sse"


@functools.lru_cache(maxsize=1)
def _cpu_identity() -> tuple[str, str]:
    """(model name, sha256 of the sorted CPU feature flags) from ``/proc/cpuinfo``; no subprocess."""
    model, flags = platform.processor() or "unknown", ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        f = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
        model = m.group(1).strip() if m else model
        flags = " ".join(sorted(f.group(1).split())) if f else ""
    except OSError:
        pass
    return model, hashlib.sha256(flags.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def llc_host_cpu() -> str:
    """The CPU name LLVM detects for this host (e.g. ``znver4``), for ``llc -mcpu``."""
    out = subprocess.run([tool("llc"), "--version"], capture_output=True, text=True, check=True).stdout
    cpu = re.search(r"Host CPU: (\S+)", out)
    return cpu.group(1) if cpu else "generic"


@dataclass(frozen=True)
class HostCPU:
    """The host CPU through LLVM.

    Attributes:
        triple: LLVM target triple (``x86_64-unknown-linux-gnu``).
        cpu: the CPU model name; ``features``: hash of its feature flags. Code is generated for
            exactly this CPU (``llc -mcpu=<host>``), so both are part of the cache key and checked on load.
    """

    triple: str
    cpu: str
    features: str
    name: str = "host-cpu"

    @staticmethod
    def detect() -> "HostCPU":
        model, features = _cpu_identity()
        return HostCPU(f"{platform.machine()}-unknown-{platform.system().lower()}-gnu", model, features)

    def key(self) -> str:
        """The target's part of a cache key."""
        return f"{self.name}:{self.triple}:{self.cpu}:{self.features}"

    def info(self) -> "TargetInfo":
        """What schedule selection knows of this CPU (:class:`~neuron_compile.codegen.TargetInfo`)."""
        from neuron_compile.codegen.strategy import TargetInfo
        isa = isa_of(_cpu_flags())
        bits = {"avx512": 512, "avx2": 256}.get(isa, 128)
        return TargetInfo(isa, bits, 32 if isa == "avx512" else 16)

    def codegen(self, llvm_mlir: Path, workdir: Path, opt_level: int, timeout: float, profile: bool = False) -> Path:
        """LLVM-dialect MLIR → LLVM IR → optimised LLVM IR (``opt -O<n>``: loop vectorizer, LICM, ...)
        → object (``llc``) → shared object (``cc -shared``), with the kernel runtime (and, for
        ``profile``, the profile counters) linked in."""
        ll, opt_ll = workdir / "kernel.ll", workdir / "kernel.opt.ll"
        obj, so = workdir / "kernel.o", workdir / "kernel.so"
        cpu = [f"-mcpu={llc_host_cpu()}", f"-mtriple={self.triple}"]
        run_stage("obj", [tool("mlir-translate"), "--mlir-to-llvmir", str(llvm_mlir), "-o", str(ll)],
                  llvm_mlir, timeout)
        run_stage("obj", [tool("opt"), f"-O{opt_level}", *cpu, "-S", str(ll), "-o", str(opt_ll)], ll, timeout)
        run_stage("obj", [tool("llc"), f"-O{opt_level}", *cpu, "--relocation-model=pic", "-filetype=obj",
                          str(opt_ll), "-o", str(obj)], opt_ll, timeout)
        # -z defs: a symbol nothing provides (a compiler-rt helper LLVM chose to call) fails here,
        # as a PipelineError with a reproduce command, not later in dlopen inside the user's process
        runtime = [str(runtime_object("runtime"))] + ([str(runtime_object("profile"))] if profile else [])
        run_stage("obj", [tool("cc"), "-shared", "-Wl,-z,defs", "-o", str(so), str(obj), *runtime, "-lm"], obj, timeout)
        return so
