"""Every conversion between floating dtypes compiles into a self-contained kernel.

LLVM lowers some conversions to compiler-rt/libgcc helpers (``__truncsfbf2`` for float32 →
bfloat16): GCC 12's libgcc does not have that one, so the kernel failed to link on such hosts. The
pipeline expands bfloat16 conversions into integer ops (``arith-expand{include-bf16}``), so the
generated code never depends on which C runtime the host has; these tests exercise every pair
(bit-exact against eager, including values that round, overflow and NaN). bfloat16 arithmetic is
emulated in float32 (``arith-emulate-unsupported-floats``), and since opt can still create bfloat16
operations of its own, the kernel runtime ships ``__truncsfbf2`` (``neuron_compile/kernel_runtime.py``):
no kernel library may need a conversion helper from the host's libgcc.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from tests.conftest import neuron_compile

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _values(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    special = torch.tensor([0.0, -0.0, 1.0, -1.5, 65504.0, 70000.0, 3.0e38, 1e-40, 6e-8, 1 / 3,
                            float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    return torch.cat([special, torch.randn(243, dtype=torch.float64) * 1000]).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize])


@pytest.mark.parametrize("src,dst", [p for p in itertools.product(FLOATS, FLOATS) if p[0] != p[1]],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_float_conversion_matches_eager_bit_for_bit(src, dst):
    x = _values(src)
    ours = neuron_compile(lambda t: (t * 2).to(dst) + 1)(x)
    eager = (x * 2).to(dst) + 1
    assert ours.dtype == dst
    assert torch.equal(ours.isnan(), eager.isnan())
    assert torch.equal(_bits(ours.nan_to_num(0.0)), _bits(eager.nan_to_num(0.0)))


INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("integer", INTS, ids=str)
def test_integer_half_conversions_match_eager(integer, half):
    x = torch.arange(-300, 300, 7).to(integer) if integer != torch.bool else torch.arange(10) % 3 == 0
    ours = neuron_compile(lambda t: (t.to(half) * 3, t.to(half).to(integer)))(x)  # (in range both ways)
    eager = (x.to(half) * 3, x.to(half).to(integer))
    for o, e in zip(ours, eager):
        assert o.dtype == e.dtype and torch.equal(o, e)


_BF16_GRAPHS = {
    # opt turns fabs(fpext(x)) into fpext(fabs.bf16(x)); llc legalizes that bfloat16 op through
    # __truncsfbf2 (every special function of a bfloat16 input: float64 work on |x|)
    "i0e": torch.special.i0e,
    "max": lambda t: t.max(),                                            # bfloat16 arithmetic in the body
    "logcumsumexp": lambda t: torch.logcumsumexp(t, 1),
    "adaptive_max_pool1d": lambda t: torch.nn.functional.adaptive_max_pool1d(t[None], 3),
    "softmax_to_float32": lambda t: torch.softmax(t, -1, dtype=torch.float32),
}


@pytest.mark.parametrize("name", sorted(_BF16_GRAPHS))
def test_bfloat16_kernels_link_no_compiler_runtime_helper(name, tmp_path):
    import subprocess
    fn = _BF16_GRAPHS[name]
    x = torch.randn(4, 7).bfloat16()
    out = neuron_compile(fn, options={"cache_dir": str(tmp_path)})(x)
    torch.testing.assert_close(out, fn(x), rtol=1.6e-2, atol=1e-5)
    libs = list(tmp_path.rglob("kernel.so"))
    assert libs
    for lib in libs:
        undefined = subprocess.run(["nm", "-u", str(lib)], capture_output=True, text=True, check=True).stdout
        helpers = [ln for ln in undefined.split() if ln.startswith(("__trunc", "__extend"))]
        assert not helpers, f"{lib} needs the C runtime's {helpers}"
