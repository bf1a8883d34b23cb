"""Config resolution, the lowering registry and the decomposition table."""
from __future__ import annotations

import pytest
import torch

from neuron_compile.config import Config, resolve_config
from neuron_compile.errors import NeuronCompileError
from neuron_compile.lowering.registry import get_lowering, lowering_rules, register_lowering, rule_file_for
from neuron_compile.passes.decompose import OURS, WHERE_LOWERING_DIFFERS, check_disjoint, decomposition_table

aten = torch.ops.aten


def test_options_win_over_environment_which_wins_over_defaults():
    env = {"NEURON_OPT_LEVEL": "1", "NEURON_DUMP_DIR": "/tmp/d"}
    assert resolve_config(None, env) == Config(dump_dir="/tmp/d", opt_level=1)
    assert resolve_config({"opt_level": 2}, env).opt_level == 2
    assert resolve_config(None, {}) == Config()


def test_bad_option_values_name_the_option_and_source():
    with pytest.raises(NeuronCompileError, match="NEURON_OPT_LEVEL"):
        resolve_config(None, {"NEURON_OPT_LEVEL": "fast"})
    with pytest.raises(NeuronCompileError, match="0..3"):
        resolve_config({"opt_level": 7}, {})
    with pytest.raises(NeuronCompileError, match="profile='maybe'.*options"):
        resolve_config({"profile": "maybe"}, {})
    with pytest.raises(NeuronCompileError, match="NEURON_PROFILE"):
        resolve_config(None, {"NEURON_PROFILE": "2"})
    with pytest.raises(NeuronCompileError, match="cache_max_bytes must be >= 0"):
        resolve_config(None, {"NEURON_CACHE_MAX_BYTES": "-5"})
    with pytest.raises(NeuronCompileError, match="stop_after builds nothing runnable"):
        resolve_config({"stop_after": "linalg"}, {})
    assert resolve_config({"profile": "yes"}, {}).profile is True
    assert resolve_config(None, {"NEURON_PROFILE": "off"}).profile is False


def test_codegen_key_holds_only_fields_that_change_code():
    assert Config(dump_dir="/a").codegen_key() == Config(dump_dir="/b").codegen_key()
    assert Config(opt_level=1).codegen_key() != Config(opt_level=3).codegen_key()


def test_packet_registration_covers_every_overload_and_refuses_duplicates():
    assert get_lowering(aten.eq.Tensor) is not None and get_lowering(aten.eq.Scalar) is not None
    with pytest.raises(ValueError, match="already has lowering rule"):
        register_lowering(aten.add.Tensor)(lambda ctx, a, b: a)


def test_rule_file_suggestions_follow_op_families():
    assert rule_file_for(aten.cumsum.default) == "lowering/rules/reduction.py"
    assert rule_file_for(aten.topk.default) == "lowering/rules/sorting.py"   # where sort and topk live
    assert rule_file_for(aten.argsort.default) == "lowering/rules/sorting.py"
    assert rule_file_for(aten.convolution.default) == "lowering/rules/conv.py"
    assert rule_file_for(aten.sin.default) == "lowering/rules/elementwise.py"


def test_no_op_is_both_decomposed_and_lowered():
    table = decomposition_table()
    rules = lowering_rules()
    # only the conditional entries, which hand every ordinary input back to the lowering rule
    both = set(table) & set(rules)
    assert both == set(WHERE_LOWERING_DIFFERS), sorted(map(str, both - set(WHERE_LOWERING_DIFFERS)))[:5]
    x, src = torch.randn(3, 4), torch.randn(1, 4)
    assert table[aten.slice_scatter.default](x.t(), src.t(), 1, 0, 1) is NotImplemented
    assert table[aten.select_scatter.default](x, src[0], 0, 2) is NotImplemented
    with pytest.raises(RuntimeError, match="both decomposed and lowered"):
        check_disjoint(table, {**rules, **{op: None for op in OURS}})


def test_dropout_decomposition_draws_like_eager():
    x = torch.randn(64, 33)
    torch.manual_seed(7)
    eager = torch.nn.functional.dropout(x, 0.25, training=True)
    fn, _ = OURS[aten.native_dropout.default]
    torch.manual_seed(7)
    ours, mask = fn(x, 0.25, True)
    torch.testing.assert_close(ours, eager)
    assert torch.equal(mask, eager != 0)
