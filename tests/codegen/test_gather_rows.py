"""Row gathers (``embedding``, ``index_select`` on dim 0) copy whole rows in an ``scf.forall``
(``forall-loop``): a gather only moves values, so the result must equal eager bit for bit, at 1
and 2 threads, for several index ranks and dtypes, and under the ``loops`` strategy (the forall
then runs as a sequential loop)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.codegen import TargetInfo, plan_codegen
from tests.conftest import neuron_compile
from tests.helpers import at_one_and_two_threads
from tests.ir.lower import lower

G = torch.Generator().manual_seed(0)
CASES = {
    "embedding": (lambda w, i: F.embedding(i, w), (torch.randn(1000, 64, generator=G),
                                                    torch.randint(0, 1000, (4, 33), generator=G))),
    "embedding-1d-index": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(50, 40, generator=G),
                                                                torch.randint(0, 50, (70,), generator=G))),
    "index-select-float64": (lambda x, i: x.index_select(0, i),
                              (torch.randn(30, 6, 5, generator=G, dtype=torch.float64),
                               torch.randint(0, 30, (45,), generator=G))),
    "index-select-int64": (lambda x, i: x.index_select(0, i) + 1,
                           (torch.randint(-2**40, 2**40, (64, 24), generator=G), torch.randint(0, 64, (9,), generator=G))),
}


@pytest.mark.parametrize("case", CASES)
def test_row_gathers_equal_eager(case):
    fn, args = CASES[case]
    _, lowered = lower(fn, *args)
    strategies = [s.strategy for s in plan_codegen(lowered.kernels, TargetInfo(), uses=lowered.value_uses).schedules]
    assert "forall-loop" in strategies
    one, two = at_one_and_two_threads(neuron_compile(fn), *args)
    expected = fn(*args)
    assert torch.equal(one, expected) and torch.equal(two, expected)


def test_a_row_gather_under_the_loops_strategy_runs_in_order():
    fn, args = CASES["embedding"]
    out = neuron_compile(fn, options={"schedule": '{"*": "loops"}', "cache": False})(*args)
    assert torch.equal(out, fn(*args))


def test_short_rows_and_other_dims_stay_one_generic():
    # rows under ROW_GATHER_MIN elements, and a gather along dim 1: the per-element generic
    for fn, args in ((lambda w, i: F.embedding(i, w), (torch.randn(100, 4), torch.randint(0, 100, (64,)))),
                     (lambda x, i: x.index_select(1, i), (torch.randn(64, 100), torch.randint(0, 100, (32,))))):
        _, lowered = lower(fn, *args)
        assert all(k.kind != "loop" for k in lowered.kernels)
        assert torch.equal(neuron_compile(fn)(*args), fn(*args))


@pytest.mark.parametrize("shape", [(64, 24), (64,), (5, 3)])
def test_a_0d_index_selects_one_row_keeping_the_dim(shape):
    # (a 0-d index made a linalg.generic whose index map had one result for a rank-0 operand)
    x = torch.randn(shape)
    fn = lambda x, i: x.index_select(0, i)  # noqa: E731
    assert torch.equal(neuron_compile(fn)(x, torch.tensor(3)), fn(x, torch.tensor(3)))


@pytest.mark.parametrize("case", ["embedding", "index-select", "index", "gather"])
def test_indexing_an_empty_dimension_is_a_compile_error_not_a_crash(case):
    """Every index into a dimension of size 0 is out of range (eager raises IndexError); clamping
    had no row to clamp to, and the kernel read outside the tensor: the process died (SIGSEGV,
    found by the fresh-user trial). Now lowering fails with the op and the user's line."""
    fn, args = {
        "embedding": (lambda i, w: F.embedding(i, w), (torch.tensor([0, 0]), torch.randn(0, 32))),
        "index-select": (lambda w, i: w.index_select(0, i), (torch.randn(0, 32), torch.tensor([0]))),
        "index": (lambda w, i: w[i], (torch.randn(0, 4), torch.tensor([0]))),
        "gather": (lambda w, i: torch.gather(w, 0, i), (torch.randn(0, 4), torch.zeros(2, 4, dtype=torch.long))),
    }[case]
    with pytest.raises(Exception) as info:
        neuron_compile(fn, options={"cache": False})(*args)
    assert "dimension of size 0" in str(info.value) and "test_gather_rows.py" in str(info.value)
    # an empty result from an empty table stays fine
    assert neuron_compile(lambda i, w: F.embedding(i, w))(torch.zeros(0, dtype=torch.long), torch.randn(0, 32)).shape == (0, 32)
