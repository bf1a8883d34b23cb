"""The codegen seam: kernels are tagged in the MLIR and described as data, schedules are selected
per kernel (pure), can be overridden, and are recorded in the dump and the manifest."""
from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.codegen import Schedule, TargetInfo, plan_codegen, plan_from_json
from neuron_compile.codegen.strategy import parse_overrides
from neuron_compile.errors import NeuronCompileError
from tests.ir.lower import lower


def _mlp_step(x, w1, b1, w2):
    h = F.layer_norm(F.gelu(x @ w1.t() + b1), (w1.shape[0],))
    return (h @ w2).softmax(-1).sum(0)


@pytest.fixture(scope="module")
def lowered():
    args = (torch.randn(8, 16), torch.randn(32, 16), torch.randn(32), torch.randn(32, 4))
    return lower(_mlp_step, *args)[1]


def test_every_kernel_is_tagged_with_its_id_and_kind(lowered):
    tags = re.findall(r'neuron\.kernel = (\d+) : i64, neuron\.kind = "(\w+)"', lowered.mlir)
    assert sorted({int(i) for i, _ in tags}) == list(range(len(lowered.kernels)))
    assert all(lowered.kernels[int(i)].kind == kind for i, kind in tags)
    kinds = [k.kind for k in lowered.kernels]
    assert kinds.count("matmul") == 2 and "reduction" in kinds and "pointwise" in kinds
    # a tiled GEMM is several ops (packs, init, one contraction per region), each naming its part
    for k in lowered.kernels:
        if "gemm" in k.attrs:
            assert len(re.findall(rf'neuron\.kernel = {k.id} : i64, neuron\.kind = "matmul", neuron\.part', lowered.mlir)) >= 2


def test_kernel_info_describes_the_matmul_layout(lowered):
    mm = [k for k in lowered.kernels if k.kind == "matmul"]
    first = mm[0]  # x @ w1.t(): w1 is read transposed through the indexing map
    assert (first.attrs["m"], first.attrs["n"], first.attrs["k"]) == (8, 32, 16)
    assert first.attrs["trans_b"] and not first.attrs["trans_a"]
    assert first.flops == 2 * 8 * 32 * 16
    assert first.attrs["gemm"]["NR"] in (16, 32)  # the schedule that shaped its payload


def test_kernel_info_round_trips_through_json(lowered):
    from neuron_compile.codegen.kernels import KernelInfo
    for k in lowered.kernels:
        assert KernelInfo.from_json(json.loads(json.dumps(k.to_json()))) == k


def test_selection_is_data_and_overrides_win(lowered):
    target = TargetInfo("avx2", 256, 16)
    plan = plan_codegen(lowered.kernels, target)
    assert len(plan.schedules) == len(lowered.kernels)
    assert all(isinstance(s, Schedule) for s in plan.schedules)
    forced = plan_codegen(lowered.kernels, target, '{"*": "loops"}')
    assert {s.strategy for s in forced.schedules} == {"loops"} and forced.library == ""
    again = plan_from_json(json.loads(json.dumps(plan.to_json())))
    assert again.schedules == plan.schedules and again.library == plan.library


@pytest.mark.parametrize("text,needle", [
    ("not json", "JSON object"), ('["loops"]', "JSON object"), ('{"conv": "loops"}', "not a kernel id"),
    ('{"matmul": "fastest"}', "unknown codegen strategy"), ('{"3": 7}', "strategy name"),
])
def test_bad_overrides_say_what_is_wrong(text, needle):
    with pytest.raises(NeuronCompileError, match=needle):
        parse_overrides(text)


def test_schedule_option_is_validated_when_the_config_is_resolved():
    from neuron_compile.config import resolve_config
    assert json.loads(resolve_config({"schedule": {"matmul": "loops"}}).schedule) == {"matmul": "loops"}
    with pytest.raises(NeuronCompileError, match="unknown codegen strategy"):
        resolve_config({}, {"NEURON_SCHEDULE": '{"*": "nope"}'})


def test_an_override_a_kernel_cannot_take_is_an_error_by_id_and_a_warning_by_kind(lowered, caplog):
    target = TargetInfo("avx2", 256, 16)
    row = next(k for k in lowered.kernels if k.kind == "reduction" and k.contiguous_dim in k.reduction_dims)
    default = plan_codegen(lowered.kernels, target).schedules[row.id]
    for strategy in ("column-reduction", "fused-rows", "matmul"):
        with pytest.raises(NeuronCompileError, match=f"kernel {row.id}: strategy '{strategy}'"):
            plan_codegen(lowered.kernels, target, json.dumps({str(row.id): strategy}))
    with caplog.at_level("WARNING", logger="neuron_compile"):
        plan = plan_codegen(lowered.kernels, target, '{"reduction": "fused-rows"}')
    assert plan.schedules[row.id] == default  # kept, not half-applied (it crashed with KeyError: 'group')
    assert f"not applied to kernel {row.id}" in caplog.text
