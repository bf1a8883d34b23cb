"""Process-wide counters of what the compiler and cache did (``neuron_compile.metrics()``).

``metrics()`` returns a snapshot; every counter is mirrored into Dynamo's
``torch._dynamo.utils.counters["neuron"]`` so it shows in Dynamo's own reports.
"""
from __future__ import annotations

import threading
from collections import Counter, defaultdict
from typing import Any

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_seconds: defaultdict[str, float] = defaultdict(float)
_fallbacks: list[Any] = []

COUNTERS = ("graphs", "graphs_compiled", "aten_ops", "kernels", "memory_hits", "disk_hits", "misses", "quarantined", "evictions",
            "cache_write_failures", "host_calls",
            "fallback_ops")


def bump(name: str, n: int = 1) -> None:
    """Add ``n`` to counter ``name`` (here and in Dynamo's counters)."""
    import torch
    with _lock:
        _counts[name] += n
    torch._dynamo.utils.counters["neuron"][name] += n


def add_seconds(phase: str, seconds: float) -> None:
    with _lock:
        _seconds[phase] += seconds


def metrics() -> dict[str, Any]:
    """Counters (graphs: handed to the backend; graphs_compiled: actually compiled; aten_ops and
    kernels: ATen ops in and loop-nest kernels out of the graphs compiled; memory_hits, disk_hits, misses, quarantined, evictions,
    cache_write_failures; host_calls: ATen calls compiled into programs between kernel segments,
    see :mod:`neuron_compile.segments`; fallback_ops: ops with no lowering rule run on the host under
    ``fallback="eager"``) and ``seconds``: wall-clock seconds per compile phase, since the last
    :func:`reset_metrics`."""
    with _lock:
        out: dict[str, Any] = {name: _counts.get(name, 0) for name in COUNTERS}
        out["seconds"] = dict(_seconds)
    return out


def record_fallbacks(ops: list[Any]) -> None:
    """Remember ops run by the eager fallback (:class:`~neuron_compile.errors.UnsupportedOp`)."""
    with _lock:
        _fallbacks.extend(ops)
    bump("fallback_ops", len(ops))


def get_fallback_ops() -> list[Any]:
    """Every op run as a host call by ``fallback="eager"`` since the last :func:`reset_metrics`:
    :class:`~neuron_compile.errors.UnsupportedOp` entries (ATen op, FX node, the user's
    ``file:line``), one per node per compiled graph."""
    with _lock:
        return list(_fallbacks)


def reset_metrics() -> None:
    """Zero every counter and timer (Dynamo's ``counters['neuron']`` too)."""
    import torch
    with _lock:
        _counts.clear()
        _seconds.clear()
        _fallbacks.clear()
    torch._dynamo.utils.counters["neuron"].clear()
