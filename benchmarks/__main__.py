"""Eager vs Inductor vs neuron-compile, side by side in one process: ``python -m benchmarks``.

For each thread count (``torch.set_num_threads``) and workload, every backend gets its own copy of
the model; the first call (Dynamo + AOTAutograd + backend compile, empty caches) is reported as the
cold compile time; after warm-up the backends are timed in interleaved rounds and the median per
backend is reported. In each round a backend makes two calls and only the second is timed, so every
timed call follows a call of its own: steady state, as in a loop calling one model. A single timed
call would inherit the previous backend's cache: a kernel writing its output with normal stores
leaves those lines dirty, and whoever runs next pays for writing them back (our softmax over
4096×1024 float32, which then wrote its 16 MB with non-temporal stores, measured 0.72–0.80× eager as one
call right after eager's, 0.94–0.99× as the second of two; AMD Zen 5, 1 thread). The untimed call
takes the lines over only as far as it goes through the cache: a kernel whose stores skip it still
pays for part of the previous backend's write-backs (layer_norm 4096×1024 timed right after eager:
6–14 % slower than in a later position; ``benchmarks/HISTORY.md``); ours runs after Inductor,
whose stores are normal. Freed memory is
kept in the process for every backend alike (:func:`steady_malloc`). Ratios are ``best of (eager,
Inductor) / ours`` (> 1: we are faster); GEMMs also show GFLOP/s and ours as % of ``torch.mm`` (eager);
``loops`` is the share of our step's kernel time in kernels without a schedule (:func:`loops_share`).

    python -m benchmarks [--threads 1 2] [--only gemm softmax ...] [--skip-heavy] [--out DIR]
    python -m benchmarks --kinds [...]      # op kinds at model sizes instead (benchmarks/op_kinds.py)
    python -m benchmarks --vision [...]     # CNNs and their layer kinds instead (benchmarks/vision.py)

Writes ``DIR/benchmarks.json`` (every number) and ``DIR/benchmarks.png`` (ratio bars).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch._inductor.utils

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.op_kinds import kind_workloads  # noqa: E402
from benchmarks.vision import layer_workloads, model_workloads  # noqa: E402
from benchmarks.workloads import Workload, workloads  # noqa: E402

BACKENDS = ("eager", "inductor", "neuron")


def _step(fn: Callable, inputs: tuple, train: bool) -> Callable[[], None]:
    if train:
        def step():
            fn(*inputs).sum().backward()
    else:
        def step():
            with torch.no_grad():
                fn(*inputs)
    return step


def _compiled(backend: str, fn: Any) -> Any:
    if backend == "eager":
        return fn
    return torch.compile(fn, backend=backend, dynamic=False)


def measure(w: Workload, threads: int, min_rounds: int, budget_s: float) -> dict[str, Any]:
    """Cold first-call time and steady-state median of every backend on ``w`` at ``threads``."""
    torch.set_num_threads(threads)
    torch._dynamo.reset()
    # cold means cold for every thread count: a fresh artifact cache (Inductor's FX graph cache is off)
    from neuron_compile.cache import clear_memory_cache
    clear_memory_cache()
    os.environ["NEURON_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-neuron-cache-")
    fn, inputs = w.make()
    steps, cold, errors = {}, {}, {}
    for backend in BACKENDS:
        model = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
        args = tuple(t.detach().clone().requires_grad_(w.train and w.input_grad and t.is_floating_point())
                     for t in inputs)
        step = _step(_compiled(backend, model), args, w.train)
        # Inductor cold as well: an empty code cache on disk and in memory for each workload (its
        # C++ kernels otherwise come back compiled from an earlier workload or thread count)
        fresh = torch._inductor.utils.fresh_cache() if backend == "inductor" else contextlib.nullcontext()
        t0 = time.perf_counter()
        try:
            with fresh:
                step()
        except Exception as exc:  # a backend failing on a workload is reported, not fatal
            errors[backend] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        cold[backend] = time.perf_counter() - t0
        step()
        steps[backend] = step
    samples: dict[str, list[float]] = {b: [] for b in steps}
    start = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or (time.perf_counter() - start < budget_s and rounds < 200):
        for backend, step in steps.items():
            step()  # untimed: takes over the cache from the previous backend (see the docstring)
            t0 = time.perf_counter()
            step()
            samples[backend].append(time.perf_counter() - t0)
        rounds += 1
    med = {b: statistics.median(s) for b, s in samples.items()}
    loops = loops_share(w, fn, inputs) if "neuron" in steps else None
    rec: dict[str, Any] = {"workload": w.name, "group": w.group, "threads": threads, "train": w.train,
                           "rounds": rounds, "median_s": med, "cold_s": cold, "errors": errors,
                           "loops_share": loops}
    best = min((med[b] for b in ("eager", "inductor") if b in med), default=None)
    if best is not None and "neuron" in med:
        rec["ratio_vs_best"] = best / med["neuron"]
        rec["ratio_vs_eager"] = med["eager"] / med["neuron"] if "eager" in med else None
    if w.flops:
        rec["gflops"] = {b: w.flops / t / 1e9 for b, t in med.items()}
        if "neuron" in med and "eager" in med:
            rec["pct_of_torch_mm"] = med["eager"] / med["neuron"]
    return rec


def loops_share(w: Workload, fn: Any, inputs: tuple) -> float:
    """The share of a step's kernel time spent in ``loops`` kernels (no schedule: issue 41 wants
    at most 5 % for a model), from a profiled copy (``options={"profile": True}``, compiled
    separately; :mod:`neuron_compile.profile`) over 3 steps after one warm-up step."""
    from neuron_compile import profile
    model = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    args = tuple(t.detach().clone().requires_grad_(w.train and w.input_grad and t.is_floating_point())
                 for t in inputs)
    step = _step(torch.compile(model, backend="neuron", dynamic=False, options={"profile": True}), args, w.train)
    step()
    profile.reset()
    for _ in range(3):
        step()
    seconds = profile.seconds_by_schedule()
    profile.reset()   # (the tables printed at exit would otherwise repeat these runs)
    return sum(seconds.get(name, 0.0) for name in profile.UNSCHEDULED) / (sum(seconds.values()) or 1.0)


def vision_workloads() -> list[Workload]:
    """``--vision``: ResNet-18, MobileNetV2-style and UNet (inference, training step), then the layer sweep."""
    return model_workloads() + layer_workloads()


def _fmt_ms(s: float | None) -> str:
    return f"{s * 1e3:9.2f}" if s is not None else f"{'-':>9}"


def print_table(records: list[dict[str, Any]]) -> None:
    print(f"\n{'workload':<36} {'thr':>3} {'eager ms':>9} {'induct ms':>9} {'neuron ms':>9} "
          f"{'best/ours':>9} {'GFLOP/s':>8} {'%torch.mm':>9} {'cold ours s':>11} {'cold ind s':>10} {'loops':>6}")
    for r in records:
        m, c = r["median_s"], r["cold_s"]
        ratio = f"{r['ratio_vs_best']:9.2f}" if "ratio_vs_best" in r else f"{'-':>9}"
        gf = f"{r['gflops'].get('neuron', 0):8.1f}" if "gflops" in r else f"{'':>8}"
        pct = f"{r['pct_of_torch_mm']:9.0%}" if "pct_of_torch_mm" in r else f"{'':>9}"
        cn = f"{c['neuron']:11.2f}" if "neuron" in c else f"{'-':>11}"
        ci = f"{c['inductor']:10.2f}" if "inductor" in c else f"{'-':>10}"
        loops = f"{r['loops_share']:6.1%}" if r.get("loops_share") is not None else f"{'-':>6}"
        print(f"{r['workload']:<36.36} {r['threads']:>3} {_fmt_ms(m.get('eager'))} {_fmt_ms(m.get('inductor'))} "
              f"{_fmt_ms(m.get('neuron'))} {ratio} {gf} {pct} {cn} {ci} {loops}")
        for b, e in r["errors"].items():
            print(f"{'':<36}     {b} failed: {e}")


def plot(records: list[dict[str, Any]], path: Path) -> bool:
    """The ratio bar chart at ``path``; False (and a message) without matplotlib (the dev extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[dev]'); no chart written", file=sys.stderr)
        return False
    threads = sorted({r["threads"] for r in records})
    names = list(dict.fromkeys(r["workload"] for r in records))
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(names) + 1.5))
    height = 0.8 / len(threads)
    for i, t in enumerate(threads):
        vals = [next((r.get("ratio_vs_best", 0) for r in records if r["workload"] == n and r["threads"] == t), 0)
                for n in names]
        ax.barh([y + i * height for y in range(len(names))], vals, height=height, label=f"{t} thread(s)")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([y + 0.4 - height / 2 for y in range(len(names))], names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("best of (eager, Inductor) time / neuron-compile time  (> 1: neuron-compile faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def steady_malloc() -> str:
    """Keep freed memory in the process for every backend alike (glibc ``mallopt``: no ``mmap``
    per large block and no trimming of the heap's top up to 1 GiB); returns what was set.

    torch's CPU allocator does not cache: every output is a ``malloc``, and glibc gives a large
    block back to the OS on ``free`` (``munmap``, or trimming the top of the heap) depending on
    the order of earlier allocations, so the next call of the same workload pays a first-touch
    page fault per 4 KiB page. Measured on one process: softmax 4096×1024 took 1.7 ms or 7.6 ms
    per call (eager and ours alike: 2,700 page faults a call) depending on where its 16 MB output
    landed. PyTorch's CPU tuning guide swaps in jemalloc or tcmalloc for the same reason."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        if libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30):
            return "glibc mallopt: M_MMAP_THRESHOLD = M_TRIM_THRESHOLD = 1 GiB"
    except (OSError, AttributeError):  # not glibc: its defaults, reported as such
        pass
    return "default"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", nargs="+", help="run workloads whose name contains any of these words")
    ap.add_argument("--skip-heavy", action="store_true", help="skip GEMM 2048 and GPT-2 (minutes each)")
    ap.add_argument("--kinds", action="store_true", help="run the op-kind workloads (benchmarks/op_kinds.py) instead")
    ap.add_argument("--vision", action="store_true",
                    help="run the vision networks and the per-layer sweep (benchmarks/vision.py) instead")
    ap.add_argument("--min-rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of timed rounds per workload (at least)")
    ap.add_argument("--out", default=".", help="directory for benchmarks.json and benchmarks.png")
    args = ap.parse_args(argv)
    # arguments checked, and the output directory made, before minutes of measuring
    if any(t < 1 for t in args.threads):
        ap.error(f"--threads takes positive thread counts, got {args.threads}")
    if args.min_rounds < 1:
        ap.error(f"--min-rounds must be at least 1, got {args.min_rounds}")
    if not args.budget >= 0:  # (also rejects nan)
        ap.error(f"--budget must be a number of seconds >= 0, got {args.budget}")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        ap.error(f"--out {args.out}: cannot make the output directory ({exc.strerror})")
    malloc = steady_malloc()
    os.environ.setdefault("NEURON_CACHE_DIR", tempfile.mkdtemp(prefix="bench-neuron-cache-"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench-inductor-cache-"))
    torch._inductor.config.fx_graph_cache = False  # Inductor compiles cold too (it bakes thread counts in)
    pool = kind_workloads() if args.kinds else vision_workloads() if args.vision else workloads()
    chosen = [w for w in pool if (not args.only or any(o in w.name for o in args.only))
              and not (args.skip_heavy and w.heavy)]
    if not chosen:
        ap.error("no workload matches --only " + " ".join(args.only or []) + " (with --skip-heavy: " +
                 str(args.skip_heavy) + "); workloads: " + ", ".join(w.name for w in pool))
    records = []
    for t in args.threads:
        for w in chosen:
            rec = measure(w, t, args.min_rounds, args.budget)
            records.append(rec)
            print_table([rec])
    print_table(records)
    meta = {"torch": torch.__version__, "cpu": _cpu(), "malloc": malloc, "records": records}
    (out / "benchmarks.json").write_text(json.dumps(meta, indent=1))
    charted = plot(records, out / "benchmarks.png")
    print(f"\nwrote {out / 'benchmarks.json'}" + (f" and {out / 'benchmarks.png'}" if charted else ""))
    return 0


def _cpu() -> str:
    try:
        from neuron_compile.target import HostCPU
        h = HostCPU.detect()
        return f"{h.cpu} ({h.info().isa})"
    except Exception:  # reporting only
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
