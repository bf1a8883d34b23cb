"""Train an MLP on scikit-learn's bundled handwritten digits with torch.compile(backend="neuron").

The same run is repeated in eager PyTorch from the same initial weights and the same random seed
(dropout masks included), and the per-epoch losses of the two are compared.

    python examples/train_digits.py [--epochs 15] [--batch-size 64]
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


class DigitsMLP(nn.Module):
    """64 pixels → Linear → LayerNorm → GELU → Dropout → Linear → 10 logits."""

    def __init__(self, hidden: int = 128, p_drop: float = 0.1):
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(p_drop)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.gelu(self.norm(self.fc1(x)))))


def load_data(seed: int = 0):
    """Digits as float32 in [0, 1] (pixels are 0..16) and int64 labels; 80/20 stratified split."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return xtr, xte, ytr, yte


def train(model: nn.Module, step_fn, data, epochs: int, batch_size: int, seed: int) -> list[float]:
    """Mean training loss per epoch; shuffling and dropout draw from one seeded generator."""
    xtr, _, ytr, _ = data
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    torch.manual_seed(seed)
    losses = []
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xtr))
        total, count = 0.0, 0
        for i in range(0, len(xtr), batch_size):
            idx = perm[i:i + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(step_fn(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
        losses.append(total / count)
    return losses


@torch.no_grad()
def accuracy(model: nn.Module, fn, data) -> float:
    _, xte, _, yte = data
    model.eval()
    return (fn(xte).argmax(-1) == yte).float().mean().item()


def neuron_compile_factory():
    """The model and the inputs it is called with, for ahead-of-time compilation:
    ``neuron-compile compile examples/train_digits.py:neuron_compile_factory --train``. Training
    calls it with batches of 64 and the last, smaller batch; accuracy with the whole test split."""
    data = load_data(0)
    torch.manual_seed(0)
    xtr, xte = data[0], data[1]
    sizes = sorted({64, len(xtr) % 64 or 64})
    return DigitsMLP(), [(xtr[:n].clone(),) for n in sizes] + [(xte.clone(),)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    data = load_data(args.seed)
    torch.manual_seed(args.seed)
    eager_model = DigitsMLP()
    neuron_model = copy.deepcopy(eager_model)
    compiled = torch.compile(neuron_model, backend="neuron", dynamic=False)

    t0 = time.perf_counter()
    neuron_losses = train(neuron_model, compiled, data, args.epochs, args.batch_size, args.seed)
    t_neuron = time.perf_counter() - t0
    t0 = time.perf_counter()
    eager_losses = train(eager_model, eager_model, data, args.epochs, args.batch_size, args.seed)
    t_eager = time.perf_counter() - t0

    print(f"{'epoch':>5} {'neuron loss':>12} {'eager loss':>12} {'rel. diff':>10}")
    worst = 0.0
    for e, (a, b) in enumerate(zip(neuron_losses, eager_losses), 1):
        rel = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, rel)
        print(f"{e:>5} {a:>12.6f} {b:>12.6f} {rel:>10.2e}")
    acc_neuron = accuracy(neuron_model, compiled, data)
    acc_eager = accuracy(eager_model, eager_model, data)
    print(f"test accuracy: neuron {acc_neuron:.4f}, eager {acc_eager:.4f}")
    print(f"largest per-epoch loss difference vs eager: {worst:.2e} relative (limit 1e-4)")
    print(f"wall time: neuron {t_neuron:.1f} s (includes compiling), eager {t_eager:.1f} s")
    import neuron_compile
    m = neuron_compile.metrics()
    print(f"graphs: {m['graphs']} handed to neuron-compile, {m['graphs_compiled']} compiled, "
          f"{m['disk_hits']} loaded from the cache")
    ok = acc_neuron >= 0.95 and worst <= 1e-4
    print("OK" if ok else "FAILED: accuracy below 95% or losses diverged from eager")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
