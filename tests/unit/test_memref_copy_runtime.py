"""Kernels carry their own ``memrefCopy`` (strided copies) instead of loading MLIR's runner utils."""
from __future__ import annotations

import ctypes

import torch

from neuron_compile.compiler import mlir_to_llvm
from neuron_compile.runtime import descriptor_type, load_shared_object
from neuron_compile.plan import TensorSpec
from neuron_compile.target import HostCPU

STRIDED_COPY = """
func.func @neuron_kernel(%src: memref<3x4xf32, strided<[1, 3]>>, %dst: memref<3x4xf32, strided<[8, 2], offset: 1>>)
    attributes {llvm.emit_c_interface} {
  memref.copy %src, %dst : memref<3x4xf32, strided<[1, 3]>> to memref<3x4xf32, strided<[8, 2], offset: 1>>
  return
}
"""


def _desc(t: torch.Tensor, offset: int, shape, strides):
    d = descriptor_type(len(shape))()
    d.allocated = d.aligned = t.data_ptr()
    d.offset = offset
    d.sizes[:] = shape
    d.strides[:] = strides
    return d


def test_strided_memref_copy_runs_without_mlir_runtime_library(tmp_path):
    src_path = tmp_path / "kernel.linalg.mlir"
    src_path.write_text(STRIDED_COPY)
    llvm = mlir_to_llvm(src_path, tmp_path, timeout=120)
    assert "llvm.call @memrefCopy" in llvm.read_text()  # the strided copy really goes through the runtime
    so = HostCPU.detect().codegen(llvm, tmp_path, 2, 120)
    fn, lib = load_shared_object(so)
    src = torch.randn(4, 3).t()                 # 3x4 with strides (1, 3)
    dst_storage = torch.zeros(32)
    fn(ctypes.byref(_desc(src, 0, (3, 4), (1, 3))), ctypes.byref(_desc(dst_storage, 1, (3, 4), (8, 2))))
    expected = torch.zeros(32)
    torch.as_strided(expected, (3, 4), (8, 2), 1).copy_(src)
    torch.testing.assert_close(dst_storage, expected)
    assert TensorSpec.of(src).stride == (1, 3)
