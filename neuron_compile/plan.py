"""The calling plan of a compiled graph: what crosses the kernel boundary and how outputs are made.

Pure data with a JSON round trip (no pickle: executables may be shared between users and hosts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} in executable manifest") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype and element strides of one tensor crossing the kernel boundary."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]

    @staticmethod
    def of(t: torch.Tensor) -> "TensorSpec":
        return TensorSpec(tuple(int(s) for s in t.shape), t.dtype, tuple(int(s) for s in t.stride()))

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": dtype_name(self.dtype), "stride": list(self.stride)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TensorSpec":
        return TensorSpec(tuple(d["shape"]), dtype_from_name(d["dtype"]), tuple(d["stride"]))


def encode_value(v: Any) -> Any:
    """JSON form of an op argument: scalars, lists, dtypes/devices/layouts and references."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, TensorSpec):
        return {"spec": v.to_json()}
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).replace("torch.", "")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).replace("torch.", "")}
    if isinstance(v, tuple) and v and v[0] in ("input", "empty", "output", "value"):
        return {"ref": [encode_value(x) for x in v]}
    if isinstance(v, (list, tuple)):
        return {"list": [encode_value(x) for x in v], "tuple": isinstance(v, tuple)}
    raise TypeError(f"cannot store a {type(v).__name__} in an executable manifest")


def decode_value(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    if "float" in v:
        return float(v["float"])
    if "spec" in v:
        return TensorSpec.from_json(v["spec"])
    if "dtype" in v:
        return dtype_from_name(v["dtype"])
    if "device" in v:
        return torch.device(v["device"])
    if "layout" in v:
        return getattr(torch, v["layout"])
    if "memory_format" in v:
        return getattr(torch, v["memory_format"])
    if "ref" in v:
        return tuple(decode_value(x) for x in v["ref"])
    items = [decode_value(x) for x in v["list"]]
    return tuple(items) if v.get("tuple") else items


def op_from_name(name: str) -> Any:
    """``aten.bernoulli.p`` → ``torch.ops.aten.bernoulli.p``."""
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


@dataclass(frozen=True)
class HostOp:
    """An ATen op run by torch on the host: a random op before the kernel, or a check after it.

    ``args`` holds constants and references ``("input", i)`` / ``("empty", TensorSpec, zeroed)``
    (random ops) or ``("output", i)``, the graph's output ``i`` (checks).
    """

    target: Any
    args: tuple
    kwargs: dict

    def to_json(self) -> dict[str, Any]:
        t = self.target
        name = f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
        return {"op": name, "args": [encode_value(a) for a in self.args],
                "kwargs": {k: encode_value(v) for k, v in self.kwargs.items()}}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "HostOp":
        return HostOp(op_from_name(d["op"]), tuple(decode_value(a) for a in d["args"]),
                      {k: decode_value(v) for k, v in d["kwargs"].items()})


@dataclass(frozen=True)
class OutputSlot:
    """How the runtime produces one graph output.

    kind: ``const`` (``value``), ``input``/``host``/``kernel`` (``index``), or ``view`` of
    ``base`` = (kind, index) rebuilt with ``as_strided(size, stride, offset)``; a view whose
    ``dtype`` differs from its base's (``y.view(torch.int32)``) reinterprets the base's storage in
    that dtype first (size, stride and offset then count elements of ``dtype``).
    ``placed``: for a kernel output (or a view of one) whose eager strides are not dense, those
    (size, stride, offset): the runtime copies the dense kernel buffer into a storage laid out so,
    once per buffer, and every slot of that buffer reads the copy (eager's views of it fit).
    """

    kind: str
    index: int = -1
    value: Any = None
    base: tuple[str, int] | None = None
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0
    placed: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    dtype: torch.dtype | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "index": self.index, "value": encode_value(self.value),
                "base": list(self.base) if self.base else None, "size": list(self.size),
                "stride": list(self.stride), "offset": self.offset,
                "placed": [list(self.placed[0]), list(self.placed[1]), self.placed[2]] if self.placed else None,
                "dtype": dtype_name(self.dtype) if self.dtype is not None else None}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "OutputSlot":
        placed = d.get("placed")
        return OutputSlot(d["kind"], d["index"], decode_value(d["value"]),
                          tuple(d["base"]) if d["base"] else None, tuple(d["size"]), tuple(d["stride"]),
                          d["offset"], (tuple(placed[0]), tuple(placed[1]), placed[2]) if placed else None,
                          dtype_from_name(d["dtype"]) if d.get("dtype") else None)


@dataclass
class CallPlan:
    """Everything the runtime needs besides the native code.

    Kernel arguments, in order: ``inputs`` (graph inputs), ``host_specs`` (results of
    ``host_ops``), ``output_specs`` (buffers the kernel writes). ``outputs`` maps them (and views
    of them) to the graph's outputs. ``checks`` run after the kernel on trailing outputs that exist
    only for them, and may raise (eager's errors); those outputs are then dropped. ``mutated_inputs``: AOTAutograd returns new values of mutated
    inputs as ordinary outputs and copies them back itself, so this is always empty here.
    """

    input_specs: list[TensorSpec]
    host_ops: list[HostOp] = field(default_factory=list)
    host_specs: list[TensorSpec] = field(default_factory=list)
    output_specs: list[TensorSpec] = field(default_factory=list)
    outputs: list[OutputSlot] = field(default_factory=list)
    checks: list[HostOp] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [s.to_json() for s in self.input_specs],
                "host_ops": [h.to_json() for h in self.host_ops],
                "host_specs": [s.to_json() for s in self.host_specs],
                "kernel_outputs": [s.to_json() for s in self.output_specs],
                "outputs": [o.to_json() for o in self.outputs],
                "checks": [h.to_json() for h in self.checks],
                "aliases": [{"output": i, "of": list(o.base)} for i, o in enumerate(self.outputs)
                            if o.kind == "view"] + [{"output": i, "of": ["input", o.index]}
                                                    for i, o in enumerate(self.outputs) if o.kind == "input"],
                "mutated_inputs": []}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "CallPlan":
        return CallPlan([TensorSpec.from_json(s) for s in d["inputs"]],
                        [HostOp.from_json(h) for h in d["host_ops"]],
                        [TensorSpec.from_json(s) for s in d["host_specs"]],
                        [TensorSpec.from_json(s) for s in d["kernel_outputs"]],
                        [OutputSlot.from_json(o) for o in d["outputs"]],
                        [HostOp.from_json(h) for h in d["checks"]])
