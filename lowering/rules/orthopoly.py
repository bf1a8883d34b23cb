"""Lowering rules for the orthogonal polynomials of ``torch.special``: Chebyshev T/U/V/W and their
shifted forms, Hermite H (physicists') and He (probabilists'), Laguerre L and Legendre P.

Each is ATen's own CPU algorithm (``aten/src/ATen/native/Math.h``, ``*_polynomial_*_forward``): the
same early returns (``n < 0`` → 0, ``|x| = 1`` closed forms, the trigonometric form of the Chebyshev
polynomials for ``|x| < 1`` at large ``n``), then the three-term recurrence (DLMF 18.9.1) run in
the result dtype up to the degree ``n`` and stopped early where ATen stops it (a NaN term). The
degree is data (a tensor), so the recurrence is an ``scf.while`` loop per element; its kernel keeps
scalar loops. ``n`` is truncated to an integer as ATen's ``static_cast<int64_t>``; a NaN, infinite or
out-of-range ``n`` gives what that cast gives on x86 (``INT64_MIN``, so the result is 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from neuron_compile.lowering.context import LoweringContext
from neuron_compile.lowering.ir import Scalar, TensorValue
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.rules.elementwise import _pointwise

aten = torch.ops.aten
FUSION_KIND = "pointwise"
I64 = torch.int64


def _overloads(name: str) -> tuple:
    packet = getattr(aten, f"special_{name}")
    return tuple(getattr(packet, o) for o in ("default", "x_scalar", "n_scalar"))


@dataclass(frozen=True)
class Recurrence:
    """``q_{k+step} = next(k, x, p, q)`` from ``(p, q)`` at ``k = start`` while ``k`` is below the
    bound (``k <= n`` if ``inclusive``, else ``k < limit(n)``) and, if ``stop_on_nan``, ``q`` is
    not NaN; the result is the last ``q``."""

    start: int
    first: Callable      # (s, x) -> q at k = start (p = 1)
    next: Callable       # (s, k_float, x, p, q) -> r
    inclusive: bool = False
    stop_on_nan: bool = True
    step: int = 1
    limit: Callable = lambda s, n: n    # (s, n) -> the loop bound


def _c(s, v, dt):
    return s.const(v, dt)


def _degree(s, n: Scalar) -> Scalar:
    """``static_cast<int64_t>(n)`` with x86's result (INT64_MIN) for NaN, ±inf and |n| ≥ 2^63."""
    if not n.dtype.is_floating_point:
        return s.cast(n, I64)
    big = _c(s, 9.2e18, n.dtype)
    ok = s.cmp("lt", s.abs(n), big)            # false for NaN and ±inf
    safe = s.select(ok, n, _c(s, 0.0, n.dtype))
    return s.select(ok, s.cast(safe, I64), _c(s, -(1 << 63), I64))


def _run(s, rec: Recurrence, x: Scalar, n: Scalar, skip: Scalar) -> Scalar:
    """The recurrence's result; no iteration at all where ``skip`` (an early return) holds."""
    dt = x.dtype
    bound = s.select(skip, _c(s, -(1 << 62), I64), rec.limit(s, n))

    def cond(b, k, p, q):
        more = b.cmp("le" if rec.inclusive else "lt", k, bound)
        return b.logical_and(more, b.logical_not(b.isnan(q))) if rec.stop_on_nan else more

    def step(b, k, p, q):
        r = rec.next(b, b.cast(k, dt), x, p, q)
        return [b.add(k, _c(b, rec.step, I64)), q, r]

    _, _, q = s.while_loop([_c(s, rec.start, I64), _c(s, 1.0, dt), rec.first(s, x)], cond, step)
    return q


def _even(s, n: Scalar) -> Scalar:
    one = _c(s, 1, I64)
    return s.cmp("eq", s.bitwise("and", n, one), _c(s, 0, I64))


def _choose(s, cases: list[tuple[Scalar, Scalar]], rest: Callable) -> Scalar:
    """ATen's early returns in order: the first case whose condition holds, else ``rest(skip)``."""
    skip = cases[0][0]
    for c, _ in cases[1:]:
        skip = s.logical_or(skip, c)
    out = rest(skip)
    for c, v in reversed(cases):
        out = s.select(c, v, out)
    return out


