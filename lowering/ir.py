"""Textual MLIR building blocks: element types, tensor values, SSA naming, affine maps.

We emit MLIR as text (parsed and verified by ``mlir-opt`` in a separate process), so nothing inside
LLVM ever runs in the user's process: an assertion failure there becomes a typed error, not a dead
training job. The syntax follows the MLIR LangRef and the builtin/tensor/linalg dialect docs of
LLVM 22.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

_ELEMENT_TYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "i8",
    torch.bool: "i1",
}

UNSIGNED = frozenset({torch.uint8, torch.bool})


def supported_dtype(dtype: torch.dtype) -> bool:
    return dtype in _ELEMENT_TYPES


def element_type(dtype: torch.dtype) -> str:
    """MLIR element type of a torch dtype (signedness is carried by the ops, as in MLIR's arith)."""
    try:
        return _ELEMENT_TYPES[dtype]
    except KeyError:
        from neuron_compile.errors import LoweringError
        raise LoweringError(f"dtype {dtype} has no MLIR element type in neuron-compile") from None


def storage_type(dtype: torch.dtype) -> str:
    """Element type of tensors/memrefs: like :func:`element_type` but ``bool`` is stored as ``i8``
    (one byte, as torch stores it; MLIR's memref-to-LLVM lowering rejects ``i1`` stores)."""
    return "i8" if dtype == torch.bool else element_type(dtype)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def tensor_type(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    """``tensor<4x8xf32>``; ``tensor<f32>`` for 0-d."""
    dims = "".join(f"{d}x" for d in shape)
    return f"tensor<{dims}{storage_type(dtype)}>"


def memref_type(shape: tuple[int, ...], dtype: torch.dtype, strides: tuple[int, ...],
                offset: int | None = None) -> str:
    """A memref with the exact element strides of a torch tensor (identity layout if contiguous and
    no ``offset`` is given; a subview's type carries its static ``offset`` in elements)."""
    dims = "".join(f"{d}x" for d in shape)
    if offset is None and tuple(strides) == contiguous_strides(shape):
        return f"memref<{dims}{storage_type(dtype)}>"
    off = "" if offset is None else f", offset: {offset}"
    return f"memref<{dims}{storage_type(dtype)}, strided<[{', '.join(map(str, strides))}]{off}>>"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw little-endian bytes of ``t`` in row-major order (bool as one byte per element)."""
    flat = t.detach().cpu().reshape(-1).clone(memory_format=torch.contiguous_format)  # real, unit-stride storage
    flat = flat.to(torch.uint8) if flat.dtype == torch.bool else flat
    return flat.view(torch.uint8).numpy().tobytes()


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def reassociation(groups: Sequence[Sequence[int]]) -> str:
    """A reshape's reassociation attribute, ``[[0, 1], [2]]`` (``[]`` for none)."""
    return "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"


def affine_map(rank: int, results: list[str]) -> str:
    """``affine_map<(d0, d1) -> (d0, 0)>`` with ``results`` as expressions of d0..d{rank-1}."""
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({dims}) -> ({', '.join(results)})>"


_BITS_AS = {torch.float32: (torch.int32, 8), torch.float64: (torch.int64, 16),
            torch.float16: (torch.int16, 4), torch.bfloat16: (torch.int16, 4)}


def float_literal(value: float, dtype: torch.dtype) -> str:
    """The exact bit pattern of ``value`` rounded to ``dtype`` as torch rounds it, as a hex literal
    (MLIR accepts hex float literals for ``arith.constant``; no decimal round trip)."""
    int_dtype, digits = _BITS_AS[dtype]
    bits = torch.tensor(value, dtype=dtype).view(int_dtype).item() & ((1 << (4 * digits)) - 1)
    return f"0x{bits:0{digits}X}"


@dataclass(frozen=True)
class TensorValue:
    """An SSA value of ranked tensor type in the function being emitted."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Scalar:
    """An SSA value of scalar type inside a region body (or the function body)."""

    name: str
    dtype: torch.dtype

    @property
    def type(self) -> str:
        return element_type(self.dtype)


class Namer:
    """Hands out unique SSA names for one function (regions included, so no shadowing)."""

    def __init__(self) -> None:
        self._n = 0

    def __call__(self, prefix: str = "v") -> str:
        self._n += 1
        return f"%{prefix}{self._n}"
