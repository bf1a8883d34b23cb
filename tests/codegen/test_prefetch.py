"""Software prefetch of the next row block in ``fused-rows`` kernels (neuron_compile.codegen.prefetch).

The decision is pure (only when a graph input exceeds L2: in blocks of several rows the member that
re-reads it first prefetches the next block, in blocks of one row the member that reads it first
prefetches rows ahead); the rewrite is a text pass whose output ``mlir-opt`` must accept; applied,
a prefetch must change no bit (the same results as without it, at 1 and 2 threads, on shapes
whose rows the vector step does not divide) and must stay inside the input (clamped last block)."""
from __future__ import annotations

import dataclasses
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.cache import clear_memory_cache
from neuron_compile.codegen import Slot, TargetInfo, plan_codegen
from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.prefetch import DIM, MARK, rewrite
from neuron_compile.codegen.strategies.fused_rows import FusedRows
from neuron_compile.codegen.strategy import Schedule
from neuron_compile.target import HostCPU
from neuron_compile.toolchain import tool
from tests.conftest import neuron_compile
from tests.helpers import at_one_and_two_threads
from tests.ir.lower import lower

ZEN5 = TargetInfo("avx512", 512, 32, l2_bytes=1 << 20, l1_bytes=48 << 10, l1_ways=12, llc_bytes=32 << 20,
                  sse4a=True)


def _fused_params(fn, *args, target=ZEN5):
    _, lowered = lower(fn, *args)
    plan = plan_codegen(lowered.kernels, target, uses=lowered.value_uses)
    params = [s.params for s in plan.schedules if s.strategy == "fused-rows"]
    assert params, "expected a fused-rows chain"
    return lowered.kernels, params[0]


def test_the_first_member_to_reread_a_large_graph_input_prefetches():
    x = torch.empty(32768, 128)  # 16 MiB > 1 MiB of L2, in blocks of several rows of 512 bytes
    kernels, p = _fused_params(lambda x: x.softmax(-1), x)
    assert p["rows"] > 1
    # max (reads x), exp (reads x again: the prefetching member), sum, divide
    readers = [k.id for k in kernels if any(o.strides is not None for o in k.inputs)]
    assert p["group"] == [k.id for k in kernels] and readers[:2] == p["group"][:2]
    assert p["prefetch"] == readers[1]
    _, p = _fused_params(lambda x, w, b: F.layer_norm(x, (256,), w, b), torch.empty(8192, 512)[:, :256],
                         torch.empty(256), torch.empty(256))
    assert "prefetch" not in p   # strided
    _, p = _fused_params(lambda x, w, b: F.layer_norm(x, (256,), w, b), torch.empty(16384, 256),
                         torch.empty(256), torch.empty(256))
    assert p["rows"] > 1 and p["prefetch"] == p["group"][1]   # mean, then variance re-reads x


def _annotations(text: str) -> list[tuple[str, str]]:
    """(attribute name, value) of each ``transform.annotate`` in a transform sequence."""
    params = dict(re.findall(r"(%\w+) = transform\.param\.constant (\S+)", text))
    return [(name, params[p]) for name, p in re.findall(r'transform\.annotate %\w+ "([\w.]+)" = (%\w+)', text)]


def test_one_row_blocks_prefetch_rows_ahead_in_the_first_reader():
    # layer_norm and softmax over rows of 4 KB: blocks of one row; the first member to read x (the
    # mean, the max) marks its column loop to prefetch 8 KB ahead: 2 rows along dim 0
    for fn, args in ((lambda x, w, b: F.layer_norm(x, (1024,), w, b),
                      (torch.empty(4096, 1024), torch.empty(1024), torch.empty(1024))),
                     (lambda x: x.softmax(-1), (torch.empty(4096, 1024),))):
        kernels, p = _fused_params(fn, *args)
        readers = [k.id for k in kernels if k.id in p["group"] and any(o.strides is not None for o in k.inputs)]
        assert p["rows"] == 1 and p["prefetch"] == readers[0] == p["group"][0] and p["prefetch_rows"] == 2
        text = FusedRows().transform(KernelInfo.from_json(p["members"][-1]), Schedule(FusedRows.name, p))
        marks = _annotations(text)
        assert marks.count((MARK, "2")) == 1 and (DIM, "0") in marks
    # rows of 16 KB: one row ahead; blocks over (B, S) rows: along S, the innermost row dim
    _, p = _fused_params(lambda x: x.softmax(-1), torch.empty(256, 4096))
    assert p["rows"] == 1 and p["prefetch_rows"] == 1
    _, p = _fused_params(lambda x, w, b: F.layer_norm(x, (768,), w, b), torch.empty(8, 128, 768),
                         torch.empty(768), torch.empty(768))
    assert p["block"] == [1, 1] and p["prefetch_rows"] == 3
    text = FusedRows().transform(KernelInfo.from_json(p["members"][-1]), Schedule(FusedRows.name, p))
    assert (MARK, "3") in _annotations(text) and (DIM, "1") in _annotations(text)
    # rows of 201 KB (GPT-2's vocabulary): the row ahead and this one exceed a quarter of L2
    _, p = _fused_params(lambda x: x.log_softmax(-1), torch.empty(128, 50257))
    assert p["rows"] == 1 and "prefetch" not in p
    # layer_norm's backward: the first member reads the gradient, a later one x; no member reads
    # both, so none prefetches
    _, p = _fused_params(lambda g, x, mean, rstd, w: torch.ops.aten.native_layer_norm_backward(
        g, x, [1024], mean, rstd, w, None, [True, False, False])[0], torch.empty(4096, 1024), torch.empty(4096, 1024),
        torch.empty(4096, 1), torch.empty(4096, 1), torch.empty(1024))
    assert p["rows"] == 1 and len(p["group"]) == 3 and "prefetch" not in p
    # in L2 (128 rows of 4 KB: 512 KiB): no prefetch
    _, p = _fused_params(lambda x: x.softmax(-1), torch.empty(128, 1024))
    assert p["rows"] == 1 and "prefetch" not in p


