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

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_compile.errors import (DynamicShapeError, LoweringError, NeuronCompileError, RuleDeclined,
                                   UnsupportedOp, UnsupportedOpsError)
from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategy import Schedule, TargetInfo
from neuron_compile.lowering.context import PROFILE_TICK, FunctionBody, LoweringContext, RegionView
from neuron_compile.lowering.ir import (TensorValue, contiguous_strides, memref_type, reassociation, supported_dtype,
                                       tensor_bytes, tensor_type)
from neuron_compile.lowering.locations import mlir_location, op_name, user_location
from neuron_compile.lowering.lazy import FROM_CHANNELS_LAST, LazyTensor, channels_last_backed, permuted
from neuron_compile.lowering.registry import (LAZY_INPUT_KINDS, fusion_kind, get_lowering, reads_lazy_inputs,
                                              rule_file_for)
from neuron_compile.lowering.outputs import live_nodes, plan_outputs
from neuron_compile.plan import CallPlan, HostOp, TensorSpec

from neuron_compile.runtime import KERNEL_SYMBOL  # noqa: E402
EMPTY_FACTORIES = {torch.ops.aten.empty_like.default, torch.ops.aten.empty.memory_format,
                    torch.ops.aten.empty_strided.default, torch.ops.aten.zeros_like.default,
                    torch.ops.aten.zeros.default}


@dataclass
class LoweredGraph:
    """Result of :func:`lower_graph`: the MLIR module text, the calling plan and the kernels (in
    the order they run; ``neuron.kernel`` attribute = index)."""

    mlir: str
    plan: CallPlan
    op_count: int = 0
    kernels: list[KernelInfo] = field(default_factory=list)
    bytes_avoided: int = 0
    shares_inits: bool = False  # a value initialises two ops: eliminate-empty-tensors is unsafe
    value_uses: dict[str, int] = field(default_factory=dict)  # SSA value → number of uses in the module


# The graph's function is called only by its C interface wrapper ``_mlir_ciface_neuron_kernel``
# (what the entry point and the JIT call), so it is internal and always inlined there. Kept out
# of line, it takes every memref unpacked (5 + 2·rank scalars each): the wrapper's one call to it
# had ~3,000 arguments on ResNet-18's forward graph, and llc's instruction selection spent 4.7 s
# of its 6.5 s on that call alone (0.9 s for the whole part once inlined; LLVM 22, Zen 4).
GRAPH_FUNCTION_ATTRS = 'llvm.emit_c_interface, llvm.linkage = #llvm.linkage<internal>, passthrough = ["alwaysinline"]'


def static_spec(node: torch.fx.Node) -> TensorSpec:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise NeuronCompileError(f"graph input {node.name} is a {type(val).__name__}; only tensors are supported")
    if any(not isinstance(s, int) for s in val.shape) or any(not isinstance(s, int) for s in val.stride()):
        raise DynamicShapeError(f"graph input '{node.name}'")
    return TensorSpec.of(val)


def graph_input_specs(gm: torch.fx.GraphModule) -> list[TensorSpec]:
    """Specs of the graph's placeholders; raises :class:`DynamicShapeError` on a symbolic size."""
    return [static_spec(n) for n in gm.graph.nodes if n.op == "placeholder"]


