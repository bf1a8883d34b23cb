"""Lower one FX graph (ATen IR, static shapes) to one MLIR ``func.func`` in destination-passing style.

Signature: ``@neuron_kernel(in_0.., host_0.., out_0..)``, all memrefs carrying the exact element
strides of the torch tensors that will be passed, so contiguous inputs are read in place (no copy)
and outputs are written straight into torch-allocated storage. Inside, inputs become tensors with
``bufferization.to_tensor ... restrict`` and results are stored with
``bufferization.materialize_in_destination`` (MLIR bufferization docs, "Destination-Passing Style").

Graph outputs that alias an input or another output (views) are not computed by the kernel: the
:class:`OutputPlan` tells the runtime to rebuild them with ``as_strided`` from the FX metadata, which
is the aliasing contract AOTAutograd expects. Random ops (tag ``nondeterministic_seeded``) run on the
host with torch's generator before the kernel and are passed in as inputs, so the random stream is
eager PyTorch's own.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from neuron_compile.errors import (DynamicShapeError, LoweringError, NeuronCompileError, RuleDeclined,
                                   UnsupportedOp, UnsupportedOpsError)
from neuron_compile.lowering.context import FunctionBody, LoweringContext
from neuron_compile.lowering.ir import TensorValue, contiguous_strides, memref_type, tensor_bytes, tensor_type
from neuron_compile.lowering.locations import mlir_location, op_name, user_location
from neuron_compile.lowering.lazy import LazyTensor
from neuron_compile.lowering.registry import fusion_kind, get_lowering, rule_file_for
from neuron_compile.plan import CallPlan, HostOp, OutputSlot, TensorSpec

from neuron_compile.runtime import KERNEL_SYMBOL  # noqa: E402
_EMPTY_FACTORIES = {torch.ops.aten.empty_like.default, torch.ops.aten.empty.memory_format,
                    torch.ops.aten.empty_strided.default, torch.ops.aten.zeros_like.default,
                    torch.ops.aten.zeros.default}


@dataclass
class LoweredGraph:
    """Result of :func:`lower_graph`: the MLIR module text and the calling plan."""

    mlir: str
    plan: CallPlan
    op_count: int = 0


def _is_dense(t: torch.Tensor) -> bool:
    return torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def _static_spec(node: torch.fx.Node) -> TensorSpec:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise NeuronCompileError(f"graph input {node.name} is a {type(val).__name__}; only tensors are supported")
    if any(not isinstance(s, int) for s in val.shape) or any(not isinstance(s, int) for s in val.stride()):
        raise DynamicShapeError(f"graph input '{node.name}'")
    return TensorSpec.of(val)


def _storage(t: Any):
    return StorageWeakRef(t.untyped_storage()) if isinstance(t, torch.Tensor) else None


def graph_input_specs(gm: torch.fx.GraphModule) -> list[TensorSpec]:
    """Specs of the graph's placeholders; raises :class:`DynamicShapeError` on a symbolic size."""
    return [_static_spec(n) for n in gm.graph.nodes if n.op == "placeholder"]