def _two_x(s, x):
    return s.add(x, x)


def _cheb_next(b, k, x, p, q):
    return b.fma(_two_x(b, x), q, b.neg(p))


def _chebyshev(kind: str, shifted: bool = False):
    """T, U, V or W (ATen ``chebyshev_polynomial_{t,u,v,w}_forward``), or their shifted forms in
    ``y = 2x - 1`` (``shifted_chebyshev_polynomial_*_forward``: the edges are tested at ``x = 1`` and
    ``x = 0``, the trigonometric form starts at n > 6 (W: n > 4) and, for W, falls back to ±1)."""
    first = {"t": lambda s, y: y, "u": _two_x,
             "v": lambda s, y: s.sub(_two_x(s, y), _c(s, 1.0, y.dtype)),
             "w": lambda s, y: s.add(_two_x(s, y), _c(s, 1.0, y.dtype))}[kind]
    rec = Recurrence(2, first, _cheb_next, inclusive=True)
    trig_from = (4 if kind == "w" else 6) if shifted else (6 if kind == "t" else 8)

    def fn(s, x, n_raw):
        dt = x.dtype
        one, zero = _c(s, 1.0, dt), _c(s, 0.0, dt)
        y = s.sub(_two_x(s, x), one) if shifted else x
        n = _degree(s, n_raw)
        nf = s.cast(n, dt)
        even = _even(s, n)
        n1 = s.cast(s.add(n, _c(s, 1, I64)), dt)                       # n + 1
        n21 = s.cast(s.add(s.add(n, n), _c(s, 1, I64)), dt)            # n + n + 1

        def parity(v):
            return s.select(even, v, s.neg(v))
        top, bottom = {"t": (one, parity(one)), "u": (n1, parity(n1)), "v": (one, parity(n21)),
                       "w": (n21, parity(one))}[kind]
        if shifted:
            edges = [(s.cmp("eq", x, one), top), (s.cmp("eq", x, zero), bottom)]
        else:
            edges = [(s.cmp("eq", s.abs(y), one), s.select(s.cmp("gt", y, zero), top, bottom))]
        big = s.logical_and(s.cmp("gt", n, _c(s, trig_from, I64)), s.cmp("lt", s.abs(y), one))
        t = s.unary("math.acos", y)
        half = s.div(t, _c(s, 2.0, dt))
        nh = s.add(nf, _c(s, 0.5, dt))
        if kind == "t":
            trig = s.unary("math.cos", s.mul(nf, t))
        elif kind == "u":
            st = s.unary("math.sin", t)
            trig = s.select(s.cmp("ne", st, zero), s.div(s.unary("math.sin", s.mul(n1, t)), st),
                            s.div(s.mul(n1, s.unary("math.cos", s.mul(n1, t))), y))
        elif kind == "v":
            trig = s.select(s.cmp("ne", s.unary("math.sin", half), one),
                            s.div(s.unary("math.cos", s.mul(nh, t)), s.unary("math.cos", half)), parity(n21))
        else:
            flat = parity(one) if shifted else s.select(s.cmp("gt", y, zero), n21, parity(one))
            trig = s.select(s.cmp("ne", s.unary("math.cos", half), one),
                            s.div(s.unary("math.sin", s.mul(nh, t)), s.unary("math.sin", half)), flat)
        cases = [(s.cmp("lt", n, _c(s, 0, I64)), zero), *edges, (big, trig),
                 (s.cmp("eq", n, _c(s, 0, I64)), one), (s.cmp("eq", n, _c(s, 1, I64)), first(s, y))]
        return _choose(s, cases, lambda skip: _run(s, rec, y, n, skip))
    return fn


