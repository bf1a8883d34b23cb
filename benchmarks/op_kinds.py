"""Op kinds at model sizes (``python -m benchmarks --kinds``): one workload per kind of kernel a
model's graphs are made of (transposes, concatenation, gathers, row and column reductions, fused
pointwise chains, softmax and layer_norm with their backward), so a kind of slowness shows up as
one row, not hidden inside a model's step. Shapes are GPT-2's and a ResNet's."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workloads import Workload


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def kind_workloads() -> list[Workload]:
    """The op-kind workloads, in report order (group ``kind``)."""
    def op(name: str, fn, *make_inputs, train: bool = False) -> Workload:
        return Workload(f"kind: {name}", "kind", lambda: (fn, tuple(m() for m in make_inputs)), train=train)
    ids = lambda: torch.randint(0, 50257, (8, 128), generator=torch.Generator().manual_seed(1))  # noqa: E731
    mask = lambda: torch.ones(128, 128, dtype=torch.bool).triu(1)  # noqa: E731
    return [
        op("transpose 2048x2048", lambda x: x.t().contiguous(), lambda: _randn(2048, 2048)),
        op("transpose keys 8x12x128x64", lambda x: x.transpose(-1, -2).contiguous(), lambda: _randn(8, 12, 128, 64)),
        op("cat 3x(8x128x768) last dim", lambda a, b, c: torch.cat([a, b, c], -1),
           lambda: _randn(8, 128, 768), lambda: _randn(8, 128, 768, seed=1), lambda: _randn(8, 128, 768, seed=2)),
        op("embedding 50257x768 [8x128]", lambda w, i: F.embedding(i, w), lambda: _randn(50257, 768), ids),
        op("masked_fill 8x12x128x128", lambda s, m: s.masked_fill(m, float("-inf")), lambda: _randn(8, 12, 128, 128),
           mask),
        op("gelu(tanh) 8x128x3072", lambda x: F.gelu(x, approximate="tanh"), lambda: _randn(8, 128, 3072)),
        op("row sum 8x128x3072", lambda x: x.sum(-1), lambda: _randn(8, 128, 3072)),
        op("column sum 8x128x3072", lambda x: x.sum((0, 1)), lambda: _randn(8, 128, 3072)),
        op("mean over HxW 32x64x56x56", lambda x: x.mean((2, 3)), lambda: _randn(32, 64, 56, 56)),
        op("softmax 8x12x128x128", lambda x: x.softmax(-1), lambda: _randn(8, 12, 128, 128)),
        op("softmax fwd+bwd 8x12x128x128", lambda x: x.softmax(-1), lambda: _randn(8, 12, 128, 128), train=True),
        op("log_softmax fwd+bwd 128x50257", lambda x: x.log_softmax(-1), lambda: _randn(128, 50257), train=True),
        Workload("kind: layer_norm fwd+bwd 8x128x768", "kind",
                 lambda: (nn.LayerNorm(768), (_randn(8, 128, 768),)), train=True),
        op("bmm 96x128x64 @ 96x64x128", lambda a, b: a @ b, lambda: _randn(96, 128, 64), lambda: _randn(96, 64, 128)),
    ]