def test_no_prefetch_when_the_input_fits_in_l2_is_an_intermediate_or_is_strided():
    _, p = _fused_params(lambda x: x.softmax(-1), torch.empty(1024, 128))  # 512 KiB: in L2
    assert p["rows"] > 1 and "prefetch" not in p
    # the scores come from a matmul in the same graph: an intermediate, not read from memory twice
    _, p = _fused_params(lambda a, b: (a @ b).softmax(-1), torch.empty(32768, 64), torch.empty(64, 128))
    assert p["rows"] > 1 and "prefetch" not in p
    # every other column of a wider tensor: a strided memref the rewrite would not touch
    _, p = _fused_params(lambda x: x.softmax(-1), torch.empty(32768, 256)[:, ::2])
    assert p["rows"] > 1 and "prefetch" not in p


VECTOR_IR = """module {
  func.func @k(%arg0: memref<64x1000xf32> {llvm.noalias}, %arg1: memref<64x1000xf32> {llvm.noalias}) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %c32 = arith.constant 32 : index
    %c992 = arith.constant 992 : index
    %alloca = memref.alloca() : memref<4x1000xf32>
    scf.for %arg2 = %c0 to %c4 step %c1 {
      scf.for %arg3 = %c0 to %c992 step %c32 {
        %0 = vector.load %arg0[%arg2, %arg3] : memref<64x1000xf32>, vector<32xf32>
        %1 = vector.load %alloca[%arg2, %arg3] : memref<4x1000xf32>, vector<32xf32>
        %2 = arith.addf %0, %1 : vector<32xf32>
        vector.store %2, %arg1[%arg2, %arg3] : memref<64x1000xf32>, vector<32xf32>
      }
    } {neuron.prefetch = 4 : i64}
    scf.for %arg2 = %c0 to %c4 step %c1 {
      %3 = vector.load %arg0[%arg2, %c0] : memref<64x1000xf32>, vector<32xf32>
      vector.store %3, %arg1[%arg2, %c0] : memref<64x1000xf32>, vector<32xf32>
    }
    return
  }
}
"""


