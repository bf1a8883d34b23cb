"""Steady-state time: eager vs Inductor vs neuron-compile with fusion off and on, side by side.

All four run in this one process on the same inputs; each is warmed up, then timed as the median
of repeated calls. Printed as milliseconds and as ratios to eager (lower is faster).

    python benchmarks/fusion.py [--repeats 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.models import workload  # noqa: E402


def cases():
    torch.manual_seed(0)
    mlp, x_mlp = workload("mlp")
    attn, x_attn = workload("attention")
    w, b = torch.randn(1024), torch.randn(1024)
    return {
        "mlp fwd (64x256->512->10)": (mlp, (x_mlp,), False),
        "mlp fwd+bwd": (mlp, (x_mlp,), True),
        "attention fwd (8x64x128)": (attn, (x_attn,), False),
        "attention fwd+bwd": (attn, (x_attn,), True),
        "softmax (256x1024)": (lambda x: x.softmax(-1), (torch.randn(256, 1024),), False),
        "layer_norm (256x1024)": (lambda x: F.layer_norm(x, (1024,), w, b), (torch.randn(256, 1024),), False),
    }


def timed(fn, args, backward: bool, repeats: int) -> float:
    def step():
        if backward:
            fn(*args).sum().backward()
        else:
            with torch.no_grad():
                fn(*args)
    for _ in range(3):
        step()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    variants = {
        "eager": lambda f: f,
        "inductor": lambda f: torch.compile(f, backend="inductor", dynamic=False),
        "neuron -fuse": lambda f: torch.compile(f, backend="neuron", dynamic=False, options={"passes": "-fuse"}),
        "neuron": lambda f: torch.compile(f, backend="neuron", dynamic=False),
    }
    print(f"threads: {torch.get_num_threads()}; median of {args.repeats} calls; ms (ratio to eager)")
    print(f"{'case':<28}" + "".join(f"{v:>20}" for v in variants))
    for name, (fn, inputs, backward) in cases().items():
        row = {}
        for v, make in variants.items():
            torch._dynamo.reset()
            row[v] = timed(make(fn), inputs, backward, args.repeats)
        print(f"{name:<28}" + "".join(f"{row[v]:>11.3f} ({row[v] / row['eager']:>5.1f}x)" for v in variants))


if __name__ == "__main__":
    main()
