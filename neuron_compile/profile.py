"""Per-kernel profile: ``NEURON_PROFILE=1`` (or ``options={"profile": True}``).

A profiled graph is compiled with a call to ``neuron_profile_tick(k)`` after each kernel ``k``
(``lowering/emit.py``); the tick, part of the kernel library's own runtime (``target.py``), adds
the wall time since the previous tick to slot ``k``; a tick before the kernel's root op closes
slot ``GLUE_SLOT + k``, the glue between it and the previous kernel (untagged inits and fills,
bufferization copies, allocation: serial code, a ``(glue)`` row ``<k``), and the last slot holds
what follows the last kernel (output copies). Like Inductor's profiler output it is a table per
graph: kernel id, kind, schedule, the ATen ops it fused, calls, time, share and achieved GFLOP/s
(matmuls) or GB/s (everything else; each operand read or written once), and a flag on the rows
to look at first (:func:`flag`: a ``loops`` kernel with a large share, a rate under 1 GB/s). The
tables print to stderr at exit and are returned by :func:`report`; :func:`seconds_by_schedule`
sums them per schedule (``python -m benchmarks`` reports each workload's share in ``loops``).
"""
from __future__ import annotations

import atexit
import ctypes
import sys
import threading
import weakref
from typing import Any

from neuron_compile.lowering.context import GLUE_SLOT

_SLOTS = 1 << 16  # must match PROFILE_C
_lock = threading.Lock()
_profiled: "weakref.WeakSet[Any]" = weakref.WeakSet()


class _Data(ctypes.Structure):
    _fields_ = [("seconds", ctypes.c_double * _SLOTS), ("calls", ctypes.c_int64 * _SLOTS), ("last", ctypes.c_double)]


class KernelProfile:
    """The counters inside one profiled kernel library."""

    def __init__(self, data: _Data):
        self._data = data

    def reset(self) -> None:
        ctypes.memset(ctypes.addressof(self._data), 0, ctypes.sizeof(_Data))

    def slot(self, k: int) -> tuple[int, float]:
        """(calls, total seconds) of slot ``k``."""
        return self._data.calls[k], self._data.seconds[k]


def attach(exe: Any, library: Any) -> KernelProfile | None:
    """The profile counters of ``exe``'s library, or ``None`` if it was not compiled to profile."""
    fn = getattr(library, "neuron_profile_data", None) if isinstance(library, ctypes.CDLL) else None
    if fn is None:
        return None
    fn.restype = ctypes.POINTER(_Data)
    prof = KernelProfile(fn().contents)
    with _lock:
        _profiled.add(exe)
    return prof


def rows(exe: Any) -> list[dict[str, Any]]:
    """One row per kernel of ``exe`` (plus the time after its last kernel), from its counters."""
    prof: KernelProfile | None = exe.profile
    if prof is None:
        return []
    out = []
    total = sum(prof.slot(k)[1] + (prof.slot(GLUE_SLOT + k)[1] if k < len(exe.kernels) else 0.0)
                for k in range(len(exe.kernels) + 1)) or 1e-30
    holder = {}   # fused-rows chains run as one loop nest: its time lands in one member's slot
    for info in exe.kernels:
        group = info["schedule"]["params"].get("group") if info["schedule"]["strategy"] == "fused-rows" else None
        for kid in group or ():
            holder[kid] = max(group, key=lambda g: prof.slot(g)[1])
    for k in range(len(exe.kernels) + 1):
        glue_calls, glue = prof.slot(GLUE_SLOT + k) if k < len(exe.kernels) else (0, 0.0)
        if glue_calls:
            out.append({"kernel": f"<{k}", "kind": "(glue)", "schedule": "(serial)", "ops": [], "ranges": "",
                        "calls": glue_calls, "seconds": glue, "share": glue / total, "rate": ""})
        calls, secs = prof.slot(k)
        info = exe.kernels[k] if k < len(exe.kernels) else None
        row = {"kernel": k if info else "-", "kind": info["kind"] if info else "(after)",
               "schedule": info["schedule"]["strategy"] if info else "", "ops": info["ops"] if info else [],
               "ranges": "x".join(map(str, info["ranges"])) if info else "",
               "calls": calls, "seconds": secs, "share": secs / total, "rate": ""}
        if k in holder and holder[k] != k:
            row["rate"] = f"(in kernel {holder[k]})"
        elif info and calls and secs > 0:
            from neuron_compile.codegen.kernels import KernelInfo
            ki = KernelInfo.from_json(info)
            if ki.flops:
                row["rate"] = f"{ki.flops * calls / secs / 1e9:.1f} GFLOP/s"
            else:
                row["rate"] = f"{ki.bytes_moved * calls / secs / 1e9:.2f} GB/s"
        out.append(row)
    return out


