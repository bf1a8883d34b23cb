"""The neuron executable: a versioned, self-describing directory per compiled graph.

```
manifest.json      format version, cache key and its named parts, calling plan (input/output
                   specs, aliasing), entry symbol, target, versions, compile times, sha256 of payloads
kernel.so          native code for the target (loads with dlopen; no MLIR needed)
kernel.llvm.mlir   the final LLVM-dialect module (re-JIT with MLIR's ExecutionEngine)
```
Nothing is pickled: artifacts may be shared between users and hosts. Loading verifies every
payload's sha256 before any native code is mapped.
"""
from __future__ import annotations

import atexit
import ctypes
import datetime
import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_compile.cache_key import EXECUTABLE_FORMAT, CacheKey, mlir_version
from neuron_compile.errors import ExecutableError
from neuron_compile.plan import CallPlan
from neuron_compile.runtime import KERNEL_SYMBOL, Executable, load_shared_object

MANIFEST = "manifest.json"
NATIVE = "kernel.so"
LLVM_MLIR = "kernel.llvm.mlir"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Build:
    """What a fresh compile produced, before it is written as an executable.

    ``payloads`` maps payload names (:data:`NATIVE`, :data:`LLVM_MLIR`) to files in a work dir.
    """

    name: str
    plan: CallPlan
    payloads: dict[str, Path] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    ops: int = 0
    kernels: list[dict[str, Any]] = field(default_factory=list)  # KernelInfo JSON + its schedule
    # a graph with host calls: the program (neuron_compile.segments.Program JSON plus "segments",
    # the cache keys of its kernel segments) and, fresh from the compile, their executables
    program: dict[str, Any] | None = None
    segment_executables: list[Any] = field(default_factory=list)


def write_executable(directory: Path, build: Build, key: CacheKey | None, target: Any) -> None:
    """Write ``build`` into (new, empty) ``directory``: payloads first, the manifest last.

    A reader treats a directory without a complete manifest as absent, so a crash mid-write never
    yields a loadable executable.
    """
    import torch

    import neuron_compile
    directory.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for name, src in build.payloads.items():
        shutil.copyfile(src, directory / name)
        hashes[name] = sha256_file(directory / name)
    manifest = {
        "format": EXECUTABLE_FORMAT,
        "kind": "neuron-compile executable",
        "name": build.name,
        "cache_key": key.digest if key else None,
        "key_parts": key.part_hashes() if key else {},
        "plan": build.plan.to_json(),
        "entry_symbol": f"_mlir_ciface_{KERNEL_SYMBOL}" if NATIVE in build.payloads else None,
        "target": {"name": target.name, "triple": target.triple, "cpu": target.cpu,
                   "cpu_features_sha256": target.features},
        "versions": {"torch": torch.__version__, "mlir": mlir_version(),
                     "neuron_compile": neuron_compile.__version__},
        "compile_seconds": build.seconds,
        "ops": build.ops,
        "kernels": build.kernels,
        "program": build.program,
        "payloads": hashes,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    tmp = directory / (MANIFEST + ".partial")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
    tmp.rename(directory / MANIFEST)


def read_manifest(directory: Path) -> dict[str, Any]:
    """Parse and sanity-check ``manifest.json``; raises :class:`ExecutableError`."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ExecutableError(f"{directory} is not a neuron executable (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise ExecutableError(f"{path} is unreadable or not JSON: {exc}") from None
    if manifest.get("kind") != "neuron-compile executable":
        raise ExecutableError(f"{path} is not a neuron-compile manifest")
    if manifest.get("format") != EXECUTABLE_FORMAT:
        raise ExecutableError(f"{path} has format {manifest.get('format')}, this neuron-compile reads "
                              f"format {EXECUTABLE_FORMAT}; recompile it")
    return manifest


def verify_payloads(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Problems with the payloads (missing, or sha256 mismatch); empty when intact."""
    problems = []
    for name, digest in manifest.get("payloads", {}).items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            problems.append(f"payload name {name!r} is not a plain file name")
            continue
        p = Path(directory) / name
        if not p.is_file():
            problems.append(f"{name} is missing")
        elif sha256_file(p) != digest:
            problems.append(f"{name} does not match its sha256 in the manifest")
    return problems


def load_executable(path: str | Path, mode: str = "native", expect_key: str | None = None) -> Executable:
    """Load a stored executable as a callable ``exe(list_of_tensors) -> list``.

    Args:
        path: the executable's directory.
        mode: ``native`` (dlopen ``kernel.so``; ~0.2 ms) or ``jit`` (re-JIT ``kernel.llvm.mlir`` with
            MLIR's ExecutionEngine in this process; 100s of ms, needs no linker).
        expect_key: the cache key the entry must carry (the cache passes its directory's key, so an
            entry moved to another key's place is refused).
    Raises:
        ExecutableError: missing/corrupt payloads (sha256 checked first), another format version, or
            native code built for another CPU than this host's.
    """
    directory = Path(path)
    manifest = read_manifest(directory)
    if expect_key is not None and manifest.get("cache_key") != expect_key:
        raise ExecutableError(f"executable {directory} carries cache key {manifest.get('cache_key')}, "
                              f"not the key {expect_key} it is stored under")
    problems = verify_payloads(directory, manifest)
    if problems:
        raise ExecutableError(f"executable {directory} is corrupt: {'; '.join(problems)}")
    plan = CallPlan.from_json(manifest["plan"])
    name = manifest.get("name", directory.name)
    if manifest.get("program"):
        return _load_program(directory, manifest, mode)
    if manifest.get("entry_symbol") is None:
        return Executable(plan, None, name, kernels=manifest.get("kernels", []))
    from neuron_compile.target import HostCPU
    host = HostCPU.detect()
    tgt = manifest["target"]
    if (tgt["triple"], tgt["cpu"], tgt["cpu_features_sha256"]) != (host.triple, host.cpu, host.features):
        raise ExecutableError(f"executable {directory} was built for {tgt['triple']} / {tgt['cpu']} (features "
                              f"{tgt['cpu_features_sha256']}), this host is {host.triple} / {host.cpu} (features "
                              f"{host.features}); its native code may not run here: recompile it")
    if mode == "native":
        fn, lib = _load_private_copy(directory / NATIVE, manifest["payloads"][NATIVE])
        return Executable(plan, fn, name, keepalive=lib, kernels=manifest.get("kernels", []))
    if mode == "jit":
        fn, engine = _jit(directory / LLVM_MLIR, plan)
        return Executable(plan, fn, name, keepalive=engine, kernels=manifest.get("kernels", []))
    raise ValueError(f"mode must be 'native' or 'jit', got {mode!r}")


def _load_program(directory: Path, manifest: dict[str, Any], mode: str):
    """A graph with host calls: its kernel segments are the cache entries named in the program,
    stored beside this one (``<cache>/<xx>/<digest>``)."""
    from neuron_compile.segments import Program, SegmentedExecutable
    program = Program.from_json(manifest["program"])
    base = directory.parent.parent
    segments = []
    for digest in manifest["program"]["segments"]:
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise ExecutableError(f"executable {directory} names a kernel segment {str(digest)[:20]!r} that is not "
                                  "a cache key; recompile it")
        seg = base / digest[:2] / digest
        if not (seg / MANIFEST).is_file():
            raise ExecutableError(f"executable {directory} runs kernel segment {digest}, which is not in "
                                  f"{base}; recompile it")
        segments.append(load_executable(seg, mode, expect_key=digest))
        try:
            os.utime(seg / MANIFEST)  # used with the program: least-recently-used eviction keeps them together
        except OSError:
            pass
    return SegmentedExecutable(manifest.get("name", directory.name), program, segments)


@functools.lru_cache(maxsize=1)
def _private_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="neuron-loaded-"))
    atexit.register(shutil.rmtree, d, True)
    return d