def lower_graph(gm: torch.fx.GraphModule, graph_name: str = "graph", profile: bool = False,
                target: TargetInfo | None = None, overrides: dict[str, Schedule] | None = None) -> LoweredGraph:
    """Emit the MLIR module for ``gm``.

    Args:
        gm: an ATen-level FX graph whose nodes carry ``meta['val']`` (FakeTensors, static shapes).
        profile: follow every kernel with a call recording its time (``NEURON_PROFILE``).
        target: what the payload-shaping strategies (matmul) plan for (default: this host);
            ``overrides``: parsed schedule overrides (``NEURON_SCHEDULE``).
    Returns:
        :class:`LoweredGraph`; ``mlir`` is empty when no output needs computing.
    Raises:
        DynamicShapeError: a symbolic size. UnsupportedOpsError: listing every node with no rule or
        whose rule declined its case. LoweringError: a rule failed (a bug).
    """
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    input_specs = [static_spec(n) for n in placeholders]
    bad_dtypes = unrepresentable_nodes(gm)
    if bad_dtypes:
        raise UnsupportedOpsError(bad_dtypes, graph_name)
    if target is None:
        from neuron_compile.target import HostCPU
        target = HostCPU.detect().info()
    body = FunctionBody(profile=profile, fused_ops=_fusion_groups(graph), target=target, overrides=dict(overrides or {}))
    env: dict[torch.fx.Node, Any] = {}
    sigs: list[str] = []
    prologue: list[str] = []

    def bind_input(name: str, spec: TensorSpec) -> TensorValue:
        sigs.append(f"%{name}: {memref_type(spec.shape, spec.dtype, spec.stride)} {{llvm.noalias}}")
        t = body.namer("in")
        body.strides[t] = spec.stride
        prologue.append(f"    {t} = bufferization.to_tensor %{name} restrict : "
                        f"{memref_type(spec.shape, spec.dtype, spec.stride)} to {tensor_type(spec.shape, spec.dtype)}")
        return TensorValue(t, spec.shape, spec.dtype)

    for i, (n, spec) in enumerate(zip(placeholders, input_specs)):
        env[n] = bind_input(f"arg_in{i}", spec)

    host_ops: list[HostOp] = []
    host_specs: list[TensorSpec] = []
    host_index: dict[torch.fx.Node, int] = {}
    declines: list[UnsupportedOp] = []
    for node in graph.nodes:  # random ops run on the host, in graph order, whether used or not
        if node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            try:
                host_op = _host_op(node, placeholders)
            except RuleDeclined as declined:
                declines.append(UnsupportedOp(op_name(node), node.name, user_location(node),
                                              rule_file_for(node.target), declined.reason))
                env[node] = _stand_in(LoweringContext(body, node, mlir_location(node)), node.meta["val"])
                continue
            host_ops.append(host_op)
            val = node.meta["val"]
            spec = TensorSpec(tuple(val.shape), val.dtype, contiguous_strides(tuple(val.shape)))
            host_specs.append(spec)
            host_index[node] = len(host_ops) - 1
            env[node] = bind_input(f"arg_host{len(host_ops) - 1}", spec)
    outputs = plan_outputs(gm, placeholders, host_index)
    live = live_nodes(outputs.kernel_nodes)  # views of inputs and dead values are never lowered

    op_count = 0
    for node in graph.nodes:
        if node not in live or node in env:
            continue
        if node.op == "get_attr":
            env[node] = _constant(body, node, _fetch_attr(gm, node.target))
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            env[node] = env[node.args[0]][node.args[1]]
            if not stays_lazy(node):
                _materialized(LoweringContext(body, node, mlir_location(node)), env, node)
            continue
        op_count += 1
        rule = get_lowering(node.target)
        ctx = LoweringContext(body, node, mlir_location(node))
        if rule is None:
            declines.append(UnsupportedOp(op_name(node), node.name, user_location(node), rule_file_for(node.target)))
            env[node] = _stand_in(ctx, node.meta["val"])
            continue
        if _no_elements(node.meta.get("val")):   # nothing to compute (and MLIR rejects some empty slices)
            env[node] = _stand_in(ctx, node.meta["val"])
            continue
        fetch = (lambda a: env[a]) if reads_lazy_inputs(node.target) else (lambda a: _materialized(ctx, env, a))
        args = torch.fx.node.map_arg(node.args, fetch)
        kwargs = torch.fx.node.map_arg(node.kwargs, fetch)
        try:
            result = rule(ctx, *args, **kwargs)
            if not isinstance(result, tuple) and not stays_lazy(node) and not _cheap_to_recompute(node, result):
                result = _stored(ctx, result)  # tuple parts are decided at their getitem
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
    sigs_out, stores = [], []
    values = [_materialized(LoweringContext(body, n, mlir_location(n)), env, n) for n in outputs.kernel_nodes]
    _keep_updated_outputs(body, values)
    for k, (v, spec) in enumerate(zip(values, outputs.kernel_specs)):
        mt = memref_type(spec.shape, spec.dtype, spec.stride)
        sigs_out.append(f"%arg_out{k}: {mt} {{llvm.noalias}}")
        stores.extend(_store_output(body, v, f"%arg_out{k}", mt, spec, {o.name for o in values if o is not v}))
    output_specs, slots = outputs.kernel_specs, outputs.slots

    mlir = ""
    if output_specs:
        sig = ", ".join(sigs + sigs_out)
        decls, begin = [], []
        if profile:
            decls = [f"  func.func private @{PROFILE_TICK}(i64)"]
            c = body.namer("prof")
            begin = [f"    {c} = arith.constant -1 : i64", f"    func.call @{PROFILE_TICK}({c}) : (i64) -> ()"]
            n = body.namer("prof")  # the time after the last kernel: output copies
            stores += [f"    {n} = arith.constant {len(body.kernels)} : i64",
                       f"    func.call @{PROFILE_TICK}({n}) : (i64) -> ()"]
        lines = ["module {", *decls,
                 f"  func.func @{KERNEL_SYMBOL}({sig}) attributes {{{GRAPH_FUNCTION_ATTRS}}} {{",
                 *begin, *prologue, *body.lines, *stores, "    return", "  }", "}"]
        mlir = "\n".join(lines) + "\n"
    avoided = sum(v.nbytes for v in env.values() if isinstance(v, LazyTensor))
    return LoweredGraph(mlir, CallPlan(input_specs, host_ops, host_specs, output_specs, slots), op_count,
                        body.kernels, avoided, body.shares_inits, value_uses(mlir))


