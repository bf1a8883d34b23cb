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
import os
import platform
import re
import resource
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
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


@functools.lru_cache(maxsize=None)
def _cache(index: int, field: str, default: int) -> int:
    """A field of cpu0's cache ``index`` from sysfs (``index0`` the L1 data cache, ``index2`` the
    unified L2): ``size`` in bytes (``48K`` → 49152), ``ways_of_associativity``; ``default`` if unknown."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/{field}").read_text().strip()
        return int(text[:-1]) << {"K": 10, "M": 20}[text[-1]] if text[-1] in "KM" else int(text)
    except (OSError, ValueError, KeyError):
        return default


DEFAULT_THREAD_STACK = 2 << 20   # glibc's x86-64 thread stack when RLIMIT_STACK is unlimited


def omp_stack_bytes(text: str) -> int | None:
    """An ``OMP_STACKSIZE`` value in bytes, as libgomp reads it (OpenMP 5.2 §21.2.2: a number with an
    optional ``B``, ``K``, ``M`` or ``G`` suffix, kilobytes when none; libgomp's ``strtoul`` also
    takes a leading ``+``); ``None`` if malformed."""
    m = re.fullmatch(r"\s*\+?(\d+)\s*([bkmgBKMG]?)\s*", text)
    if m is None:
        return None
    return int(m.group(1)) << {"b": 0, "k": 10, "": 10, "m": 20, "g": 30}[m.group(2).lower()]


def thread_stack_bytes() -> int:
    """The smallest stack a kernel's parallel loop body may run on: the main thread's
    (``RLIMIT_STACK``), OpenMP workers' (``OMP_STACKSIZE`` or ``GOMP_STACKSIZE`` if set, else the
    thread default, which glibc takes from ``RLIMIT_STACK``) and Python threads' when the process
    set one (``threading.stack_size``; a thread that calls the kernel at one thread runs its loop
    body itself). Read at compile time: a smaller stack set later is not seen."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    main = soft if soft != resource.RLIM_INFINITY and soft > 0 else DEFAULT_THREAD_STACK
    sizes = [main]
    py = threading.stack_size()   # (it also resets the setting to the default: put it back)
    if py:
        threading.stack_size(py)
        sizes.append(py)
    for var in ("OMP_STACKSIZE", "GOMP_STACKSIZE"):
        n = omp_stack_bytes(os.environ[var]) if var in os.environ else None
        if n:
            sizes.append(n)
    return min(sizes)


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


