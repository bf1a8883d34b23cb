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


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8], ids=str)
def test_shifts_match_eager_for_every_amount(dtype):
    """``x >> k``, ``x << k`` and ``bitwise_{left,right}_shift`` (issue 13, item 7) with amounts from
    -1 to bits + 1: ATen gives 0 for negative or too-large amounts, except a signed right shift,
    which keeps the sign (``BinaryOpsKernel.cpp``); MLIR's shifts are poison there."""
    info = torch.iinfo(dtype)
    if dtype == torch.uint8:
        x, amounts = torch.tensor([0, 1, 5, 100, 200, 255], dtype=dtype), [0, 1, 3, 6, 7, 8, 9]
    else:
        x, amounts = torch.tensor([info.min, -9, -1, 0, 1, 5, 100, info.max], dtype=dtype), \
            [-1, 0, 1, 3, info.bits - 2, info.bits - 1, info.bits, info.bits + 1]
    a, s = (t.contiguous() for t in torch.broadcast_tensors(x[:, None], torch.tensor(amounts, dtype=dtype)[None, :]))

    def shifts(a, s):
        return (a >> s, a << s, torch.bitwise_right_shift(a, s), torch.bitwise_left_shift(a, s), a >> 3, a << 1,
                a >> (info.bits - 1))
    torch._dynamo.reset()
    for got, want in zip(neuron_compile(shifts)(a, s), shifts(a, s)):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