def lower_graph(gm: torch.fx.GraphModule, graph_name: str = "graph") -> LoweredGraph:
    """Emit the MLIR module for ``gm``.

    Args:
        gm: an ATen-level FX graph whose nodes carry ``meta['val']`` (FakeTensors, static shapes).
    Returns:
        :class:`LoweredGraph`; ``mlir`` is empty when no output needs computing.
    Raises:
        DynamicShapeError: a symbolic size. UnsupportedOpsError: listing every node with no rule or
        whose rule declined its case. LoweringError: a rule failed (a bug).
    """
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    input_specs = [_static_spec(n) for n in placeholders]
    body = FunctionBody()
    env: dict[torch.fx.Node, Any] = {}
    sigs: list[str] = []
    prologue: list[str] = []

    def bind_input(name: str, spec: TensorSpec) -> TensorValue:
        sigs.append(f"%{name}: {memref_type(spec.shape, spec.dtype, spec.stride)}")
        t = body.namer("in")
        prologue.append(f"    {t} = bufferization.to_tensor %{name} restrict : "
                        f"{memref_type(spec.shape, spec.dtype, spec.stride)} to {tensor_type(spec.shape, spec.dtype)}")
        return TensorValue(t, spec.shape, spec.dtype)

    for i, (n, spec) in enumerate(zip(placeholders, input_specs)):
        env[n] = bind_input(f"arg_in{i}", spec)
    input_storage = {_storage(n.meta["val"]): i for i, n in enumerate(placeholders)}

    host_ops: list[HostOp] = []
    host_specs: list[TensorSpec] = []
    host_index: dict[torch.fx.Node, int] = {}
    declines: list[UnsupportedOp] = []
    op_count = 0
    for node in graph.nodes:
        if node.op == "get_attr":
            env[node] = _constant(body, node, _fetch_attr(gm, node.target))
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            env[node] = env[node.args[0]][node.args[1]]
            continue
        op_count += 1
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            host_ops.append(_host_op(node, placeholders))
            spec = TensorSpec(tuple(node.meta["val"].shape), node.meta["val"].dtype,
                              contiguous_strides(tuple(node.meta["val"].shape)))
            host_specs.append(spec)
            host_index[node] = len(host_ops) - 1
            env[node] = bind_input(f"arg_host{len(host_ops) - 1}", spec)
            continue
        rule = get_lowering(node.target)
        ctx = LoweringContext(body, node, mlir_location(node))
        if rule is None:
            declines.append(UnsupportedOp(op_name(node), node.name, user_location(node), rule_file_for(node.target)))
            env[node] = _stand_in(ctx, node.meta["val"])
            continue
        kind = fusion_kind(node.target)
        fetch = (lambda a: env[a]) if kind in LAZY_INPUT_KINDS else (lambda a: _materialized(ctx, env, a))
        args = torch.fx.node.map_arg(node.args, fetch)
        kwargs = torch.fx.node.map_arg(node.kwargs, fetch)
        try:
            result = rule(ctx, *args, **kwargs)
            if not stays_lazy(node):
                result = _materialize_all(ctx, result)
            env[node] = result
        except RuleDeclined as declined:  # keep going so one error lists every unsupported op
            declines.append(UnsupportedOp(op_name(node), node.name, user_location(node),
                                          rule_file_for(node.target), declined.reason))
            env[node] = _stand_in(ctx, node.meta["val"])
        except NeuronCompileError:
            raise
        except Exception as exc:  # a rule bug: report with the node, keep the cause
            raise LoweringError(f"lowering rule {rule.__name__} failed: {type(exc).__name__}: {exc}",
                                op=op_name(node), node=node.name, location=user_location(node)) from exc

    if declines:
        raise UnsupportedOpsError(declines, graph_name)
    out_node = next(n for n in graph.nodes if n.op == "output")
    for o in out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]:
        if isinstance(o, torch.fx.Node):
            _materialized(LoweringContext(body, o, mlir_location(o)), env, o)
    outs = out_node.args[0]
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    first_owner: dict[Any, torch.fx.Node] = {}
    for n in graph.nodes:
        st = _storage(n.meta.get("val"))
        if st is not None and st not in first_owner and n.op != "output":
            first_owner[st] = n

    output_specs: list[TensorSpec] = []
    kernel_index: dict[torch.fx.Node, int] = {}
    stores: list[str] = []

    def kernel_output(n: torch.fx.Node) -> int:
        if n not in kernel_index:
            val = n.meta["val"]
            stride = tuple(val.stride()) if _is_dense(val) else contiguous_strides(tuple(val.shape))
            spec = TensorSpec(tuple(val.shape), val.dtype, tuple(int(s) for s in stride))
            kernel_index[n] = len(output_specs)
            output_specs.append(spec)
            v = env[n]
            mt = memref_type(spec.shape, spec.dtype, spec.stride)
            sigs_out.append(f"%arg_out{kernel_index[n]}: {mt}")
            stores.append(f"    bufferization.materialize_in_destination {v.name} in restrict writable "
                          f"%arg_out{kernel_index[n]} : ({v.type}, {mt}) -> ()")
        return kernel_index[n]

    sigs_out: list[str] = []
    slots: list[OutputSlot] = []
    for o in outs:
        if not isinstance(o, torch.fx.Node):
            slots.append(OutputSlot("const", value=o))
            continue
        val = o.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise NeuronCompileError(f"graph output {o.name} is not a tensor ({type(val).__name__})")
        st = _storage(val)
        owner = first_owner.get(st)
        if st in input_storage:
            i = input_storage[st]
            if o.op == "placeholder":
                slots.append(OutputSlot("input", index=i))
            else:
                slots.append(OutputSlot("view", base=("input", i), size=tuple(val.shape),
                                        stride=tuple(val.stride()), offset=int(val.storage_offset())))
        elif o in host_index:
            slots.append(OutputSlot("host", index=host_index[o]))
        elif owner is not None and owner is not o and owner.op != "placeholder":
            base = ("host", host_index[owner]) if owner in host_index else ("kernel", kernel_output(owner))
            slots.append(OutputSlot("view", base=base, size=tuple(val.shape), stride=tuple(val.stride()),
                                    offset=int(val.storage_offset())))
        else:
            slots.append(OutputSlot("kernel", index=kernel_output(o)))

    mlir = ""
    if output_specs:
        sig = ", ".join(sigs + sigs_out)
        lines = ["module {",
                 f"  func.func @{KERNEL_SYMBOL}({sig}) attributes {{llvm.emit_c_interface}} {{",
                 *prologue, *body.lines, *stores, "    return", "  }", "}"]
        mlir = "\n".join(lines) + "\n"
    return LoweredGraph(mlir, CallPlan(input_specs, host_ops, host_specs, output_specs, slots), op_count)


