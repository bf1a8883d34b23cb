"""Ops whose result size depends on tensor values (unique, nonzero, masked_select), returned from the
compiled function: computed into a buffer of the static bound, narrowed to the count on the host."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import neuron_compile as nc


def _same(got, exp):
    got, exp = (got, exp) if isinstance(exp, tuple) else ((got,), (exp,))
    assert len(got) == len(exp)
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)


X = torch.tensor([[3., 1., 2., 3.], [1., 5., 1., 3.], [3., 1., 2., 3.]])


@pytest.mark.parametrize("kw", [
    {}, {"return_inverse": True}, {"return_counts": True, "return_inverse": True},
    {"dim": 0, "return_inverse": True, "return_counts": True}, {"dim": 1, "return_counts": True},
    {"sorted": False},
])
def test_unique_matches_eager(kw):
    _same(nc(lambda t: torch.unique(t, **kw), fullgraph=True)(X), torch.unique(X, **kw))


@pytest.mark.parametrize("kw", [{}, {"return_inverse": True, "return_counts": True}, {"dim": 1, "return_counts": True}])
def test_unique_consecutive_matches_eager(kw):
    x = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 2, 2, 7, 0]])
    _same(nc(lambda t: torch.unique_consecutive(t, **kw), fullgraph=True)(x), torch.unique_consecutive(x, **kw))


def test_unique_with_nan_keeps_each_nan_like_eager():
    x = torch.tensor([float("nan"), 1.0, float("nan"), 1.0])
    kw = {"return_inverse": True, "return_counts": True}
    _same(nc(lambda t: torch.unique(t, **kw), fullgraph=True)(x), torch.unique(x, **kw))


def test_nonzero_argwhere_masked_select_and_a_static_output_alongside():
    x = torch.randn(4, 5)

    def f(t):
        return torch.nonzero(t > 0), torch.nonzero(t > 0.5, as_tuple=True), t.masked_select(t < 0), t * 2

    got, exp = nc(f, fullgraph=True)(x), f(x)
    _same((got[0], *got[1], got[2], got[3]), (exp[0], *exp[1], exp[2], exp[3]))
    # a different count on the next call: the same executable, narrowed differently
    y = -x
    got, exp = nc(f, fullgraph=True)(y), f(y)
    _same((got[0], *got[1], got[2], got[3]), (exp[0], *exp[1], exp[2], exp[3]))


def test_masked_select_gradient_reaches_the_selected_elements():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, False, True, False]])
    out = nc(lambda t, m: torch.masked_select(t * 3, m), fullgraph=True)(x, mask)
    ref = torch.masked_select(x.detach() * 3, mask)
    torch.testing.assert_close(out.detach(), ref)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (mask.expand(3, 4) * 3.0).to(torch.float64))


def test_boolean_mask_index_returned_from_the_graph_matches_eager():
    x, mask = torch.randn(5, 3, 2), torch.tensor([True, False, True, True, False])
    f = lambda t, m: (t[m], t * 2)  # noqa: E731
    _same(nc(f, fullgraph=True)(x, mask), f(x, mask))


def test_a_bounded_result_used_by_further_computation_is_still_refused():
    from neuron_compile.errors import UnsupportedOpsError
    with pytest.raises(Exception) as info:
        nc(lambda t: torch.unique(t).sum(), fullgraph=True)(X)
    assert any(isinstance(e, UnsupportedOpsError) for e in _chain(info.value))


def _chain(e):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def test_item_results_returned_from_the_graph_match_eager():
    """``.item()`` under ``fullgraph=True``: a float comes back through ``scalar_tensor``, an int or
    a bool as the number itself (with Dynamo's range asserts); each is read on the host after the
    compiled call and equals eager's, with eager's Python type."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) * 3
    f = lambda t: (t * 2, t.sum().item(), t.argmax().item(), (t > 0).all().item(),  # noqa: E731
                   t.int().sum().item(), t[1:2, 2:].item())
    got, exp = nc(f, fullgraph=True)(x), f(x)
    torch.testing.assert_close(got[0], exp[0], rtol=0, atol=0)
    for g, e in zip(got[1:], exp[1:]):
        assert type(g) is type(e)
    # a float32 sum in another order: against the float64 sum, at float32's rounding of 12 terms
    assert got[1] == pytest.approx(x.double().sum().item(), abs=1e-5) and got[2:] == exp[2:]
    assert nc(lambda t: t.item(), fullgraph=True)(torch.tensor([[2.5]])) == 2.5


def test_an_item_used_by_further_computation_is_refused_with_what_to_do():
    from neuron_compile.errors import UnsupportedOpsError
    with pytest.raises(Exception) as info:
        nc(lambda t: t * t.sum().item(), fullgraph=True)(X)
    err = next(e for e in _chain(info.value) if isinstance(e, UnsupportedOpsError))
    assert "item" in str(err) and "x * t.item()" in str(err)
