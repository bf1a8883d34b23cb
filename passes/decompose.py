"""The decomposition table handed to AOTAutograd, as data.

Starts from ``torch._decomp.core_aten_decompositions()`` (the core ATen opset, as Inductor and
torch-mlir do), adds reference decompositions from ``torch._decomp`` for composite ops we do not
lower, and our own entries. Each extra entry carries a one-line reason. An op is either decomposed
or lowered, never both: ops that have a lowering rule are taken out of the core table, and
:func:`check_disjoint` (run when the table is built) fails if one of *our* entries is also lowered.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from neuron_compile.overloads import aten_overload, present
from neuron_compile.passes import (bessel, distance, embedding, erf_family, foreach, histogram, householder, jacobi,
                                   linalg, max_pool, sampling, separable, special, transformer, view_scatter)

aten = torch.ops.aten

# Reference decompositions from torch._decomp that are not in the core table.
EXTRA_REFERENCE: dict[object, str] = {
    aten.native_layer_norm: "var_mean + rsqrt + affine: elementwise and reductions we already lower",
    aten._log_softmax: "amax, sub, exp, sum, log, sub (torch._decomp)",
    aten.addcmul: "mul + add",
    aten.addcdiv: "div + mul + add",
    aten.linalg_vector_norm: "abs / pow, sum, root: pointwise + reduction",
    aten.repeat: "unsqueeze + expand + reshape",
    aten.isinf: "abs(x) == inf",
    aten.elu: "where(x > 0, x, alpha * (exp(x) - 1)) (expm1 form)",
    aten.hardtanh: "clamp",
    aten.leaky_relu: "where(x > 0, x, slope * x)",
    aten.native_group_norm: "var_mean over groups + affine",
    aten._native_batch_norm_legit_functional: "batch statistics by var_mean; running stats returned as outputs",
    aten._native_batch_norm_legit_no_training: "running statistics + affine",
    aten._native_batch_norm_legit: "functional form: batch statistics, new running stats as outputs",
    aten.native_batch_norm: "dispatches to the _legit forms above",
    aten._adaptive_avg_pool2d: "windowed sums by index gathers, divided by the window sizes",
    aten.ldexp.Tensor: "a * 2**b",
    aten.diagonal: "as_strided view of the diagonal",
    aten.as_strided_copy: "as_strided + clone",
    aten.narrow_copy: "slice + clone",
    aten.view_copy: "view + clone",
    aten.permute_copy: "permute + clone",
    aten.unbind_copy: "unbind + clone",
    aten.unfold: "windows gathered by index arithmetic",
    aten.addmv: "beta * self + alpha * (mat @ vec)",
    aten.dist: "vector norm of the difference",
    aten.upsample_bilinear2d: "gathers of the four neighbours and lerps (align_corners as eager)",
    aten.upsample_nearest2d.vec: "index gathers",
    aten.upsample_bicubic2d: "gathers of the 4x4 neighbourhood with cubic weights",
    aten.grid_sampler_2d: "gathers at the sampling points with bilinear/nearest weights",
    aten._batch_norm_with_update_functional: "the _native_batch_norm_legit_functional form above",
}


def _native_dropout(input: torch.Tensor, p: float, train: bool | None):
    """Dropout whose mask is drawn exactly as eager CPU dropout draws it.

    Eager ``F.dropout`` (ATen ``_dropout``) does ``empty_like(x).bernoulli_(1 - p)`` then scales by
    ``1/(1-p)``; we keep that one ``bernoulli`` op (run on the host with torch's generator) so the
    random stream, and so training, matches eager bit for bit in the mask.
    """
    if not train or p == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(input), torch.zeros_like(input, dtype=torch.bool)
    noise = torch.bernoulli(torch.empty_like(input), 1 - p)
    return input * noise * (1.0 / (1 - p)), noise.to(torch.bool)


def _addbmm(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """``beta·x + alpha·Σ_b b1[b] @ b2[b]`` as ATen's ``addbmm`` (``Blas.cpp``): ``beta == 0`` ignores
    ``x`` (its NaN/inf do not propagate), and for integer tensors the scalars are first converted to
    the tensor's type (``Scalar.to<int64_t>()`` truncates: beta 0.6 is 0), so the result keeps x's
    integer dtype where Python float scalars would promote it to float."""
    if not (x.is_floating_point() or x.is_complex()):
        beta, alpha = int(beta), int(alpha)
    prod = (b1 @ b2).sum(0)
    return alpha * prod if beta == 0 else beta * x + alpha * prod


def _trilinear(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1, expand2, expand3, sumdim,
               unroll_dim: int = 1) -> torch.Tensor:
    """ATen's ``_trilinear`` (``Linear.cpp``; ``F.bilinear`` calls it with the weight as ``i2``):
    each input unsqueezed at its ``expand`` dims in increasing order, the three multiplied with
    broadcasting and summed over ``sumdim`` (dims removed). ``unroll_dim`` only picks ATen's loop
    order. The product and the sum fuse into one reduction kernel."""
    def expand(t: torch.Tensor, dims) -> torch.Tensor:
        for d in sorted(dims):
            t = t.unsqueeze(d)
        return t
    prod = expand(i1, expand1) * expand(i2, expand2) * expand(i3, expand3)
    return prod.sum(list(sumdim)) if len(sumdim) else prod


def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """``softmax`` as ATen's CPU kernel computes it (``SoftMaxKernel.cpp``): e = exp(x - amax(x)),
    then along the last dim ``e * (1 / sum(e))`` (``_vec_softmax_lastdim``), along any other dim
    ``e / sum(e)`` (``_vec_softmax``). torch._decomp divides everywhere: one division per element
    instead of one per row, and one rounding away from eager's results. The reciprocal is safe
    here: the row's maximum contributes exp(0) = 1, so sum(e) >= 1 (or NaN) and 1/sum is a normal
    number; a general row divisor could be subnormal (1/d overflows) and keeps its division.

    Shapes and dtypes as ``aten._softmax``: any float ``x``, ``dim`` normalized here; with
    ``half_to_float`` a float16 ``x`` gives a float32 result (computed in float32 either way)."""
    dim = dim % max(x.dim(), 1)
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.numel() == 0:  # amax has no identity to reduce an empty dim with; nothing to compute
        return torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    x = x.contiguous().to(torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype)
    e = torch.exp(x - torch.amax(x, dim, keepdim=True))
    total = torch.sum(e, dim, keepdim=True)
    y = e * torch.reciprocal(total) if dim == max(x.dim() - 1, 0) else e / total
    return y.to(out_dtype)


def _sdpa_scores(query, key, is_causal, attn_mask, s):
    """``q kᵀ · s`` with the causal (top-left aligned, as ATen's) and the given mask applied: -inf
    where masked out. ``key`` has as many heads as ``query``."""
    scores = (query @ key.transpose(-2, -1)) * s
    if is_causal:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else scores + attn_mask
    return scores


def _sdpa_flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """``(output, logsumexp)`` of the CPU FlashAttention forward. torch's own decomposition (2.13 and
    2.14) returns the attention weights ``(N, H, L, S)`` as its second result, not the row
    logsumexp ``(N, H, L)`` (found by 2.14's new OpInfo entry for this op); the output is torch's."""
    from torch._decomp.decompositions import scaled_dot_product_flash_attention_for_cpu
    if query.shape[1] % key.shape[1]:
        return NotImplemented
    output, _ = scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                           attn_mask=attn_mask, scale=scale)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    s = scale if scale is not None else 1.0 / query.shape[-1] ** 0.5
    lse = torch.logsumexp(_sdpa_scores(query.float(), key.float(), is_causal, attn_mask, s), -1)
    return output, lse.to(query.dtype) if query.dtype == torch.float64 else lse


def _sdpa_flash_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                             attn_mask=None, scale=None):
    """Gradients of scaled dot-product attention from the saved output, as matmuls and pointwise ops
    (the FlashAttention backward, Dao et al. 2022, Alg. 2): P = safe_softmax(S), dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - rowsum(dO ∘ O)), dQ = dS K·s, dK = dSᵀ Q·s."""
    if dropout_p != 0 or query.shape[1] % key.shape[1]:
        return NotImplemented
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: kv heads shared by `groups` q heads
    key_heads = key
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    s = scale if scale is not None else 1.0 / query.shape[-1] ** 0.5
    scores = _sdpa_scores(query, key, is_causal, attn_mask, s)
    # the softmax is recomputed from the scores rather than from the saved `logsumexp`, whose layout
    # differs between the fused kernel and its decomposition; a fully masked row (all -inf) has
    # P = 0, as in the forward (`_safe_softmax`) and ATen's kernel, not NaN (exp(-inf - -inf))
    p = aten._safe_softmax.default(scores, -1)
    grad_v = p.transpose(-2, -1) @ grad_out
    grad_p = grad_out @ value.transpose(-2, -1)
    grad_s = p * (grad_p - (grad_out * out).sum(-1, keepdim=True))
    grad_q, grad_k = grad_s @ key * s, grad_s.transpose(-2, -1) @ query * s
    if groups > 1:
        b, hk, sk = key_heads.shape[0], key_heads.shape[1], key_heads.shape[2]
        grad_k = grad_k.view(b, hk, groups, sk, grad_k.shape[-1]).sum(2)
        grad_v = grad_v.view(b, hk, groups, sk, grad_v.shape[-1]).sum(2)
    return grad_q, grad_k, grad_v


def _order_statistic(x: torch.Tensor, dim: int, keepdim: bool, pick):
    """(values, indices) at position ``pick(n, nan_count)`` of ``x`` sorted stably along ``dim``
    (NaN last, so the first NaN sits at ``n - nan_count``)."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64)
    dim = dim % x.dim()
    values, indices = aten.sort.default(x, dim)
    n = x.shape[dim]
    nans = x.isnan().sum(dim, keepdim=True) if x.is_floating_point() else torch.zeros_like(x, dtype=torch.int64).sum(dim, keepdim=True)
    pos = pick(n, nans)
    values, indices = values.gather(dim, pos), indices.gather(dim, pos)
    return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))


