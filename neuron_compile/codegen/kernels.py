"""What the emitter knows about each kernel, kept as data for schedule selection and profiling.

A *kernel* is one loop nest over data in the lowered MLIR: a ``linalg.generic`` (a fused pointwise
chain, a reduction with its pointwise prologue, a matmul), a ``linalg.transpose``, a
``tensor.insert_slice`` copy, or an ``scf.for`` a rule writes. The emitter tags the root op with
``neuron.kernel = <id> : i64`` and ``neuron.kind = "<kind>"`` so a strategy's transform sequence can
match it (``transform.structured.match attributes {neuron.kernel = 3 : i64}``); ops producing its
accumulator (``linalg.fill``) are fused into it by the schedule. Nothing here imports MLIR.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

KINDS = ("matmul", "pointwise", "reduction", "transpose", "copy", "loop")
_DIM = re.compile(r"^d(\d+)$")
_TERM = re.compile(r"^d(\d+)(?:\s*\*\s*(\d+))?$")


@dataclass(frozen=True)
class Operand:
    """One operand of a kernel's root op.

    Attributes:
        shape, dtype: of the tensor the op reads or writes.
        exprs: its indexing-map results over the kernel's loop dims (``("d0", "0")``), ``()`` when
            the op has no indexing maps (transpose/copy).
        strides: element strides in memory if known (graph inputs may be transposed views);
            ``None`` = the compiler allocates it, contiguous row-major.
        output: written by the kernel (``outs``) rather than read.
        value: the SSA name of the tensor in the emitted MLIR (dataflow between kernels).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    exprs: tuple[str, ...] = ()
    strides: tuple[int, ...] | None = None
    output: bool = False
    value: str = ""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    @property
    def affine(self) -> bool:
        """Every index is a loop dim or 0 (a projected permutation with broadcasts): no ``d2 + d5``
        windows as convolutions and pools read."""
        return all(_DIM.match(e) or e == "0" for e in self.exprs)

    def unit_window(self, contiguous: int) -> bool:
        """Whether every index is a loop dim, 0, or a window ``dA * s + dB * t`` in which loop dim
        ``contiguous`` appears at most once, with coefficient 1: with every other loop dim tiled to
        one, folding the unit dims leaves a projected permutation the vectorizer takes (an im2col
        copy with unit stride; a stride along the contiguous dim would be a gather)."""
        seen = 0
        for e in self.exprs:
            if _DIM.match(e) or e == "0":
                seen += e == f"d{contiguous}"
                continue
            for term in e.split("+"):
                m = _TERM.match(term.strip())
                if m is None:
                    return False
                if int(m.group(1)) == contiguous:
                    seen += 1
                    if m.group(2) not in (None, "1"):
                        return False
        return seen <= 1

    def window_dims(self) -> set[int]:
        """The loop dims inside a window index (``d2 + d5``): slices of one of them alone are not
        disjoint in this operand (a col2im's output positions overlap through its kernel offsets)."""
        return {int(m) for e in self.exprs if not (_DIM.match(e) or e.isdigit()) for m in re.findall(r"d(\d+)", e)}

    def covers(self, ranges: tuple[int, ...]) -> bool:
        """Whether the indices reach every element, each dim's ``[0, shape)`` with no gap, over
        loop trip counts ``ranges``: every tile's slice of this operand is then all written. Not so
        for a strided col2im's output: ``d4 * 2 + d2`` over 4 windows of 1 reaches 7 of 8 rows,
        and a zero fill fused into each tile's slice left the last row and column holding freed
        memory (the input gradient of a 1×1 stride-2 convolution at 8×8, batch 16: 1.8e37 where
        eager has 0; a new user's trial); over 7 rows it reaches rows 0, 2, 4, 6 only, a gap a
        tile boundary could fall into. Unparsed expressions count as not covering."""
        for e, size in zip(self.exprs, self.shape):
            if e == "0":
                if size != 1:
                    return False
                continue
            terms = []
            for term in e.split("+"):
                m = _TERM.match(term.strip())
                if m is None or int(m.group(1)) >= len(ranges):
                    return False
                terms.append((int(m.group(2) or 1), ranges[int(m.group(1))]))
            top = 0   # the values so far are exactly 0..top; a step of at most top + 1 keeps them so
            for coef, trips in sorted(terms):
                if trips > 1:
                    if coef > top + 1:
                        return False
                    top += coef * (trips - 1)
            if top != size - 1:
                return False
        return len(self.exprs) == len(self.shape)

    def dims(self) -> tuple[int | None, ...]:
        """The loop dim each tensor dim is indexed by (``None`` for a constant index)."""
        return tuple(int(m.group(1)) if (m := _DIM.match(e)) else None for e in self.exprs)

    def contiguous_dim(self) -> int | None:
        """The loop dim walking this operand's unit-stride (innermost in memory) dimension. A
        stride-0 dim (an expanded input: every index reads the same element) is never it: taken as
        the smallest stride, it made layer_norm over ``x.expand(4, 300, 1025)`` a column reduction,
        summing each row one float32 at a time (3-40x eager's float32 error; a new user's trial)."""
        dims = self.dims()
        if not dims:
            return None
        strides = self.strides or tuple(math.prod(self.shape[i + 1:]) for i in range(len(self.shape)))
        order = sorted((s, i) for i, s in enumerate(strides) if self.shape[i] != 1 and s != 0)
        return dims[order[0][1]] if order else None

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": str(self.dtype).replace("torch.", ""),
                "exprs": list(self.exprs), "strides": list(self.strides) if self.strides else None,
                "output": self.output, "value": self.value}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Operand":
        return Operand(tuple(d["shape"]), getattr(torch, d["dtype"]), tuple(d["exprs"]),
                       tuple(d["strides"]) if d.get("strides") else None, d["output"], d.get("value", ""))