LAZY_INPUT_KINDS = ("pointwise", "reduction")
KERNEL = "neuron_kernel"  # node.meta key set by the fusion pass (passes/fuse.py)


def stays_lazy(node: torch.fx.Node) -> bool:
    """A fused value stays unmaterialised iff the fusion pass put every user in its own kernel and
    every user can read lazy inputs (and it is not a graph output)."""
    kernel = node.meta.get(KERNEL)
    if kernel is None:
        return False
    for u in node.users:
        if u.op != "call_function" or u.meta.get(KERNEL) != kernel or fusion_kind(u.target) not in LAZY_INPUT_KINDS:
            return False
    return True


def _materialize_all(ctx: LoweringContext, v: Any) -> Any:
    if isinstance(v, LazyTensor):
        return ctx.materialize(v)
    if isinstance(v, tuple):
        return tuple(_materialize_all(ctx, x) for x in v)
    return v


def _materialized(ctx: LoweringContext, env: dict, node: torch.fx.Node) -> Any:
    """``env[node]`` written to memory (once: the materialised value replaces the lazy one)."""
    v = env[node]
    if isinstance(v, LazyTensor) or (isinstance(v, tuple) and any(isinstance(x, LazyTensor) for x in v)):
        v = env[node] = _materialize_all(LoweringContext(ctx.body, node, mlir_location(node)), v)
    return v


def _stand_in(ctx: LoweringContext, val: Any) -> Any:
    """Placeholder values for a declined node, so lowering can go on to find further unsupported ops."""
    if isinstance(val, torch.Tensor):
        return ctx.empty(tuple(val.shape), val.dtype)
    if isinstance(val, (list, tuple)):
        return tuple(_stand_in(ctx, v) for v in val)
    return val


def _fetch_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _constant(body: FunctionBody, node: torch.fx.Node, value: Any) -> TensorValue:
    """A tensor constant lifted by Dynamo/AOTAutograd, inlined as an ``arith.constant`` dense hex blob
    (raw little-endian bytes: exact for every dtype)."""
    if not isinstance(value, torch.Tensor):
        raise LoweringError(f"graph attribute {node.target} is a {type(value).__name__}, not a tensor",
                            node=node.name)
    t = value
    shape = tuple(t.shape)
    ty = tensor_type(shape, t.dtype)
    name = body.namer("cst")
    if t.numel() == 0:
        body.lines.append(f"    {name} = tensor.empty() : {ty}")
    else:
        blob = tensor_bytes(t).hex().upper()
        body.lines.append(f'    {name} = arith.constant dense<"0x{blob}"> : {ty} {mlir_location(node)}')
    return TensorValue(name, shape, t.dtype)


def _host_op(node: torch.fx.Node, placeholders: list[torch.fx.Node]) -> HostOp:
    def ref(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if a.op == "placeholder":
                return ("input", placeholders.index(a))
            if a.op == "call_function" and a.target in _EMPTY_FACTORIES:
                return ("empty", TensorSpec.of(a.meta["val"]), a.target == torch.ops.aten.zeros_like.default
                        or a.target == torch.ops.aten.zeros.default)
            raise LoweringError("a random op whose input is computed inside the graph is not supported; "
                                "its random draws must come from graph inputs or fresh tensors",
                                op=op_name(node), node=node.name, location=user_location(node))
        if isinstance(a, (list, tuple)):
            return type(a)(ref(x) for x in a)
        return a
    return HostOp(node.target, tuple(ref(a) for a in node.args), {k: ref(v) for k, v in node.kwargs.items()})
