"""Textual MLIR building blocks: element types, tensor values, SSA naming, affine maps.

We emit MLIR as text (parsed and verified by ``mlir-opt`` in a separate process), so nothing inside
LLVM ever runs in the user's process: an assertion failure there becomes a typed error, not a dead
training job. The syntax follows the MLIR LangRef and the builtin/tensor/linalg dialect docs of
LLVM 22.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

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


def element_type(dtype: torch.dtype) -> str:
    """MLIR element type of a torch dtype (signedness is carried by the ops, as in MLIR's arith)."""
    try:
        return _ELEMENT_TYPES[dtype]
    except KeyError:
        from neuron_compile.errors import LoweringError
        raise LoweringError(f"dtype {dtype} has no MLIR element type in neuron-compile") from None


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def tensor_type(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    """``tensor<4x8xf32>``; ``tensor<f32>`` for 0-d."""
    dims = "".join(f"{d}x" for d in shape)
    return f"tensor<{dims}{element_type(dtype)}>"


def memref_type(shape: tuple[int, ...], dtype: torch.dtype, strides: tuple[int, ...]) -> str:
    """A memref with the exact element strides of a torch tensor (identity layout if contiguous)."""
    dims = "".join(f"{d}x" for d in shape)
    if tuple(strides) == contiguous_strides(shape):
        return f"memref<{dims}{element_type(dtype)}>"
    return f"memref<{dims}{element_type(dtype)}, strided<[{', '.join(map(str, strides))}]>>"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def affine_map(rank: int, results: list[str]) -> str:
    """``affine_map<(d0, d1) -> (d0, 0)>`` with ``results`` as expressions of d0..d{rank-1}."""
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({dims}) -> ({', '.join(results)})>"


def float_literal(value: float, dtype: torch.dtype) -> str:
    """A literal accepted by ``arith.constant`` for a float type (hex for inf/nan)."""
    if math.isnan(value):
        return {"f32": "0x7FC00000", "f64": "0x7FF8000000000000", "f16": "0x7E00",
                "bf16": "0x7FC0"}[element_type(dtype)]
    if math.isinf(value):
        pos = value > 0
        return {"f32": ("0x7F800000", "0xFF800000"), "f64": ("0x7FF0000000000000", "0xFFF0000000000000"),
                "f16": ("0x7C00", "0xFC00"), "bf16": ("0x7F80", "0xFF80")}[element_type(dtype)][0 if pos else 1]
    return repr(float(value))


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
