"""Decompositions of special functions (lgamma, digamma, polygamma, Hurwitz zeta) into elementwise ops.

Every function takes tensors of any shape and returns the broadcast shape. Work is done in float64
and the result cast back to the input's floating dtype; integer and bool inputs promote to the
default float dtype, as eager does. Loops of the reference algorithms run over a fixed count (no
data-dependent control flow); their special cases become ``torch.where`` selections.

Sources:
  * lgamma: Lanczos approximation, g = 7, n = 9 (Numerical Recipes 3rd ed. §6.1; Godfrey's
    coefficients), with the reflection formula Γ(x)Γ(1-x) = π / sin(πx) (DLMF 5.5.3) for x < 0.5.
  * digamma: ATen ``calc_digamma`` (aten/src/ATen/native/Math.h, from Cephes ``psi``): reflection
    ψ(1-x) - ψ(x) = π cot(πx) (DLMF 5.5.4), recurrence ψ(x+1) = ψ(x) + 1/x (DLMF 5.5.2) over a fixed
    shift of 10, then the asymptotic series (DLMF 5.11.2) with ATen's coefficients.
  * zeta: ATen ``zeta`` (Math.h, from Cephes ``zeta``): direct sum of the first terms, then
    Euler-Maclaurin summation (DLMF 2.10.1, 25.11.5) with 12 Bernoulli terms.
  * polygamma: ATen ``calc_trigamma`` for n = 1; ψ⁽ⁿ⁾(x) = (-1)ⁿ⁺¹ n! ζ(n+1, x) for n >= 2
    (DLMF 25.11.12), as ATen's ``calc_polygamma``.
"""
from __future__ import annotations

import math

import torch

F64 = torch.float64
PI = math.pi

# Lanczos coefficients for g = 7, n = 9 (Numerical Recipes / Godfrey).
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
            1.5056327351493116e-7)
# ATen calc_digamma's asymptotic coefficients (highest order first, as polevl takes them).
_DIGAMMA_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2, 7.57575757575757575758E-3,
              -4.16666666666666666667E-3, 3.96825396825396825397E-3, -8.33333333333333333333E-3,
              8.33333333333333333333E-2)
# ATen zeta's Euler-Maclaurin denominators: (2j)! / B_2j.
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)
_MACHEP = 1.11022302462515654042E-16


def _out_dtype(*xs) -> torch.dtype:
    """Eager's result dtype: the promoted floating dtype, else the default float dtype."""
    dt = xs[0].dtype if len(xs) == 1 else torch.result_type(*xs)
    return dt if dt.is_floating_point else torch.get_default_dtype()


def _f64(x):
    return x.to(F64)


def _polevl(z, coeffs):
    """Horner evaluation, coefficients highest order first (Cephes ``polevl``)."""
    acc = torch.full_like(z, coeffs[0])
    for c in coeffs[1:]:
        acc = acc * z + c
    return acc


def _is_int(x):
    return x == torch.floor(x)


def _abs_sin_pi(x):
    """|sin(πx)| computed from x - round(x), exact for large |x| and zero at the integers."""
    return torch.abs(torch.sin(PI * (x - torch.round(x))))