def test_rewrite_prefetches_argument_loads_in_marked_loops_one_per_line():
    out = rewrite(VECTOR_IR)
    prefetches = [ln.strip() for ln in out.splitlines() if "memref.prefetch" in ln]
    # a vector of 32 floats spans two 64-byte lines; only the argument's load in the marked loop
    assert len(prefetches) == 2
    assert all(p.startswith("memref.prefetch %arg0[%neuron_pf0_r, ") for p in prefetches)
    assert "arith.minsi %neuron_pf0_s, %neuron_pf0_last" in out and "arith.constant 63 : index" in out
    assert out.count(MARK) == VECTOR_IR.count(MARK) and rewrite(out.replace(MARK, "x")) == out.replace(MARK, "x")
    # mlir-opt parses and verifies the result, and lowers it to the LLVM dialect
    r = subprocess.run([tool("mlir-opt"), "-", "--pass-pipeline=builtin.module(expand-strided-metadata,"
                        "finalize-memref-to-llvm,convert-scf-to-cf,convert-vector-to-llvm,convert-arith-to-llvm,"
                        "convert-cf-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts)"],
                       input=out, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("llvm.intr.prefetch") == 2


def test_rewrite_steps_along_the_marked_dim():
    text = (VECTOR_IR.replace("64x1000xf32>", "2x64x1000xf32>")
            .replace("[%arg2, %arg3]", "[%c1, %arg2, %arg3]").replace("[%arg2, %c0]", "[%c1, %arg2, %c0]")
            .replace("{neuron.prefetch = 4 : i64}", "{neuron.prefetch = 4 : i64, neuron.prefetch_dim = 1 : i64}"))
    out = rewrite(text)
    prefetches = [ln.strip() for ln in out.splitlines() if "memref.prefetch" in ln]
    assert len(prefetches) == 2 and all(p.startswith("memref.prefetch %arg0[%c1, %neuron_pf0_r, ") for p in prefetches)
    assert "arith.addi %arg2, %neuron_pf0_d" in out and "arith.constant 63 : index" in out


def test_rewrite_leaves_unmarked_text_alone():
    text = VECTOR_IR.replace(" {neuron.prefetch = 4 : i64}", "")
    assert rewrite(text) == text


CASES = {
    # rows shorter than 2 KB of output: blocks of several rows, the next block prefetched
    "softmax-odd": (lambda x: x.softmax(-1), (torch.randn(512, 250) * 3,)),
    "log-softmax": (lambda x: torch.log_softmax(x, -1), (torch.randn(768, 203) * 3,)),
    "layer-norm": (lambda x, w, b: F.layer_norm(x, (384,), w, b), (torch.randn(256, 384), torch.randn(384),
                                                                    torch.randn(384))),
    "layer-norm-short-rows": (lambda x, w, b: F.layer_norm(x, (200,), w, b),
                              (torch.randn(512, 200), torch.randn(200), torch.randn(200))),
    # blocks of rows inside dim 1 (the next block along dim 1), and blocks spanning dim 1 whole
    # (the next block along dim 0)
    "softmax-rank4": (lambda x: x.softmax(-1), (torch.randn(2, 3, 40, 200) * 3,)),
    "softmax-whole-inner-dim": (lambda x: x.softmax(-1), (torch.randn(96, 3, 130) * 3,)),
    # rows of 2 KB of output or more: blocks of one row, the first reader's column loop prefetches
    # (a partial last vector step: 600 and 1000 columns; rows ahead along dim 1, clamped at its end)
    "softmax-one-row-blocks": (lambda x: x.softmax(-1), (torch.randn(64, 600) * 3,)),
    "layer-norm-one-row-blocks": (lambda x, w, b: F.layer_norm(x, (1000,), w, b),
                                  (torch.randn(80, 1000), torch.randn(1000), torch.randn(1000))),
    "layer-norm-one-row-blocks-rank3": (lambda x, w, b: F.layer_norm(x, (520,), w, b),
                                        (torch.randn(2, 40, 520), torch.randn(520), torch.randn(520))),
}


@pytest.mark.parametrize("case", CASES)
def test_prefetching_kernels_change_no_bit(case, tmp_path, monkeypatch):
    fn, args = CASES[case]
    # an L2 of 128 KiB: blocks of a few rows and inputs larger than L2, so the chains prefetch;
    # without prefetch: the same target with the prefetch decision switched off
    small_l2 = dataclasses.replace(ZEN5, l2_bytes=128 << 10)
    monkeypatch.setattr(HostCPU, "info", lambda self: small_l2)
    import neuron_compile.codegen.strategies.fused_rows as fused_rows
    with monkeypatch.context() as m:
        m.setattr(fused_rows, "prefetch_member", lambda *a: None)
        plain = neuron_compile(fn, options={"cache": False})(*args)
    torch._dynamo.reset()
    clear_memory_cache()  # the same cache key: the decision is a pure function of what the key holds
    compiled = neuron_compile(fn, options={"cache": False, "dump_dir": str(tmp_path)})
    one, two = at_one_and_two_threads(compiled, *args)
    (rewritten,) = tmp_path.glob("*/work/kernel.rewritten.mlir")
    assert "memref.prefetch" in rewritten.read_text()
    assert torch.equal(one, plain) and torch.equal(two, plain)
    reference = fn(*[a.double() for a in args]).float()
    torch.testing.assert_close(one, reference, rtol=1e-5, atol=1e-5)


def test_the_two_stages_run_exactly_the_passes_of_the_one_pipeline():
    from neuron_compile.codegen.strategies.vector import FRAGMENTS
    from neuron_compile.phases import linalg_to_llvm
    fragments = {slot: [f] for slot, f in FRAGMENTS.items()}
    (whole,) = linalg_to_llvm(None, fragments)
    first, second = linalg_to_llvm(None, fragments, split=True)
    inner = lambda p: p[len("builtin.module("):-1]  # noqa: E731
    assert f"builtin.module({inner(first)},{inner(second)})" == whole
    assert inner(first).endswith(FRAGMENTS[Slot.PRE_LLVM]) and inner(second).startswith(FRAGMENTS[Slot.PARALLEL])
