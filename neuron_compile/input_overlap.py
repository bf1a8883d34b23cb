"""Which graph inputs overlap in memory, exactly, for AOTAutograd's synthetic bases.

When graph inputs share a storage and one of them is mutated, AOTAutograd replaces them by one
*synthetic base* and regenerates each input as a view of it, so the graph sees the mutation through
every alias (``runtime_wrappers.merge_view_inputs``). It skips that where the inputs share a
storage but do not overlap, asking ``torch._C._dynamo.guards.compute_overlapping_tensors``. In torch
2.13 and 2.14 that check answers "disjoint" for some overlapping views: ``base[:, :-1]`` (elements
0, 2, 4 of a 3×2 base) and ``base[1:]`` (2..5). Then ``x1.add_(1); return x3 + x3`` reads ``x3``
before the mutation, on every backend (``aot_eager`` too).

:func:`exact_input_overlap` makes the check exact while our backend runs AOTAutograd: with static
shapes the storage elements of each input are known, and two inputs overlap where those sets meet.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Sequence

import numpy as np

# above this many elements in a group the sets are not built: every input counts as overlapping
# (a synthetic base where none was needed costs a copy, never a wrong value)
MAX_ELEMENTS = 1 << 24


def _elements(t: Any) -> np.ndarray:
    at = np.full((), int(t.storage_offset()), dtype=np.int64)
    for d, (n, st) in enumerate(zip(t.shape, t.stride())):
        at = at + (np.arange(int(n), dtype=np.int64) * int(st)).reshape([int(n) if k == d else 1
                                                                         for k in range(t.dim())])
    return np.unique(at)


def overlapping(tensors: Sequence[Any]) -> set[int]:
    """Indices of the tensors (views of one storage, static shapes) sharing an element with
    another. Views of different dtypes, or groups above :data:`MAX_ELEMENTS`, count as all
    overlapping."""
    if len({t.dtype for t in tensors}) > 1 or sum(math.prod(t.shape) for t in tensors) > MAX_ELEMENTS:
        return set(range(len(tensors)))
    sets = [_elements(t) for t in tensors]
    found = set()
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            if sets[i].size and sets[j].size and np.intersect1d(sets[i], sets[j], assume_unique=True).size:
                found |= {i, j}
    return found


@contextlib.contextmanager
def exact_input_overlap() -> Iterator[None]:
    """Within the block, AOTAutograd's overlap check for static-shape inputs is :func:`overlapping`
    (united with torch's own answer); symbolic shapes keep torch's."""
    from torch._functorch._aot_autograd import input_output_analysis as analysis
    torch_check = analysis.compute_overlapping_tensors

    def check(tensors, symbolic: bool = False):
        found = set(torch_check(tensors, symbolic=symbolic))
        return found if symbolic else found | overlapping(tensors)
    analysis.compute_overlapping_tensors = check
    try:
        yield
    finally:
        analysis.compute_overlapping_tensors = torch_check
