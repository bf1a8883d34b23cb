"""Failures are loud, typed and point at the user's source line."""
from __future__ import annotations

import inspect

import pytest
import torch

import neuron_compile
from neuron_compile.errors import DynamicShapeError, UnsupportedOpsError
from tests.conftest import neuron_compile as nc


# ATen ops with no lowering rule (tests/opinfo/expectations.py lists them as unsupported): the
# honest "op with no rule". (A torch.library.custom_op runs as a host call instead: test_host_calls.)
NO_RULE_A, NO_RULE_B = "aten.nextafter.default", "aten.igamma.default"


def _line_of(fn, needle: str) -> int:
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(src) if needle in s)


def one_unsupported(x):
    y = x.relu()
    return torch.nextafter(y, y + 1) * 2


def two_unsupported(x):
    a = torch.nextafter(x, x - 1)
    b = torch.igamma(a.exp(), x.abs())
    return b.sum()


def unwrap(err: BaseException, kind: type) -> BaseException | None:
    """Our error inside Dynamo's ``BackendCompilerFailed`` (``inner_exception``) or a cause chain."""
    while err is not None and not isinstance(err, kind):
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
    return err


def _unsupported_error(fn, *args) -> UnsupportedOpsError:
    with pytest.raises(Exception) as info:
        nc(fn)(*args)
    err = unwrap(info.value, UnsupportedOpsError)
    assert isinstance(err, UnsupportedOpsError), f"expected UnsupportedOpsError, got {info.value!r}"
    assert str(err) in str(info.value), "our message must reach the user through BackendCompilerFailed"
    return err


def test_unsupported_op_names_op_and_user_line():
    err = _unsupported_error(one_unsupported, torch.randn(4))
    assert [u.op for u in err.ops] == [NO_RULE_A]
    assert err.ops[0].location == f"{__file__}:{_line_of(one_unsupported, 'nextafter(y')}"
    assert f"{__file__}:{_line_of(one_unsupported, 'nextafter(y')}" in str(err)
    assert "lowering/rules/" in err.ops[0].rule_file


def test_every_unsupported_op_is_listed_once_in_one_error():
    err = _unsupported_error(two_unsupported, torch.randn(3, 2))
    assert sorted(u.op for u in err.ops) == sorted([NO_RULE_A, NO_RULE_B])
    lines = {u.op: u.location for u in err.ops}
    assert lines[NO_RULE_A].endswith(f":{_line_of(two_unsupported, 'nextafter(x')}")
    assert lines[NO_RULE_B].endswith(f":{_line_of(two_unsupported, 'igamma(a.exp()')}")


def test_unsupported_op_is_not_silently_run_eagerly():
    neuron_compile.reset_metrics()
    with pytest.raises(Exception):
        nc(lambda x: torch.nextafter(x, x + 1))(torch.randn(2))
    m = neuron_compile.metrics()
    assert m["graphs_compiled"] == 0 and m["host_calls"] == 0 and m["fallback_ops"] == 0
    assert neuron_compile.get_fallback_ops() == []


def test_dynamic_true_gives_clear_error():
    f = torch.compile(lambda x: x * 2, backend="neuron", dynamic=True)
    with pytest.raises(Exception) as info:
        f(torch.randn(5))
    msg = str(info.value)
    assert "static shapes only" in msg and "dynamic=False" in msg
    assert "L['x']" in msg or "input" in msg
    assert isinstance(unwrap(info.value, DynamicShapeError), DynamicShapeError)


def test_mark_dynamic_gives_clear_error():
    x = torch.randn(6, 3)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception) as info:
        nc(lambda t: t + 1)(x)
    assert "dynamic=False" in str(info.value)


def test_unknown_option_is_rejected_with_the_known_ones():
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x + 1, backend="neuron", options={"opt_levle": 2})(torch.randn(2))
    assert "opt_levle" in str(info.value) and "opt_level" in str(info.value)


def test_public_error_types_are_exported():
    for name in ("UnsupportedOpsError", "DynamicShapeError", "PipelineError", "LoweringError"):
        assert issubclass(getattr(neuron_compile, name), neuron_compile.NeuronCompileError)


def declined_and_missing(x, mask, values):
    y = x.clone()
    y[mask] = values                   # index_put with a boolean mask and a values tensor: declined
    return torch.nextafter(y, y + 1)


def test_a_rule_declining_a_case_is_listed_with_the_other_unsupported_ops():
    err = _unsupported_error(declined_and_missing, torch.randn(4, 4), torch.tensor([True, False, True, False]),
                             torch.randn(2, 4))
    by_op = {u.op: u for u in err.ops}
    assert set(by_op) == {"aten.index_put.default", NO_RULE_A}
    assert "boolean mask and a values tensor" in by_op["aten.index_put.default"].reason
    assert by_op["aten.index_put.default"].location.endswith(f":{_line_of(declined_and_missing, 'y[mask]')}")


def test_mode_argument_is_ignored_with_a_warning():
    with pytest.warns(RuntimeWarning, match="mode='max-autotune' has no meaning"):
        out = torch.compile(lambda x: x + 1, backend="neuron", mode="max-autotune", dynamic=False)(torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 2.0))


def test_unsupported_dtype_is_a_clean_refusal():
    x = torch.randn(3, 2)
    err = _unsupported_error(lambda t: torch.view_as_complex(t) * 2, x)
    assert any("complex64" in u.reason for u in err.ops)


def add_one(x):
    return x + 1


def test_an_unsupported_input_dtype_points_at_the_inputs_first_use():
    err = _unsupported_error(add_one, torch.tensor([1, 2, 3]).to(torch.uint32))
    line = f"{__file__}:{_line_of(add_one, 'x + 1')}"
    inputs = [u for u in err.ops if u.op.startswith("input")]
    assert inputs and all("uint32" in u.reason for u in inputs)
    assert inputs[0].location == f"{line} (its first use)" and "<unknown location>" not in str(err)


def test_ops_only_producing_views_of_inputs_need_no_rule():
    x = torch.randn(6, 4)
    outs = nc(lambda t: t.chunk(3))(x)
    for got, exp in zip(outs, x.chunk(3)):
        torch.testing.assert_close(got, exp)


def _nonzero_rows(t):
    return torch.nonzero(t > 0) * 2


def _split_at_values(t, at):
    return torch.tensor_split(t, at, dim=1)[0] + 1


@pytest.mark.parametrize("fn, args, op", [
    (_nonzero_rows, (torch.randn(4, 3),), "nonzero"),                             # size seen by Dynamo
    (_split_at_values, (torch.randn(3, 6), torch.tensor([1, 4])), "tensor_split"),  # seen by AOTAutograd
])
def test_data_dependent_size_is_a_clean_refusal_naming_the_call(fn, args, op):
    with pytest.raises(Exception) as info:
        nc(fn, fullgraph=True)(*args)
    err = unwrap(info.value, UnsupportedOpsError)
    assert [u.op for u in err.ops] == [op]
    assert "depends on tensor values" in err.ops[0].reason
    assert err.ops[0].location.startswith(f"{__file__}:")
