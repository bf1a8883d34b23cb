"""Python scalars meet integer tensors of every width, and integer powers (issue 13, item 4): torch
wraps the scalar into the tensor's dtype and every result modulo 2**bits; eager is the reference, exactly."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import neuron_compile

INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def _values(dtype):
    info = torch.iinfo(dtype)
    return torch.tensor([info.min, info.min + 1, -1 if info.min < 0 else 2, 0, 1, 3, info.max - 1, info.max],
                        dtype=dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("scalar", [300, -300, 70000, 2 ** 40 + 5])
def test_out_of_range_scalars_wrap_as_torch(dtype, scalar):
    def f(u):
        return u + scalar, u * scalar, u < scalar, u == scalar
    x = _values(dtype)
    for got, want in zip(neuron_compile(f)(x), f(x)):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_power_matches_eager(dtype):
    base = torch.tensor([-3, 2, 3, 2, 1, -1, 0, 7, 5]).to(dtype).abs() if dtype == torch.uint8 else \
        torch.tensor([-3, 2, 3, 2, 1, -1, 0, 7, 5], dtype=dtype)
    exp = torch.tensor([5, 70, 39, 63, 100, 3, 0, 0, 2], dtype=dtype)
    got = neuron_compile(lambda a, b: (a ** b, 2 ** b, a ** 3))(base, exp)
    want = (base ** exp, 2 ** exp, base ** 3)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_integer_power_with_negative_exponents_matches_eager():
    a, b = torch.tensor([2, 3, 1, -1, -1]), torch.tensor([-1, 2, -2, -3, -4])
    assert torch.equal(neuron_compile(lambda x, y: x ** y)(a, b), a ** b)
