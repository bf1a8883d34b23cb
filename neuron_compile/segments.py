"""A graph with host calls: an ordered program of kernel segments and ATen calls on the host.

:func:`split_program` cuts an ATen FX graph at the nodes chosen by
:func:`neuron_compile.passes.host_calls.host_call_nodes` (as Inductor's scheduler places
``ExternKernel``/``FallbackKernel`` calls between generated kernels). Each maximal run of other
nodes becomes a *segment*: its own FX graph, compiled and cached by
:func:`~neuron_compile.compiler.compile_graph` like any graph, so the FX passes (fusion included)
never see across a host call. The program is pure data over value ids (graph inputs first, then each
step's results) with a JSON round trip; the runtime (:class:`SegmentedExecutable`) runs the steps
in order and drops each value after its last use.
"""
from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from neuron_compile.plan import HostOp, decode_value, encode_value


@dataclass
class KernelStep:
    """Run segment ``segment`` (an executable) on values ``args``; its outputs become ``results``."""

    segment: int
    args: list[int]
    results: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.segment, "args": self.args, "results": self.results}


@dataclass
class HostStep:
    """Run ``op`` (an ATen op; ``("value", id)`` references in its arguments) into value ``result``;
    or, when ``index`` is set, take item ``index`` of value ``source`` (a tuple result)."""

    result: int
    op: HostOp | None = None
    source: int = -1
    index: int = -1

    def to_json(self) -> dict[str, Any]:
        if self.op is None:
            return {"getitem": [self.source, self.index], "result": self.result}
        return {"host": self.op.to_json(), "result": self.result}


@dataclass
class Program:
    """``n_inputs`` graph inputs (value ids ``0..n_inputs-1``), ``steps`` in order, the graph's
    ``outputs`` (``("value", id)`` or constants) and, per step, the value ids dead after it."""

    n_inputs: int
    steps: list[KernelStep | HostStep] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    frees: list[list[int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": self.n_inputs, "steps": [s.to_json() for s in self.steps],
                "outputs": [encode_value(o) for o in self.outputs], "frees": self.frees}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Program":
        steps: list[KernelStep | HostStep] = []
        for s in d["steps"]:
            if "kernel" in s:
                steps.append(KernelStep(s["kernel"], list(s["args"]), list(s["results"])))
            elif "getitem" in s:
                steps.append(HostStep(s["result"], source=s["getitem"][0], index=s["getitem"][1]))
            else:
                steps.append(HostStep(s["result"], HostOp.from_json(s["host"])))
        return Program(d["inputs"], steps, [decode_value(o) for o in d["outputs"]], [list(f) for f in d["frees"]])

    @property
    def host_calls(self) -> int:
        return sum(1 for s in self.steps if isinstance(s, HostStep) and s.op is not None)


def _group_getitems(graph: torch.fx.Graph) -> None:
    """Move each ``getitem`` right after the node it indexes (always legal: it depends on nothing
    else), so a tuple never crosses a segment boundary."""
    for node in list(graph.nodes):
        items = [u for u in node.users if u.target is operator.getitem]
        anchor = node
        for item in sorted(items, key=lambda u: u.args[1]):
            anchor.append(item)
            anchor = item


def split_program(gm: torch.fx.GraphModule, host_nodes: Sequence[torch.fx.Node]
                  ) -> tuple[Program, list[torch.fx.GraphModule]]:
    """Cut ``gm`` at ``host_nodes``. Returns the program and one FX graph per kernel segment
    (placeholders carry ``meta['val']``; ``get_attr`` constants are copied into each segment that
    reads them). Raises ``ValueError`` if a host call reads a ``get_attr`` constant (not storable
    in a program)."""
    graph = gm.graph
    _group_getitems(graph)
    host = set(host_nodes)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    ids: dict[torch.fx.Node, int] = {n: i for i, n in enumerate(placeholders)}
    body = [n for n in graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    output = next(n for n in graph.nodes if n.op == "output")
    runs: list[tuple[bool, list[torch.fx.Node]]] = []
    for n in body:
        is_host = n in host
        if is_host or not runs or runs[-1][0]:
            runs.append((is_host, [n]))
        else:
            runs[-1][1].append(n)

    program = Program(len(placeholders))
    segments: list[torch.fx.GraphModule] = []
    for is_host, nodes in runs:
        if is_host:
            (n,) = nodes
            ids[n] = len(ids)
            if n.target is operator.getitem:
                program.steps.append(HostStep(ids[n], source=ids[n.args[0]], index=n.args[1]))
                continue

            def ref(a: Any) -> Any:
                if isinstance(a, torch.fx.Node):
                    if a.op == "get_attr":
                        raise ValueError(f"host call {n.name} reads the constant {a.target}")
                    return ("value", ids[a])
                return a
            args = torch.fx.node.map_aggregate(n.args, ref)
            kwargs = torch.fx.node.map_aggregate(dict(n.kwargs), ref)
            program.steps.append(HostStep(ids[n], HostOp(n.target, tuple(args), dict(kwargs))))
            continue
        inside = set(nodes)
        g = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        ext: list[torch.fx.Node] = []  # values from graph inputs or earlier steps, in first-use order
        for n in nodes:
            for a in n.all_input_nodes:
                if a not in inside and a.op != "get_attr" and a not in env:
                    p = env[a] = g.placeholder(a.name)
                    p.meta = copy.copy(a.meta)
                    ext.append(a)

        def lookup(a: torch.fx.Node) -> torch.fx.Node:
            if a not in env:  # a get_attr constant: copied into each segment reading it
                env[a] = g.node_copy(a)
            return env[a]
        for n in nodes:
            env[n] = g.node_copy(n, lookup)
        outs = [n for n in nodes if any(u not in inside for u in n.users)]
        g.output(tuple(env[n] for n in outs))
        g.lint()
        for n in outs:
            ids[n] = len(ids)
        program.steps.append(KernelStep(len(segments), [ids[a] for a in ext], [ids[n] for n in outs]))
        segments.append(torch.fx.GraphModule(gm, g))

    program.outputs = list(torch.fx.node.map_aggregate(
        output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]],
        lambda a: ("value", ids[a]) if isinstance(a, torch.fx.Node) else a))
    program.frees = _last_uses(program)
    return program, segments