def _host_sized(x: torch.Tensor, dim: int | None) -> bool:
    """A row longer than the generated sort handles: the op stays in the graph as a host call
    (:mod:`neuron_compile.passes.host_calls`), ATen's O(n) selection instead of an O(n²) kernel."""
    from neuron_compile.passes.host_calls import GENERATED_MAX_LENGTH
    n = x.numel() if dim is None else (x.shape[dim % x.dim()] if x.dim() else 1)
    return n > GENERATED_MAX_LENGTH


def _median_dim(x, dim=-1, keepdim=False):
    """Lower median along ``dim``; NaN (and a NaN's index) if the slice holds one, as ATen."""
    if _host_sized(x, dim):
        return NotImplemented
    return _order_statistic(x, dim, keepdim, lambda n, nans: torch.where(nans > 0, n - nans, (n - 1) // 2))


def _nanmedian_dim(x, dim=-1, keepdim=False):
    """Lower median of the non-NaN values along ``dim`` (NaN if all are NaN)."""
    if _host_sized(x, dim):
        return NotImplemented
    return _order_statistic(x, dim, keepdim, lambda n, nans: ((n - nans - 1) // 2).clamp_min(0))


def _kthvalue(x, k, dim=-1, keepdim=False):
    """The k-th smallest (1-based) along ``dim``, NaN counting as the largest."""
    if _host_sized(x, dim):
        return NotImplemented
    return _order_statistic(x, dim, keepdim, lambda n, nans: torch.full_like(nans, k - 1))


def _mode(x, dim=-1, keepdim=False):
    """Most frequent value along ``dim`` and an index of it, as ATen's CPU kernel: it sorts each
    slice and keeps the first value whose run is strictly longest, so ties go to the smallest
    value, and the index is that value's last occurrence (the end of its run in a stable sort;
    ATen's ``std::sort`` is not stable beyond 16 elements, where eager may return another
    occurrence of the same value). Each NaN is its own value (NaN equals nothing), so it is the
    mode only of a row of NaNs. Counting is O(n²) per slice, like the sort family's kernels."""
    if _host_sized(x, dim):
        return NotImplemented
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64)
    dim = dim % x.dim()
    t = torch.movedim(x, dim, -1)
    n = t.shape[-1]
    same = t.unsqueeze(-1) == t.unsqueeze(-2)                       # [..., n, n]; NaN equals nothing
    counts = same.sum(-1)
    best = counts == counts.amax(-1, keepdim=True)
    if t.is_floating_point():  # a NaN (count 0) is never the mode while the row has a number
        best = best & ~t.isnan() | best.all(-1, keepdim=True)
        top = torch.full_like(t, math.inf)
    else:
        top = t.amax(-1, keepdim=True).expand(t.shape)
    values = torch.where(best, t, top).amin(-1, keepdim=True)
    pos = torch.arange(n).expand(t.shape)
    indices = torch.where(t == values, pos, torch.zeros_like(pos)).amax(-1, keepdim=True)
    values, indices = torch.movedim(values, -1, dim), torch.movedim(indices, -1, dim)
    return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))


def _cdist_forward(x1, x2, p, compute_mode=None):
    """Pairwise p-norm distances, [..., P, M] × [..., R, M] → [..., P, R], as ATen's CPU kernel:
    for p = 2 with more than 25 rows (or compute_mode 1) it uses the matmul form
    ``sqrt(clamp(|a|² - 2a·b + |b|², 0))`` (``_euclidean_dist``), else differences directly."""
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (x1.shape[-2] > 25 or x2.shape[-2] > 25))):
        n1, n2 = x1.pow(2).sum(-1, keepdim=True), x2.pow(2).sum(-1, keepdim=True)
        a = torch.cat([x1.mul(-2), n1, torch.ones_like(n1)], -1)
        b = torch.cat([x2, torch.ones_like(n2), n2], -1)
        return a.matmul(b.mT).clamp_min(0).sqrt()
    return distance.norm_of_abs_diff((x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs(), p)


def _put(x, index, source, accumulate=False):
    """``Tensor.put``: writes (or adds) ``source`` at flat positions ``index`` of ``x``."""
    flat = x.reshape(-1)
    idx = torch.where(index.reshape(-1) < 0, index.reshape(-1) + flat.numel(), index.reshape(-1))
    return flat.index_put((idx,), source.reshape(-1), accumulate).view_as(x)


def _masked_scatter(x, mask, source):
    """``Tensor.masked_scatter``: the k-th True position of ``mask`` (``x`` and ``mask`` broadcast, row-major)
    takes ``source``'s k-th element (flattened), the others keep ``x``; k is the running count of
    the mask, a static-size gather (Inductor decomposes it the same way). Eager raises when
    ``source`` has fewer elements than the mask has True; here the index is clamped instead."""
    shape = torch.broadcast_shapes(x.shape, mask.shape)   # out-of-place: both broadcast, as ATen
    m = mask.expand(shape).reshape(-1)
    k = (torch.cumsum(m.to(torch.int64), 0) - 1).clamp(0, max(source.numel() - 1, 0))
    return torch.where(m, source.reshape(-1)[k], x.expand(shape).reshape(-1)).reshape(shape)


def _masked_scatter_backward(grad, mask, sizes):
    """``source``'s gradient of :func:`_masked_scatter`: element k of the flattened source gets the
    gradient at the mask's k-th True position, 0 beyond the mask's count. An accumulating index_put
    into ``numel + 1`` slots, the last one collecting every position that feeds no source element."""
    n = math.prod(sizes)
    m = mask.expand(grad.shape).reshape(-1)
    k = torch.cumsum(m.to(torch.int64), 0) - 1
    slot = torch.where(m & (k < n), k, n)
    out = torch.zeros(n + 1, dtype=grad.dtype).index_put((slot,), grad.reshape(-1), accumulate=True)
    return out[:n].reshape(sizes)


def _index_reduce(x, dim, index, source, reduce, *, include_self=True):
    """``Tensor.index_reduce``: ``scatter_reduce`` with the 1-d index broadcast along ``dim``."""
    if x.dim() == 0:
        return aten.scatter_reduce.two(x, 0, index.reshape(()), source, reduce, include_self=include_self)
    dim = dim % x.dim()
    shape = [1] * source.dim()
    shape[dim] = -1
    full = index.reshape(shape).expand(source.shape)
    return aten.scatter_reduce.two(x, dim, full, source, reduce, include_self=include_self)


_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}


