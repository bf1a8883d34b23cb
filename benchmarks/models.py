"""Workloads shared by the benchmarks: the vertical slice's MLP and causal attention block, a ResNet block."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Linear → LayerNorm → GELU → Linear (``norm_first``), or Linear → GELU → LayerNorm → Linear."""

    def __init__(self, d_in: int = 256, hidden: int = 512, d_out: int = 10, norm_first: bool = True):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(d_in, hidden), nn.LayerNorm(hidden), nn.Linear(hidden, d_out)
        self.norm_first = norm_first

    def forward(self, x):
        h = self.fc1(x)
        h = F.gelu(self.norm(h)) if self.norm_first else self.norm(F.gelu(h))
        return self.fc2(h)


class Attention(nn.Module):
    def __init__(self, d: int = 128, heads: int = 4):
        super().__init__()
        self.h = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, t, c = x.shape
        def split(y):
            return y.view(b, t, self.h, c // self.h).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
        s = s.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))


class ResBlock(nn.Module):
    """ResNet's basic block (He et al., 2016): conv3x3-BN-ReLU-conv3x3-BN, identity shortcut, ReLU."""

    def __init__(self, c: int = 64):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


def workload(name: str):
    """(module, example input) with a training-shaped batch; seeded."""
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(), torch.randn(64, 256)
    if name == "attention":
        return Attention(), torch.randn(8, 64, 128)
    raise ValueError(name)
