"""Functional decompositions of the ``*_scatter`` ops that write ``src`` into a view of ``input``.

``torch._refs`` decomposes them by copying into a view of a clone (``prims.copy_to``), which is not
functional, so AOTAutograd rejects it. Here the view's elements are selected by index arithmetic
instead, and ``src`` is merged with ``where`` (diagonal) or written with ``index_put`` (as_strided),
ops we lower. Semantics: PyTorch's ``diagonal_scatter`` / ``as_strided_scatter`` docs.

Storage semantics. ATen builds every ``*_scatter`` result with ``clone_preserve_strides``
(``TensorShape.cpp``): a copy of ``input``'s whole storage, seen with ``input``'s strides and
storage offset, into whose view ``src`` is copied. Where ``input`` overlaps itself (an
``as_strided`` view with strides (1, 1)), a write through the view changes every element that
shares its memory location; ``as_strided_scatter``'s view is placed in that storage, not in the
logical elements. :func:`storage_scatter` reproduces this from the fake value's strides; the
``*_OVERLAPPING`` forms use it only where ``input`` overlaps itself, otherwise the op is lowered.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch


def diagonal_scatter(input, src, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """``input`` with ``input.diagonal(offset, dim1, dim2)`` replaced by ``src``.

    input: (..., n1, ..., n2, ...); src: input's shape without dim1 and dim2, plus (L,), the
    diagonal's length. Same dtype as input."""
    if overlaps_itself(input):
        return storage_scatter(input, src, lambda at: at.diagonal(offset, dim1, dim2), _own_span(input))
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


Layout = tuple[tuple[int, ...], int]   # (strides, storage offset) of a value of known shape


def clone_layout(t: torch.Tensor) -> Layout:
    """Strides and storage offset of ATen's ``clone_preserve_strides(t)``, the ``*_scatter`` ops'
    result: ``t``'s own, except where ``t`` surely overlaps itself (a stride 0 over a size > 1,
    ``has_internal_overlap`` = YES), which is cloned densely (contiguous, offset 0)."""
    if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        strides, acc = [], 1
        for n in reversed(t.shape):
            strides.insert(0, acc)
            acc *= max(n, 1)
        return tuple(strides), 0
    return tuple(t.stride()), t.storage_offset()


def _positions(shape, layout: Layout, arange=torch.arange, full=None):
    strides, offset = layout
    at = torch.full((), offset, dtype=torch.int64) if full is None else full(offset)
    for d, (n, st) in enumerate(zip(shape, strides)):
        at = at + (arange(n) * st).reshape([n if k == d else 1 for k in range(len(shape))])
    return at


def _span(shape, stride, offset: int) -> tuple[int, int]:
    """Lowest and highest storage index of a non-empty view (strides are never negative in torch)."""
    return offset, offset + sum((n - 1) * st for n, st in zip(shape, stride))


def overlaps_itself(t: torch.Tensor) -> bool:
    """True if two elements of ``t``'s :func:`clone_layout` share a memory location (exact, from
    the static shape and strides; ATen's ``has_internal_overlap`` answers "too hard" here)."""
    if t.numel() <= 1 or t.is_contiguous():
        return False
    at = _positions(tuple(t.shape), clone_layout(t), lambda n: np.arange(n, dtype=np.int64),
                    lambda v: np.full((), v, dtype=np.int64))
    return np.unique(at).size < t.numel()


def storage_scatter(input: torch.Tensor, src: torch.Tensor,
                    written: Callable[[torch.Tensor], torch.Tensor], write_span: tuple[int, int]) -> torch.Tensor:
    """ATen's ``*_scatter`` at the level of storage: ``input``'s elements placed in a flat copy of
    the storage they cover (laid out as :func:`clone_layout`), ``src`` written at the storage
    indices ``written(positions)`` picks (``positions`` relative to the lowest index either side),
    and the result read back through that layout. ``write_span``: lowest and highest storage index
    written. Same shape and dtype as ``input``."""
    if input.numel() == 0:
        return input.clone()
    layout = clone_layout(input)
    lo_in, hi_in = _span(input.shape, *layout)
    lo, hi = min(lo_in, write_span[0]), max(hi_in, write_span[1])
    at = _positions(tuple(input.shape), layout).expand(input.shape) - lo
    flat = input.new_zeros(hi - lo + 1).index_put((at.reshape(-1),), input.reshape(-1))
    if src.numel():
        flat = flat.index_put((written(at).reshape(-1),), src.reshape(-1).to(input.dtype))
    return flat[at]


def as_strided_scatter(input, src, size, stride, storage_offset=None):
    """``input`` with the elements of its ``as_strided(size, stride, storage_offset)`` view replaced
    by ``src`` (shape ``size``). As ATen's, the view is placed in the storage of the result
    (:func:`clone_layout`: absolute storage indices, default offset the result's), so a
    non-contiguous or offset ``input`` sees the writes where eager's does. Where the view overlaps
    itself, which write wins is unspecified, as in eager."""
    own = clone_layout(input)[1]
    offset = own if storage_offset is None else storage_offset
    if math.prod(size) == 0:
        return input.clone()
    origin = min(own, offset)  # storage_scatter's index 0: the lowest one either side
    return storage_scatter(input, src, lambda at: _positions(tuple(size), (tuple(stride), offset - origin)),
                           _span(size, stride, offset))


def _own_span(input: torch.Tensor) -> tuple[int, int]:
    return _span(input.shape, *clone_layout(input))


def slice_scatter_overlapping(input, src, dim=0, start=None, end=None, step=1):
    """``slice_scatter`` where ``input`` overlaps itself (storage semantics, see the module doc);
    ``NotImplemented`` otherwise, so the op keeps its lowering rule."""
    if not overlaps_itself(input):
        return NotImplemented
    return storage_scatter(input, src, lambda at: torch.ops.aten.slice.Tensor(at, dim, start, end, step),
                           _own_span(input))


def select_scatter_overlapping(input, src, dim, index):
    """``select_scatter`` where ``input`` overlaps itself; ``NotImplemented`` otherwise."""
    if not overlaps_itself(input):
        return NotImplemented
    return storage_scatter(input, src, lambda at: at.select(dim, index), _own_span(input))
