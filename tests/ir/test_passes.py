"""FileCheck-style checks of each FX pass: what it must produce and what it must not."""
from __future__ import annotations

import networkx as nx
import pytest
import torch
import torch.nn.functional as F

from neuron_compile.errors import NeuronCompileError
from neuron_compile.passes.analysis import merge_creates_cycle
from neuron_compile.passes.registry import DEFAULT_PIPELINE, parse_pass_spec
from tests.ir.lower import lower, run_pass, targets, trace


def test_dce_removes_unused_pure_nodes_but_keeps_random_draws():
    def f(x):
        x.exp()                                   # unused: removed
        torch.bernoulli(torch.empty_like(x), 0.5)  # unused, but eager draws it: kept
        return x + 1
    gm = trace(f, torch.randn(3))
    from neuron_compile.passes.dce import DeadCodeElimination
    DeadCodeElimination().run(gm)
    ts = targets(gm)
    assert "aten.exp.default" not in ts and "aten.bernoulli.p" in ts


def test_cse_merges_identical_pure_nodes_only():
    gm, changed = run_pass("cse", lambda x: x.exp() + x.exp() + x.exp().sum(), torch.randn(4))
    assert changed and targets(gm).count("aten.exp.default") == 1
    gm, _ = run_pass("cse", lambda x: torch.bernoulli(x, 0.5) + torch.bernoulli(x, 0.5), torch.rand(4))
    assert targets(gm).count("aten.bernoulli.p") == 2


def test_fold_views_removes_noop_views_and_transpose_pairs():
    gm, changed = run_pass("fold-views", lambda x: x.view(3, 4).t().t().reshape(3, 4) * 2, torch.randn(3, 4))
    assert changed and targets(gm) == ["aten.mul.Tensor"]
    gm, _ = run_pass("fold-views", lambda x: x.permute(2, 0, 1).permute(2, 0, 1) + 1, torch.randn(2, 3, 4))
    assert targets(gm) == ["aten.permute.default", "aten.add.Tensor"]  # two permutes compose into one
    perm = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.permute.default).args[1]
    assert perm == [1, 2, 0]


def test_fold_views_keeps_a_view_of_an_input_that_is_an_output():
    gm, _ = run_pass("fold-views", lambda x: x.view(3, 4), torch.randn(3, 4))
    assert targets(gm) == ["aten.view.default"]


def test_fold_identity_arith_drops_mul_by_one_but_not_broadcasts_or_promotions():
    gm, changed = run_pass("fold-identity-arith", lambda x: ((x * 1 + 0) / 1 - 0 + x) * 2, torch.randn(3))
    # x + 0.0 stays: it turns -0.0 into +0.0 (x - 0.0 and x + (-0.0) are the identity)
    assert changed and targets(gm) == ["aten.add.Tensor", "aten.add.Tensor", "aten.mul.Tensor"]
    gm, _ = run_pass("fold-identity-arith", lambda x: (x + -0.0) * 2, torch.randn(3))
    assert targets(gm) == ["aten.mul.Tensor"]
    gm, _ = run_pass("fold-identity-arith", lambda x, y: x * 1 + y, torch.randn(3), torch.randn(3))
    assert "aten.mul.Tensor" not in targets(gm)
    gm2, _ = run_pass("fold-identity-arith", lambda i: i * 1.0, torch.arange(3))  # int * float promotes
    assert "aten.mul.Tensor" in targets(gm2)


def test_fold_zeros_scatter_accumulates_a_sparse_gradient_into_the_dense_addend():
    ids, d, v = torch.tensor([3, 1, 3, 0]), torch.randn(5, 4), torch.randn(4, 4)

    def tied(w_grad, v, ids):  # a tied embedding's gradient: LM head's dense part + the embedding's rows
        return w_grad + torch.zeros(5, 4).index_put((ids,), v, accumulate=True)
    gm, changed = run_pass("fold-zeros-scatter", tied, d, v, ids)
    assert changed and targets(gm) == ["aten.index_put.default"]
    gm, changed = run_pass("fold-zeros-scatter",
                           lambda d, s, i: torch.zeros(5, 4).scatter_add(0, i[:, None].expand(4, 4), s) + d, d, v, ids)
    assert changed and targets(gm)[-1] == "aten.scatter_add.default" and "aten.add.Tensor" not in targets(gm)
    gm, changed = run_pass("fold-zeros-scatter", lambda d, s, i: d + torch.zeros(5, 4).index_add(0, i, s), d, v, ids)
    assert changed and "aten.add.Tensor" not in targets(gm)