def _step_reads(step: KernelStep | HostStep) -> list[int]:
    if isinstance(step, KernelStep):
        return step.args
    if step.op is None:
        return [step.source]
    found: list[int] = []

    def visit(a: Any) -> None:
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "value":
            found.append(a[1])
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
    visit(step.op.args)
    visit(list(step.op.kwargs.values()))
    return found


def _last_uses(program: Program) -> list[list[int]]:
    kept = {o[1] for o in program.outputs if isinstance(o, tuple) and len(o) == 2 and o[0] == "value"}
    last: dict[int, int] = {}
    for i, step in enumerate(program.steps):
        for v in _step_reads(step):
            last[v] = i
    frees: list[list[int]] = [[] for _ in program.steps]
    for v, i in last.items():
        if v not in kept:
            frees[i].append(v)
    return frees


def _resolve(a: Any, env: dict[int, Any]) -> Any:
    """``a`` with each ``("value", id)`` replaced by ``env[id]``. A module-level function: a nested
    recursive closure is a reference cycle holding ``env`` (and so every output) until the garbage
    collector runs, and each call then page-faults fresh memory (measured: 4096 faults and 3x the
    time per call of a 16 MB cumsum)."""
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "value":
        return env[a[1]]
    if isinstance(a, (list, tuple)):
        return type(a)(_resolve(x, env) for x in a)
    return a


class SegmentedExecutable:
    """A compiled graph with host calls: ``exe(inputs) -> outputs`` (lists), running the program's
    kernel segments (each an :class:`~neuron_compile.runtime.Executable`) and host calls in order."""

    def __init__(self, name: str, program: Program, segments: Sequence[Callable[[list], list]]):
        self.name = name
        self.program = program
        self.segments = list(segments)
        self.cache_key = None

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        from neuron_compile.errors import RuntimeCallError
        p = self.program
        if len(args) != p.n_inputs:
            raise RuntimeCallError(f"{self.name}: expected {p.n_inputs} inputs, got {len(args)}")
        env: dict[int, Any] = dict(enumerate(args))
        for step, dead in zip(p.steps, p.frees):
            if isinstance(step, KernelStep):
                outs = self.segments[step.segment]([env[i] for i in step.args])
                env.update(zip(step.results, outs))
            elif step.op is None:
                env[step.result] = env[step.source][step.index]
            else:
                op = step.op
                env[step.result] = op.target(*_resolve(op.args, env), **{k: _resolve(v, env) for k, v in op.kwargs.items()})
            for v in dead:
                env.pop(v, None)
        return [_resolve(o, env) for o in p.outputs]
