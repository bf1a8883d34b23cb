"""Decompositions of ATen's ``_foreach_*`` ops (the optimizers' multi-tensor updates) into one
per-tensor op per list element, generated from the ops' schemas.

``torch.optim`` uses the foreach forms by default on CPU too (``foreach=None`` picks them for
native tensors); ``torch._decomp`` has no decomposition for them (Inductor lowers each one in
``torch/_inductor/lowering.py`` by mapping it onto the pointwise op of the same name, the scheme
followed here). A list argument (``Tensor[]``, ``Scalar[]``, or the 1-D ``Tensor scalars`` of
``addcmul``/``addcdiv``) is indexed per element; anything else is passed to every element. Once
decomposed, the per-tensor ops fuse like any other pointwise chain.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

aten = torch.ops.aten


def _addc(combine: Callable[..., torch.Tensor], fused: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``addcmul``/``addcdiv``: ATen's op for a number ``value``; for an element of a
    ``Tensor scalars`` (a 0-d tensor) ``s + value·combine(t1, t2)``, with no ``.item()`` while tracing."""
    def per(s, t1, t2, value=1):
        return s + value * combine(t1, t2) if isinstance(value, torch.Tensor) else fused(s, t1, t2, value=value)
    return per


def _binary_or_clamp(binary: Callable, clamp: Callable) -> Callable:
    """``maximum``/``minimum`` with a number are ATen's ``clamp_min``/``clamp_max`` (foreach's
    ``.Scalar`` overloads call those)."""
    return lambda s, o: binary(s, o) if isinstance(o, torch.Tensor) else clamp(s, o)


# Per-tensor forms whose torch function differs from the op's name or its argument handling
PER_TENSOR: dict[str, Callable[..., Any]] = {
    "addcmul": _addc(torch.mul, torch.addcmul),
    "addcdiv": _addc(torch.div, torch.addcdiv),
    "maximum": _binary_or_clamp(torch.maximum, torch.clamp_min),
    "minimum": _binary_or_clamp(torch.minimum, torch.clamp_max),
    "copy": lambda s, src, non_blocking=False: aten.copy.default(s, src, non_blocking),
    "zero": torch.zeros_like,
    "norm": lambda s, ord=2, dtype=None: torch.linalg.vector_norm(s, ord, dtype=dtype),
    "max": torch.amax,
}


def _indexed(arg: torch._C.Argument) -> bool:
    return isinstance(arg.type, torch._C.ListType) or (arg.name == "scalars" and str(arg.type) == "Tensor")


def _decomposition(base: str, schema: torch._C.FunctionSchema) -> Callable[..., list]:
    per = PER_TENSOR.get(base) or getattr(torch, base)
    names = [a.name for a in schema.arguments]
    indexed = {a.name for a in schema.arguments if _indexed(a)}

    def decompose(*args, **kwargs):
        bound = dict(zip(names, args)) | kwargs
        n = len(next(v for k, v in bound.items() if k in indexed))
        pos = names[:len(args)]
        out = []
        for i in range(n):
            a = [bound[k][i] if k in indexed else bound[k] for k in pos]
            kw = {k: (v[i] if k in indexed else v) for k, v in kwargs.items()}
            out.append(per(*a, **kw))
        return out
    decompose.__name__ = f"_foreach_{base}"
    return decompose


def table() -> dict[Any, tuple[Callable[..., list], str]]:
    """``{OpOverload: (decomposition, reason)}`` for every functional ``_foreach_*`` overload of
    this torch build whose per-tensor op we can call (in-place forms are functionalized into these
    by AOTAutograd first; ``.out`` forms never reach a graph)."""
    out = {}
    for qual in torch._C._dispatch_get_all_op_names():
        name, _, overload = qual.partition(".")
        if not name.startswith("aten::_foreach_") or name.endswith("_") or overload.endswith("out"):
            continue
        base = name[len("aten::_foreach_"):]
        if base not in PER_TENSOR and not callable(getattr(torch, base, None)):
            continue
        op = getattr(getattr(aten, name[len("aten::"):]), overload or "default")
        out[op] = (_decomposition(base, op._schema), f"one {base} per list element (as Inductor's foreach lowering)")
    return out