def _segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                    initial=None):
    """``torch.segment_reduce`` over contiguous segments along ``axis`` (given by ``lengths`` or
    ``offsets``; shapes (*B, S) / (*B, S+1) with B = data.shape[:axis]), as ATen's CPU kernel
    (``SegmentReduce.cpp``): each segment reduces from ``initial`` (else the identity); ``max``
    and ``min`` propagate NaN; ``mean`` divides by the length, an empty segment keeping ``initial``
    or giving NaN. A membership mask (*B, S, N) selects each segment's elements."""
    if indices is not None:
        return NotImplemented
    axis = axis % data.dim()
    if offsets is None:
        offsets = torch.cat([torch.zeros_like(lengths[..., :1]), lengths.cumsum(-1)], -1)
    start, end = offsets[..., :-1], offsets[..., 1:]
    rest = (1,) * (data.dim() - axis - 1)
    pos = torch.arange(data.shape[axis])
    member = ((pos >= start.unsqueeze(-1)) & (pos < end.unsqueeze(-1))).reshape(*start.shape, -1, *rest)
    ident = _SEGMENT_IDENTITY[reduce] if initial is None else initial
    vals = torch.where(member, data.unsqueeze(axis), torch.full((), _SEGMENT_IDENTITY[reduce], dtype=data.dtype))
    red = {"sum": torch.sum, "mean": torch.sum, "prod": torch.prod,
           "max": torch.amax, "min": torch.amin}[reduce](vals, axis + 1)
    if initial is not None:
        red = {"max": torch.maximum, "min": torch.minimum, "prod": torch.mul}.get(reduce, torch.add)(
            red, torch.full((), initial, dtype=data.dtype))
    if reduce == "mean":
        count = (end - start).reshape(*start.shape, *rest)
        empty = torch.full((), ident if initial is not None else float("nan"), dtype=data.dtype)
        red = torch.where(count > 0, red / count, empty)
    return red


