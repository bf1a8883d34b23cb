"""Passes by name, and the pipeline spec (``options={"passes": ...}`` / ``NEURON_PASSES``).

A spec is ``default`` (or empty), a comma list of pass names (that exact pipeline), or the default
with removals, e.g. ``-fuse`` to debug without fusion.
"""
from __future__ import annotations

from typing import Callable

from neuron_compile.errors import NeuronCompileError


def _factories() -> dict[str, Callable[[str], object]]:
    from neuron_compile.passes.constant_fold import ConstantFold
    from neuron_compile.passes.conv_layout import ChannelsLastConvolutions
    from neuron_compile.passes.cse import CommonSubexpressionElimination
    from neuron_compile.passes.dce import DeadCodeElimination
    from neuron_compile.passes.fold_identity_arith import FoldIdentityArith
    from neuron_compile.passes.fold_views import FoldViews
    from neuron_compile.passes.fold_zeros_scatter import FoldZerosScatter
    from neuron_compile.passes.fuse import Fuse
    from neuron_compile.passes.layout import FoldTransposeIntoMatmul
    from neuron_compile.passes.verify_lowerable import VerifyLowerable
    return {
        "verify-lowerable": lambda g: VerifyLowerable(graph_name=g),
        "dce": lambda g: DeadCodeElimination(),
        "cse": lambda g: CommonSubexpressionElimination(),
        "fold-views": lambda g: FoldViews(),
        "fold-identity-arith": lambda g: FoldIdentityArith(),
        "fold-zeros-scatter": lambda g: FoldZerosScatter(),
        "constant-fold": lambda g: ConstantFold(),
        "fold-transpose-into-matmul": lambda g: FoldTransposeIntoMatmul(),
        "channels-last-convolutions": lambda g: ChannelsLastConvolutions(),
        "fuse": lambda g: Fuse(),
    }


PASS_NAMES = ("verify-lowerable", "dce", "cse", "fold-views", "fold-identity-arith", "fold-zeros-scatter",
              "constant-fold", "fold-transpose-into-matmul", "channels-last-convolutions", "fuse")
DEFAULT_PIPELINE = ("verify-lowerable", "dce", "cse", "fold-views", "fold-identity-arith", "fold-zeros-scatter",
                    "constant-fold", "fold-transpose-into-matmul", "dce", "channels-last-convolutions", "fuse")


def parse_pass_spec(spec: str | None) -> tuple[str, ...]:
    """The pass names a spec stands for.

    Raises:
        NeuronCompileError: an unknown pass name (the message lists the known ones).
    """
    tokens = [t.strip() for t in (spec or "").split(",") if t.strip()]
    if not tokens or tokens == ["default"]:
        return DEFAULT_PIPELINE
    unknown = [t.lstrip("-") for t in tokens if t.lstrip("-") not in PASS_NAMES and t != "default"]
    if unknown:
        raise NeuronCompileError(f"unknown pass(es) {unknown} in the pass pipeline spec {spec!r}; "
                                 f"known passes: {', '.join(PASS_NAMES)}")
    removals = {t[1:] for t in tokens if t.startswith("-")}
    kept = [t for t in tokens if not t.startswith("-") and t != "default"]
    base = list(DEFAULT_PIPELINE) if (not kept or "default" in tokens) else kept
    return tuple(p for p in base if p not in removals)


def build_passes(names: tuple[str, ...], graph_name: str) -> list:
    factories = _factories()
    return [factories[n](graph_name) for n in names]
