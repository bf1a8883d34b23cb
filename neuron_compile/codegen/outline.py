"""Outline each scheduled kernel into its own function while its schedule is applied.

Why: ``transform.structured.fuse_into_containing_op`` prints the producer and the containing op into
a diagnostic on every call, and printing numbers every value of the closest isolated-from-above
op — the graph's whole function. With one function per graph the interpreter was quadratic in the
graph's size (measured on a synthetic chain: 11 ms per fusion in a 50-kernel function, 117 ms in an
800-kernel one; GPT-2-2L's backward graph spent 6.7 s of its 11 s ``linalg`` → ``llvm`` phase
there). Here every kernel's ops (with the fills, empties and constants they start from) move into a
private ``func.func`` called from the graph's function; the schedules run on those small functions,
and the pipeline's ``inline`` pass puts everything back before bufferization, so what follows sees
the IR it always saw. IREE gets the same locality by forming one dispatch region (its own function)
per fused kernel before code generation.

The emitter's text is regular (one top-level op per statement, SSA names unique across the whole
function, the result type last on the statement's last line), so this works on text and never
loads MLIR into the user's process. Anything it does not recognise leaves the module as it was
(only slower to schedule).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Sequence

log = logging.getLogger("neuron_compile")

CODE_ATTR = "neuron.code"          # unit attribute on every function with code (cleanups match it)
SEGMENT_ATTR = "neuron.segment"    # the outlined function of the kernel group whose last id it names
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r"%[\w.$]+(?:#\d+)?")
_LHS = re.compile(r"^\s*(%[\w.$]+(?::\d+)?(?:\s*,\s*%[\w.$]+(?::\d+)?)*)\s*=\s")
_KERNEL = re.compile(r"neuron\.kernel = (\d+) : i64")
_LOC = re.compile(r"\s+loc\(.*\)\s*$")
_INSERT = re.compile(r"^\s*%[\w.$]+ = tensor\.insert_slice ")
_CLONEABLE = re.compile(r"^\s*%[\w.$]+ = (tensor\.empty\(|arith\.constant [^d]|linalg\.fill )")


@dataclass
class _Stmt:
    text: str
    defs: list[str]
    uses: set[str] = field(default_factory=set)
    kernels: set[int] = field(default_factory=set)


class _Unrecognised(Exception):
    pass


def _split_top(s: str, sep: str = ",") -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _result_types(stmt: _Stmt) -> list[str]:
    """Result types of a top-level statement: the type(s) ending its last line (before ``loc``),
    else those after ``->`` ending its first line (``scf.for ... -> (T) {``), else a named DPS op's
    ``outs`` types (``linalg.transpose``)."""
    lines = [_LOC.sub("", _STRING.sub('""', ln)).rstrip() for ln in stmt.text.rstrip().split("\n")]
    first, last = lines[0], lines[-1]
    one = r"(tensor<[^<>]*>|index|[if]\d+|bf16)"
    candidates = []
    if last.endswith(")") and len(stmt.defs) > 1:
        candidates.append(_paren_tail(last))
    m = re.search(one + "$", last)
    if m:
        candidates.append([m.group(1)])
    m = re.search(r"->\s*(\(.*\)|" + one + r")\s*\{$", first)
    if m:
        candidates.append(_split_top(m.group(1)[1:-1]) if m.group(1).startswith("(") else [m.group(1)])
    outs = re.search(r"\souts\(([^()]*)\)", first)
    if outs and ":" in outs.group(1):
        candidates.append(_split_top(outs.group(1).split(":", 1)[1]))
    for types in candidates:
        if len(types) == len(stmt.defs):
            return types
    raise _Unrecognised(stmt.text[:120])


def _paren_tail(line: str) -> list[str]:
    depth, i = 0, len(line) - 1
    while i >= 0:
        depth += {")": 1, "(": -1}.get(line[i], 0)
        if depth == 0:
            break
        i -= 1
    return _split_top(line[i + 1:-1])


def _statements(body: list[str]) -> list[_Stmt]:
    out: list[_Stmt] = []
    i = 0
    while i < len(body):
        lines, depth = [], 0
        while True:
            line = body[i]
            i += 1
            lines.append(line)
            bare = _STRING.sub('""', line)
            depth += bare.count("{") - bare.count("}")
            if depth <= 0 or i >= len(body):
                break
        text = "\n".join(lines)
        m = _LHS.match(lines[0])
        defs: list[str] = []
        if m:
            for d in _split_top(m.group(1)):
                name, _, count = d.partition(":")
                defs += [f"{name}#{j}" for j in range(int(count))] if count else [name]
        out.append(_Stmt(text, defs, kernels={int(k) for k in _KERNEL.findall(text)}))
    return out


def outline_kernels(mlir: str, groups: Sequence[Sequence[int]], function: str = "neuron_kernel") -> str:
    """Move the statements of each kernel group into a private function (see the module docstring).

    Args:
        mlir: the emitter's module (one ``func.func @{function}`` with the graph).
        groups: kernel ids scheduled together by one transform sequence (a fused-rows chain, or
            one kernel), in kernel order.
    Returns:
        The module with one ``func.func private @neuron_segment_<last id>`` per group (attributes
        ``neuron.code`` and ``neuron.segment = <last id>``) and the graph's function calling them,
        itself marked ``neuron.code``; the module unchanged but for that mark when its text is
        not of the expected shape.
    """
    lines = _distinct_empties(mlir).split("\n")
    head = next((i for i, l in enumerate(lines) if l.startswith(f"  func.func @{function}(")), None)
    if head is None:
        return mlir
    lines[head] = lines[head].replace("attributes {", f"attributes {{{CODE_ATTR}, ", 1)
    if not groups:
        return "\n".join(lines)
    end = next(i for i in range(head + 1, len(lines)) if lines[i] == "  }")
    try:
        outlined = _outline(lines[head + 1:end], groups, _signature(lines[head]))
    except _Unrecognised as exc:
        log.debug("neuron-compile: kernels not outlined (unrecognised statement %s)", exc)
        return "\n".join(lines)
    functions, body = outlined
    return "\n".join(lines[:head] + functions + [lines[head]] + body + lines[end:])


def _distinct_empties(mlir: str) -> str:
    """Give every ``tensor.empty`` a distinct ``neuron.empty`` attribute, so CSE inside a kernel's
    function cannot merge two kernels' identical inits (``tensor.empty`` + ``linalg.fill``): one
    value initialising two ops is what eliminate-empty-tensors miscompiles, and it now runs after
    the schedules (measured: a layer_norm bias gradient summed into its sibling's accumulator)."""
    n = iter(range(1 << 62))
    return re.sub(r"= tensor\.empty\(\) :", lambda m: f"= tensor.empty() {{neuron.empty = {next(n)} : i64}} :", mlir)


def _signature(line: str) -> dict[str, str]:
    inner = line[line.index("(") + 1:]
    depth, i = 1, 0
    while depth:
        depth += {"(": 1, ")": -1}.get(inner[i], 0)
        i += 1
    args = {}
    for a in _split_top(inner[:i - 1]):
        name, _, rest = a.partition(":")
        args[name.strip()] = re.sub(r"\s*\{.*\}\s*$", "", rest.strip())
    return args


def _outline(body: list[str], groups: Sequence[Sequence[int]], args: dict[str, str]
             ) -> tuple[list[str], list[str]]:
    stmts = _statements(body)
    defined = {d: i for i, s in enumerate(stmts) for d in s.defs}
    last_use: dict[str, int] = {}
    for i, s in enumerate(stmts):
        s.uses = {n for n in _NAME.findall(_STRING.sub('""', s.text)) if (n in defined and defined[n] != i) or n in args}
        for n in s.uses:
            last_use[n] = i
    # statement ranges per group, merged where they overlap; each extends back to the previous end
    spans = []
    for g in groups:
        idx = [i for i, s in enumerate(stmts) if s.kernels & set(g)]
        if idx:
            spans.append([min(idx), max(idx), max(g)])
    spans.sort()
    merged: list[list[int]] = []
    for a, b, key in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
            merged[-1][2] = max(merged[-1][2], key)
        else:
            merged.append([a, b, key])
    # a kernel writing a slice of a larger destination (a ``cat`` piece, a padded copy) keeps the
    # ``tensor.insert_slice`` of its result: split from it, the next segment would clone the
    # destination's ``tensor.empty`` and write into the clone, leaving the kernel's own slice in a
    # buffer of the destination's full size, allocated and copied every call (measured: the first
    # ``cat`` piece of 3 × (8, 128, 768) took 1.8 ms against its siblings' 0.1)
    for n, span in enumerate(merged):
        limit = merged[n + 1][0] if n + 1 < len(merged) else len(stmts)
        while span[1] + 1 < limit and _INSERT.match(stmts[span[1] + 1].text) \
                and any(defined.get(u, -1) in range(span[0], span[1] + 1) for u in stmts[span[1] + 1].uses):
            span[1] += 1
    functions: list[str] = []
    main: list[str] = []
    rename: dict[str, str] = {}
    start = 0
    for _, b, key in merged:
        seg = list(range(start, b + 1))
        inside = {d for i in seg for d in stmts[i].defs}
        # values read from outside: pure init ops (empty, constant, fill) are cloned in so each
        # kernel's schedule finds its fills in its own function; the rest become arguments
        cloned: list[int] = []
        need = sorted({n for i in seg for n in stmts[i].uses} - inside, key=lambda n: (n not in args, n))
        work = list(need)
        ins: list[str] = []
        while work:
            n = work.pop(0)
            j = defined.get(n)
            if j is not None and _CLONEABLE.match(stmts[j].text) and not stmts[j].kernels and j not in cloned:
                cloned.append(j)
                work += [u for u in stmts[j].uses if u not in inside and u not in ins]
                inside |= set(stmts[j].defs)
            elif n not in inside and n not in ins:
                ins.append(n)
        ins = [n for n in ins if n not in inside]
        outs = [d for i in seg for d in stmts[i].defs if last_use.get(d, -1) > b]
        in_types = [args[n] if n in args else _result_types(stmts[defined[n]])[stmts[defined[n]].defs.index(n)]
                    for n in ins]
        out_types = [_result_types(stmts[defined[n]])[stmts[defined[n]].defs.index(n)] for n in outs]
        local = {n: _plain(n) for n in ins if "#" in n}  # an argument cannot be named %a#1
        sig = ", ".join(f"{_plain(n)}: {t}" for n, t in zip(ins, in_types))
        res = f" -> ({', '.join(out_types)})" if outs else ""
        functions.append(f"  func.func private @neuron_segment_{key}({sig}){res} attributes "
                         f"{{{CODE_ATTR}, {SEGMENT_ATTR} = {key} : i64}} {{")
        functions += [_renamed(stmts[j].text, {**rename, **local}) for j in sorted(cloned)]
        functions += [_renamed(stmts[i].text, {**rename, **local}) for i in seg]
        functions.append(f"    return {', '.join(outs)} : {', '.join(out_types)}" if outs else "    return")
        functions.append("  }")
        for n in outs:
            if "#" in n:
                rename[n] = _plain(n)
        call_args = ", ".join(_renamed(n, rename) for n in ins)
        lhs = f"{', '.join(_renamed(n, rename) for n in outs)} = " if outs else ""
        main.append(f"    {lhs}func.call @neuron_segment_{key}({call_args}) : ({', '.join(in_types)}) -> "
                    f"({', '.join(out_types)})")
        start = b + 1
    main += [_renamed(s.text, rename) for s in stmts[start:]]
    return functions, main


def _plain(name: str) -> str:
    """``%a#1`` → ``%a__1`` (a result of a multi-result op, as a plain SSA name)."""
    return name.replace("#", "__")


def _renamed(text: str, rename: dict[str, str]) -> str:
    if not rename:
        return text
    return _NAME.sub(lambda m: rename.get(m.group(0), m.group(0)), text)