def _keep_updated_outputs(body: FunctionBody, values: list[TensorValue]) -> None:
    """A graph output that is (a reshape of) a value some op also takes as its destination (``outs``:
    a scatter's ``self``, an ``index_put``'s input, an accumulator) is that value's second
    destination. With eliminate-empty-tensors the value was computed straight into the output buffer
    and the op then wrote its result there too: ``b = x * 2; return b.scatter_add(0, i, s), b``
    returned ``b`` with the scattered values, and a ``self`` saved for the backward gave wrong
    gradients (``index_reduce`` amax). Counted as such (:attr:`FunctionBody.shares_inits`), the
    graph is bufferized without that pass and the op works on a copy."""
    inits = {init.name for init, _ in body.updates.values()}

    def is_init(v: TensorValue) -> bool:
        return v.name in inits or body.init_uses.get(v.name.split("#")[0], 0) > 0

    for v in values:
        while not is_init(v) and v.name in body.views:
            v = body.views[v.name]
        if is_init(v):
            body.used_as_init(v)


def _store_output(body: FunctionBody, v: TensorValue, dest: str, mt: str, spec: TensorSpec,
                  others: set[str] = frozenset()) -> list[str]:
    """The statements writing graph output ``v`` into the memref ``dest``.

    A value computed in an expanded form and collapsed (a GEMM's C in its [M/MR, MR, N/NR, NR]
    register-tile view) is materialized in that form into an ``expand_shape`` of a contiguous
    destination: ``eliminate-empty-tensors`` follows same-type values only, so storing the collapsed
    value left the GEMM writing a temporary and a whole-output memcpy after it (2 MB per weight
    gradient of the MLP's backward: 9% of the 2-thread step)."""
    contiguous = tuple(spec.stride) == tuple(contiguous_strides(spec.shape))
    if contiguous and v.name in body.region_views:
        return _store_regions(body, body.region_views[v.name][1], dest, mt, spec)
    chain = _region_chain(body, v, others) if contiguous else None
    if chain is not None:
        return _store_through(body, *chain, dest, mt, spec)
    src = body.collapsed_views.get(v.name)
    if src is None or not contiguous:
        return [f"    bufferization.materialize_in_destination {v.name} in restrict writable "
                f"{dest} : ({v.type}, {mt}) -> ()"]
    full, groups = src
    mt4 = memref_type(full.shape, full.dtype, contiguous_strides(full.shape))
    view = body.namer("out")
    lines = []
    if groups is None:   # a reshape of the collapsed value: through the flattened destination
        lines, dest, mt = _dest_view(body, dest, mt, spec, (math.prod(spec.shape),))
        groups = [list(range(full.rank))]
    return lines + [
            f"    {view} = memref.expand_shape {dest} {reassociation(groups)} output_shape [{', '.join(map(str, full.shape))}] "
            f": {mt} into {mt4}",
            f"    bufferization.materialize_in_destination {full.name} in restrict writable "
            f"{view} : ({full.type}, {mt4}) -> ()"]


