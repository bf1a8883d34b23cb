"""Streaming (non-temporal) stores: when a kernel's traffic exceeds the last-level cache its output
stores skip the read-for-ownership. The decision is pure (checked on the kernels the emitter
tags); applied, the stores must be marked ``nontemporal`` and the numerics must not change (the
same bits as without streaming, at 1 and 2 threads, on shapes whose rows the vector step does not
divide, so the remainder stores are unaligned and must not fault)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.codegen import TargetInfo, plan_codegen
from neuron_compile.codegen.streaming import align_stores, streams
from neuron_compile.target import HostCPU
from tests.conftest import neuron_compile
from tests.helpers import at_one_and_two_threads
from tests.ir.lower import lower

ZEN3 = TargetInfo("avx2", 256, 16, 512 << 10, 32 << 10, 8, llc_bytes=32 << 20, sse4a=True)


def _plan(fn, *args, target=ZEN3):
    _, lowered = lower(fn, *args)
    return lowered.kernels, plan_codegen(lowered.kernels, target, uses=lowered.value_uses).schedules


def test_streams_only_when_the_traffic_exceeds_the_last_level_cache():
    big = torch.empty(4096, 1024)  # 16 MiB read + 16 MiB written > 3/4 of 32 MiB
    kernels, schedules = _plan(lambda x: x * 2 + 1, big)
    assert streams(kernels, ZEN3) and schedules[0].params.get("stream") is True
    small = torch.empty(1024, 1024)  # 4 + 4 MiB: the output may still be in the cache for its consumer
    kernels, schedules = _plan(lambda x: x * 2 + 1, small)
    assert not streams(kernels, ZEN3) and "stream" not in schedules[0].params
    # unknown cache size, or no 8-byte non-temporal stores from vector registers: never
    for target in (dataclasses.replace(ZEN3, llc_bytes=0), dataclasses.replace(ZEN3, sse4a=False)):
        kernels, schedules = _plan(lambda x: x * 2 + 1, big, target=target)
        assert not streams(kernels, target) and "stream" not in schedules[0].params


def test_a_fused_row_chain_streams_its_last_kernel_and_a_reduction_never_does():
    x, w, b = torch.empty(4096, 1024), torch.empty(1024), torch.empty(1024)
    kernels, schedules = _plan(lambda x, w, b: F.layer_norm(x, (1024,), w, b), x, w, b)
    assert {s.strategy for s in schedules} == {"fused-rows"}
    assert all(s.params.get("stream") is True for s in schedules)
    kernels, schedules = _plan(lambda x: x.sum(-1), torch.empty(8192, 1024))  # 32 MiB read, 32 KiB written
    assert not any(s.params.get("stream") for s in schedules)


def test_a_chain_computing_a_transcendental_streams_with_256_and_512_bit_vectors():
    # softmax (its exp) streams like layer_norm, on AVX2 and on AVX-512 (where an unaligned
    # vector store splits into eight 8-byte pieces; torch's buffers are aligned)
    zen5 = dataclasses.replace(ZEN3, isa="avx512", vector_bits=512, vector_registers=32)
    x, w, b = torch.empty(4096, 1024), torch.empty(1024), torch.empty(1024)
    for target in (ZEN3, zen5):
        _, schedules = _plan(lambda x: x.softmax(-1), x, target=target)
        assert {s.strategy for s in schedules} == {"fused-rows"}
        assert all(s.params.get("stream") is True for s in schedules)
        _, schedules = _plan(lambda x, w, b: F.layer_norm(x, (1024,), w, b), x, w, b, target=target)
        assert all(s.params.get("stream") is True for s in schedules)
        kernels, _ = _plan(lambda x: torch.exp(x) * 2, torch.empty(4096, 2048), target=target)
        assert streams(kernels, target)
        # (32 MiB read and 32 written: under three quarters of a 128 MiB cache, no streaming)
        assert not streams(kernels, dataclasses.replace(target, llc_bytes=128 << 20))


CASES = {
    "pointwise-odd-rows": (lambda x, b: torch.sigmoid(x * 1.5 + b).mul(x), (torch.randn(37, 1003), torch.randn(1003))),
    "pointwise-one-dim": (lambda x: torch.erf(x) + x * x, (torch.randn(3 * 65536),)),
    "softmax-odd": (lambda x: x.softmax(-1), (torch.randn(64, 1000),)),
    "layer-norm": (lambda x, w, b: F.layer_norm(x, (768,), w, b), (torch.randn(128, 768), torch.randn(768),
                                                                    torch.randn(768))),
    # the streamed kernel writes straight into a slice of the concatenation, 8 columns into each row
    # of 1032: its stores are off any vector boundary (vector-aligned stores faulted here)
    "into-a-slice": (lambda a, x: torch.cat([a, x * 2 + 1], -1), (torch.randn(64, 8), torch.randn(64, 1024))),
}


@pytest.mark.parametrize("case", CASES)
def test_streamed_stores_are_nontemporal_and_change_no_bit(case, tmp_path, monkeypatch):
    fn, args = CASES[case]
    # the same target without and with streaming (on another host the host's own vector width
    # would change the reductions' summation order, not the stores)
    monkeypatch.setattr(HostCPU, "info", lambda self: dataclasses.replace(ZEN3, llc_bytes=0))
    plain = neuron_compile(fn, options={"cache": False})(*args)
    # a target whose last-level cache is tiny: every kernel here streams
    tiny = dataclasses.replace(ZEN3, llc_bytes=16 << 10)
    monkeypatch.setattr(HostCPU, "info", lambda self: tiny)
    torch._dynamo.reset()
    compiled = neuron_compile(fn, options={"cache": False, "dump_dir": str(tmp_path)})
    one, two = at_one_and_two_threads(compiled, *args)
    llvm_dialect = "".join(p.read_text() for p in tmp_path.glob("*/*.llvm.mlir"))
    assert "nontemporal" in llvm_dialect
    # each streamed store also has its aligned form, taken when the address turns out aligned
    assert "alignment = 32 : i64, nontemporal" in llvm_dialect
    assert torch.equal(one, plain) and torch.equal(two, plain)
    torch.testing.assert_close(one, fn(*args), rtol=1e-5, atol=1e-5)


STORE = ("        vector.store %20, %subview[%c0, %arg3] {nontemporal = true} : "
         "memref<1x1024xf32, strided<[1024, 1], offset: ?>>, vector<64xf32>")


def test_a_streamed_store_gets_an_aligned_form_chosen_on_its_address_at_run_time():
    text = "\n".join(["func.func @k(%arg1: memref<4096x1024xf32>) {", STORE, "}"])
    out = align_stores(text, 64)
    lines = [line.strip() for line in out.split("\n")]
    # the address: aligned pointer + (offset + row * stride0 + col * stride1) * 4 bytes, low 6 bits
    assert any(line.startswith("%neuron_nt0_ptr = memref.extract_aligned_pointer_as_index %subview") for line in lines)
    assert "%neuron_nt0_m1 = arith.muli %arg3, %neuron_nt0_t1 : index" in lines
    assert "%neuron_nt0_eb = arith.constant 4 : index" in lines
    assert "%neuron_nt0_mask = arith.constant 63 : index" in lines
    branch = lines.index("scf.if %neuron_nt0_ok {")
    assert lines[branch + 1].startswith("vector.store %20, %subview[%c0, %arg3] {alignment = 64 : i64, nontemporal = true}")
    assert lines[branch + 2] == "} else {" and lines[branch + 3] == STORE.strip() and lines[branch + 4] == "}"
    # a 256-bit target claims 32 bytes; a vector narrower than the register claims its own size
    assert "alignment = 32 : i64" in align_stores(text, 32)
    assert "alignment = 16 : i64" in align_stores(text.replace("vector<64xf32>", "vector<4xf32>"), 64)
    # stores too narrow to gain (8 bytes), plain stores and text without streaming stay as they are
    for same in (text.replace("vector<64xf32>", "vector<2xf32>"), text.replace(" {nontemporal = true}", "")):
        assert align_stores(same, 64) == same
