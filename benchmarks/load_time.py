"""Loading a stored executable: native shared object (dlopen) vs re-JIT of the stored LLVM-dialect
module with MLIR's ExecutionEngine, measured side by side on the same cache entries.

    python benchmarks/load_time.py
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from benchmarks.models import workload
    from neuron_compile.executable import load_executable
    with tempfile.TemporaryDirectory() as cache:
        for name in ("mlp", "attention"):
            m, x = workload(name)
            torch._dynamo.reset()
            f = torch.compile(m, backend="neuron", dynamic=False, options={"cache_dir": cache})
            f(x).sum().backward()
        print(f"{'entry':<20} {'native ms':>10} {'jit ms':>10} {'jit / native':>13}")
        for manifest in sorted(Path(cache).glob("v1/??/*/manifest.json")):
            d = manifest.parent
            times = {}
            for mode in ("native", "jit"):
                samples = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    load_executable(d, mode=mode)
                    samples.append(time.perf_counter() - t0)
                times[mode] = statistics.median(samples) * 1e3
            name = __import__("json").loads(manifest.read_text())["name"]
            print(f"{name:<20} {times['native']:>10.2f} {times['jit']:>10.1f} {times['jit'] / times['native']:>12.0f}x")


if __name__ == "__main__":
    main()
