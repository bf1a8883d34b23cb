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

from neuron_compile.toolchain import run_stage, tool


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


# MLIR lowers memref.copy between non-identity layouts to a call to `memrefCopy`, which upstream
# ships in libmlir_c_runner_utils.so (it drags in libMLIR and libLLVM: ~40 ms to load). Our kernels
# carry their own copy of that routine instead (same contract as mlir/lib/ExecutionEngine/
# CRunnerUtils.cpp), so a stored kernel.so loads alone, in well under a millisecond.
RUNTIME_C = r"""
#include <stdint.h>
#include <string.h>
typedef struct { int64_t rank; void *descriptor; } UnrankedMemRef;
__attribute__((visibility("hidden")))
void memrefCopy(int64_t elem, UnrankedMemRef *src, UnrankedMemRef *dst) {
  int64_t rank = src->rank;
  int64_t *s = (int64_t *)src->descriptor, *d = (int64_t *)dst->descriptor;
  char *sp = (char *)s[1], *dp = (char *)d[1];
  int64_t so = s[2], dof = d[2];
  int64_t *sizes = s + 3, *ss = s + 3 + rank, *ds = d + 3 + rank;
  if (rank == 0) { memcpy(dp + dof * elem, sp + so * elem, elem); return; }
  for (int64_t i = 0; i < rank; i++) if (sizes[i] == 0) return;
  int64_t idx[rank];
  memset(idx, 0, sizeof idx);
  for (;;) {
    memcpy(dp + dof * elem, sp + so * elem, elem);
    int64_t ax = rank - 1;
    for (; ax >= 0; ax--) {
      idx[ax]++; so += ss[ax]; dof += ds[ax];
      if (idx[ax] < sizes[ax]) break;
      so -= ss[ax] * sizes[ax]; dof -= ds[ax] * sizes[ax]; idx[ax] = 0;
    }
    if (ax < 0) return;
  }
}
"""


@functools.lru_cache(maxsize=1)
def _runtime_object() -> Path:
    """The kernel runtime (``memrefCopy``) compiled once per process."""
    import atexit
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="neuron-runtime-"))
    atexit.register(shutil.rmtree, d, True)
    src, obj = d / "runtime.c", d / "runtime.o"
    src.write_text(RUNTIME_C)
    run_stage("obj", [tool("cc"), "-O2", "-fPIC", "-c", str(src), "-o", str(obj)], src, 120)
    return obj


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

    def codegen(self, llvm_mlir: Path, workdir: Path, opt_level: int, timeout: float) -> Path:
        """LLVM-dialect MLIR → LLVM IR → optimised LLVM IR (``opt -O<n>``: loop vectorizer, LICM, ...)
        → object (``llc``) → shared object (``cc -shared``)."""
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
        run_stage("obj", [tool("cc"), "-shared", "-Wl,-z,defs", "-o", str(so), str(obj), str(_runtime_object()),
                          "-lm"], obj, timeout)
        return so