@dataclass(frozen=True)
class KernelInfo:
    """One kernel of a lowered graph.

    Attributes:
        id: its number in the graph (emission order; the ``neuron.kernel`` attribute).
        kind: one of :data:`KINDS`.
        ranges: static trip count of each loop dim (``d0``, ``d1``, ...).
        iterators: ``parallel``/``reduction`` per loop dim (``()`` for non-generic kernels).
        operands: inputs then outputs of the root op.
        node: the FX node whose rule emitted it; ``ops``: the ATen ops of its FX fusion group
            (``aten.mul.Tensor``...), for the profile table.
        attrs: kind-specific facts (matmul: ``batch``, ``m``, ``n``, ``k``, ``trans_a``, ``trans_b``).
        gather: the body reads tensors at computed indices or uses loop indices (``tensor.extract``,
            ``linalg.index``), or holds a data-dependent loop (``scf.while``): not vectorizable.
        body_ops: operations in the op's region (a size hint: register pressure when unrolling).
        fill_inits: per output, whether its initial value is a ``linalg.fill`` that a schedule may
            fuse into each tile (the output's indices cover it whole: :meth:`Operand.covers`).
        results: the SSA names of the kernel's results.
    """

    id: int
    kind: str
    ranges: tuple[int, ...]
    iterators: tuple[str, ...]
    operands: tuple[Operand, ...]
    node: str = ""
    ops: tuple[str, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    gather: bool = False
    body_ops: int = 0
    fill_inits: tuple[bool, ...] = ()
    results: tuple[str, ...] = ()

    @property
    def inputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if not o.output)

    @property
    def outputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.output)

    @property
    def reduction_dims(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.iterators) if t == "reduction")

    @property
    def contiguous_dim(self) -> int:
        """The loop dim that walks memory with unit stride in the kernel's largest operand (the
        one to vectorize along)."""
        big = max(self.operands, key=lambda o: (math.prod(o.shape), o.output), default=None)
        d = big.contiguous_dim() if big is not None else None
        return d if d is not None else len(self.ranges) - 1

    @property
    def flops(self) -> int:
        """Floating-point operations of a matmul (``2·batch·m·n·k``); 0 for other kinds."""
        if self.kind != "matmul":
            return 0
        a = self.attrs
        return 2 * a.get("batch", 1) * a["m"] * a["n"] * a["k"]

    @property
    def bytes_moved(self) -> int:
        """Bytes read and written once each (a lower bound on memory traffic)."""
        return sum(o.nbytes for o in self.operands)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "ranges": list(self.ranges), "iterators": list(self.iterators),
                "operands": [o.to_json() for o in self.operands], "node": self.node, "ops": list(self.ops),
                "attrs": dict(self.attrs), "gather": self.gather, "body_ops": self.body_ops,
                "fill_inits": list(self.fill_inits), "results": list(self.results)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "KernelInfo":
        return KernelInfo(d["id"], d["kind"], tuple(d["ranges"]), tuple(d["iterators"]),
                          tuple(Operand.from_json(o) for o in d["operands"]), d.get("node", ""),
                          tuple(d.get("ops", ())), dict(d.get("attrs", {})), d.get("gather", False),
                          d.get("body_ops", 0), tuple(d.get("fill_inits", ())), tuple(d.get("results", ())))


def parse_map_results(affine_map_text: str) -> tuple[str, ...]:
    """``affine_map<(d0, d1) -> (d0, 0)>`` → ``("d0", "0")``."""
    m = re.search(r"->\s*\((.*)\)>\s*$", affine_map_text)
    if not m or not m.group(1).strip():
        return ()
    return tuple(e.strip() for e in m.group(1).split(","))
