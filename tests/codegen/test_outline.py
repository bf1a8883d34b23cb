"""Kernels are outlined into functions of their own while their schedules run (compile time linear
in the graph's size), and the module mlir-opt then gets is the same computation."""
from __future__ import annotations

import re
import subprocess

import torch
import torch.nn.functional as F

from neuron_compile.codegen import TargetInfo, plan_codegen
from neuron_compile.codegen.outline import outline_kernels
from neuron_compile.toolchain import tool
from tests.ir.lower import lower


def _train_like(x, w1, b1, w2, g):
    h = F.layer_norm(F.gelu(x @ w1.t() + b1), (w1.shape[0],))
    y = (h @ w2).softmax(-1)
    # two column sums of the same shape (a bias gradient and its sibling) and a topk (multi-result)
    return y.sum(0), (g * h).sum(0), h.sum(0), torch.topk(h, 2, dim=-1).indices


def _lowered():
    args = (torch.randn(8, 16), torch.randn(32, 16), torch.randn(32), torch.randn(32, 4), torch.randn(8, 32))
    lowered = lower(_train_like, *args)[1]
    plan = plan_codegen(lowered.kernels, TargetInfo(), uses=lowered.value_uses)
    return lowered, plan


def _functions(mlir: str) -> dict[str, str]:
    return dict(re.findall(r"func\.func (?:private )?@(\w+)\((.*?)\n  \}", mlir, re.S))


def test_every_scheduled_kernel_group_gets_a_function_of_its_own():
    lowered, plan = _lowered()
    out = outline_kernels(lowered.mlir, plan.groups)
    funcs = _functions(out)
    for group in plan.groups:
        body = funcs[f"neuron_segment_{max(group)}"]
        assert set(map(int, re.findall(r"neuron\.kernel = (\d+)", body))) >= set(group)
        assert f"neuron.segment = {max(group)} : i64" in out
    # the graph's function keeps only the calls, unscheduled work, views and the stores
    main = funcs["neuron_kernel"]
    scheduled = {i for g in plan.groups for i in g}
    assert not scheduled & set(map(int, re.findall(r"neuron\.kernel = (\d+)", main)))
    assert main.count("func.call @neuron_segment_") == len(plan.groups)
    # identical inits stay distinct ops, so CSE cannot make two kernels share one accumulator
    empties = re.findall(r"tensor\.empty\(\) \{neuron\.empty = (\d+) : i64\}", out)
    assert len(empties) == len(set(empties)) == lowered.mlir.count("tensor.empty()")


def test_outlined_module_verifies_and_inlines_back():
    lowered, plan = _lowered()
    out = outline_kernels(lowered.mlir, plan.groups)
    r = subprocess.run([tool("mlir-opt"), "-", "--pass-pipeline=builtin.module(inline,symbol-dce)"],
                       input=out, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[:2000]
    assert "neuron_segment_" not in r.stdout and "func.call" not in r.stdout.replace("@neuron_profile_tick", "")


def test_text_it_does_not_recognise_is_left_alone():
    weird = ("module {\n  func.func @neuron_kernel(%arg_in0: memref<4xf32>) attributes {llvm.emit_c_interface} {\n"
             "    %in1 = bufferization.to_tensor %arg_in0 restrict : memref<4xf32> to tensor<4xf32>\n"
             '    %t2 = "some.op"(%in1) {neuron.kernel = 0 : i64} : (tensor<4xf32>) -> !some.type\n'
             '    "some.use"(%t2) : (!some.type) -> ()\n'
             "    return\n  }\n}\n")
    out = outline_kernels(weird, [[0]])
    assert "neuron_segment" not in out and "neuron.code" in out


def test_a_kernel_keeps_the_insert_of_its_slice_so_cat_writes_the_output_in_place(tmp_path):
    """A ``cat`` piece's ``tensor.insert_slice`` stays in its kernel's function: in the next one,
    the destination's ``tensor.empty`` was cloned and the piece written into a buffer of the
    whole output's size, allocated and copied every call. Checked on the code: no allocation
    left, and the values are eager's."""
    from tests.conftest import neuron_compile
    fn = lambda a, b, c: torch.cat([a, b, c], -1)  # noqa: E731
    args = [torch.randn(8, 64, 640) for _ in range(3)]
    lowered = lower(fn, *args)[1]
    plan = plan_codegen(lowered.kernels, TargetInfo(), uses=lowered.value_uses)
    funcs = _functions(outline_kernels(lowered.mlir, plan.groups))
    for group in plan.groups:
        body = funcs[f"neuron_segment_{max(group)}"]
        assert "linalg.copy" in body and "tensor.insert_slice" in body
    out = neuron_compile(fn, options={"cache": False, "dump_dir": str(tmp_path)})(*args)
    assert torch.equal(out, fn(*args))
    (llvm,) = tmp_path.glob("*/work/kernel.llvm.mlir")
    assert "_mlir_memref_to_llvm_alloc" not in llvm.read_text().split("llvm.func internal @neuron_kernel(", 1)[1]
