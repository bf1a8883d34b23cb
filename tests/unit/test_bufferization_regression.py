"""Regression for a bufferization miscompile seen with MLIR's eliminate-empty-tensors (LLVM 22.1.8)."""
from __future__ import annotations

import ctypes

import torch

from neuron_compile.compiler import mlir_to_llvm
from neuron_compile.plan import TensorSpec
from neuron_compile.runtime import _descriptor, load_shared_object
from neuron_compile.target import HostCPU

# (m * c).sum(0) and m.sum(0) with m = a * b, as our emitter wrote it: after CSE both reductions start
# from ONE zero-filled init; eliminate-empty-tensors then made the second sum accumulate into the
# first one's output buffer.
TWO_SUMS = """module {
  func.func @neuron_kernel(%arg_in0: memref<8x32xf32>, %arg_in1: memref<8x32xf32>, %arg_in2: memref<8x32xf32>, %arg_out0: memref<32xf32>, %arg_out1: memref<32xf32>) attributes {llvm.emit_c_interface} {
    %in1 = bufferization.to_tensor %arg_in0 restrict : memref<8x32xf32> to tensor<8x32xf32>
    %in2 = bufferization.to_tensor %arg_in1 restrict : memref<8x32xf32> to tensor<8x32xf32>
    %in3 = bufferization.to_tensor %arg_in2 restrict : memref<8x32xf32> to tensor<8x32xf32>
    %t4 = tensor.empty() : tensor<8x32xf32>
    %t9 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%in1, %in2 : tensor<8x32xf32>, tensor<8x32xf32>) outs(%t4 : tensor<8x32xf32>) {
    ^bb0(%a5: f32, %a6: f32, %a7: f32):
      %s8 = arith.mulf %a5, %a6 : f32
      linalg.yield %s8 : f32
    } -> tensor<8x32xf32>
    %t10 = tensor.empty() : tensor<8x32xf32>
    %t15 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%t9, %in3 : tensor<8x32xf32>, tensor<8x32xf32>) outs(%t10 : tensor<8x32xf32>) {
    ^bb0(%a11: f32, %a12: f32, %a13: f32):
      %s14 = arith.mulf %a11, %a12 : f32
      linalg.yield %s14 : f32
    } -> tensor<8x32xf32>
    %t16 = tensor.empty() : tensor<32xf32>
    %s17 = arith.constant 0x00000000 : f32
    %t18 = linalg.fill ins(%s17 : f32) outs(%t16 : tensor<32xf32>) -> tensor<32xf32>
    %t22 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>], iterator_types = ["reduction", "parallel"]} ins(%t15 : tensor<8x32xf32>) outs(%t18 : tensor<32xf32>) {
    ^bb0(%a19: f32, %a20: f32):
      %s21 = arith.addf %a20, %a19 : f32
      linalg.yield %s21 : f32
    } -> tensor<32xf32>
    %t23 = tensor.empty() : tensor<32xf32>
    %s24 = arith.constant 0x00000000 : f32
    %t25 = linalg.fill ins(%s24 : f32) outs(%t23 : tensor<32xf32>) -> tensor<32xf32>
    %t29 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>], iterator_types = ["reduction", "parallel"]} ins(%t9 : tensor<8x32xf32>) outs(%t25 : tensor<32xf32>) {
    ^bb0(%a26: f32, %a27: f32):
      %s28 = arith.addf %a27, %a26 : f32
      linalg.yield %s28 : f32
    } -> tensor<32xf32>
    bufferization.materialize_in_destination %t22 in restrict writable %arg_out0 : (tensor<32xf32>, memref<32xf32>) -> ()
    bufferization.materialize_in_destination %t29 in restrict writable %arg_out1 : (tensor<32xf32>, memref<32xf32>) -> ()
    return
  }
}
"""


def test_two_sums_sharing_an_init(tmp_path):
    path = tmp_path / "kernel.linalg.mlir"
    path.write_text(TWO_SUMS)
    so = HostCPU.detect().codegen(mlir_to_llvm(path, tmp_path, 120), tmp_path, 2, 120)
    fn, _lib = load_shared_object(so)
    a, b, c = torch.randn(8, 32), torch.randn(8, 32), torch.randn(8, 32)
    out0, out1 = torch.empty(32), torch.empty(32)
    args = [a, b, c, out0, out1]
    fn(*[ctypes.byref(_descriptor(t, TensorSpec.of(t))) for t in args])
    torch.testing.assert_close(out0, (a * b * c).sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out1, (a * b).sum(0), rtol=1e-5, atol=1e-5)
