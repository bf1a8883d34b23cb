"""Functional decompositions of the ``*_scatter`` ops that write ``src`` into a view of ``input``.

``torch._refs`` decomposes them by copying into a view of a clone (``prims.copy_to``), which is not
functional, so AOTAutograd rejects it. Here the view's elements are selected by index arithmetic
instead, and ``src`` is merged with ``where`` (diagonal) or written with ``index_put`` (as_strided),
ops we lower. Semantics: PyTorch's ``diagonal_scatter`` / ``as_strided_scatter`` docs.
"""
from __future__ import annotations

import math

import torch


def diagonal_scatter(input, src, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """``input`` with ``input.diagonal(offset, dim1, dim2)`` replaced by ``src``.

    input: (..., n1, ..., n2, ...); src: input's shape without dim1 and dim2, plus (L,), the
    diagonal's length. Same dtype as input."""
    dim1, dim2 = dim1 % input.dim(), dim2 % input.dim()
    x = input.movedim((dim1, dim2), (-2, -1))
    n1, n2 = x.shape[-2:]
    rows = torch.arange(n1).unsqueeze(1)
    cols = torch.arange(n2).unsqueeze(0)
    on_diagonal = cols - rows == offset                                 # (n1, n2)
    if src.shape[-1] == 0:
        return input.clone()
    k = (rows - max(-offset, 0)).clamp(0, src.shape[-1] - 1).expand(n1, n2)  # position along the diagonal
    picked = src.unsqueeze(-2).expand(*src.shape[:-1], n1, src.shape[-1]).gather(
        -1, k.expand(*src.shape[:-1], n1, n2))
    return torch.where(on_diagonal, picked.to(x.dtype), x).movedim((-2, -1), (dim1, dim2))


def as_strided_scatter(input, src, size, stride, storage_offset=None):
    """``input`` (taken as contiguous, as the values of an FX graph are) with the elements of its
    ``as_strided(size, stride, storage_offset)`` view replaced by ``src`` (shape ``size``). Where
    the view overlaps itself, which write wins is unspecified, as in eager."""
    flat = input.reshape(-1)
    at = torch.full((), storage_offset or 0, dtype=torch.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        at = at + (torch.arange(n) * st).reshape(shape)
    if math.prod(size) == 0:
        return input.clone()
    return flat.index_put((at.reshape(-1),), src.reshape(-1).to(input.dtype)).reshape(input.shape)
