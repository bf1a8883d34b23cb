"""``transpose-tiles`` (neuron_compile.codegen.strategies.transpose): transposes that move the
contiguous dim run as register tiles. A transpose only moves values, so every case must equal
eager bit for bit, at 1 and 2 threads, for each element type it takes, under both shuffle
lowerings (AVX-512's 16×16 network and the AVX2 8×8 sequence)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from neuron_compile.cache import clear_memory_cache
from neuron_compile.codegen import TargetInfo, plan_codegen
from neuron_compile.target import HostCPU
from tests.conftest import neuron_compile
from tests.helpers import at_one_and_two_threads
from tests.ir.lower import lower

AVX512 = TargetInfo("avx512", 512, 32)
AVX2 = TargetInfo("avx2", 256, 16)


def _schedule(fn, *args, target=AVX512):
    _, lowered = lower(fn, *args)
    (s,) = plan_codegen(lowered.kernels, target, uses=lowered.value_uses).schedules
    return s


def test_transposes_of_the_contiguous_dim_are_tiled_and_others_are_not():
    s = _schedule(lambda x: x.t().contiguous(), torch.empty(2048, 2048))
    assert s.strategy == "transpose-tiles" and s.params["tile"] == [16, 16] and s.params["shuffle_16x16"]
    assert s.params["forall"][1] == 0 and 2048 // s.params["forall"][0] >= 8   # blocks of rows for the threads
    s = _schedule(lambda x: x.transpose(-1, -2).contiguous(), torch.empty(8, 12, 128, 64), target=AVX2)
    assert s.strategy == "transpose-tiles" and s.params["tile"] == [8, 8] and not s.params["shuffle_16x16"]
    assert s.params["dims"] == [2, 3]
    # the last dim stays last: contiguous rows (copy-rows); no tile of 4 divides 1002: loops
    assert _schedule(lambda x: x.permute(1, 0, 2).contiguous(), torch.empty(64, 32, 48)).strategy == "copy-rows"
    assert _schedule(lambda x: x.t().contiguous(), torch.empty(1002, 64)).strategy == "loops"


CASES = {
    "square": (lambda x: x.t().contiguous(), lambda: torch.randn(512, 512)),
    "tall-float64": (lambda x: x.t().contiguous(), lambda: torch.randn(96, 640, dtype=torch.float64)),
    "int64": (lambda x: x.t().contiguous(), lambda: torch.randint(-2**40, 2**40, (200, 128))),
    "int32-heads": (lambda x: x.transpose(-1, -2).contiguous(), lambda: torch.randint(-9, 9, (2, 6, 40, 64),
                                                                                       dtype=torch.int32)),
    "keys": (lambda x: x.transpose(-1, -2).contiguous(), lambda: torch.randn(3, 4, 48, 80)),
    "middle": (lambda x: x.permute(2, 0, 1).contiguous(), lambda: torch.randn(24, 80, 32)),
    "slice": (lambda x: x[:, 8:72].t().contiguous(), lambda: torch.randn(256, 96)),
    "uneven-tiles": (lambda x: x.t().contiguous(), lambda: torch.randn(1000, 72)),
    "in-graph": (lambda x, y: (x * 2).t() + y, lambda: (torch.randn(160, 320), torch.randn(320, 160))),
}


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("case", CASES)
def test_tiled_transposes_equal_eager_bit_for_bit(case, isa, monkeypatch):
    fn, make = CASES[case]
    args = make() if isinstance(make(), tuple) else (make(),)
    if isa == "avx2":   # AVX2 code runs on an AVX-512 host too
        info = HostCPU.info
        monkeypatch.setattr(HostCPU, "info", lambda self: dataclasses.replace(info(self), isa="avx2",
                                                                              vector_bits=256, vector_registers=16))
    clear_memory_cache()
    torch._dynamo.reset()
    one, two = at_one_and_two_threads(neuron_compile(fn, options={"cache": False}), *args)
    expected = fn(*args)
    assert torch.equal(one, expected) and torch.equal(two, expected)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_copied_rows_take_at_most_eight_registers_a_vector(target):
    """A transpose keeping 256-float rows last (a grouped convolution's output, [G, OC/G, N, 256]
    → [N, G, OC/G, 256]) copies each row in pieces of at most 8 registers: as one vector<256xf32>
    it was 32 AVX2 registers (spilled), and 64 such copies unrolled into one block made llc's
    post-RA scheduler take 3 of a 4.5 s compile. Bit-exact against eager."""
    from neuron_compile.codegen.strategies.vector import COPY_REGISTERS
    fn = lambda x: x.permute(2, 0, 1, 3).contiguous()  # noqa: E731
    x = torch.randn(4, 16, 16, 256)
    s = _schedule(fn, x, target=target)
    lanes = target.vector_bits // 32
    assert s.strategy == "copy-rows" and s.params["piece"] == COPY_REGISTERS * lanes
    one, two = at_one_and_two_threads(neuron_compile(fn), x)
    assert torch.equal(one, fn(x)) and torch.equal(two, fn(x))
