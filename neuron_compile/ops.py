"""neuron-compile's own ops, which FX passes introduce (``torch.ops.neuron.*``).

``neuron::matmul(a, b, bias, trans_a, trans_b)``: ``op(a) @ op(b) (+ bias)`` where ``op`` transposes
the last two dims when asked, for 2-D and batched 3-D operands. The layout pass folds a
``permute``/``t`` feeding a matmul into these flags so no transposed copy is made; the lowering
reads the operand through a transposed indexing map.
"""
from __future__ import annotations

from typing import Optional

import torch


@torch.library.custom_op("neuron::matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], trans_a: bool, trans_b: bool
           ) -> torch.Tensor:
    """Eager reference (also what the FX repro runs)."""
    x = a.transpose(-2, -1) if trans_a else a
    y = b.transpose(-2, -1) if trans_b else b
    out = x @ y
    return out + bias if bias is not None else out


@matmul.register_fake
def _(a, b, bias, trans_a, trans_b):
    m = a.shape[-1] if trans_a else a.shape[-2]
    n = b.shape[-2] if trans_b else b.shape[-1]
    return a.new_empty((*a.shape[:-2], m, n))