def _region_chain(body: FunctionBody, v: TensorValue, others: set[str]
                  ) -> tuple[TensorValue, tuple[TensorValue, TensorValue, int] | None] | None:
    """The GEMM's C assembled from regions that ``v`` is a row-major reshape of, or a reshape of an
    in-place loop update of (at most one: ``(result, init, lines index of its scf.for)``), with
    that update; ``None`` when ``v`` is neither (:attr:`FunctionBody.views`, :attr:`FunctionBody.updates`).

    With an update, the loop then writes the output buffer that the regions were stored into, so
    C and every value between it and the loop must have no other reader and be no other output
    (``others``): another store of a region would copy it from that buffer after the loop wrote
    it (measured: ``(index_put(C), C)`` returned C with the update in it). Otherwise ``None``."""
    update, below = None, []
    while v.name not in body.region_views:
        if v.name in body.views:
            v = body.views[v.name]
        elif v.name in body.updates and update is None:
            init, line = body.updates[v.name]
            if f"= {init.name}) ->" not in body.lines[line]:   # not the loop text _store_through rewrites
                return None
            update, v = (v, init, line), init
        else:
            return None
        if update is not None:
            below.append(v.name)
    if update is not None:
        uses = value_uses("\n".join(body.lines))
        if any(n in others or uses.get(n, 0) != 1 for n in below):
            return None
    return v, update


def _dest_view(body: FunctionBody, dest: str, mt: str, spec: TensorSpec, shape: tuple[int, ...]
               ) -> tuple[list[str], str, str]:
    """Contiguous graph output ``dest`` reshaped (row-major) to ``shape``: (statements, memref, its type)."""
    if tuple(shape) == tuple(spec.shape):
        return [], dest, mt
    lines, n = [], math.prod(spec.shape)
    flat_t = memref_type((n,), spec.dtype, (1,))
    if len(spec.shape) != 1:
        flat = body.namer("oflat")
        lines.append(f"    {flat} = memref.collapse_shape {dest} [[{', '.join(map(str, range(len(spec.shape))))}]] "
                     f": {mt} into {flat_t}")
        dest = flat
    if len(shape) == 1:
        return lines, dest, flat_t
    view, view_t = body.namer("oview"), memref_type(tuple(shape), spec.dtype, contiguous_strides(tuple(shape)))
    lines.append(f"    {view} = memref.expand_shape {dest} [[{', '.join(map(str, range(len(shape))))}]] "
                 f"output_shape [{', '.join(map(str, shape))}] : {flat_t} into {view_t}")
    return lines, view, view_t


def _store_through(body: FunctionBody, c: TensorValue, update: tuple[TensorValue, TensorValue, int] | None,
                   dest: str, mt: str, spec: TensorSpec) -> list[str]:
    """Graph output ``dest`` holding a region-assembled GEMM C seen through reshapes and at most one
    in-place loop update (:func:`_region_chain`): the regions go straight into ``dest`` reshaped to
    C (:func:`_store_regions`), and the loop updates ``dest`` itself, its init being ``dest`` read
    back after the regions. Stored as the final value instead, the regions computed into a
    temporary (eliminate-empty-tensors stops at reshapes) and a whole-output ``memcpy`` followed:
    GPT-2's tied embedding and LM-head weight gradient (``index_put`` into a 50257×768 ``mm``),
    154 MB a step, and its 128×50257 logits viewed as (1, 128, 50257), 26 MB."""
    pre, dc, dc_t = _dest_view(body, dest, mt, spec, c.shape)
    stores = pre + _store_regions(body, body.region_views[c.name][1], dc, dc_t,
                                  TensorSpec(c.shape, c.dtype, contiguous_strides(c.shape)))
    if update is None:
        return stores
    result, init, line = update
    more, di, di_t = _dest_view(body, dest, mt, spec, init.shape)
    it = body.namer("t")
    loop = body.lines[line]
    body.lines[line] = "\n".join(stores + more + [
        f"    {it} = bufferization.to_tensor {di} restrict writable : {di_t} to {init.type}",
        loop.replace(f"= {init.name}) ->", f"= {it}) ->", 1)])
    return [f"    bufferization.materialize_in_destination {result.name} in restrict writable {di} : "
            f"({result.type}, {di_t}) -> ()"]