@pytest.mark.parametrize("case", ["overwrite", "broadcast", "promotion", "zeros_used_twice", "alpha", "nonzero_base"])
def test_fold_zeros_scatter_leaves_what_is_not_the_same_sum(case):
    def f(d, v, ids):
        z = torch.full((5, 4), 1.0) if case == "nonzero_base" else torch.zeros(5, 4)
        s = z.index_put((ids,), v, accumulate=case != "overwrite")
        if case == "broadcast":
            return d[:1] + s
        if case == "promotion":
            return d.double() + s
        if case == "zeros_used_twice":
            return d + s + z
        if case == "alpha":
            return torch.add(d, s, alpha=2)
        return d + s
    gm, changed = run_pass("fold-zeros-scatter", f, torch.randn(5, 4), torch.randn(4, 4), torch.tensor([3, 1, 3, 0]))
    assert not changed and "aten.add.Tensor" in targets(gm)


def test_constant_fold_turns_a_mask_built_from_factories_into_one_constant():
    def f(x):
        mask = ~torch.tril(torch.ones(4, 4, dtype=torch.bool))
        return x.masked_fill(mask, 0.0)
    gm, changed = run_pass("constant-fold", f, torch.randn(4, 4))
    ops = targets(gm)
    assert changed and not any("tril" in t or "ones" in t or "bitwise_not" in t for t in ops)
    consts = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert consts and torch.equal(getattr(gm, consts[0].target), ~torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_layout_folds_weight_transpose_into_the_matmul():
    gm, changed = run_pass("fold-transpose-into-matmul", lambda x, w, b: F.linear(x, w, b),
                           torch.randn(8, 16), torch.randn(32, 16), torch.randn(32))
    assert changed and targets(gm) == ["neuron.matmul.default"]
    mm = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert mm.args[3:] == (False, True) and mm.args[2] is not None  # trans_b, bias as accumulator


def test_x_at_w_t_materialises_no_transposed_copy():
    from neuron_compile.codegen.strategy import parse_overrides
    from neuron_compile.lowering.emit import lower_graph
    gm, lowered = lower(lambda x, w: x @ w.t(), torch.randn(8, 16), torch.randn(32, 16))
    assert "linalg.transpose" not in lowered.mlir
    # the tiled GEMM packs W as stored, [N, K], into its NR-wide panels: no transposed copy first
    assert "linalg.pack %in" in lowered.mlir and "inner_dims_pos = [0]" in lowered.mlir
    plain = lower_graph(gm, "test", overrides=parse_overrides('{"matmul": "loops"}'))
    assert "linalg.transpose" not in plain.mlir
    assert "affine_map<(d0, d1, d2) -> (d1, d2)>" in plain.mlir  # B read as (n, k): transposed map
    _, unfused = lower(lambda x, w: x @ w.t(), torch.randn(8, 16), torch.randn(32, 16), passes="-fold-transpose-into-matmul")
    assert "linalg.transpose" in unfused.mlir  # the pass is what removes it


def test_fuse_partitions_without_cycles():
    gm, _ = run_pass("fuse", lambda x: (x.exp() * 2).sum(-1, keepdim=True) + x.relu(), torch.randn(4, 5))
    kernels = {n.meta.get("neuron_kernel") for n in gm.graph.nodes if n.op == "call_function"}
    assert None not in kernels and len(kernels) == 2  # exp·mul·sum (prologue) | add·relu


def test_merge_that_would_create_a_cycle_is_detected():
    g = nx.DiGraph([("a", "b"), ("b", "c"), ("a", "c")])
    assert merge_creates_cycle(g, ["a", "c"])       # b sits between them
    assert not merge_creates_cycle(g, ["a", "b", "c"])
    assert not merge_creates_cycle(g, ["b", "c"])


def test_pass_spec_by_name():
    assert parse_pass_spec(None) == DEFAULT_PIPELINE
    assert "fuse" not in parse_pass_spec("-fuse")
    assert parse_pass_spec("dce,fuse") == ("dce", "fuse")
    with pytest.raises(NeuronCompileError, match="unknown pass.*known passes"):
        parse_pass_spec("dce,fusion")
