"""MLIR text building blocks: literals, types, locations."""
from __future__ import annotations

import struct

import torch

from neuron_compile.lowering.ir import float_literal, memref_type, tensor_type
from neuron_compile.lowering.locations import mlir_location, user_location


def test_float_literals_are_exact_bit_patterns():
    assert float_literal(1e-5, torch.float32) == "0x" + struct.pack(">f", 1e-5).hex().upper()
    assert float_literal(0.1, torch.float64) == "0x" + struct.pack(">d", 0.1).hex().upper()
    assert float_literal(float("-inf"), torch.float32) == "0xFF800000"
    assert float_literal(-0.0, torch.float32) == "0x80000000"


def test_types_store_bool_as_bytes_and_keep_strides():
    assert tensor_type((2, 3), torch.bool) == "tensor<2x3xi8>"
    assert tensor_type((), torch.float32) == "tensor<f32>"
    assert memref_type((2, 3), torch.float32, (3, 1)) == "memref<2x3xf32>"
    assert memref_type((2, 3), torch.float32, (1, 2)) == "memref<2x3xf32, strided<[1, 2]>>"


def test_locations_point_at_the_user_frame_not_torch():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.ops.aten.relu.default, (x,))
    torch_file = torch.__file__
    n.meta["stack_trace"] = (f'  File "/home/u/train.py", line 12, in forward\n    y = x.relu()\n'
                             f'  File "{torch_file}", line 99, in relu\n    return ...\n')
    assert user_location(n) == "/home/u/train.py:12"
    assert mlir_location(n) == 'loc("aten.relu.default relu_default"("/home/u/train.py":12:0))'
    n.meta["stack_trace"] = ""
    assert user_location(n) == "<unknown location>"
    assert mlir_location(n) == 'loc("aten.relu.default relu_default")'


def test_tensor_bytes_of_expanded_and_0d_constants():
    from neuron_compile.lowering.ir import tensor_bytes
    assert tensor_bytes(torch.tensor(1.5)) == struct.pack("<f", 1.5)
    assert tensor_bytes(torch.tensor([2.0]).expand(3)) == struct.pack("<3f", 2.0, 2.0, 2.0)
    assert tensor_bytes(torch.tensor([True, False])) == b"\x01\x00"
