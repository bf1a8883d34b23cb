"""A crash inside LLVM/MLIR (assertions are on in these builds) becomes a PipelineError, never a dead process."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from neuron_compile.compiler import mlir_to_llvm
from neuron_compile.errors import PipelineError

# memref<...xi1> stores hit `Assertion integralElementType.getWidth() >= 8` in MemRefToLLVM: a real abort.
CRASHING_IR = """
func.func @neuron_kernel(%m: memref<4xi1>, %v: i1) {
  %c0 = arith.constant 0 : index
  memref.store %v, %m[%c0] : memref<4xi1>
  return
}
"""


def test_llvm_assertion_is_a_typed_error_with_a_repro_command(tmp_path):
    src = tmp_path / "kernel.linalg.mlir"
    src.write_text(CRASHING_IR)
    with pytest.raises(PipelineError) as info:
        mlir_to_llvm(src, tmp_path, timeout=120)
    err = info.value
    assert err.phase == "llvm"
    assert "SIGABRT" in err.detail and "Assertion" in err.detail
    assert err.input_path == str(src) and os.path.exists(err.input_path)
    # the printed command reproduces the same crash from the dumped file
    proc = subprocess.run(shlex.split(err.command), capture_output=True, text=True)
    assert proc.returncode != 0 and "Assertion" in proc.stderr


def test_invalid_ir_reports_the_parser_diagnostic(tmp_path):
    src = tmp_path / "kernel.linalg.mlir"
    src.write_text("func.func @f() { %0 = arith.constant 1 : f32 \n return }\n")
    with pytest.raises(PipelineError) as info:
        mlir_to_llvm(src, tmp_path, timeout=120)
    assert "kernel.linalg.mlir:1" in info.value.detail


def test_a_stage_runs_under_the_memory_cap_and_its_repro_command_is_the_tool_alone(tmp_path):
    """Each stage gets the address-space cap (so a runaway tool fails, not the machine) from a
    shell that execs it; the repro command in an error names the tool, not the wrapper."""
    from neuron_compile.toolchain import MEMORY_CAP_BYTES, run_stage
    src = tmp_path / "in.ll"
    src.write_text("")
    run_stage("obj", ["sh", "-c", f'test "$(ulimit -v)" = {MEMORY_CAP_BYTES >> 10}'], src, timeout=30)
    with pytest.raises(PipelineError) as info:
        run_stage("obj", ["sh", "-c", "exit 3"], src, timeout=30)
    assert "exited with status 3" in info.value.detail
    assert "neuron-compile-stage" not in str(info.value) and "exit 3" in str(info.value)
