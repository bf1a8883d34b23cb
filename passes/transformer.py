"""``nn.TransformerEncoderLayer``'s inference fast path (``aten._transformer_encoder_layer_fwd``)
as the ops it fuses, following ATen's ``aten/src/ATen/native/transformers/transformer.cpp`` and
``attention.cpp`` (``_native_multi_head_attention``).

PyTorch takes this path in ``eval()`` under ``no_grad`` with batched 3-D input; Dynamo traces the
layer's Python, which picks it, so the graph holds the one fused op. The layer is: (norm-first:
LayerNorm 1 →) self-attention with a packed in-projection → + src (→ LayerNorm 1) → (norm-first:
LayerNorm 2 →) Linear → ReLU or GELU → Linear → + residual (→ LayerNorm 2). Attention scales q by
1/sqrt(head_dim) before q·kᵀ (``transform_bias_rescale_qkv``); a boolean mask marks positions to
leave out (True), a float mask is added; rows with every position left out give 0, as ATen's
``_masked_softmax`` does. ``mask_type`` 0 is a (T, T) source mask, 1 a (B, T) key-padding mask, 2 any
mask broadcastable to (B, heads, T, T).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _attention(x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    b, t, e = x.shape
    d = embed_dim // num_heads
    q, k, v = (y.reshape(b, t, num_heads, d).transpose(1, 2) for y in F.linear(x, qkv_weight, qkv_bias).chunk(3, -1))
    scores = (q * (1.0 / math.sqrt(d))) @ k.transpose(-2, -1)                   # (B, H, T, T)
    if mask is not None:
        m = mask.reshape(b, 1, 1, t) if mask_type == 1 else mask
        if m.dtype == torch.bool:
            scores = scores.masked_fill(m, float("-inf"))
            attn = torch.softmax(scores, -1)
            attn = torch.where(m.expand(scores.shape).all(-1, keepdim=True), 0.0, attn)
        else:
            attn = torch.softmax(scores + m, -1)
    else:
        attn = torch.softmax(scores, -1)
    out = (attn @ v).transpose(1, 2).reshape(b, t, e)
    return F.linear(out, proj_weight, proj_bias)


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """``aten._transformer_encoder_layer_fwd``: src (B, T, E) → (B, T, E); weights as the layer's
    (``in_proj`` (3E, E), ``out_proj`` (E, E), ``linear1`` (F, E), ``linear2`` (E, F))."""
    def norm(y, w, bias):
        return F.layer_norm(y, (embed_dim,), w, bias, eps)

    def ffn(y):
        h = F.linear(y, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)

    attn_args = (embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)
    if norm_first:
        x = src + _attention(norm(src, norm_weight_1, norm_bias_1), *attn_args)
        return x + ffn(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + _attention(src, *attn_args), norm_weight_1, norm_bias_1)
    return norm(x + ffn(x), norm_weight_2, norm_bias_2)