def _nonzero_static(x, *, size, fill_value=-1):
    """``torch.nonzero_static``: the coordinates of the first ``size`` nonzero elements in row-major
    order, padded with ``fill_value``: slot k takes the element whose running nonzero count is k."""
    flat = x.reshape(-1) != 0
    n = flat.numel()
    rank = torch.cumsum(flat.to(torch.int64), 0) - 1
    hit = flat.unsqueeze(0) & (rank.unsqueeze(0) == torch.arange(size).unsqueeze(1))      # (size, n)
    linear = (hit.to(torch.int64) * torch.arange(n).unsqueeze(0)).sum(1, keepdim=True)   # (size, 1)
    strides = [1] * x.dim()
    for d in range(x.dim() - 2, -1, -1):
        strides[d] = strides[d + 1] * x.shape[d + 1]
    coords = torch.stack([(linear[:, 0] // st) % sz for st, sz in zip(strides, x.shape)], 1) \
        if x.dim() else torch.zeros(size, 0, dtype=torch.int64)
    return torch.where(hit.any(1, keepdim=True), coords, torch.full((), fill_value, dtype=torch.int64))


def _adaptive_max_pool(x, output_size):
    """``adaptive_max_poolNd`` (ATen ``AdaptiveMaxPoolKernel.cpp``): output i of a spatial dim of
    length n takes the max over [⌊i·n/o⌋, ⌈(i+1)·n/o⌉), NaN propagating, with the flat index of
    its first maximum. Every window is masked out of the whole plane (O(out · in) elements)."""
    nd = len(output_size)
    spatial = x.shape[-nd:]
    plane = x.reshape(*x.shape[:-nd], *([1] * nd), -1)                 # (..., 1.., H·W..)
    inside = None
    for i, (n, o) in enumerate(zip(spatial, output_size)):
        idx = torch.arange(o)
        start, end = (idx * n) // o, ((idx + 1) * n + o - 1) // o
        pos = torch.arange(n)
        m = (pos >= start[:, None]) & (pos < end[:, None])                 # (o, n)
        shape = [1] * nd + [1] * nd
        shape[i], shape[nd + i] = o, n
        m = m.reshape(shape)
        inside = m if inside is None else inside & m
    inside = inside.reshape(*output_size, -1)                            # (o.., H·W..)
    lowest = torch.full((), float("-inf") if x.is_floating_point() else torch.iinfo(x.dtype).min, dtype=x.dtype)
    vals = torch.where(inside, plane, lowest)
    return vals.amax(-1), vals.argmax(-1)


OURS: dict[object, tuple[Callable, str]] = present({
    aten.empty_permuted.default: (lambda size, physical_layout, **kw: torch.empty(
        [size[p] for p in physical_layout], **kw).permute([physical_layout.index(d) for d in range(len(size))]),
        "empty in the physical order, permuted to the logical one (ATen's own definition)"),
    aten.linalg_solve_triangular.default: (linalg.solve_triangular, "substitution unrolled over rows"),
    aten.triangular_solve.default: (linalg.triangular_solve, "substitution unrolled over rows"),
    aten.linalg_cholesky_ex.default: (linalg.cholesky_ex, "Cholesky-Banachiewicz unrolled over columns"),
    aten_overload("cholesky.default"): (linalg.cholesky, "Cholesky-Banachiewicz unrolled over columns"),
    aten.cholesky_solve.default: (linalg.cholesky_solve, "two triangular solves"),
    aten.cholesky_inverse.default: (linalg.cholesky_inverse, "two triangular solves against the identity"),
    aten.linalg_lu_factor_ex.default: (linalg.lu_factor_ex, "partial-pivoting elimination unrolled over columns"),
    aten.linalg_lu_solve.default: (linalg.lu_solve, "row interchanges and two triangular solves"),
    aten.lu_unpack.default: (linalg.lu_unpack, "triangles of LU; permutation from the interchanges"),
    aten.linalg_lu.default: (linalg.lu, "LU factor + unpack"),
    aten._linalg_svd.default: (jacobi.svd, "one-sided Jacobi, round-robin sweeps unrolled, float64"),
    aten._linalg_eigh.default: (jacobi.eigh, "two-sided cyclic Jacobi, round-robin sweeps unrolled, float64"),
    aten.linalg_pinv.atol_rtol_tensor: (jacobi.pinv, "V diag(1/σ above tol) Uᵀ from the Jacobi SVD / eigh"),
    aten._linalg_det.default: (linalg.det, "LU: product of U's diagonal times the permutation's sign"),
    aten._linalg_slogdet.default: (linalg.slogdet, "LU: signs and log-magnitudes of U's diagonal"),
    aten.linalg_inv_ex.default: (linalg.inv_ex, "LU solves against the identity"),
    aten._linalg_solve_ex.default: (linalg.solve_ex, "LU factor + LU solve"),
    aten.geqrf.default: (householder.geqrf, "dgeqr2: dlarfg + dlarf unrolled over columns"),
    aten.linalg_qr.default: (householder.linalg_qr, "geqrf, then the reflectors applied to identity columns"),
    aten.ormqr.default: (householder.ormqr, "dorm2r: the reflectors applied one by one"),
    aten.linalg_householder_product.default: (householder.householder_product,
                                              "dorg2r: the reflectors applied to identity columns"),
    aten.max_pool2d_with_indices.default: (max_pool.max_pool2d_with_indices,
                                           "a compare-select per tap over strided views of the padded input"),
    aten.max_pool3d_with_indices.default: (max_pool.max_pool3d_with_indices,
                                           "a compare-select per tap over strided views of the padded input"),
    aten.adaptive_max_pool2d.default: (_adaptive_max_pool, "windows masked out of the plane, amax + argmax"),
    aten.adaptive_max_pool3d.default: (_adaptive_max_pool, "windows masked out of the volume, amax + argmax"),
    aten.addbmm.default: (_addbmm, "batched matmul summed over the batch"),
    aten._trilinear.default: (_trilinear, "inputs unsqueezed, multiplied with broadcasting, summed over sumdim"),
    aten.nonzero_static.default: (_nonzero_static, "running nonzero count picks each output slot"),
    aten.segment_reduce.default: (_segment_reduce, "membership mask per segment, then one masked reduction"),
    aten.index_reduce.default: (_index_reduce, "scatter_reduce with the index broadcast along dim"),
    aten._cdist_forward.default: (_cdist_forward, "pairwise differences, or ATen's matmul form for large p=2"),
    aten._pdist_forward.default: (distance.pdist_forward, "row pairs from the triangle's closed form, gathered"),
    aten._pdist_backward.default: (distance.pdist_backward, "ATen's per-p terms index_added to both rows"),
    aten.put.default: (_put, "index_put on the flattened tensor"),
    aten.masked_scatter.default: (_masked_scatter, "gather of source at the mask's running count"),
    aten._transformer_encoder_layer_fwd.default: (transformer.transformer_encoder_layer_fwd,
                                                  "TransformerEncoderLayer's fast path as attention, FFN, LayerNorms"),
    aten.masked_scatter_backward.default: (_masked_scatter_backward, "scatter-add of grad at the running count"),
    aten._embedding_bag_forward_only.default: (embedding.embedding_bag, "bag-membership matmul, or masked amax"),
    aten._embedding_bag.default: (embedding.embedding_bag, "bag-membership matmul, or masked amax"),
    aten.embedding_renorm.default: (embedding.embedding_renorm, "referenced rows over max_norm rescaled"),
    aten.grid_sampler_3d.default: (sampling.grid_sampler_3d, "8 corner gathers with trilinear weights, or the nearest"),
    aten.take.default: (lambda x, index: x.reshape(-1).gather(
        0, torch.where(index < 0, index + x.numel(), index).reshape(-1)).reshape(index.shape),
        "gather from the flattened input (negative indices wrap); a 0-d index is a tensor, not .item()"),
    aten.diagonal_scatter.default: (view_scatter.diagonal_scatter, "src merged where the diagonal mask holds"),
    aten.as_strided_scatter.default: (view_scatter.as_strided_scatter, "index_put at the view's flat offsets"),
    aten.histc.default: (histogram.histc, "bin index by linear interpolation, one-hot counts"),
    aten.histogram.bin_ct: (histogram.histogram_bin_ct, "ATen's linspace edges, bin by edge count, one-hot counts"),
    aten.histogram.bins_tensor: (histogram.histogram_bins_tensor, "bin by edge count, one-hot counts"),
    aten._histogramdd_bin_edges.default: (histogram.histogramdd_bin_edges, "per-dim outer edges, ATen's linspace"),
    aten._histogramdd_from_bin_cts.default: (histogram.histogramdd_from_bin_cts, "flat bin index, one-hot counts"),
    aten._histogramdd_from_bin_tensors.default: (histogram.histogramdd_from_bin_tensors,
                                                 "std::upper_bound unrolled per dim, one-hot counts"),
    aten.median.dim: (_median_dim, "stable sort, then the element at the lower-median position"),
    aten.median.default: (lambda x: NotImplemented if _host_sized(x, None) else _median_dim(x.reshape(-1), 0)[0],
                          "median of the flattened input"),
    aten.nanmedian.dim: (_nanmedian_dim, "stable sort (NaN last), lower median of the non-NaN prefix"),
    aten.nanmedian.default: (lambda x: NotImplemented if _host_sized(x, None) else _nanmedian_dim(x.reshape(-1), 0)[0],
                             "nanmedian of the flattened input"),
    aten.mode.default: (_mode, "O(n^2) equal-value counts; ties to the smallest value, its last index"),
    aten.kthvalue.default: (_kthvalue, "stable sort, then the element at position k - 1"),
    aten.avg_pool2d.default: (separable.avg_pool(2), "window-weight matrix per spatial dim, as matmuls"),
    aten.avg_pool3d.default: (separable.avg_pool(3), "window-weight matrix per spatial dim, as matmuls"),
    aten.avg_pool2d_backward.default: (separable.avg_pool_backward(2), "the transposed window matrices"),
    aten.avg_pool3d_backward.default: (separable.avg_pool_backward(3), "the transposed window matrices"),
    aten._adaptive_avg_pool2d_backward.default: (separable.adaptive_avg_pool_backward(2),
                                                 "the transposed adaptive window matrices"),
    aten._adaptive_avg_pool3d.default: (separable.adaptive_avg_pool(3), "adaptive window matrix per spatial dim"),
    aten._adaptive_avg_pool3d_backward.default: (separable.adaptive_avg_pool_backward(3),
                                                 "the transposed adaptive window matrices"),
    aten._upsample_bilinear2d_aa.default: (separable.upsample_aa(False), "antialias weight matrix per spatial dim"),
    aten._upsample_bicubic2d_aa.default: (separable.upsample_aa(True), "antialias weight matrix per spatial dim"),
    aten._upsample_bilinear2d_aa_backward.default: (separable.upsample_aa_backward(False),
                                                    "the transposed antialias weight matrices"),
    aten._upsample_bicubic2d_aa_backward.default: (separable.upsample_aa_backward(True),
                                                   "the transposed antialias weight matrices"),
    aten.replication_pad1d_backward.default: (separable.replication_pad_backward(1), "one-hot clamp matrix, transposed"),
    aten.replication_pad2d_backward.default: (separable.replication_pad_backward(2), "one-hot clamp matrix, transposed"),
    aten.replication_pad3d_backward.default: (separable.replication_pad_backward(3), "one-hot clamp matrix, transposed"),
    aten._softmax.default: (_softmax, "amax, sub, exp, sum, then times 1/sum along the last dim as ATen's CPU kernel"),
    aten.native_dropout.default: (_native_dropout, "mask from host bernoulli, matching eager's RNG stream"),
    aten._scaled_dot_product_flash_attention_for_cpu.default: (
        _sdpa_flash_cpu, "torch's decomposition for the output; the row logsumexp of the masked scores"),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (
        _sdpa_flash_cpu_backward, "FlashAttention backward as matmuls (the forward is in the core table)"),
    aten.erfinv.default: (erf_family.erfinv, "ATen calc_erfinv's start + 3 Newton steps (erfc residual), float64"),
    aten.special_ndtri.default: (erf_family.ndtri, "ATen/Cephes ndtri: three rational approximations, float64"),
    aten.special_erfcx.default: (erf_family.erfcx, "ATen/Johnson erfcx: 100-piece table gathered, continued fraction"),
    aten.special_log_ndtr.default: (erf_family.log_ndtr, "ATen calc_log_ndtr (split at x < -1), float64"),
    aten.lgamma.default: (special.lgamma, "Lanczos (g=7, n=9) + reflection, float64 elementwise"),
    aten.digamma.default: (special.digamma, "ATen calc_digamma: reflection, fixed shift of 10, asymptotic series"),
    aten.polygamma.default: (special.polygamma, "digamma / ATen trigamma / (-1)^(n+1) n! zeta(n+1, x)"),
    aten.special_zeta.default: (special.zeta, "ATen zeta: 10 direct terms + Euler-Maclaurin, unrolled"),
    aten.i0.default: (bessel.i0, "ATen calc_i0: Chebyshev series on [0, 8] and (8, inf), float64"),
    aten.special_i0e.default: (bessel.i0e, "ATen calc_i0e: Chebyshev series on [0, 8] and (8, inf), float64"),
    aten.special_i1.default: (bessel.i1, "ATen calc_i1: Chebyshev series on [0, 8] and (8, inf), float64"),
    aten.special_i1e.default: (bessel.i1e, "ATen calc_i1e: Chebyshev series on [0, 8] and (8, inf), float64"),
    aten.special_bessel_j0.default: (bessel.bessel_j0, "ATen bessel_j0_forward: rational on [0, 5], Hankel form above"),
    aten.special_bessel_j1.default: (bessel.bessel_j1, "ATen bessel_j1_forward: rational on [0, 5], Hankel form above"),
    aten.special_bessel_y0.default: (bessel.bessel_y0, "ATen bessel_y0_forward: rational + (2/pi) log(x) J0, Hankel"),
    aten.special_bessel_y1.default: (bessel.bessel_y1, "ATen bessel_y1_forward: rational + (2/pi) log(x) J1, Hankel"),
    aten.special_modified_bessel_i0.default: (bessel.modified_bessel_i0, "ATen modified_bessel_i0_forward (= calc_i0)"),
    aten.special_modified_bessel_i1.default: (bessel.modified_bessel_i1, "ATen modified_bessel_i1_forward, Chebyshev"),
    aten.special_modified_bessel_k0.default: (bessel.modified_bessel_k0, "ATen modified_bessel_k0_forward, Chebyshev"),
    aten.special_modified_bessel_k1.default: (bessel.modified_bessel_k1, "ATen modified_bessel_k1_forward, Chebyshev"),
    aten.special_scaled_modified_bessel_k0.default: (bessel.scaled_modified_bessel_k0,
                                                     "ATen scaled_modified_bessel_k0_forward, Chebyshev"),
    aten.special_scaled_modified_bessel_k1.default: (bessel.scaled_modified_bessel_k1,
                                                     "ATen scaled_modified_bessel_k1_forward, Chebyshev"),
    aten.special_spherical_bessel_j0.default: (bessel.spherical_bessel_j0, "sin(x)/x; Taylor series for |x| < 0.5"),
    aten.special_airy_ai.default: (bessel.airy_ai, "ATen airy_ai_forward: asymptotic forms, power series (masked)"),
})

OURS.update(foreach.table())  # the optimizers' _foreach_* ops, one entry per overload

# Lowered ops decomposed in one case their lowering rule cannot express; the decomposition returns
# NotImplemented in every other case, so AOTAutograd keeps the op for its lowering rule.
WHERE_LOWERING_DIFFERS: dict[object, tuple[Callable, str]] = {
    aten.slice_scatter.default: (view_scatter.slice_scatter_overlapping,
                                 "input overlapping itself: ATen's storage-level write (clone_preserve_strides)"),
    aten.select_scatter.default: (view_scatter.select_scatter_overlapping,
                                  "input overlapping itself: ATen's storage-level write (clone_preserve_strides)"),
}


def check_disjoint(table: dict, lowered: dict) -> None:
    """Raise ``RuntimeError`` if an op we chose to decompose also has a lowering rule."""
    ours = set(OURS) | set(get_decompositions(list(EXTRA_REFERENCE)))
    both = sorted(str(op) for op in ours if op in lowered)
    if both:
        raise RuntimeError(f"ops both decomposed and lowered: {both}; remove one of the two")


@lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """``{OpOverload: decomposition}`` for AOTAutograd (built once per process)."""
    from neuron_compile.lowering.registry import lowering_rules
    lowered = lowering_rules()
    table = {op: fn for op, fn in core_aten_decompositions().items() if op not in lowered}
    table.update(get_decompositions(list(EXTRA_REFERENCE)))
    table.update({op: fn for op, (fn, _reason) in OURS.items()})
    check_disjoint(table, lowered)
    table.update({op: fn for op, (fn, _reason) in WHERE_LOWERING_DIFFERS.items()})
    return table
