"""Cold compile vs warm start, ours vs Inductor, measured side by side in one run.

Each measurement runs in a fresh Python process (so nothing is warm in memory): "cold" with an
empty cache directory, "warm" with the directory the cold run filled. Reported: wall time of the
first forward+backward call (Dynamo + AOTAutograd + backend), and for neuron-compile also the time
spent in its own backend (``neuron_compile.metrics()['seconds']['total']``).

    python benchmarks/compile_time.py [--models mlp attention] [--repeats 1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(model: str, backend: str) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.models import workload
    m, x = workload(model)
    t0 = time.perf_counter()
    f = torch.compile(m, backend=backend, dynamic=False)
    f(x).sum().backward()
    first = time.perf_counter() - t0
    ours = None
    if backend == "neuron":
        import neuron_compile
        ours = neuron_compile.metrics()["seconds"].get("total", 0.0)
    print(json.dumps({"first_call": first, "backend": ours}))


def measure(model: str, backend: str, cache: str) -> dict:
    env = {**os.environ, "NEURON_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, __file__, "--child", model, backend], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "attention"])
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    rows = []
    for model in args.models:
        r = {}
        for backend in ("neuron", "inductor"):
            with tempfile.TemporaryDirectory(prefix=f"bench-{backend}-") as cache:
                os.chmod(cache, 0o700)
                r[backend, "cold"] = measure(model, backend, cache)
                r[backend, "warm"] = measure(model, backend, cache)
        rows.append((model, r))
    print(f"{'model':<10} {'':<28} {'neuron':>9} {'inductor':>9}")
    for model, r in rows:
        nc, nw, ic, iw = r["neuron", "cold"], r["neuron", "warm"], r["inductor", "cold"], r["inductor", "warm"]
        print(f"{model:<10} {'first call, cold (s)':<28} {nc['first_call']:>9.2f} {ic['first_call']:>9.2f}")
        print(f"{'':<10} {'first call, warm (s)':<28} {nw['first_call']:>9.2f} {iw['first_call']:>9.2f}")
        print(f"{'':<10} {'warm / cold, first call':<28} {nw['first_call'] / nc['first_call']:>9.1%} "
              f"{iw['first_call'] / ic['first_call']:>9.1%}")
        print(f"{'':<10} {'backend only: cold (s)':<28} {nc['backend']:>9.3f} {'':>9}")
        print(f"{'':<10} {'backend only: warm (s)':<28} {nw['backend']:>9.4f} {'':>9}")
        print(f"{'':<10} {'warm / cold, backend only':<28} {nw['backend'] / nc['backend']:>9.1%} {'':>9}")
        print(f"{'':<10} {'ours / inductor, cold':<28} {nc['first_call'] / ic['first_call']:>9.2f}x")
        print(f"{'':<10} {'ours / inductor, warm':<28} {nw['first_call'] / iw['first_call']:>9.2f}x")


if __name__ == "__main__":
    main()