def _store_regions(body: FunctionBody, views: list[RegionView], dest: str, mt: str, spec: TensorSpec) -> list[str]:
    """Graph output ``dest`` written by a GEMM's regions in place: each region's register-tile
    view becomes a ``tensor.empty`` of its own (every region overwrites its view: zero or bias
    first), and its result is materialized into an ``expand_shape`` of its subview of ``dest``, so
    eliminate-empty-tensors, which follows same-type values only, makes the region compute
    straight into the output. Materializing the assembled C instead left the full-tile region in a
    temporary and copied it (the M edge of 512 rows in 6-row tiles: 1 MB per call)."""
    lines = []
    strides = contiguous_strides(spec.shape)
    for r in views:
        line = body.lines[r.line]
        loc = line[line.rindex(" loc("):] if " loc(" in line else ""
        body.lines[r.line] = f"    {r.name} = tensor.empty() : {r.value.type}{loc}"
        sizes = [math.prod(r.value.shape[i] for i in g) for g in r.groups]
        offset = sum(o * st for o, st in zip(r.offsets, strides))
        sub_t = memref_type(tuple(sizes), spec.dtype, strides, offset)
        view_strides = [0] * len(r.value.shape)
        for g, st in zip(r.groups, strides):
            acc = st
            for i in reversed(g):
                view_strides[i] = acc
                acc *= r.value.shape[i]
        view_t = memref_type(r.value.shape, spec.dtype, tuple(view_strides), offset)
        sub, view = body.namer("osub"), body.namer("oview")
        lines += [f"    {sub} = memref.subview {dest}[{', '.join(map(str, r.offsets))}] [{', '.join(map(str, sizes))}] "
                  f"[{', '.join('1' for _ in sizes)}] : {mt} to {sub_t}",
                  f"    {view} = memref.expand_shape {sub} {reassociation([list(g) for g in r.groups])} output_shape "
                  f"[{', '.join(map(str, r.value.shape))}] : {sub_t} into {view_t}",
                  f"    bufferization.materialize_in_destination {r.value.name} in restrict writable {view} : "
                  f"({r.value.type}, {view_t}) -> ()"]
    return lines


def value_uses(mlir: str) -> dict[str, int]:
    """How often each SSA value of our own emitted text is used (occurrences minus its definition;
    a result ``%t:2`` is used as ``%t#0``, ``%t#1``)."""
    counts: dict[str, int] = {}
    for name in re.findall(r"%[A-Za-z_][\w]*(?:#\d+)?", mlir):
        counts[name] = counts.get(name, 0) + 1
    uses = {k: v - (0 if "#" in k else 1) for k, v in counts.items() if not k.startswith("%arg")}
    # a reshape nobody reads (a keepdim view whose consumers read its source) does not use its source
    for m in reversed(list(re.finditer(r"^\s*(%\w+) = tensor\.(?:expand|collapse)_shape (%\w+(?:#\d+)?)", mlir, re.M))):
        if uses.get(m.group(1), 0) == 0 and m.group(2) in uses:
            uses[m.group(2)] -= 1
    return uses


def _fusion_groups(graph: torch.fx.Graph) -> dict[int, tuple[str, ...]]:
    """The ATen ops of each FX fusion group (``node.meta['neuron_kernel']``), in graph order."""
    groups: dict[int, list[str]] = {}
    for n in graph.nodes:
        if n.op == "call_function" and n.meta.get(KERNEL) is not None and n.target is not operator.getitem:
            groups.setdefault(n.meta[KERNEL], []).append(op_name(n))
    return {k: tuple(v) for k, v in groups.items()}


KERNEL = "neuron_kernel"  # node.meta keys set by the fusion pass (passes/fuse.py)
INLINE = "neuron_inline"


def stays_lazy(node: torch.fx.Node) -> bool:
    """A fused value stays unmaterialised iff the fusion pass put every user in its own kernel and
    every user can read lazy inputs (and it is not a graph output)."""
    kernel = node.meta.get(KERNEL)
    if kernel is None:
        return False
    inline = node.meta.get(INLINE, False)  # recomputed in every consumer kernel
    for u in node.users:
        if u.op != "call_function" or (u.meta.get(KERNEL) != kernel and not inline):
            return False
        if u.target is not operator.getitem and not reads_lazy_inputs(u.target):
            return False
    return True


