"""Compiled optimizer steps (issue 13, item 6): a whole training step (forward, backward,
``step``, ``zero_grad``) in one compiled function, for every optimizer PyTorch recommends
compiling, with the multi-tensor (``foreach``) updates and the per-tensor loop, and an LR scheduler
between steps. After 5 steps the parameters must be as close to a float64 eager run as float32
eager's are. The kinds this guards: Dynamo's ``prims.fma`` (``addcmul_``/``addcdiv_`` with
``value=``) and ATen's ``_foreach_*`` ops, which had no lowering or decomposition."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import neuron_compile

CASES = [
    ("SGD", dict(momentum=0.9), True), ("SGD", dict(momentum=0.9, nesterov=True), True),
    ("Adam", {}, True), ("Adam", {}, False), ("AdamW", dict(amsgrad=True), True), ("RMSprop", dict(momentum=0.5), True),
    ("Adagrad", {}, True), ("Adamax", {}, True), ("NAdam", {}, True), ("RAdam", {}, True), ("SGD", {}, False),
]


def _train(model: torch.nn.Module, name: str, kw: dict, foreach: bool, x, y, compile_step: bool) -> list[torch.Tensor]:
    opt = getattr(torch.optim, name)(model.parameters(), lr=0.01, foreach=foreach, **kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def train_step():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    step = neuron_compile(train_step) if compile_step else train_step
    for _ in range(5):
        step()
        sched.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name,kw,foreach", CASES, ids=lambda v: str(v) if not isinstance(v, dict) else
                         ",".join(f"{k}={w}" for k, w in v.items()) or "defaults")
def test_compiled_training_step_with_optimizer_matches_eager(name, kw, foreach):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    torch._dynamo.reset()
    got = _train(copy.deepcopy(model), name, kw, foreach, x, y, compile_step=True)
    eager = _train(copy.deepcopy(model), name, kw, foreach, x, y, compile_step=False)
    ref = _train(copy.deepcopy(model).double(), name, kw, foreach, x.double(), y.double(), compile_step=False)
    start = list(model.parameters())
    for g, e, r, p0 in zip(got, eager, ref, start):
        assert g.dtype == torch.float32
        assert not torch.equal(g, p0.detach()), "the compiled step did not update the parameters"
        err, err_eager = (g.double() - r).abs().max().item(), (e.double() - r).abs().max().item()
        assert err <= 4 * err_eager + 1e-6, (name, err, err_eager)
