"""Typed errors of neuron-compile.

Every error names what went wrong, where in the user's program (the FX node and the user's
``file:line``), and what to do. Dynamo wraps backend exceptions in ``BackendCompilerFailed``; our
message is kept intact inside it, so the user sees the same text.
"""
from __future__ import annotations

from dataclasses import dataclass


class NeuronCompileError(RuntimeError):
    """Base class of every error neuron-compile raises on purpose."""


@dataclass(frozen=True)
class UnsupportedOp:
    """One FX node whose ATen op has no lowering rule.

    Attributes:
        op: the ATen overload name, e.g. ``aten.cumsum.default``.
        node: the FX node name, e.g. ``cumsum_1``.
        location: the user's ``file:line`` that produced the node, or ``<unknown>``.
        rule_file: where its rule or decomposition would go (``lowering/rules/*.py`` or a ``passes/`` file).
    """

    op: str
    node: str
    location: str
    rule_file: str
    reason: str = ""


class UnsupportedOpsError(NeuronCompileError):
    """Compilation refused: the graph holds ops with no lowering rule.

    Lists *every* such op (never just the first), each with the user's source line, so one compile
    tells the whole story. neuron-compile never falls back to eager silently.
    """

    def __init__(self, ops: list[UnsupportedOp], graph_name: str = "graph"):
        self.ops = list(ops)
        lines = [
            f"neuron-compile cannot lower {len(self.ops)} op(s) in {graph_name}; "
            "no silent fallback is made:"
        ]
        for u in self.ops:
            # a reason (a dtype, a data-dependent size) says what to change; with none, the op has
            # no lowering rule and the hint says where one would go
            why = f" ({u.reason})" if u.reason else f"; a lowering rule or a decomposition would go in {u.rule_file}"
            lines.append(f"  - {u.op} (FX node '{u.node}') at {u.location}{why}")
        lines.append("Rewrite these calls with supported ops, or add a lowering rule "
                     "(@register_lowering in neuron_compile.lowering.rules) or a decomposition (passes/decompose.py).")
        super().__init__("\n".join(lines))


class DynamicShapeError(NeuronCompileError):
    """A graph input or node has a symbolic size; neuron-compile compiles static shapes only."""

    def __init__(self, what: str):
        super().__init__(
            f"neuron-compile compiles static shapes only, but {what} has a symbolic size. "
            "Call torch.compile(..., backend=\"neuron\", dynamic=False) "
            "(and do not mark inputs dynamic with torch._dynamo.mark_dynamic).")


class RuleDeclined(NeuronCompileError):
    """Raised by a lowering rule for a case of its op it does not support (collected by the emitter
    into one :class:`UnsupportedOpsError`; never escapes to the user on its own)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class LoweringError(NeuronCompileError):
    """A lowering rule failed on a node it claims to support (a bug or an unhandled argument)."""

    def __init__(self, message: str, op: str = "", node: str = "", location: str = ""):
        self.op, self.node, self.location = op, node, location
        where = f" while lowering {op} (FX node '{node}') at {location}" if op else ""
        super().__init__(f"{message}{where}")


class PipelineError(NeuronCompileError):
    """An external compiler stage (MLIR pass pipeline, translation, codegen, link) failed or crashed.

    Attributes:
        phase: the named phase that failed (``llvm``, ``obj``, ...).
        input_path: the dumped input of the failing stage.
        command: a shell command that reproduces the failure from ``input_path``.
        detail: the tool's diagnostics (stderr tail), or the signal that killed it.
    """

    def __init__(self, phase: str, input_path: str, command: str, detail: str):
        self.phase, self.input_path, self.command, self.detail = phase, input_path, command, detail
        super().__init__(
            f"neuron-compile phase '{phase}' failed.\n{detail.strip()}\n"
            f"The stage's input was kept at {input_path}; reproduce with:\n  {command}\n"
            "Please report this with that file attached.")


class ArgumentCheckError(NeuronCompileError):
    """An op's arguments are ones ATen's CPU kernel rejects (e.g. ``torch.mm`` of float32 and float64):
    the message is eager's, followed by the op, the FX node and the user's line."""


class RuntimeCallError(NeuronCompileError):
    """A compiled executable was called with inputs that do not match what it was compiled for."""


class CacheError(NeuronCompileError):
    """The artifact cache cannot be used as configured."""


class ExecutableError(NeuronCompileError):
    """A stored executable is unreadable, corrupt, of another format version, or built for another host."""