CHEAP_OPS = 2  # a cast or a scale of a stored value: recomputed by each consumer instead of stored


def _cheap_to_recompute(node: torch.fx.Node, v: Any) -> bool:
    """A reduction's float64 accumulator cast back to float32 (or divided by N for a mean), or a
    convolution's output cropped from its padded-grid product, is read by its consumers directly;
    storing it would cost a whole extra loop."""
    if not isinstance(v, LazyTensor) or v.ops > CHEAP_OPS or node.meta.get(KERNEL) is None \
            or fusion_kind(node.target) not in ("reduction", "matmul"):
        return False
    return all(u.op == "call_function" and u.target is not operator.getitem
               and fusion_kind(u.target) in LAZY_INPUT_KINDS and u.meta.get(KERNEL) is not None for u in node.users)


def _stored(ctx: LoweringContext, v: Any) -> Any:
    """``v`` written to memory at its kernel's end, in the layout it is computed in: a value read
    from channels-last tensors is stored channels-last and passed on as a lazy read of that
    tensor (channels-last consumers read it as stored; others get it transposed once, by
    :meth:`LoweringContext.materialize`)."""
    if channels_last_backed(v):
        return permuted(ctx.stored_channels_last(v), FROM_CHANNELS_LAST)
    return _materialize_all(ctx, v)


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


def unrepresentable_nodes(gm: torch.fx.GraphModule) -> list[UnsupportedOp]:
    """Nodes whose values the lowering cannot represent: a dtype with no MLIR element type here
    (complex, uint64, ...), or an output size that depends on tensor values (``nonzero``,
    ``unique``, ``masked_select``: Dynamo records them as unbacked symbols; we compile static
    shapes only)."""
    found = []
    for n in gm.graph.nodes:
        if n.op not in ("placeholder", "call_function", "get_attr"):
            continue
        if n.meta.get("unbacked_bindings"):
            found.append(UnsupportedOp(op_name(n) if n.op == "call_function" else f"input {n.name}", n.name,
                                       user_location(n), "lowering/emit.py",
                                       "its output size depends on tensor values; only static shapes compile"))
            continue
        val = n.meta.get("val")
        vals = [val] if isinstance(val, torch.Tensor) else [v for v in val if isinstance(v, torch.Tensor)] \
            if isinstance(val, (list, tuple)) else []
        bad = [v.dtype for v in vals if not supported_dtype(v.dtype)]
        if bad:
            found.append(UnsupportedOp(op_name(n) if n.op == "call_function" else f"input {n.name}", n.name,
                                       user_location(n), "lowering/ir.py",
                                       f"dtype {str(bad[0]).replace('torch.', '')} is not supported"))
    return found


def _no_elements(val: Any) -> bool:
    """Whether a node's value is an empty tensor, or a tuple of only empty tensors."""
    if isinstance(val, torch.Tensor):
        return val.numel() == 0
    return isinstance(val, (list, tuple)) and bool(val) and all(
        isinstance(v, torch.Tensor) and v.numel() == 0 for v in val)


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
    """The :class:`HostOp` running random op ``node`` before the kernel; raises :class:`RuleDeclined`
    for a case the host path cannot run (a tuple result, an input computed inside the graph)."""
    if not isinstance(node.meta["val"], torch.Tensor):  # e.g. rrelu_with_noise_functional's pair
        raise RuleDeclined("a random op runs on the host before the kernel and must return one tensor")

    def ref(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if a.op == "placeholder":
                return ("input", placeholders.index(a))
            if a.op == "call_function" and a.target in EMPTY_FACTORIES:
                return ("empty", TensorSpec.of(a.meta["val"]), a.target == torch.ops.aten.zeros_like.default
                        or a.target == torch.ops.aten.zeros.default)
            raise RuleDeclined("a random op whose input is computed inside the graph runs on the host before "
                               "the kernel, so its input must be a graph input or a fresh tensor")
        if isinstance(a, (list, tuple)):
            return type(a)(ref(x) for x in a)
        return a
    return HostOp(node.target, tuple(ref(a) for a in node.args), {k: ref(v) for k, v in node.kwargs.items()})
