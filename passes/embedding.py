"""``embedding_bag`` forward as a bag-membership matrix and one matmul (sum/mean) or masked max.

Semantics of ATen's CPU kernel (``EmbeddingBag.cpp``): bag ``j`` holds the indices at positions
``offsets[j] <= i < offsets[j + 1]`` (the last bag runs to the end, or to the last offset with
``include_last_offset``); positions whose index equals ``padding_idx`` are skipped and not counted;
``sum`` weights each row by ``per_sample_weights``; ``mean`` divides by the bag's count; ``max``
takes the per-feature maximum. Empty bags give zeros. Cost O(bags × indices × dim).
"""
from __future__ import annotations

import torch


def embedding_bag(weight, indices, offsets, scale_grad_by_freq: bool = False, mode: int = 0,
                  sparse: bool = False, per_sample_weights=None, include_last_offset: bool = False,
                  padding_idx: int = -1):
    """``_embedding_bag(_forward_only)``: weight (V, D), 1-D indices (n,) and offsets (B or B+1,);
    returns (output (B, D), offset2bag (n,), bag_size (B,), max_indices ((B, D) for max, else (0,)))
    with ``mode`` 0 = sum, 1 = mean, 2 = max. ``scale_grad_by_freq``/``sparse`` only affect the
    backward."""
    n = indices.numel()
    bags = offsets.numel() - 1 if include_last_offset else offsets.numel()
    pos = torch.arange(n)
    starts = offsets[:bags]
    ends = torch.cat([offsets[1:bags], offsets[bags:bags + 1] if include_last_offset else
                      torch.full((1,), n, dtype=offsets.dtype)])[:bags]
    member = (pos.unsqueeze(0) >= starts.unsqueeze(1)) & (pos.unsqueeze(0) < ends.unsqueeze(1))  # (B, n)
    offset2bag = (member.to(torch.int64) * torch.arange(bags).unsqueeze(1)).sum(0)
    if padding_idx is not None and padding_idx >= 0:
        member = member & (indices != padding_idx).unsqueeze(0)
    bag_size = member.sum(1)
    rows = weight[indices]                                              # (n, D)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1).to(rows.dtype)
    if mode == 2:
        vals = torch.where(member.unsqueeze(2), rows.unsqueeze(0), float("-inf"))     # (B, n, D)
        best = vals.argmax(1)
        out = torch.where(bag_size.unsqueeze(1) > 0, vals.amax(1), 0).to(weight.dtype)
        max_indices = torch.where(bag_size.unsqueeze(1) > 0, indices[best], 0)
    else:
        out = member.to(rows.dtype) @ rows
        if mode == 1:
            out = out / bag_size.clamp(min=1).unsqueeze(1).to(out.dtype)
        max_indices = torch.zeros(0, dtype=torch.int64)
    return out, offset2bag, bag_size, max_indices


def embedding_renorm(weight, indices, max_norm: float, norm_type: float):
    """Functional ``embedding_renorm_`` (``max_norm`` of ``embedding``/``embedding_bag``): each row of
    weight (V, D) that ``indices`` references and whose ``norm_type``-norm exceeds ``max_norm`` is
    scaled by ``max_norm / (norm + 1e-7)``, the scale formed in float64 as ATen's CPU kernel does."""
    referenced = (indices.reshape(-1, 1) == torch.arange(weight.shape[0]).reshape(1, -1)).any(0)  # (V,)
    norm = torch.linalg.vector_norm(weight, norm_type, dim=1).to(torch.float64)
    scale = torch.where(referenced & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return weight * scale.to(weight.dtype).unsqueeze(1)