def _hermite(probabilists: bool):
    """H (``hermite_polynomial_h_forward``, H_{k+1} = 2x H_k - 2k H_{k-1}, k stepping by 2 as
    ATen) or He (He_{k+1} = x He_k - k He_{k-1}); NaN above ATen's degree limit (128 for float32,
    512 for float64); non-finite ``n`` reads as -1."""
    if probabilists:
        rec = Recurrence(1, lambda s, x: x, lambda b, k, x, p, q: b.fma(x, q, b.neg(b.mul(k, p))),
                         stop_on_nan=False)
    else:
        rec = Recurrence(2, _two_x, lambda b, k, x, p, q: b.fma(_two_x(b, x), q, b.neg(b.mul(k, p))),
                         stop_on_nan=False, step=2, limit=lambda s, n: s.add(n, n))

    def fn(s, x, n_raw):
        dt = x.dtype
        n = _degree(s, n_raw)
        limit = 128 if dt == torch.float32 else 512
        cases = [(s.cmp("lt", n, _c(s, 0, I64)), _c(s, 0.0, dt)), (s.cmp("eq", n, _c(s, 0, I64)), _c(s, 1.0, dt)),
                 (s.cmp("eq", n, _c(s, 1, I64)), rec.first(s, x)),
                 (s.cmp("gt", n, _c(s, limit, I64)), _c(s, float("nan"), dt))]
        return _choose(s, cases, lambda skip: _run(s, rec, x, n, skip))
    return fn


def _laguerre(s, x, n_raw):
    """L (``laguerre_polynomial_l_forward``): L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1)."""
    dt = x.dtype
    n = _degree(s, n_raw)
    one = _c(s, 1.0, dt)

    def nxt(b, k, x, p, q):
        return b.div(b.fma(b.add(b.add(k, k), b.sub(one, x)), q, b.neg(b.mul(k, p))), b.add(k, one))
    rec = Recurrence(1, lambda b, x: b.sub(one, x), nxt)
    cases = [(s.cmp("lt", n, _c(s, 0, I64)), _c(s, 0.0, dt)), (s.cmp("eq", s.abs(x), _c(s, 0.0, dt)), one),
             (s.cmp("eq", n, _c(s, 0, I64)), one), (s.cmp("eq", n, _c(s, 1, I64)), s.sub(one, x))]
    return _choose(s, cases, lambda skip: _run(s, rec, x, n, skip))


def _legendre(s, x, n_raw):
    """P (``legendre_polynomial_p_forward``): P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1)."""
    dt = x.dtype
    n = _degree(s, n_raw)
    one, zero = _c(s, 1.0, dt), _c(s, 0.0, dt)

    def nxt(b, k, x, p, q):
        return b.div(b.fma(b.mul(b.add(b.add(k, k), one), x), q, b.neg(b.mul(k, p))), b.add(k, one))
    rec = Recurrence(1, lambda b, x: x, nxt)
    edge = s.select(s.logical_or(s.cmp("gt", x, zero), _even(s, n)), one, s.neg(one))
    cases = [(s.cmp("lt", n, _c(s, 0, I64)), zero), (s.cmp("eq", s.abs(x), one), edge),
             (s.cmp("eq", n, _c(s, 0, I64)), one), (s.cmp("eq", n, _c(s, 1, I64)), x)]
    return _choose(s, cases, lambda skip: _run(s, rec, x, n, skip))


_BODIES = {f"chebyshev_polynomial_{k}": _chebyshev(k) for k in "tuvw"}
_BODIES.update({f"shifted_chebyshev_polynomial_{k}": _chebyshev(k, shifted=True) for k in "tuvw"})
_BODIES.update({"hermite_polynomial_h": _hermite(False), "hermite_polynomial_he": _hermite(True),
                "laguerre_polynomial_l": _laguerre, "legendre_polynomial_p": _legendre})


def _rule(body):
    def lower(ctx: LoweringContext, x, n) -> TensorValue:
        """``P_n(x)`` elementwise over broadcast ``x`` and ``n`` (tensors or Python numbers), in the
        promoted floating dtype (integer and bool inputs give the default float dtype, as eager)."""
        return _pointwise(ctx, body, x, n)
    return lower


for _name, _body in _BODIES.items():
    register_lowering(*_overloads(_name))(_rule(_body))
