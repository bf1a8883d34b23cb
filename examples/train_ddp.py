"""Train the digits MLP with DistributedDataParallel on two processes, compiled by neuron-compile.

Two processes form a gloo process group on 127.0.0.1 (a free port); each trains on its half of every
batch with ``torch.compile(DDP(model), backend="neuron", dynamic=False)``, and DDP all-reduces the
gradients. The same run is repeated with eager DDP from the same weights and seed, and rank 0 prints
both runs' per-epoch losses (dropout off, so they must agree), the median step time of each (after
the first epoch, which includes compiling) and their ratio, and what each rank compiled.

    python examples/train_ddp.py [--epochs 4] [--batch-size 64]
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import DigitsMLP, load_data  # noqa: E402


def run_epochs(model, step_fn, data, epochs: int, batch_size: int, rank: int, world: int):
    """Per-epoch global mean loss and the step times (seconds) of every epoch after the first."""
    xtr, _, ytr, _ = data
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    g = torch.Generator().manual_seed(0)
    losses, steps = [], []
    for epoch in range(epochs):
        perm = torch.randperm(len(xtr), generator=g)
        total = torch.zeros(2)
        for i in range(0, len(xtr) - batch_size + 1, batch_size):
            idx = perm[i:i + batch_size].chunk(world)[rank]  # this rank's half of the batch
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(step_fn(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            if epoch:
                steps.append(time.perf_counter() - t0)
            total += torch.tensor([loss.item() * len(idx), len(idx)])
        dist.all_reduce(total)
        losses.append((total[0] / total[1]).item())
    return losses, steps


def worker(rank: int, world: int, port: int, epochs: int, batch_size: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        import neuron_compile
        data = load_data(0)
        torch.manual_seed(0)
        eager_model = DigitsMLP(p_drop=0.0)
        neuron_model = copy.deepcopy(eager_model)
        compiled = torch.compile(DDP(neuron_model), backend="neuron", dynamic=False)
        ours, t_ours = run_epochs(neuron_model, compiled, data, epochs, batch_size, rank, world)
        theirs, t_eager = run_epochs(eager_model, DDP(eager_model), data, epochs, batch_size, rank, world)
        m = neuron_compile.metrics()
        info = torch.tensor([m["graphs"], m["graphs_compiled"] + m["disk_hits"]], dtype=torch.float64)
        gathered = [torch.zeros_like(info) for _ in range(world)]
        dist.all_gather(gathered, info)
        if rank == 0:
            print(f"{'epoch':>5} {'neuron loss':>12} {'eager loss':>12}")
            for e, (a, b) in enumerate(zip(ours, theirs), 1):
                print(f"{e:>5} {a:>12.6f} {b:>12.6f}")
            mo, me = statistics.median(t_ours), statistics.median(t_eager)
            print(f"median step: neuron {mo * 1e3:.2f} ms, eager DDP {me * 1e3:.2f} ms, eager/neuron {me / mo:.2f}")
            for r, g in enumerate(gathered):
                print(f"rank {r}: {int(g[0])} graphs handed to neuron-compile, {int(g[1])} compiled or loaded")
            worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
            ok = worst <= 1e-4 and all(int(g[1]) > 0 for g in gathered)
            print(f"largest loss difference vs eager DDP: {worst:.2e} relative (limit 1e-4)")
            print("OK" if ok else "FAILED")
            if not ok:
                os._exit(1)
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, args.epochs, args.batch_size), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
