"""Random small programs over aliased / mutated / requires_grad inputs, for tests/e2e/test_alias_fuzz.py.

A ``Program`` is a list of Python statements plus the code that builds its inputs. It prints as
runnable code (``make_inputs()`` and ``f(...)``) and ``build()`` exec's exactly that code, so a
failing program can be pasted into a regression test as is.

The generator executes every candidate statement on a "shadow" copy of the inputs while it draws
(with the same views and ``requires_grad`` as the real run): a statement that raises there (a
partially overlapping in-place write, an in-place write on a view of a leaf that requires grad,
...) is dropped, so the programs are (nearly always) legal eager programs. The test still runs
eager first and rejects the rare program whose backward is illegal.

Rules that keep eager itself well defined (so any disagreement is the compiler's):
  * programs that require grad never write to an input or to a view of one (illegal in eager);
  * in-place ops never write to expanded / overlapping memory (``expand``, overlapping
    ``as_strided``), and their other operands never alias the written tensor (eager's result
    would depend on its loop order, e.g. ``x.add_(x.t())``);
  * ``scatter`` (no reduction) and ``index_put`` (no accumulate) get duplicate-free indices
    (eager leaves the winner of duplicate writes unspecified).
"""
from __future__ import annotations

import dataclasses
import itertools
import linecache

import torch
from hypothesis import strategies as st

_counter = itertools.count()


@dataclasses.dataclass
class Program:
    input_lines: list[str]      # body of make_inputs(), after the generator line
    input_names: list[str]      # f's parameters, in order
    root_names: list[str]       # the tensors the inputs are made from (leaves; grads are compared)
    body: list[str]             # f's statements
    outputs: list[str]          # f's returned expressions

    def source(self) -> str:
        mk = ["def make_inputs():", "    g = torch.Generator().manual_seed(0)"]
        mk += ["    " + line for line in self.input_lines]
        mk.append(f"    return [{', '.join(self.input_names)}], [{', '.join(self.root_names)}]")
        outs = self.outputs or self.input_names[:1]
        ret = ", ".join(outs) if len(outs) > 1 else f"({outs[0]},)"
        fn = [f"def f({', '.join(self.input_names)}):"] + ["    " + line for line in self.body]
        fn.append(f"    return {ret}")
        return "\n".join(mk + ["", ""] + fn) + "\n"

    def build(self):
        """(f, make_inputs) exec'd from ``source()`` (registered with linecache for tracebacks)."""
        return build_source(self.source())

    def __repr__(self) -> str:
        return "\n" + self.source()


def build_source(src: str):
    filename = f"<alias_fuzz_program_{next(_counter)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = {"torch": torch}
    exec(compile(src, filename, "exec"), ns)
    return ns["f"], ns["make_inputs"]


@dataclasses.dataclass
class _Var:
    group: str            # alias group: vars in one group may share memory
    aliases_input: bool   # an input, or a view of one
    overlapping: bool     # expanded / self-overlapping memory: never written in place


