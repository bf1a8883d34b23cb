"""The runtime contract: strides, storage offsets, aliasing outputs, mutated inputs, 0-d and empty."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import neuron_compile


def test_non_contiguous_and_offset_inputs_are_read_correctly():
    def f(a, b, c):
        return a * 2 + b + c
    base = torch.randn(6, 8)
    a = base.t()[:4, 1:5]            # transposed, non-contiguous
    b = base[2:6, :4]                # storage offset
    c = torch.randn(4).expand(4, 4)  # stride 0
    torch.testing.assert_close(neuron_compile(f)(a, b, c), f(a, b, c))


def test_inputs_with_other_strides_than_compiled_are_copied_not_misread():
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.compiler import compile_graph
    gm = make_fx(lambda t: t * 3, tracing_mode="fake")(torch.randn(3, 4))
    exe = compile_graph(gm)
    y = torch.randn(4, 3).t()  # same shape, other strides than the compiled contiguous input
    torch.testing.assert_close(exe([y])[0], y * 3)


def test_outputs_aliasing_inputs_are_views_of_them():
    def f(x):
        return x.view(-1), x[1:], x.t()
    x = torch.randn(3, 4)
    outs = neuron_compile(f)(x)
    for got, exp in zip(outs, f(x)):
        torch.testing.assert_close(got, exp)
        assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert got.stride() == exp.stride() and got.storage_offset() == exp.storage_offset()


def test_outputs_aliasing_an_intermediate_keep_view_semantics():
    def f(x):
        y = x * 2
        return y, y.t(), y[:, 1]
    x = torch.randn(3, 4)
    outs = neuron_compile(f)(x)
    for got, exp in zip(outs, f(x)):
        torch.testing.assert_close(got, exp)
        assert got.stride() == exp.stride()


def test_mutated_inputs_are_updated_like_eager():
    def f(x, y):
        x.add_(1)
        y.mul_(2)
        return x * y
    x, y = torch.randn(5), torch.randn(5)
    x2, y2 = x.clone(), y.clone()
    out = neuron_compile(f)(x, y)
    exp = f(x2, y2)
    torch.testing.assert_close(out, exp)
    torch.testing.assert_close(x, x2)
    torch.testing.assert_close(y, y2)


def test_zero_dim_tensors():
    def f(x, s):
        return (x * s).sum(), s * 3 + 1
    x, s = torch.randn(4), torch.tensor(1.5)
    for got, exp in zip(neuron_compile(f)(x, s), f(x, s)):
        assert got.shape == exp.shape
        torch.testing.assert_close(got, exp)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)])
def test_empty_tensors(shape):
    def f(x):
        return x * 2 + 1, x.sum(-1), x.sum()
    x = torch.randn(shape)
    for got, exp in zip(neuron_compile(f)(x), f(x)):
        assert got.shape == exp.shape
        torch.testing.assert_close(got, exp)


def test_int64_and_bool_values_round_trip():
    def f(i, b):
        return i * 3 - 7, ~b, (i > 2) & b, i.to(torch.float32) / 2, b.to(torch.int64).sum()
    i = torch.tensor([[-5, 0, 3], [7, 2, 9]])
    b = torch.tensor([[True, False, True], [False, False, True]])
    for got, exp in zip(neuron_compile(f)(i, b), f(i, b)):
        assert got.dtype == exp.dtype
        torch.testing.assert_close(got, exp)


def test_same_tensor_returned_twice_and_an_input_returned():
    def f(x, y):
        z = x + y
        return z, z, y
    x, y = torch.randn(3), torch.randn(3)
    a, b, c = neuron_compile(f)(x, y)
    torch.testing.assert_close(a, x + y)
    torch.testing.assert_close(b, x + y)
    torch.testing.assert_close(c, y)


def test_tensor_constants_created_in_the_graph_including_0d():
    def f(x):
        return x * torch.tensor(3.0) + torch.tensor([1.0, 2.0]) + torch.tensor(True)
    x = torch.randn(2)
    torch.testing.assert_close(neuron_compile(f)(x), f(x))


def test_assignment_into_input_slices_copies_back_like_eager():
    def f(x, y):
        x[:2] += 1
        x[:, 0] = 0
        y.copy_(x.sum(0))
        return x * 2
    x, y = torch.randn(4, 3), torch.randn(3)
    x2, y2 = x.clone(), y.clone()
    out = neuron_compile(f)(x, y)
    torch.testing.assert_close(out, f(x2, y2))
    torch.testing.assert_close(x, x2)
    torch.testing.assert_close(y, y2)
