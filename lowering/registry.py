"""The one op → lowering-rule registry.

Modelled on JAX's ``mlir.register_lowering`` and Inductor's ``lowering.register_lowering``: a dict
keyed by ATen ``OpOverload``; ``@register_lowering(aten.add.Tensor, ...)`` above a rule
``(ctx, *args, **kwargs) -> TensorValue | tuple``. Passing an ``OpOverloadPacket`` registers every
overload. Registering an op twice is an error.
"""
from __future__ import annotations

import importlib
import re
from typing import Callable

import torch

LoweringRule = Callable[..., object]

_RULES: dict[torch._ops.OpOverload, LoweringRule] = {}
_KINDS: dict[torch._ops.OpOverload, str] = {}
# Ops that exist only once an optional module defines them, by qualified name ("prims::fma.default":
# Dynamo emits Inductor's ``prims.fma`` for ``addcmul_(value=)``, and importing
# ``torch._inductor.inductor_prims`` up front costs 1.6 s)
_BY_NAME: dict[str, tuple[LoweringRule, str]] = {}
FUSION_KINDS = ("pointwise", "reduction", "matmul", "opaque")
_FAMILIES = ("elementwise", "reduction", "matmul", "shape", "indexing", "creation", "conv", "pooling", "sorting", "orthopoly")
_loaded = False


def register_lowering(*ops: object, kind: str | None = None) -> Callable[[LoweringRule], LoweringRule]:
    """Register the decorated rule for ``ops`` (``OpOverload`` or ``OpOverloadPacket``, or the
    qualified name ``"ns::op.overload"`` of an op another module defines on import).

    ``kind`` is the op's fusion kind (``pointwise``, ``reduction``, ``matmul``, ``opaque``);
    by default the ``FUSION_KIND`` of the rule's module (``opaque`` if it has none). Pointwise and
    reduction rules accept lazy (fused, not yet materialised) inputs.

    Raises:
        ValueError: an op already has a rule (rules must be unique), or an unknown kind.
    """
    def deco(fn: LoweringRule) -> LoweringRule:
        import sys
        k = kind or getattr(sys.modules.get(fn.__module__), "FUSION_KIND", "opaque")
        if k not in FUSION_KINDS:
            raise ValueError(f"unknown fusion kind {k!r}")
        for op in ops:
            if isinstance(op, str):
                if op in _BY_NAME:
                    raise ValueError(f"{op} already has lowering rule {_BY_NAME[op][0].__name__}")
                _BY_NAME[op] = (fn, k)
                continue
            overloads = ([getattr(op, o) for o in op.overloads()]
                         if isinstance(op, torch._ops.OpOverloadPacket) else [op])
            for ov in overloads:
                if ov in _RULES:
                    raise ValueError(f"{ov} already has lowering rule {_RULES[ov].__name__}")
                _RULES[ov] = fn
                _KINDS[ov] = k
        return fn
    return deco


def _load_rules() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for fam in _FAMILIES:
            importlib.import_module(f"neuron_compile.lowering.rules.{fam}")


def lowering_rules() -> dict[torch._ops.OpOverload, LoweringRule]:
    """The registry (rule modules are imported on first use, keeping ``import`` cheap)."""
    _load_rules()
    return _RULES


def _by_name(op: object) -> tuple[LoweringRule, str] | None:
    if not isinstance(op, torch._ops.OpOverload):
        return None
    return _BY_NAME.get(f"{op.namespace}::{op._opname}.{op._overloadname}")


def get_lowering(op: object) -> LoweringRule | None:
    rule = lowering_rules().get(op)  # type: ignore[arg-type]
    named = _by_name(op) if rule is None else None
    return named[0] if named else rule


# Ops whose lowering rules take pointwise (lazy) inputs although they are not pointwise: they write
# each input into a slice of their output (``LoweringContext.insert_slice``), so a fused pointwise
# producer is computed straight into that slice instead of being stored and copied (torch.cat of
# ``-x2, x1`` in rotary embeddings; F.pad of a ReLU; a convolution's zero-padded input, which the
# implicit GEMM reads: the previous convolution's BN + ReLU is written there directly). The fusion
# pass lets producers join them.
LAZY_INPUT_OPS: frozenset = frozenset({torch.ops.aten.cat.default, torch.ops.aten.constant_pad_nd.default,
                                       torch.ops.aten.convolution.default})


LAZY_INPUT_KINDS = ("pointwise", "reduction")  # fusion kinds whose rules read lazy inputs


def reads_lazy_inputs(op: object, kind: str | None = None) -> bool:
    """Whether ``op``'s rule accepts unmaterialised (lazy) inputs: pointwise and reduction rules,
    and :data:`LAZY_INPUT_OPS`. ``kind``: the op's fusion kind if the caller already decided it
    (the fusion pass treats ``getitem`` as pointwise and seeded random ops as opaque)."""
    return (kind or fusion_kind(op)) in LAZY_INPUT_KINDS or op in LAZY_INPUT_OPS


def fusion_kind(op: object) -> str:
    """``pointwise``/``reduction``/``matmul``/``opaque`` for an op (``opaque`` if it has no rule)."""
    lowering_rules()
    named = _by_name(op)
    return named[1] if named else _KINDS.get(op, "opaque")  # type: ignore[arg-type]


# Where an op's support would go, by name pattern: a rule file of lowering/rules/, or for the
# families we decompose instead (pooling, norms, linear algebra) the pass that holds them
_FAMILY_PLACES = [
    ("lowering/rules/conv.py", r"conv"),
    ("passes/separable.py", r"pool"),
    ("passes/decompose.py", r"norm"),
    ("passes/linalg.py", r"^linalg_|^_linalg|matrix_exp|cholesky|^lu|qr$|svd|eig|solve|inverse|^det$|slogdet"),
    ("lowering/rules/indexing.py", r"index|gather|scatter|take|put|embedding|masked|nonzero"),
    ("lowering/rules/sorting.py", r"sort|topk|kthvalue|searchsorted|bucketize"),
    ("lowering/rules/reduction.py", r"sum|mean|prod|max|min|var|std|any|all|cum|arg|logsumexp|median|mode"),
    ("lowering/rules/matmul.py", r"mm|matmul|dot|linear|einsum|baddbmm|addmv|mv$"),
    ("lowering/rules/shape.py", r"view|reshape|permute|cat|slice|select|squeeze|expand|pad|flip|roll|split|stack|"
                                r"transpose|unfold|narrow|as_strided|repeat|tile|diag|tril|triu"),
    ("passes/decompose.py", r"rand|bernoulli|normal|uniform|multinomial|dropout|poisson"),
]


def rule_file_for(op: object) -> str:
    """Where support for ``op`` would go, for error messages: a ``lowering/rules/<family>.py``
    file, or the pass whose decompositions cover its family (``passes/linalg.py`` for linear
    algebra, ``passes/separable.py`` for pooling, ``passes/decompose.py`` for the rest)."""
    name = getattr(op, "__name__", str(op)).split(".")[0]
    tags = getattr(op, "tags", ())
    if torch.Tag.pointwise in tags:
        return "lowering/rules/elementwise.py"
    for place, pat in _FAMILY_PLACES:
        if re.search(pat, name):
            return place
    return "lowering/rules/elementwise.py"
