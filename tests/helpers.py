"""Helpers shared by the end-to-end tests."""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn.functional as F

from tests.conftest import neuron_compile


def train_side_by_side(model: torch.nn.Module, steps: int, batch: Callable[[torch.Generator], tuple],
                       lr: float = 1e-2, **compile_kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    """AdamW + cross-entropy for ``steps`` on a compiled copy and an eager copy of ``model``, same
    batches, same random seed per step (dropout masks). Returns (ours, eager) for comparison.
    ``compile_kw`` go to ``torch.compile`` (e.g. ``fullgraph=True``)."""
    eager = copy.deepcopy(model)
    compiled = neuron_compile(model, **compile_kw)
    opts = [(compiled, torch.optim.AdamW(model.parameters(), lr=lr)),
            (eager, torch.optim.AdamW(eager.parameters(), lr=lr))]
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        x, y = batch(gen)
        for fn, opt in opts:
            torch.manual_seed(1000 + step)
            opt.zero_grad()
            F.cross_entropy(fn(x), y).backward()
            opt.step()
    return model, eager


def at_one_and_two_threads(compiled: Callable, *args) -> tuple:
    """``compiled(*args)`` with ``torch.set_num_threads(1)`` and then ``2`` (the thread count a
    kernel's parallel loops follow at call time); the caller's count is restored."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = compiled(*args)
        torch.set_num_threads(2)
        two = compiled(*args)
    finally:
        torch.set_num_threads(old)
    return one, two
