"""Aliasing between inputs and outputs as eager has it (issue 40): inputs that are views of one
tensor, an out-of-place scatter whose ``self`` is also an output, identical outputs, structured
control flow refused with a typed error. Each test compares with eager (float64 where values matter)
and failed on 5777d20."""
from __future__ import annotations

import json

import pytest
import torch

from neuron_compile.errors import UnsupportedOpsError
from tests.conftest import neuron_compile


def _grad_of(fn, w0, *inputs):
    w = w0.clone().requires_grad_(True)
    fn(w, *inputs).backward()
    return w.grad


def test_inputs_that_are_shifted_views_of_one_tensor_get_eager_gradients():
    """The backward reads the saved ``x`` and ``y``; both are graph inputs sharing one storage, and
    the forward returned the second as the first (the output plan looked inputs up by storage)."""
    base = torch.arange(12.0, dtype=torch.float64).reshape(2, 6)
    w0 = torch.randn(2, 5, dtype=torch.float64)

    def f(w, x, y):
        return (w * x).sum() + (w.sin() * y * 3).sum()

    expected = _grad_of(f, w0, base[:, :-1], base[:, 1:])
    got = _grad_of(neuron_compile(f), w0, base[:, :-1], base[:, 1:])
    torch.testing.assert_close(got, expected)


def test_unbind_pieces_as_inputs_keep_their_own_values_in_the_backward():
    qkv = torch.randn(3, 4, 4, dtype=torch.float64)
    w0 = torch.randn(4, 4, dtype=torch.float64)

    def f(w, q, k, v):
        return ((w @ q) * k.cos() + v.exp() * w).sum()

    expected = _grad_of(f, w0, *qkv.unbind(0))
    got = _grad_of(neuron_compile(f), w0, *qkv.unbind(0))
    torch.testing.assert_close(got, expected)


def test_an_input_returned_as_it_is_is_that_input():
    base = torch.randn(2, 6)
    x, y = base[:, :-1], base[:, 1:]
    out = neuron_compile(lambda x, y: (x + y, y, x))(x, y)
    assert out[1] is y or (out[1].data_ptr() == y.data_ptr() and out[1].stride() == y.stride())
    assert out[2].data_ptr() == x.data_ptr()
    torch.testing.assert_close(out[0], x + y)


@pytest.mark.parametrize("op", ["scatter_add", "scatter", "scatter_reduce", "index_add", "slice_scatter",
                                "select_scatter", "index_reduce"])
def test_a_scatter_whose_self_is_also_returned_leaves_self_unchanged(op):
    idx = torch.tensor([[0, 1, 2], [3, 0, 1]])
    src = torch.randn(2, 3)
    calls = {
        "scatter_add": lambda b: b.scatter_add(0, idx, src),
        "scatter": lambda b: b.scatter(0, idx, src),
        "scatter_reduce": lambda b: b.scatter_reduce(0, idx, src, "amax"),
        "index_add": lambda b: b.index_add(0, torch.tensor([1, 3]), src),
        "slice_scatter": lambda b: b.slice_scatter(src, 0, 1, 3),
        "select_scatter": lambda b: b.select_scatter(src[0], 0, 2),
        "index_reduce": lambda b: b.index_reduce(0, torch.tensor([1, 3]), src, "amax"),
    }

    def f(x):
        b = x * 2
        return calls[op](b), b

    x = torch.randn(4, 3)
    expected = f(x)
    got = neuron_compile(f)(x)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_index_reduce_gradient_through_a_saved_self(reduce):
    x0 = torch.randn(5, 3, dtype=torch.float64)
    src = torch.randn(4, 3, dtype=torch.float64)
    index = torch.tensor([0, 2, 2, 4])

    def f(x):
        b = x * 2
        return (b.index_reduce(0, index, src, reduce) * b).sum()

    torch.testing.assert_close(_grad_of(neuron_compile(f), x0), _grad_of(f, x0))


def test_identical_computations_stay_two_tensors():
    def f(a):
        b = a * 2
        c = a * 2
        return b, c, b.reshape(-1), (a + 1).reshape(-1), (a + 1).reshape(-1)

    a = torch.randn(3, 2)
    b, c, b_flat, d, e = neuron_compile(f)(a)
    assert b.untyped_storage().data_ptr() != c.untyped_storage().data_ptr()
    assert d.untyped_storage().data_ptr() != e.untyped_storage().data_ptr()
    assert b_flat.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # a view, as in eager
    b.add_(1)
    torch.testing.assert_close(c, a * 2)
    torch.testing.assert_close(b_flat, (a * 2 + 1).reshape(-1))


def test_torch_cond_is_refused_with_a_typed_error():
    def f(x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))

    with pytest.raises(Exception) as info:
        neuron_compile(f)(torch.randn(4))
    inner = getattr(info.value, "inner_exception", info.value)
    assert isinstance(inner, UnsupportedOpsError), repr(info.value)
    assert "higher_order.cond" in str(inner) and "test_aliasing.py" in str(inner)


def test_while_loop_is_refused_with_a_typed_error():
    from torch._higher_order_ops.while_loop import while_loop

    def f(x):
        return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2), (torch.tensor(0), x))

    with pytest.raises(Exception) as info:
        neuron_compile(f)(torch.randn(3))
    inner = getattr(info.value, "inner_exception", info.value)
    assert isinstance(inner, UnsupportedOpsError), repr(info.value)
    assert "higher_order.while_loop" in str(inner)


