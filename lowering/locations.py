"""FX node → user source location, and → MLIR ``Location`` text.

The user's frame is the innermost frame of ``node.meta['stack_trace']`` (recorded by Dynamo and
carried through AOTAutograd) that is not inside torch or neuron-compile, as JAX reports user-frame
locations. The stack trace is only stored as text, so it is parsed here and nowhere else.
"""
from __future__ import annotations

import os
import re

import torch

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_INTERNAL = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch,))
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _internal(path: str) -> bool:
    p = os.path.abspath(path)
    return p.startswith(_INTERNAL) or (p.startswith(_OURS) and "/tests/" not in p and "/examples/" not in p)


def user_frame(node: torch.fx.Node) -> tuple[str, int] | None:
    """``(file, line)`` of the user code that produced ``node``, or ``None`` if unrecorded."""
    trace = node.meta.get("stack_trace") or ""
    frames = [(m["file"], int(m["line"])) for m in _FRAME.finditer(trace)]
    for f, ln in reversed(frames):
        if not _internal(f):
            return f, ln
    return frames[-1] if frames else None


def user_location(node: torch.fx.Node) -> str:
    """``file:line`` for messages; for a graph input, where its first user is; else the nn.Module
    the node came from; else ``<unknown location>`` (e.g. the copy-back of a mutated input, which
    AOTAutograd adds after the user's code)."""
    fr = user_frame(node)
    if fr:
        return f"{fr[0]}:{fr[1]}"
    if node.op == "placeholder":  # an input has no line of its own
        used = [f for f in map(user_frame, node.users) if f]
        if used:
            return f"{used[0][0]}:{used[0][1]} (its first use)"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1][:2]
        kind = getattr(kind, "__qualname__", None) or str(kind).rsplit(".", 1)[-1]
        return f"<inside {kind} module {path}>"
    return "<unknown location>"


def op_name(node: torch.fx.Node) -> str:
    t = node.target
    return f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}" if hasattr(t, "_schema") \
        else getattr(t, "__name__", str(t))


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def mlir_location(node: torch.fx.Node | None) -> str:
    """``loc("aten.add.Tensor"("file.py":12:0))``: a NameLoc of the op around the user's FileLineColLoc.

    Cache keys strip these (``--mlir-print-debuginfo`` off) so source moves do not change keys.
    """
    if node is None:
        return "loc(unknown)"
    fr = user_frame(node)
    name = _quote(op_name(node) + " " + node.name)
    return f"loc({name}({_quote(fr[0])}:{fr[1]}:0))" if fr else f"loc({name})"