SPLIT_MIN_BYTES = 256 << 10  # LLVM IR text below this compiles as one module


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
        """The target's part of a cache key: the CPU and what schedule selection knows of it (cache
        sizes differ between machines, VMs above all, with the same CPU model and flags)."""
        info = ",".join(f"{k}={v}" for k, v in sorted(self.info().to_json().items()))
        return f"{self.name}:{self.triple}:{self.cpu}:{self.features}:{info}"

    def info(self) -> "TargetInfo":
        """What schedule selection knows of this CPU (:class:`~neuron_compile.codegen.TargetInfo`)."""
        from neuron_compile.codegen.strategy import TargetInfo
        flags = _cpu_flags()
        isa = isa_of(flags)
        bits = {"avx512": 512, "avx2": 256}.get(isa, 128)
        return TargetInfo(isa, bits, 32 if isa == "avx512" else 16, _cache(2, "size", 512 << 10),
                          _cache(0, "size", 32 << 10), _cache(0, "ways_of_associativity", 8),
                          _cache(3, "size", 0), "sse4a" in flags, thread_stack_bytes())

    def codegen(self, llvm_mlir: Path, workdir: Path, opt_level: int, timeout: float, profile: bool = False,
                entry_c: str | None = None, jobs: int = 1) -> Path:
        """LLVM-dialect MLIR → LLVM IR → optimised LLVM IR (``opt -O<n>``: loop vectorizer, LICM, ...)
        → object (``llc``) → shared object (``cc -shared``), with the kernel runtime (and, for
        ``profile``, the profile counters) linked in; ``entry_c`` is the graph's packed entry point
        (:func:`~neuron_compile.kernel_runtime.entry_source`), compiled into the same library;
        ``jobs`` parallel ``opt``/``llc`` processes (:meth:`_objects`).

        Raises:
            PipelineError: a stage failed, crashed or timed out (with a command reproducing it).
        """
        ll, so = workdir / "kernel.ll", workdir / "kernel.so"
        run_stage("obj", [tool("mlir-translate"), "--mlir-to-llvmir", str(llvm_mlir), "-o", str(ll)],
                  llvm_mlir, timeout)
        runtime = [str(runtime_object("runtime"))] + ([str(runtime_object("profile"))] if profile else [])
        with ThreadPoolExecutor(1) as side:  # the entry point compiles while opt/llc run
            if entry_c is not None:
                entry = workdir / "entry.c"
                entry.write_text(entry_c)
                # -O0: the entry only fills one descriptor per memref and calls the kernel once. GCC 12
                # at -O2 took 1.7 s alone (4 s beside opt/llc) on MobileNetV2's forward (267
                # memrefs), -O0 0.07 s; a call costs 0.7 µs against 0.6 µs at -O2 (Zen 4)
                entry_built = side.submit(run_stage, "obj", [tool("cc"), "-O0", "-fPIC", "-c", str(entry), "-o",
                                                             str(workdir / "entry.o")], entry, timeout)
                runtime.append(str(workdir / "entry.o"))
            objects = self._objects(ll, workdir, opt_level, timeout, jobs)
            if entry_c is not None:
                entry_built.result()
        # -z defs: a symbol nothing provides (a compiler-rt helper LLVM chose to call) fails here,
        # as a PipelineError with a reproduce command, not later in dlopen inside the user's process
        run_stage("obj", [tool("cc"), "-shared", "-Wl,-z,defs", "-o", str(so), *map(str, objects), *runtime, "-lm"],
                  objects[0], timeout)
        return so

    def _objects(self, ll: Path, workdir: Path, opt_level: int, timeout: float, jobs: int) -> list[Path]:
        """``opt`` + ``llc`` on ``ll``, split into one module per core (``llvm-split``, functions
        dealt round-robin; the kernel function and OpenMP's outlined bodies are separate functions)
        and compiled in parallel processes. One module took 24 s for GPT-2-2L's backward graph on
        2 cores, with one idle (``opt`` and ``llc`` are single-threaded)."""
        cpu = [f"-mcpu={llc_host_cpu()}", f"-mtriple={self.triple}"]
        n_functions = len(re.findall(r"^define ", ll.read_text(), re.MULTILINE))
        # more parts than processes: the graph's function (every kernel not run by threads) is
        # the largest, so the others share the remaining processes (measured 7.1 s + 2.7 s with
        # two halves against 4.9 s wall with eight parts on two processes). A small module stays
        # whole: each part costs two process starts (~40 ms) and the split itself.
        big = ll.stat().st_size >= SPLIT_MIN_BYTES
        if big:
            ll = _extract_loops(ll, workdir, timeout)
            n_functions = len(re.findall(r"^define ", ll.read_text(), re.MULTILINE))
        parts = max(1, min(4 * jobs if jobs > 1 and big else 1, n_functions))
        if parts > 1:
            run_stage("obj", [tool("llvm-split"), f"-j{parts}", "--round-robin", str(ll), "-o",
                              str(workdir / "part.bc")], ll, timeout)
            inputs = [(workdir / f"part.bc{i}", f"part{i}") for i in range(parts)]
        else:
            inputs = [(ll, "kernel")]

        def build(src_base: tuple[Path, str]) -> Path:
            src, base = src_base
            opt_bc, obj = workdir / f"{base}.opt.bc", workdir / f"{base}.o"
            run_stage("obj", [tool("opt"), f"-O{opt_level}", *cpu, str(src), "-o", str(opt_bc)], src, timeout)
            run_stage("obj", [tool("llc"), f"-O{opt_level}", *cpu, "--relocation-model=pic", "-filetype=obj",
                              str(opt_bc), "-o", str(obj)], opt_bc, timeout)
            return obj
        if len(inputs) == 1:
            return [build(inputs[0])]
        with ThreadPoolExecutor(jobs) as pool:
            return list(pool.map(build, inputs))


def _extract_loops(ll: Path, workdir: Path, timeout: float) -> Path:
    """Every top-level loop of the module's functions into a function of its own (LLVM's
    ``loop-extract``), kept out of line (``noinline``, else ``-O3`` inlines them straight back).

    The graph's function holds every kernel not run by threads, one after another; ``opt -O3``'s
    IndVarSimplify asks ScalarEvolution whether each loop's entry is guarded
    (``isBasicBlockEntryGuardedByCond``), walking the dominator chain back to the function's entry:
    quadratic in the number of kernels (GPT-2-2L backward: 2.3 of 2.9 s of ``opt`` on that one
    function, 0.2 s once its loops are extracted; 12 layers took 10x the obj phase of 2). Extracted
    loops are also what ``llvm-split`` deals out to the parallel processes.

    Identical functions are then merged (LLVM's ``mergefunc``; the duplicates become calls of the
    one kept): the same kernel appears once per layer of a model, and its OpenMP body and extracted
    loops are byte-for-byte the same. GPT-2-2L's backward graph: 265 functions and 45k lines of
    IR to 169 and 23k, so ``opt``/``llc`` compile each distinct loop once.

    The graph's function is first inlined into its C wrapper (``always-inline``: it is internal
    and ``alwaysinline``, see :data:`neuron_compile.lowering.emit.GRAPH_FUNCTION_ATTRS`), so
    ``llvm-split`` cannot deal the two to different parts and leave the wrapper's call to it;
    the attribute is then removed (``forceattrs``) before the extracted loops inherit it, as they
    inherit their function's attributes, and conflict with the ``noinline`` they get below.
    """
    out = workdir / "kernel.extracted.ll"
    run_stage("obj", [tool("opt"), "-S", "-passes=always-inline,forceattrs,loop-extract,mergefunc",
                      "-force-remove-attribute=alwaysinline", str(ll), "-o", str(out)], ll, timeout)
    define = re.compile(r"^(define [^\n]*@([\w.$]+)\(.*?\))((?: #\d+)?) \{$", re.MULTILINE)
    before = {m.group(2) for m in define.finditer(ll.read_text())}

    def noinline(m: re.Match) -> str:  # the functions loop-extract made
        return m.group(0) if m.group(2) in before else f"{m.group(1)} noinline{m.group(3)} {{"
    out.write_text(define.sub(noinline, out.read_text()))
    return out