def _load_private_copy(path: Path, digest: str):
    """dlopen a private, verified copy of ``path``.

    The bytes we hash are the bytes we map (no window in which the shared file could be swapped),
    each load gets a fresh path (the dynamic loader would otherwise hand back an older library
    loaded from the same path), and later writes to the cache file cannot reach the mapped code.
    """
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise ExecutableError(f"{path} does not match its sha256 in the manifest")
    fd, private = tempfile.mkstemp(suffix=".so", dir=_private_dir())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return load_shared_object(Path(private))
    finally:
        os.unlink(private)


def _jit(llvm_mlir: Path, plan: CallPlan):
    """Re-JIT the stored LLVM-dialect module (runs LLVM in this process: the module was already
    compiled once by the crash-isolated pipeline, so it is known-good)."""
    from mlir.execution_engine import ExecutionEngine
    from mlir.ir import Context, Module

    from neuron_compile.kernel_runtime import runtime_shared_library
    with Context():
        module = Module.parse(llvm_mlir.read_text())
        # the kernel runtime (memrefCopy, OpenMP entry points, allocation) as a shared library
        engine = ExecutionEngine(module, opt_level=3, shared_libs=[str(runtime_shared_library())])
    # raw_lookup returns the engine's *packed* wrapper `void(void **args)`: args[i] points at the
    # i-th argument, here itself a pointer to a memref descriptor.
    packed = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup(f"_mlir_ciface_{KERNEL_SYMBOL}"))
    nargs = len(plan.input_specs) + len(plan.host_specs) + len(plan.output_specs)
    word = ctypes.sizeof(ctypes.c_void_p)

    def fn(*descriptors) -> None:
        values = (ctypes.c_void_p * nargs)(*[ctypes.addressof(d._obj) for d in descriptors])
        slots = (ctypes.c_void_p * nargs)(*[ctypes.addressof(values) + i * word for i in range(nargs)])
        packed(slots)
    return fn, engine