@pytest.mark.parametrize("make", [lambda t: t.t(), lambda t: t[:, 1:], lambda t: t.as_strided((2, 2), (1, 1)),
                                  lambda t: t[0, :2].expand(2, 2)],
                         ids=["transposed", "offset", "overlapping", "expanded"])
def test_view_scatters_write_where_eager_writes_in_storage(make):
    """ATen's *_scatter results copy the input's storage with its strides (clone_preserve_strides):
    as_strided_scatter's view is placed in that storage, and through an input overlapping itself a
    write changes every element sharing the location; an input with a stride 0 is cloned densely."""
    base = torch.randn(3, 3, dtype=torch.float64)
    src = torch.tensor([10.0, 20.0], dtype=torch.float64)

    def f(x, s):
        return (torch.as_strided_scatter(x, s, (2,), (1,), x.storage_offset()),
                torch.as_strided_scatter(x * 1, s, (2,), (2,)),
                torch.select_scatter(x, x[1] * 3, 0, 0),
                torch.slice_scatter(x, x[:, :1] * 5, 1, 1, 2))
    x = make(base)
    for got, want in zip(torch.compile(f, backend="neuron", dynamic=False)(x, src), f(x, src)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("make", [lambda t: t.t(), lambda t: t[:, ::2], lambda t: t[1:],
                                  lambda t: t.reshape(3, 4, 1).permute(2, 1, 0)[0]],
                         ids=["transposed", "stepped", "offset", "permuted"])
def test_diagonal_of_a_non_contiguous_input(make):
    x = make(torch.randn(3, 4, dtype=torch.float64))
    f = lambda x: (x.diagonal() * 2, x.diagonal(1).exp(), torch.diagonal(x, -1) + 1)  # noqa: E731
    for got, want in zip(torch.compile(f, backend="neuron", dynamic=False)(x), f(x)):
        # (exp within an ulp of eager's: its vectorized and scalar paths differ by that much)
        torch.testing.assert_close(got, want, rtol=4e-16, atol=0)


@pytest.mark.parametrize("f", [lambda x: (x[1:] * 1,), lambda x: (x.t() / 1,), lambda x: (x.view(-1) - 0,),
                               lambda x: (x[0].expand(2, 3) * 1,), lambda x: (x * 2, (x * 2) * 1),
                               lambda x: (x * 2, (x * 2)[1:] ** 1), lambda x: (x.t().reshape(-1), x.t().contiguous())],
                         ids=["slice*1", "t/1", "view-0", "expand*1", "a,a*1", "a,a[1:]**1", "t.reshape,t.contiguous"])
def test_arithmetic_identities_and_equal_copies_return_fresh_tensors(f):
    """Eager's ``x * 1`` (and ``+ 0``, ``/ 1``, ``** 1``, ``contiguous`` of a transposed view) is a new
    tensor: folding it into ``x`` returned a view of the input, or one output twice."""
    x = torch.randn(2, 3)
    outs = neuron_compile(f)(x)
    want = f(x)
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w, rtol=0, atol=0)
        assert o.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    ptrs = [o.untyped_storage().data_ptr() for o in outs]
    assert len(set(ptrs)) == len(ptrs)


@pytest.mark.parametrize("f", [lambda x: ((x.double() * 2).view(torch.int64),),
                               lambda x: (lambda y: (y.view(torch.uint8), y))(x * 2),
                               lambda x: ((x * 2).view(torch.float16)[:, 2:],),
                               lambda x: ((x * 2).sum().view(torch.int32),),
                               lambda x: (x[1:].view(torch.int16),),
                               lambda x: (x.t().view(torch.int32),)],
                         ids=["f64->i64", "u8-and-base", "f16-sliced", "0-d", "input-slice->i16", "input-t->i32"])
def test_a_dtype_view_output_reads_the_same_bytes_as_eager(f):
    """``y.view(dtype)`` as a graph output: the bytes of ``y`` read as ``dtype``, sharing ``y``'s
    storage. Found after 9563e03: the runtime rebuilt it with ``as_strided`` in ``y``'s dtype (float
    values where eager has int64 bit patterns) or raised "setStorage: ... out of bounds"."""
    x = torch.randn(4, 6)
    outs, want = neuron_compile(f)(x), f(x)
    for o, w in zip(outs, want):
        assert (o.dtype, o.shape, o.stride(), o.storage_offset()) == (w.dtype, w.shape, w.stride(), w.storage_offset())
        # bit patterns are compared as the float values they came from (sums may round differently)
        torch.testing.assert_close(o.view(torch.float32) if o.dtype in (torch.int32, torch.float16) else
                                   o.view(torch.float64) if o.dtype == torch.int64 else o,
                                   w.view(torch.float32) if w.dtype in (torch.int32, torch.float16) else
                                   w.view(torch.float64) if w.dtype == torch.int64 else w, rtol=1e-6, atol=0)
        assert (o._base is None) == (w._base is None)
    if len(outs) == 2:   # the view and its base share one storage, as in eager
        assert outs[0].untyped_storage().data_ptr() == outs[1].untyped_storage().data_ptr()


def test_a_dtype_view_slot_survives_the_saved_function_format():
    """The view's dtype is part of the executable's manifest (saved functions, the disk cache)."""
    from neuron_compile.plan import OutputSlot
    slot = OutputSlot("view", base=("kernel", 0), size=(4, 12), stride=(12, 1), offset=2, dtype=torch.uint8)
    assert OutputSlot.from_json(json.loads(json.dumps(slot.to_json()))) == slot
    plain = OutputSlot("view", base=("input", 1), size=(3,), stride=(1,))
    assert OutputSlot.from_json(json.loads(json.dumps(plain.to_json()))) == plain