def _shape(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _base_views(R: int, C: int) -> list[tuple[str, bool]]:
    """(expression over ``base`` of shape (R, C), overlapping?)"""
    return [
        ("base[:, :-1]", False), ("base[:, 1:]", False), ("base[1:]", False), ("base[:-1]", False),
        ("base", False), ("base[0]", False), (f"base.select(1, {C - 1})", False),
        (f"base.unbind(0)[{R - 1}]", False), ("base.chunk(2)[0]", False), ("base.chunk(2, 1)[1]", False),
        ("base.t()", False), ("base.transpose(0, 1)[1:]", False),
        (f"base.as_strided(({R - 1}, {C - 1}), ({C}, 1), 1)", False),
        (f"base.as_strided(({C}, {R}), (1, {C}))", False),
        (f"base[0].expand(2, {C})", True), (f"base[:, :1].expand({R}, 3)", True),
        ("base.as_strided((2, 2), (1, 1))", True),
    ]


_UNARY = ["{a} * 2", "{a} + 1", "torch.sin({a})", "torch.relu({a})", "{a}.clamp(-0.5, 0.5)"]
_BINARY = ["{a} + {b}", "{a} * {b}", "torch.where({a} > 0, {a}, {b})"]
_KINDS = ["unary", "binary", "reduce", "matmul", "view", "inplace", "scatter", "repeat"]


class _Gen:
    def __init__(self, draw, env: dict, vars_: dict[str, _Var], rg: bool):
        self.draw, self.env, self.vars, self.rg = draw, env, vars_, rg
        self.pure: list[tuple[str, str]] = []   # (right-hand side, target) of out-of-place statements
        self.written: str | None = None   # the variable the last drawn in-place statement writes
        self.arg: str | None = None       # the last statement's first operand (or the original)

    def shape(self, name):
        return tuple(self.env[name].shape)

    def pick(self, names):
        """One of ``names``: half the time the newest (chains like ``b = x * 2; b.scatter_add(...)``)."""
        names = [n for n in self.vars if n in set(names)]
        name = names[-1] if self.draw(st.booleans()) else self.draw(st.sampled_from(names))
        self.arg = self.arg or name
        return name

    def names(self, pred=lambda n: True):
        return [n for n in self.vars if pred(n)]

    def idx(self, n: int, length: int, unique: bool) -> list[int]:
        if unique:
            return self.draw(st.permutations(range(n)))[:length]
        return self.draw(st.lists(st.integers(0, n - 1), min_size=length, max_size=length))

    def src(self, shape, exclude_group, fallbacks: list[str]) -> str:
        """An operand of exactly ``shape``: a variable (not in ``exclude_group``) or a fallback."""
        cands = [n for n in self.names(lambda n: self.shape(n) == tuple(shape)
                                       and self.vars[n].group != exclude_group)]
        return self.draw(st.sampled_from(cands + fallbacks + [f"torch.full({_shape(shape)}, 0.5)"]))

    def scatter_like(self, a: str, inplace: bool) -> str | None:
        shape, d = self.shape(a), self.draw
        if len(shape) == 0 or shape[0] == 0:
            return None
        n, us = shape[0], "_" if inplace else ""
        ex = self.vars[a].group if inplace else None
        kinds = ["scatter_add", "scatter", "index_add", "index_put", "index_put_acc"]
        if not inplace:
            kinds += ["index_select", "slice_scatter", "select_scatter"]
        kind = d(st.sampled_from(kinds))
        own = [] if inplace else [f"{a} * 3"]
        if kind in ("scatter_add", "scatter"):
            if len(shape) > 2:
                return None
            if len(shape) == 1:
                idx = self.idx(n, n, unique=kind == "scatter")
            else:   # column j of idx says where row i of src goes; unique per column for scatter
                cols = [self.idx(n, n, unique=kind == "scatter") for _ in range(shape[1])]
                idx = [[cols[j][i] for j in range(shape[1])] for i in range(n)]
            return f"{a}.{kind}{us}(0, torch.tensor({idx}), {self.src(shape, ex, own)})"
        if kind == "index_add":
            return f"{a}.index_add{us}(0, torch.tensor({self.idx(n, n, False)}), {self.src(shape, ex, own)})"
        if kind in ("index_put", "index_put_acc"):
            acc = kind == "index_put_acc"
            k = d(st.integers(1, n))
            vals = self.src(shape[1:], ex, ["torch.tensor(2.0)"] + ([] if inplace else [f"{a}[0] * 3"]))
            return (f"{a}.index_put{us}((torch.tensor({self.idx(n, k, not acc)}),), {vals}"
                    + (", accumulate=True)" if acc else ")"))
        if kind == "index_select":
            dim = d(st.integers(0, len(shape) - 1))
            if shape[dim] == 0:   # (an empty dim: nothing to select)
                return None
            k = d(st.integers(1, shape[dim]))
            return f"{a}.index_select({dim}, torch.tensor({self.idx(shape[dim], k, False)}))"
        if kind == "slice_scatter":
            s = d(st.integers(0, n - 1))
            e = d(st.integers(s + 1, n))
            src = self.src((e - s,) + shape[1:], None, [f"{a}[{s}:{e}] * 3"])
            return f"torch.slice_scatter({a}, {src}, 0, {s}, {e})"
        i = d(st.integers(0, n - 1))
        return f"torch.select_scatter({a}, {self.src(shape[1:], None, [f'{a}[{n - 1 - i}] * 3'])}, 0, {i})"

    def statement(self, target: str) -> tuple[str, _Var | None] | None:
        """One drawn statement: (code, the new variable's info or None for an in-place op)."""
        d, kind = self.draw, self.draw(st.sampled_from(_KINDS))
        fresh = _Var(group=target, aliases_input=False, overlapping=False)
        if kind == "unary":
            return f"{target} = " + d(st.sampled_from(_UNARY)).format(a=self.pick(self.vars)), fresh
        if kind == "binary":
            a = self.pick(self.vars)
            b = self.pick(self.names(lambda n: _broadcastable(self.shape(a), self.shape(n))))
            return f"{target} = " + d(st.sampled_from(_BINARY)).format(a=a, b=b), fresh
        if kind == "reduce":
            cands = self.names(lambda n: len(self.shape(n)) >= 1)
            if not cands:
                return None
            a = self.pick(cands)
            dim = d(st.integers(0, len(self.shape(a)) - 1))
            return f"{target} = " + d(st.sampled_from([f"{a}.sum({dim})", f"{a}.amax({dim})", f"{a}.sum()"])), fresh
        if kind == "matmul":
            cands = self.names(lambda n: len(self.shape(n)) == 2)
            if not cands:
                return None
            a = self.pick(cands)
            k = self.shape(a)[1]
            opts = [f"{a} @ {a}.t()"]
            for b in self.vars:
                sb = self.shape(b)
                if len(sb) == 2 and sb[0] == k:
                    opts.append(f"{a} @ {b}")
                if len(sb) == 2 and sb[1] == k:
                    opts.append(f"{a} @ {b}.t()")
                if sb == (k,):
                    opts.append(f"{a} @ {b}")
            return f"{target} = " + d(st.sampled_from(opts)), fresh
        if kind == "view":
            cands = self.names(lambda n: len(self.shape(n)) >= 1)
            if not cands:
                return None
            a = self.pick(cands)
            shape, t = self.shape(a), self.env[a]
            opts = [(".view(-1)", False)] if t.is_contiguous() else []
            opts += [("[1:]", False), ("[0]", False)] if shape[0] >= 2 else []
            opts += [(".t()", False), ("[:, :-1]", False)] if len(shape) == 2 else []
            opts += [(f".unsqueeze(0).expand(2, {', '.join(map(str, shape))})", True)]
            suffix, overlapping = d(st.sampled_from(opts))
            v = self.vars[a]
            return f"{target} = {a}{suffix}", _Var(v.group, v.aliases_input, v.overlapping or overlapping)
        if kind == "inplace":
            cands = self.names(lambda n: not self.vars[n].overlapping
                               and not (self.rg and self.vars[n].aliases_input))
            if not cands:
                return None
            t = self.written = self.pick(cands)
            if d(st.booleans()):
                return self.scatter_like(t, inplace=True), None
            ops = [f"{t}.add_(1)", f"{t}.mul_(2)"]
            for b in self.vars:
                if self.vars[b].group != self.vars[t].group and \
                        _broadcastable(self.shape(t), self.shape(b), into=True):
                    ops += [f"{t}.add_({b})", f"{t}.copy_({b})"]
            return d(st.sampled_from(ops)), None
        if kind == "scatter":
            rhs = self.scatter_like(self.pick(self.vars), inplace=False)
            return (f"{target} = {rhs}", fresh) if rhs else None
        if not self.pure:   # repeat: the same computation again, under another name
            return None
        rhs, self.arg = d(st.sampled_from(self.pure))
        return f"{target} = {rhs}", fresh


def _broadcastable(a, b, into=False) -> bool:
    try:
        s = torch.broadcast_shapes(a, b)
    except RuntimeError:
        return False
    return s == tuple(a) if into else True


@st.composite
def programs(draw, max_inputs: int = 4, max_statements: int = 5) -> Program:
    R, C = draw(st.integers(2, 5)), draw(st.integers(2, 5))
    rg = draw(st.booleans())
    sfx = ".requires_grad_()" if rg else ""
    lines, names, roots, vars_, shapes = [], [], [], {}, []
    views = _base_views(R, C)
    view_shape = {e: tuple(eval(e, {"base": torch.empty(R, C)}).shape) for e, _ in views}
    for k in range(draw(st.integers(1, max_inputs))):
        name = f"x{k}"
        names.append(name)
        # often the shape of an earlier input, so that binary ops can combine them (x0 * x1)
        want = draw(st.sampled_from(shapes)) if shapes and draw(st.booleans()) else None
        if draw(st.booleans()):
            expr, overlapping = draw(st.sampled_from(
                [v for v in views if want in (None, view_shape[v[0]])] or views))
            shapes.append(view_shape[expr])
            if "base" not in roots:
                lines.append(f"base = torch.randn({R}, {C}, generator=g){sfx}")
                roots.append("base")
            lines.append(f"{name} = {expr}")
            vars_[name] = _Var("base", True, overlapping)
        else:
            shape = want or draw(st.sampled_from([(R, C), (C,), (R,), (C, R)]))
            shapes.append(shape)
            lines.append(f"{name} = torch.randn({', '.join(map(str, shape))}, generator=g){sfx}")
            roots.append(name)
            vars_[name] = _Var(name, True, False)
    prog = Program(lines, names, roots, [], [])
    _, make_inputs = prog.build()
    inputs, _ = make_inputs()
    env = {"torch": torch, **dict(zip(names, inputs))}
    gen = _Gen(draw, env, vars_, rg)
    mutated: set[str] = set()     # alias groups written in place
    related: dict[str, str] = {}  # variable -> its statement's first operand (scatter's self, ...)
    for _ in range(draw(st.integers(1, max_statements))):
        target = f"v{sum(n.startswith('v') for n in vars_)}"
        gen.written = gen.arg = None
        stmt = gen.statement(target)
        if stmt is None or stmt[0] is None:
            continue
        code, info = stmt
        try:
            exec(code, env)
        except Exception:   # illegal in eager (overlap, leaf view written, ...): leave it out
            env.pop(target, None)
            continue
        prog.body.append(code)
        if gen.written is not None:
            mutated.add(vars_[gen.written].group)
        if info is not None:
            vars_[target] = info
            related[target] = gen.arg
            if info.group == target:
                gen.pure.append((code.split(" = ", 1)[1], target))
    # Dropped construct: when an input that aliases another input is mutated (AOTAutograd's
    # "synthetic base" case), torch 2.13's aot_eager rebuilds outputs that are views of those
    # inputs from the wrong base (``x0 = base; x1 = base[1:]; x0.add_(1); return x1[0].view(-1)``
    # gives base[0]; ``x1.view(-1)`` raises). Such programs return those inputs only unviewed.
    synthetic = "base" in mutated and sum(vars_[n].group == "base" for n in names) >= 2
    latest_first = [n for n in reversed(list(vars_))
                    if not (synthetic and vars_[n].group == "base" and n not in names)]
    last = next((n for n in latest_first if n not in names), None)
    for _ in range(draw(st.integers(1, 3))):
        # mostly the last statement's result and its operand (``return b.scatter_add(...), b``,
        # ``b = a * 2; c = a * 2; return c, b``), else any variable
        mode = draw(st.integers(0, 2))
        if mode == 0 and last is not None:
            v = last
        elif mode == 1 and related.get(last) in latest_first:
            v = related[last]
        else:
            v = draw(st.sampled_from(latest_first))
        # dtype views read the same bytes as another dtype (compared as float32 again, see
        # test_alias_fuzz._observe); float16 halves the element size, where the strides allow
        wrap = draw(st.sampled_from(["", ".view(-1)", "[1:]", ".t()", ".view(torch.int32)",
                                     ".view(torch.float16)"]))
        if synthetic and vars_[v].group == "base":
            wrap = ""
        # Dropped construct: torch 2.13's AOTAutograd (aot_eager and inductor too) fails to
        # rebuild an int32 view of a view of an intermediate that requires grad when the view is
        # returned as well (``v = (x * 2)[1:]; return v, v.view(torch.int32)``: "incorrect out
        # shape after application of ViewMeta sequence")
        if rg and wrap == ".view(torch.int32)" and vars_[v].group != v:
            wrap = ""
        try:
            out = eval(v + wrap, env)
            ok = out.numel() > 0
        except Exception:
            ok = False
        prog.outputs.append(v + wrap if ok else v)
    return prog