SLOW_GBPS = 1.0          # a kernel moving less than this per second is flagged (issue 41: "no silent cliffs")
UNSCHEDULED = ("loops", "loops-forall")   # plain loops (LLVM's own vectorizer), on one thread or the pool
FLAG_SHARE = 0.05        # ... as is a ``loops`` kernel taking at least this share of its graph
GLUE_SHOWN = 0.005       # a glue row under this share of its graph is summed into one row of the table


def flag(row: dict[str, Any]) -> str:
    """Why a profile row deserves a look, or ``""``: a ``loops`` kernel (no schedule: LLVM's own
    vectorizer over plain loops) or the serial glue before a kernel with at least
    :data:`FLAG_SHARE` of its graph's time, or a kernel under :data:`SLOW_GBPS` (bytes read and written once each) that takes at least 0.1 ms a call."""
    if row["kernel"] == "-" or not row["calls"]:
        return ""
    if row["kind"] == "(glue)":
        return "glue" if row["share"] >= FLAG_SHARE else ""
    if row["schedule"] in UNSCHEDULED and row["share"] >= FLAG_SHARE:
        return "loops"
    per_call = row["seconds"] / row["calls"]
    if row["rate"].endswith("GB/s") and float(row["rate"].split()[0]) < SLOW_GBPS and per_call >= 1e-4:
        return "slow"
    return ""


def seconds_by_schedule() -> dict[str, float]:
    """Kernel seconds per schedule (``loops``, ``matmul``, ...) summed over every profiled
    executable alive in this process since the last :func:`reset`; the time after each graph's
    last kernel is under ``""``. A benchmark's share of unscheduled time is the :data:`UNSCHEDULED`
    schedules' seconds over the sum."""
    with _lock:
        exes = list(_profiled)
    out: dict[str, float] = {}
    for e in exes:
        for r in rows(e):
            out[r["schedule"]] = out.get(r["schedule"], 0.0) + r["seconds"]
    return out


def table(exe: Any) -> str:
    """The profile of one executable as a text table, slowest kernels first; the glue rows under
    :data:`GLUE_SHOWN` of the graph's time are summed into one ``<*`` row (a CNN has one before
    almost every kernel, most of them microseconds: they buried the rows that matter)."""
    rs = rows(exe)
    small = [r for r in rs if r["kind"] == "(glue)" and r["share"] < GLUE_SHOWN]
    if len(small) > 1:
        rs = [r for r in rs if not (r["kind"] == "(glue)" and r["share"] < GLUE_SHOWN)]
        rs.append({"kernel": "<*", "kind": "(glue)", "schedule": f"({len(small)} under {GLUE_SHOWN:.1%})",
                   "ops": [], "ranges": "", "calls": max(r["calls"] for r in small),
                   "seconds": sum(r["seconds"] for r in small), "share": sum(r["share"] for r in small),
                   "rate": ""})
    rs = sorted(rs, key=lambda r: -r["seconds"])
    calls = max((r["calls"] for r in rs), default=0)
    head = f"neuron-compile profile: {exe.name} ({calls} call{'s' if calls != 1 else ''})"
    lines = [head, f"{'kernel':>6} {'kind':<10} {'schedule':<16} {'loops':<16} {'ms/call':>9} {'share':>6} "
                   f"{'rate':>16} {'flag':<5}  ATen ops"]
    for r in rs:
        per = r["seconds"] / r["calls"] * 1e3 if r["calls"] else 0.0
        ops = ", ".join(o.removeprefix("aten.") for o in r["ops"])
        lines.append(f"{r['kernel']!s:>6} {r['kind']:<10.10} {r['schedule']:<16.16} {r['ranges']:<16.16} {per:>9.3f} "
                     f"{r['share']:>6.1%} "
                     f"{r['rate']:>16} {flag(r):<5}  {ops[:100]}")
    return "\n".join(lines)


def report() -> str:
    """Tables of every profiled executable still alive in this process."""
    with _lock:
        exes = sorted(_profiled, key=lambda e: e.name)
    return "\n\n".join(table(e) for e in exes if e.profile is not None and any(r["calls"] for r in rows(e)))


def reset() -> None:
    """Zero the counters of every profiled executable."""
    with _lock:
        exes = list(_profiled)
    for e in exes:
        e.profile.reset()


@atexit.register
def _print_at_exit() -> None:
    text = report()
    if text:
        print(text, file=sys.stderr)


PROFILE_C = r"""
#include <stdint.h>
#include <time.h>
#define SLOTS (1 << 16)
static struct { double seconds[SLOTS]; int64_t calls[SLOTS]; double last; } prof;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
__attribute__((visibility("hidden"))) void neuron_profile_tick(int64_t k) {
  double t = now();
  if (k >= 0 && k < SLOTS) { prof.seconds[k] += t - prof.last; prof.calls[k] += 1; }
  prof.last = t;
}
void *neuron_profile_data(void) { return &prof; }
"""