def _lgamma64(x):
    inf = torch.full_like(x, math.inf)
    reflect = x < 0.5
    y = torch.where(reflect, 1.0 - x, x)
    z = y - 1.0
    acc = torch.full_like(z, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        acc = acc + c / (z + i)
    t = z + (_LANCZOS_G + 0.5)
    lg = 0.5 * math.log(2 * PI) + (z + 0.5) * torch.log(t) - t + torch.log(acc)
    refl = torch.log(PI / _abs_sin_pi(x)) - lg
    out = torch.where(reflect, refl, lg)
    return torch.where(torch.isinf(x), inf, out)


def lgamma(x):
    """``torch.lgamma``: log|Γ(x)|; +inf at the non-positive integers and at ±inf, NaN stays NaN."""
    return _lgamma64(_f64(x)).to(_out_dtype(x))


def _digamma64(x):
    inf = torch.full_like(x, math.inf)
    nan = torch.full_like(x, math.nan)
    neg = x < 0
    y = torch.where(neg, 1.0 - x, x)                 # ψ(x) = ψ(1-x) - π / tan(π r), r = frac(x)
    shift = y < 10
    corr = torch.zeros_like(y)
    for k in range(10):                              # ψ(y) = ψ(y + 10) - Σ_{k<10} 1/(y + k)
        corr = corr + 1.0 / (y + k)
    y = torch.where(shift, y + 10.0, y)
    z = 1.0 / (y * y)
    series = torch.where(y < 1.0e17, z * _polevl(z, _DIGAMMA_A), torch.zeros_like(y))
    out = torch.log(y) - 0.5 / y - series - torch.where(shift, corr, torch.zeros_like(corr))
    r = x - torch.trunc(x)
    out = torch.where(neg, out - PI / torch.tan(PI * r), out)
    out = torch.where(neg & _is_int(x), nan, out)
    return torch.where(x == 0, torch.copysign(inf, -x), out)


def digamma(x):
    """``torch.digamma`` (ATen ``calc_digamma``): ψ(0) = ∓inf by the sign of zero, NaN at the
    negative integers and at -inf."""
    return _digamma64(_f64(x)).to(_out_dtype(x))


def _zeta_pos(x, q):
    """ζ(x, q) for q > 0 by ATen's scheme: 10 direct terms, then Euler-Maclaurin at w = q + 10 with
    all 12 Bernoulli terms (w >= 10 keeps them decreasing; ATen's early exits only drop terms
    below MACHEP relative)."""
    s = torch.zeros_like(q + x)
    for i in range(10):
        s = s + torch.pow(q + i, -x)
    w = q + 10.0
    b = torch.pow(w, -x)
    s = s + b + b * w / (x - 1.0) - 0.5 * b
    a = torch.ones_like(s)
    for j, denom in enumerate(_ZETA_A):
        a = a * (x + 2.0 * j)
        b = b / w
        s = s + a * b / denom
        a = a * (x + 2.0 * j + 1.0)
        b = b / w
    return s


def _zeta64(x, q):
    """Hurwitz ζ(x, q) with ATen's special cases. For q < 0 (integer x) the terms with negative
    base are (-1)^x Σ_{j<m} (u + j)^-x with u = 1 - frac(q), m = -floor(q), i.e.
    (-1)^x (ζ(x, u) - ζ(x, 1 - q)); the rest is ζ(x, frac(q)). All ζ's then have q > 0."""
    x, q = torch.broadcast_tensors(x, q)
    inf = torch.full_like(q, math.inf)
    nan = torch.full_like(q, math.nan)
    neg = q < 0
    fl = torch.floor(q)
    one = torch.ones_like(q)
    frac = torch.where(neg, q - fl, q)
    u = torch.where(neg, 1.0 - q + fl, one)
    qs = torch.stack([torch.where(neg & _is_int(q), one, frac), u, torch.where(neg, 1.0 - q, one)])
    main, z_u, z_1q = _zeta_pos(x.unsqueeze(0), qs).unbind(0)          # one unrolled evaluation
    sign = 1.0 - 2.0 * torch.remainder(x, 2.0)                           # (-1)^x for integer x
    tail = z_u - z_1q
    out = torch.where(neg, main + sign * tail, main)
    out = torch.where((q <= 0) & ~_is_int(x), nan, out)
    out = torch.where((q <= 0) & _is_int(q), inf, out)
    out = torch.where(x < 1, nan, out)
    return torch.where(x == 1, inf, out)


def zeta(x, q):
    """``torch.special.zeta(x, q)``: the Hurwitz zeta function Σ_{k>=0} (q + k)^-x (ATen ``zeta``)."""
    return _zeta64(_f64(x), _f64(q)).to(_out_dtype(x, q))


def _trigamma64(x):
    """ATen ``calc_trigamma``: reflection ψ'(1-x) + ψ'(x) = π²/sin²(πx) (DLMF 5.15.6) for x < 0.5,
    six recurrence steps (DLMF 5.15.5), then the asymptotic series (DLMF 5.15.8). Like eager, sin(πx)
    is taken at the unreduced argument (so the poles give eager's large finite values)."""
    reflect = x < 0.5
    pole = torch.where(reflect, -(PI * PI) / torch.sin(PI * x) ** 2, torch.zeros_like(x))
    y = torch.where(reflect, 1.0 - x, x)
    acc = torch.zeros_like(y)
    for k in range(6):
        acc = acc + 1.0 / ((y + k) * (y + k))
    y = y + 6.0
    ixx = 1.0 / (y * y)
    acc = pole + acc + (1.0 + 1.0 / (2.0 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx / 42))) / y
    return torch.where(reflect, -acc, acc)


def polygamma(n: int, x):
    """``torch.polygamma(n, x)``: ψ for n = 0, ATen's trigamma for n = 1, else (-1)ⁿ⁺¹ n! ζ(n + 1, x)."""
    x64 = _f64(x)
    if n == 0:
        out = _digamma64(x64)
    elif n == 1:
        out = _trigamma64(x64)
    else:
        out = (-1.0) ** (n + 1) * math.factorial(n) * _zeta64(torch.full_like(x64, n + 1.0), x64)
    return out.to(_out_dtype(x))
