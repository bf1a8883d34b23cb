"""Per-rank training functions for the distributed tests (module-level: spawn pickles them by name).

Every worker trains the same seeded model on the same global batch for :data:`STEPS` AdamW steps and
returns the full parameters (numpy arrays, so the result pickles without shared memory) and the
rank's neuron-compile metrics.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 3
BATCH = 16


class MLP(nn.Module):
    """Linear(32, 64) → GELU → Linear(64, 8), the issue's MLP (a user-defined class: Dynamo skips a
    torch-internal ``nn.Sequential`` as a top-level frame under DDP, see README *Distributed*)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


def make_mlp() -> MLP:
    torch.manual_seed(0)
    return MLP()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 32, generator=g), torch.randn(BATCH, 8, generator=g)


def train(model: nn.Module, run, params, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(run(x), y).backward()
        opt.step()


def _full(t) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _result(model: nn.Module) -> dict:
    import neuron_compile
    m = neuron_compile.metrics()
    return {"params": {k: _full(v).numpy() for k, v in model.state_dict().items()},
            "metrics": {k: m[k] for k in ("graphs", "graphs_compiled", "disk_hits", "host_calls")}}


def eager_reference() -> dict:
    """One process, the whole batch, eager PyTorch."""
    model = make_mlp()
    x, y = batch()
    train(model, model, model.parameters(), x, y)
    return {k: v.detach().clone().numpy() for k, v in model.state_dict().items()}


def _shard(rank: int, world: int):
    x, y = batch()
    n = BATCH // world
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def ddp(rank: int, world: int) -> dict:
    """``torch.compile(DDP(model), backend="neuron")``: each rank its slice of the batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = make_mlp()
    run = torch.compile(DDP(model), backend="neuron", dynamic=False)
    train(model, run, model.parameters(), *_shard(rank, world))
    return _result(model)


def fsdp2(rank: int, world: int) -> dict:
    """FSDP2: ``fully_shard`` on each Linear and the root, then ``torch.compile``."""
    from torch.distributed.fsdp import fully_shard
    model = make_mlp()
    fully_shard(model.a)
    fully_shard(model.b)
    fully_shard(model)
    run = torch.compile(model, backend="neuron", dynamic=False)
    train(model, run, model.parameters(), *_shard(rank, world))
    return _result(model)


def tensor_parallel(rank: int, world: int) -> dict:
    """``ColwiseParallel`` then ``RowwiseParallel``: the graph holds the all-reduce (a host call)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    model = make_mlp()
    parallelize_module(model, init_device_mesh("cpu", (world,)), {"a": ColwiseParallel(), "b": RowwiseParallel()})
    run = torch.compile(model, backend="neuron", dynamic=False)
    train(model, run, model.parameters(), *batch())  # every rank sees the whole batch
    return _result(model)


def dies_mid_step(rank: int, world: int) -> dict:
    """Rank 1 exits after its forward; the others must fail in their all-reduce, not hang."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = make_mlp()
    run = torch.compile(DDP(model), backend="neuron", dynamic=False)
    x, y = _shard(rank, world)
    loss = F.mse_loss(run(x), y)
    if rank == 1:
        os._exit(3)
    loss.backward()  # DDP's gradient all-reduce waits for rank 1
    return _result(model)


def make_gpt2():
    """A 2-layer GPT-2 from a tiny config with seeded random weights (no download)."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # see tests/e2e/models/test_transformers.py
    return model


def token_batch(rank: int | None = None, world: int = 1) -> torch.Tensor:
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(2))
    if rank is None:
        return ids
    n = ids.shape[0] // world
    return ids[rank * n:(rank + 1) * n]


def train_lm(model, run, ids) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach().item())
    return losses


def gpt2_eager_reference() -> dict:
    model = make_gpt2()
    losses = train_lm(model, model, token_batch())
    return {"losses": losses, "params": {k: v.detach().clone().numpy() for k, v in model.state_dict().items()}}


def _lm_result(model, losses) -> dict:
    out = _result(model)
    import torch.distributed as dist
    t = torch.tensor(losses)
    dist.all_reduce(t)  # the global batch's loss: the mean of the ranks' equal shards
    out["losses"] = (t / dist.get_world_size()).tolist()
    return out


def gpt2_ddp(rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = make_gpt2()
    run = torch.compile(DDP(model), backend="neuron", dynamic=False)
    return _lm_result(model, train_lm(model, run, token_batch(rank, world)))


def gpt2_fsdp2(rank: int, world: int) -> dict:
    from torch.distributed.fsdp import fully_shard
    model = make_gpt2()
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    run = torch.compile(model, backend="neuron", dynamic=False)
    return _lm_result(model, train_lm(model, run, token_batch(rank, world)))


def ddp_buckets(rank: int, world: int) -> dict:
    """A 4 MB MLP in 1 MB gradient buckets: Dynamo's DDPOptimizer splits the graph at bucket
    boundaries and each piece is compiled. Returns the eager one-process reference as well."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def wide():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 8))
    reference = wide()
    train(reference, reference, reference.parameters(), *batch())
    model = wide()
    run = torch.compile(DDP(Wrapped(model), bucket_cap_mb=1), backend="neuron", dynamic=False)
    train(model, run, model.parameters(), *_shard(rank, world))
    out = _result(model)
    out["reference"] = {k: v.detach().clone().numpy() for k, v in reference.state_dict().items()}
    return out


class Wrapped(nn.Module):
    """A user-level module around a built-in container (see README *Distributed*: Dynamo skips a
    top-level ``nn.Sequential`` frame under DDP)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)
