"""Lazy (fused) tensor values: pointwise expressions not yet written to memory.

Inductor's ``Pointwise(inner_fn)`` idea on linalg: a :class:`LazyTensor` is a scalar function of
*leaves* — materialised tensors read through affine indexing maps over the lazy value's own
iteration domain. Combining lazies composes the maps (broadcasts become ``0`` or a renamed loop
dim), so a chain of pointwise ops, or a pointwise prologue feeding a reduction, becomes the body of
ONE ``linalg.generic`` and its intermediates never touch memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from neuron_compile.lowering.ir import Scalar, TensorValue


@dataclass(frozen=True)
class Leaf:
    """A materialised tensor read at ``exprs`` (one ``dK`` or ``0`` per dim) of the lazy domain."""

    value: TensorValue
    exprs: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class LazyTensor:
    """A tensor value defined by ``fn(builder, leaf_scalars) -> Scalar`` at every point of ``shape``.

    ``ops`` counts the ATen-level operations folded in (the fusion size limit uses it).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    leaves: tuple[Leaf, ...]
    fn: Callable[[Any, Sequence[Scalar]], Scalar]
    ops: int = 1

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


def broadcast_exprs(src: Sequence[int], out: Sequence[int]) -> tuple[str, ...]:
    """Index expressions reading a ``src``-shaped tensor at a point of the ``out`` domain
    (numpy broadcasting, right-aligned). Raises ``ValueError`` if ``src`` does not broadcast."""
    lead = len(out) - len(src)
    if lead < 0:
        raise ValueError(f"cannot broadcast {tuple(src)} to {tuple(out)}")
    exprs = []
    for i, s in enumerate(src):
        if s == out[lead + i]:
            exprs.append(f"d{lead + i}")
        elif s == 1:
            exprs.append("0")
        else:
            raise ValueError(f"cannot broadcast {tuple(src)} to {tuple(out)}")
    return tuple(exprs)


def compose(inner: Sequence[str], outer: Sequence[str]) -> tuple[str, ...]:
    """Substitute ``outer`` (exprs of the inner domain's dims over the outer domain) into ``inner``."""
    return tuple(e if e == "0" else outer[int(e[1:])] for e in inner)


class _Leaves:
    def __init__(self) -> None:
        self.items: list[Leaf] = []
        self._index: dict[tuple[str, tuple[str, ...]], int] = {}

    def add(self, leaf: Leaf) -> int:
        key = (leaf.value.name, leaf.exprs)
        if key not in self._index:
            self._index[key] = len(self.items)
            self.items.append(leaf)
        return self._index[key]


def emit_shared(b: Any, lazy: LazyTensor, scalars: Sequence[Scalar]) -> Scalar:
    """``lazy.fn(b, scalars)``, emitted once per region: a fused value read by several consumers
    in one body (each term of Clenshaw's or any recurrence is read by the next two steps) reuses
    the first emission instead of re-emitting its whole expression tree at every use, which grows
    the body exponentially with the chain length (220 MB of MLIR for one Bessel K1). Keyed by the
    builder's nesting (a value defined inside a nested region is not visible outside it)."""
    memo = b.__dict__.setdefault("_lazy_memo", {})
    key = (id(lazy), tuple(s.name for s in scalars), b.indent)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (lazy, lazy.fn(b, scalars))   # holding ``lazy`` keeps its id unique
    return hit[1]


def pointwise(fn: Callable[..., Scalar], operands: Sequence[Any], out_shape: Sequence[int],
              out_dtype: torch.dtype, compute_dtypes: Sequence[torch.dtype | None],
              py_dtype: Callable[[Any], torch.dtype]) -> LazyTensor:
    """``fn(b, *operand_scalars)`` over broadcast operands (tensors, lazies or Python numbers).

    Operand scalars are cast to their compute dtype, the result to ``out_dtype``.
    """
    out_shape = tuple(int(s) for s in out_shape)
    leaves = _Leaves()
    plan: list[tuple] = []
    ops = 1
    for o, cdt in zip(operands, compute_dtypes):
        if isinstance(o, TensorValue):
            plan.append(("leaf", leaves.add(Leaf(o, broadcast_exprs(o.shape, out_shape))), cdt))
        elif isinstance(o, LazyTensor):
            outer = broadcast_exprs(o.shape, out_shape)
            idx = [leaves.add(Leaf(lf.value, compose(lf.exprs, outer))) for lf in o.leaves]
            plan.append(("lazy", (o, idx), cdt))
            ops += o.ops
        else:
            plan.append(("const", o, cdt))

    def body(b, scalars: Sequence[Scalar]) -> Scalar:
        vals = []
        for kind, what, cdt in plan:
            if kind == "leaf":
                s = scalars[what]
            elif kind == "lazy":
                s = emit_shared(b, what[0], [scalars[i] for i in what[1]])
            else:
                s = b.const(what, cdt if cdt is not None else py_dtype(what))
            vals.append(b.cast(s, cdt) if cdt is not None else s)
        return b.cast(fn(b, *vals), out_dtype)

    return LazyTensor(out_shape, out_dtype, tuple(leaves.items), body, ops)


def permuted(v: TensorValue | LazyTensor, perm: Sequence[int]) -> LazyTensor:
    """``v`` with its dims permuted (result dim i is ``v``'s dim ``perm[i]``), as a lazy read
    through permuted indexing maps: no copy until a consumer materialises it."""
    if isinstance(v, TensorValue):
        v = LazyTensor(v.shape, v.dtype, (Leaf(v, tuple(f"d{i}" for i in range(v.rank))),),
                       lambda b, xs: xs[0], ops=0)
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    outer = tuple(f"d{inv[k]}" for k in range(v.rank))   # v's dim k over the permuted domain
    return LazyTensor(tuple(v.shape[p] for p in perm), v.dtype,
                      tuple(Leaf(lf.value, compose(lf.exprs, outer)) for lf in v.leaves), v.fn, v.ops)


NHWC_READ = ("d0", "d2", "d3", "d1")   # an [N, H, W, C] tensor read at the point (n, c, h, w)
TO_CHANNELS_LAST, FROM_CHANNELS_LAST = (0, 2, 3, 1), (0, 3, 1, 2)


def channels_last_backed(v: object) -> bool:
    """Whether ``v`` is an [N, C, H, W] lazy value computed from channels-last ([N, H, W, C])
    tensors (a channels-last convolution's result and its pointwise consumers), every other leaf
    per channel or a scalar: stored channels-last, it is written with contiguous reads."""
    if not isinstance(v, LazyTensor) or v.rank != 4:
        return False
    found = False
    for lf in v.leaves:
        if lf.exprs == NHWC_READ:
            found = True
        elif not set(lf.exprs) <= {"d1", "0"}:
            return False
    return found
