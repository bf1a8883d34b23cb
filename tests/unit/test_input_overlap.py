"""neuron_compile/input_overlap.py: the exact overlap of views of one storage, against a brute
force over every element's address."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_compile.input_overlap import overlapping


def _addresses(t: torch.Tensor) -> set[int]:
    import itertools
    return {t.storage_offset() + sum(p * s for p, s in zip(pos, t.stride()))
            for pos in itertools.product(*(range(n) for n in t.shape))}


@st.composite
def views(draw):
    base = torch.zeros(24)
    out = []
    for _ in range(draw(st.integers(2, 4))):
        shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2))
        stride = draw(st.lists(st.integers(0, 5), min_size=len(shape), max_size=len(shape)))
        span = sum((n - 1) * s for n, s in zip(shape, stride))
        offset = draw(st.integers(0, max(0, 23 - span)))
        if offset + span <= 23:
            out.append(base.as_strided(shape, stride, offset))
    return out


@settings(max_examples=200, deadline=None)
@given(views())
def test_overlapping_matches_a_brute_force(ts):
    sets = [_addresses(t) for t in ts]
    want = {i for i in range(len(ts)) for j in range(len(ts)) if i != j and sets[i] & sets[j]}
    assert overlapping(ts) == want


def test_the_views_torch_calls_disjoint_overlap():
    base = torch.randn(3, 2)
    assert overlapping([base[:, :-1], base[1:]]) == {0, 1}   # elements 0, 2, 4 and 2..5
    assert overlapping([base[:, :-1], base[:, 1:]]) == set()
