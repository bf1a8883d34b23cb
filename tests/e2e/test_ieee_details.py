"""IEEE details eager keeps (issue 40): the sign of zero through relu/clamp/maximum/minimum, the sign
bit of the NaN an out-of-domain argument gives. Expected values are eager's, computed here."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import neuron_compile

ZERO_KEEPING = {
    "relu": torch.relu,
    "clamp_min": lambda x: torch.clamp(x, min=0.0),
    "clamp_max": lambda x: torch.clamp(x, max=0.0),
    "clamp_both": lambda x: torch.clamp(x, min=-0.0, max=0.0),
    "clamp_min_op": lambda x: torch.clamp_min(x, 0.0),
    "relu6": F.relu6,
    "hardtanh": F.hardtanh,
    "maximum": lambda x: torch.maximum(x, torch.zeros_like(x)),
    "minimum": lambda x: torch.minimum(x, torch.zeros_like(x)),
    "maximum_swapped": lambda x: torch.maximum(torch.zeros_like(x), x),
    "minimum_swapped": lambda x: torch.minimum(torch.zeros_like(x), x),
}


@pytest.mark.parametrize("name", sorted(ZERO_KEEPING))
def test_signed_zeros_as_eager(name):
    """Small tensors (ATen's scalar loop): for maximum/minimum eager's vectorized loop breaks a ±0
    tie the other way, so eager itself depends on the size there; relu and clamp do not."""
    fn = ZERO_KEEPING[name]
    x = torch.tensor([-0.0, 0.0, -1.0, 2.0, float("nan")])
    expected, got = fn(x), neuron_compile(fn)(x)
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert torch.equal(torch.signbit(got), torch.signbit(expected)), (got, expected)


@pytest.mark.parametrize("name", ["relu", "clamp_min", "relu6", "hardtanh"])
def test_relu_of_negative_zero_is_negative_zero_at_any_size(name):
    fn = ZERO_KEEPING[name]
    x = torch.full((1000,), -0.0)
    expected, got = fn(x), neuron_compile(fn)(x)
    assert torch.equal(torch.signbit(got), torch.signbit(expected))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,fn", [("sqrt", torch.sqrt), ("log2", torch.log2),
                                     ("acos", lambda v: torch.acos(v - 5)), ("asin", lambda v: torch.asin(v - 5)),
                                     ("log1p", lambda v: torch.log1p(v - 5))])
def test_nan_sign_of_an_out_of_domain_argument_as_eager(name, fn, dtype):
    y = -torch.linspace(1, 2, 70, dtype=torch.float64).to(dtype)
    expected, got = fn(y), neuron_compile(fn)(y)
    assert expected.isnan().all() and got.isnan().all()
    assert torch.equal(torch.signbit(got), torch.signbit(expected)), (name, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,fn", [("fmod", lambda v: torch.fmod(v, 1.3)),
                                     ("remainder", lambda v: torch.remainder(v, 1.3)),
                                     ("mod", lambda v: v % 0.7),
                                     ("fmod_0d", lambda v: torch.fmod(v, torch.tensor(1.3))),
                                     ("add_0d", lambda v: v + torch.tensor(1e-3))])
def test_reduced_precision_takes_its_other_operand_rounded_first(name, fn, dtype):
    """Eager rounds a Python float (and a 0-d float32 tensor) to the float16/bfloat16 common dtype
    before its kernel computes in float32; the compiled call rounds it the same way."""
    h = (torch.linspace(-20, 20, 1001, dtype=torch.float64) * 1.3).to(dtype)
    torch.testing.assert_close(neuron_compile(fn)(h), fn(h), rtol=0, atol=0)


def test_adding_zero_turns_negative_zero_positive():
    """``-0.0 + 0.0`` is ``+0.0``: ``x + 0`` is no identity for floats (``x - 0`` is)."""
    x = torch.tensor([-0.0, 1.0, -0.0])
    f = lambda x: ((x * 2) + 0, (x * 2) - 0)   # noqa: E731
    for got, want in zip(neuron_compile(f)(x), f(x)):
        assert torch.equal(torch.signbit(got), torch.signbit(want))
