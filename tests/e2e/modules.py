"""The modules of the vertical slice: an MLP and a causal self-attention block."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Linear → LayerNorm → GELU → Dropout → Linear (→ ReLU-free logits)."""

    def __init__(self, d_in: int, hidden: int, d_out: int, p_drop: float = 0.0, approximate: str = "none"):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(p_drop)
        self.fc2 = nn.Linear(hidden, d_out)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.gelu(self.norm(self.fc1(x)), approximate=self.approximate)))


class CausalSelfAttention(nn.Module):
    """q/k/v projections, scaled dot product written as matmul + softmax, causal mask, output projection."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.n_heads

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, h, c // h).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // h)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, c))
