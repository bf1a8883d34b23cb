"""Error checks that run on the host after the kernel, so a failed factorization raises eager's error.

AOTAutograd keeps ops with side effects in order by threading an *effect token* through them
(``torch._higher_order_ops.effects``): ``torch.linalg.inv`` becomes an LU factorization plus
``with_effects(token, aten._linalg_check_errors.default, info, "linalg.inv", is_matrix=True)``,
which raises ``torch.linalg.LinAlgError`` when ``info`` is non-zero (a singular matrix).
:func:`split_host_checks` turns ``info`` into one more graph output and returns the check as a
:class:`~neuron_compile.plan.HostOp`; the runtime calls the same ATen op on that output after the
kernel and drops it (``CallPlan.checks``), so the user gets eager's exact exception and message.
The token carries no data and is passed through unchanged.

This is a mandatory rewrite, run before the optional FX pass pipeline: it must not be lost when a
pipeline is customised, and the dry-run lowering of ``verify-lowerable`` must not see the checks.
"""
from __future__ import annotations

import operator

import torch

from neuron_compile.plan import HostOp

CHECK_OPS = {torch.ops.aten._linalg_check_errors.default}


def split_host_checks(gm: torch.fx.GraphModule) -> list[HostOp]:
    """Rewrite ``gm`` in place: each ``with_effects`` node running a :data:`CHECK_OPS` op is removed,
    its token result replaced by the token it received, and the tensor it checks appended to the
    graph's outputs. Returns one :class:`HostOp` per check, reading its tensor as ``("output", i)``.
    Other effectful ops are left in place (and refused: they have no lowering rule)."""
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    n_outs = len(output.args[0]) if isinstance(output.args[0], (list, tuple)) else 1
    checks, checked_nodes = [], []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.higher_order.with_effects:
            continue
        token, op, checked, *rest = node.args
        users = list(node.users)
        if op not in CHECK_OPS or not isinstance(checked, torch.fx.Node) or any(
                u.target is not operator.getitem or u.args[1] != 0 for u in users):
            continue
        for user in users:
            user.replace_all_uses_with(token)
            graph.erase_node(user)
        graph.erase_node(node)
        checks.append(HostOp(op, (("output", n_outs + len(checked_nodes)), *rest), dict(node.kwargs)))
        checked_nodes.append(checked)
    if checks:
        outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
        output.args = (tuple(outs) + tuple(checked_nodes),)
        graph.lint()
        gm.recompile()
    return checks
