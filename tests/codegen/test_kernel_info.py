"""``Operand.covers``: whether a kernel's output indices reach every element (a zero fill may then be
fused into each tile's slice), against a brute-force enumeration of the indices."""
from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_compile.codegen.kernels import Operand


def _reached(exprs, ranges):
    """Every index tuple the map reaches (the loop nest enumerated)."""
    out = set()
    for point in itertools.product(*(range(r) for r in ranges)):
        out.add(tuple(eval(e.replace("d", "p"), {}, {f"p{i}": v for i, v in enumerate(point)})  # noqa: S307
                      for e in exprs))
    return out


@settings(max_examples=200, deadline=None)
@given(terms=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 5)), min_size=1, max_size=3),
       extra=st.integers(-2, 2))
def test_covers_is_true_exactly_when_every_element_is_reached(terms, extra):
    """One output dim indexed ``d1 * c1 + d2 * c2 + ...`` (a col2im's ``oh·stride + kh·dilation``),
    plus a plain batch dim; sizes around the largest index reached."""
    ranges = (2,) + tuple(r for _, r in terms)
    expr = " + ".join(f"d{i + 1} * {c}" for i, (c, _) in enumerate(terms))
    top = sum(c * (r - 1) for c, r in terms)
    size = max(1, top + 1 + extra)
    op = Operand((2, size), torch.float32, ("d0", expr), output=True)
    reached = _reached(op.exprs, ranges)
    whole = set(itertools.product(range(2), range(size)))
    assert op.covers(ranges) == (reached == whole)


def test_a_constant_index_covers_only_a_dim_of_one():
    assert Operand((1, 5), torch.float32, ("0", "d1"), output=True).covers((1, 5))
    assert not Operand((2, 5), torch.float32, ("0", "d1"), output=True).covers((1, 5))
