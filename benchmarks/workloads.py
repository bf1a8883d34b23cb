"""The benchmark workloads: each builds a fresh (module or function, inputs) with seeded weights, so
every backend runs a copy of the same model on the same data."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.models import MLP, ResBlock


@dataclass(frozen=True)
class Workload:
    """``make()`` returns (callable, inputs); ``train``: time forward + backward of ``out.sum()``;
    ``flops``: floating-point operations per call (GEMMs, for GFLOP/s); ``group`` for the report."""

    name: str
    group: str
    make: Callable[[], tuple[Callable[..., Any], tuple]]
    train: bool = False
    flops: int = 0
    heavy: bool = False
    input_grad: bool = True   # training: whether the inputs require grad (a model's images do not)


class CausalAttention(nn.Module):
    """Multi-head causal self-attention block with a residual and LayerNorm (d=256, 4 heads)."""

    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.h = heads
        self.qkv, self.o, self.norm = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).split(c, dim=-1)
        q, k, v = (y.view(b, t, self.h, c // self.h).transpose(1, 2) for y in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
        s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        return x + self.o(y)


def _gemm(n: int, layout: str) -> Workload:
    def make():
        g = torch.Generator().manual_seed(n)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        a = a.t() if layout[0] == "t" else a   # A^T: a transposed view (strides (1, n)), as x.t() @ g
        b = b.t() if layout[1] == "t" else b   # B^T: nn.Linear's x @ W.t()
        return (lambda x, y: x @ y), (a, b)
    label = {"nn": "A@B", "nt": "A@B.T", "tn": "A.T@B"}[layout]
    return Workload(f"gemm {n} {label}", "gemm", make, flops=2 * n ** 3, heavy=n >= 2048)


def _seeded(factory: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return factory()


def _issue_mlp() -> nn.Module:
    """512 → 1024 (GELU, LayerNorm) → 512: the issue's MLP."""
    return MLP(512, 1024, 512, norm_first=False)


def _gpt2(train: bool) -> Workload:
    def make():
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = _seeded(lambda: GPT2LMHeadModel(cfg)).train(train)
        ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))

        def run(m, x):
            return m(input_ids=x, labels=x).loss if train else m(input_ids=x).logits
        return _Bound(model, run), (ids,)
    return Workload(f"gpt2-2L {'train step' if train else 'inference'}", "model", make, train=train, heavy=True)


class _Bound(nn.Module):
    """``fn(module, *inputs)`` as a module, so torch.compile sees the parameters."""

    def __init__(self, module: nn.Module, fn: Callable):
        super().__init__()
        self.m, self.fn = module, fn

    def forward(self, *xs):
        return self.fn(self.m, *xs)


def workloads() -> list[Workload]:
    """Every workload of ``python -m benchmarks``, in report order."""
    torch.manual_seed(0)
    w, b = torch.randn(1024), torch.randn(1024)
    out = [_gemm(n, lay) for n in (256, 512, 1024, 2048) for lay in ("nn", "nt", "tn")]
    out += [
        Workload("softmax 4096x1024", "op", lambda: ((lambda x: x.softmax(-1)), (torch.randn(4096, 1024),))),
        Workload("layer_norm 4096x1024", "op",
                 lambda: ((lambda x: F.layer_norm(x, (1024,), w, b)), (torch.randn(4096, 1024),))),
        Workload("linear+gelu 1024x1024, batch 1024", "op",
                 lambda: (_seeded(lambda: nn.Sequential(nn.Linear(1024, 1024), nn.GELU())), (torch.randn(1024, 1024),)),
                 flops=2 * 1024 ** 3),
        Workload("mlp inference", "block", lambda: (_seeded(_issue_mlp), (torch.randn(256, 512),))),
        Workload("mlp train step", "block", lambda: (_seeded(_issue_mlp), (torch.randn(256, 512),)), train=True),
        Workload("attention inference", "block", lambda: (_seeded(CausalAttention), (torch.randn(8, 128, 256),))),
        Workload("attention train step", "block", lambda: (_seeded(CausalAttention), (torch.randn(8, 128, 256),)),
                 train=True),
        Workload("conv3x3+relu 64ch 56x56, batch 8", "op",
                 lambda: (_seeded(lambda: nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU())),
                          (torch.randn(8, 64, 56, 56),)), flops=2 * 8 * 64 * 64 * 9 * 56 * 56),
        Workload("resnet block inference", "block", lambda: (_seeded(ResBlock).eval(), (torch.randn(8, 64, 56, 56),))),
        Workload("resnet block train step", "block", lambda: (_seeded(ResBlock), (torch.randn(8, 64, 56, 56),)),
                 train=True),
        _gpt2(False),
        _gpt2(True),
    ]
    # host calls (issue 11): ops whose generated form is O(n^2) run in ATen between kernel segments
    g = torch.Generator().manual_seed(3)
    out += [
        Workload("topk k=50 1x50257", "host", lambda: ((lambda x: torch.topk(x, 50, -1)), (torch.randn(1, 50257, generator=g),))),
        Workload("topk k=50 32x50257", "host", lambda: ((lambda x: torch.topk(x, 50, -1)), (torch.randn(32, 50257, generator=g),))),
        Workload("sort 1M", "host", lambda: ((lambda x: torch.sort(x)), (torch.randn(1 << 20, generator=g),))),
        Workload("argsort 1M", "host", lambda: ((lambda x: torch.argsort(x)), (torch.randn(1 << 20, generator=g),))),
        Workload("cumsum 64x65536", "host", lambda: ((lambda x: torch.cumsum(x, -1)), (torch.randn(64, 65536, generator=g),))),
        Workload("unique 1M int64", "host",
                 lambda: ((lambda x: torch.unique(x)), (torch.randint(0, 1 << 16, (1 << 20,), generator=g),))),
    ]
    return out
