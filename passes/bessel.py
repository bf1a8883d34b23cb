"""Decompositions of the Bessel and Airy functions (``torch.i0``, ``torch.special.*bessel*``,
``airy_ai``) into elementwise ops.

Each function follows its ATen kernel (aten/src/ATen/native/Math.h, all derived from the Cephes Math
Library) operation for operation, in float64 with ATen's double-precision tables
(:mod:`.bessel_coefficients`), so the result is eager float64's up to rounding (ATen's CPU kernels are
compiled with multiply-adds contracted to FMAs; here every op rounds); it is then cast to the input's
floating dtype (integer and bool inputs give the default float dtype, as eager). Every branch is evaluated for all elements and one is selected with
``torch.where``; ATen's one data-dependent loop (the Airy power series) runs a fixed number of
times.

Sources (Math.h function, Cephes routine):
  * i0, i0e, i1, i1e: ``calc_i0``, ``calc_i0e``, ``calc_i1``, ``calc_i1e`` (Cephes ``i0``, ``i0e``,
    ``i1``, ``i1e``): Chebyshev series (``chbevl``) of exp(-x) I(x) on [0, 8] and of
    exp(-x) sqrt(x) I(x) on (8, inf). ``modified_bessel_i0/i1_forward`` are the same algorithm.
  * k0, k1 and the scaled k0e, k1e: ``modified_bessel_k0/k1_forward``,
    ``scaled_modified_bessel_k0/k1_forward`` (Cephes ``k0``, ``k0e``, ``k1``, ``k1e``): a Chebyshev
    series plus the log(x/2) I(x) term on (0, 2], a Chebyshev series of exp(x) sqrt(x) K(x) on (2, inf).
  * j0, j1, y0, y1: ``bessel_j0/j1/y0/y1_forward`` (Cephes ``j0``, ``j1``, ``y0``, ``y1``): rational
    approximations on [0, 5], Hankel's modulus/phase form (DLMF 10.17) with rational P, Q for x > 5.
  * airy_ai: ``airy_ai_forward`` (Cephes ``airy``): asymptotic expansions (DLMF 9.7.5, 9.7.9) for
    x < -2.09 and x >= 2.09, the Maclaurin series Ai = c1 f - c2 g (DLMF 9.4.1) in between.
  * spherical_bessel_j0: ``spherical_bessel_j0_forward``: sin(x)/x, its Taylor series for |x| < 0.5.
"""
from __future__ import annotations

import math

import torch

from neuron_compile.passes import bessel_coefficients as C
from neuron_compile.passes.special import _f64, _out_dtype, _polevl

# Terms of Airy's power series: ATen sums until a term of f is below epsilon relative, which takes
# at most 14 terms for -2.09 <= x < 2.09; the 20th term is below 1e-36 there.
_AIRY_TERMS = 20


def _chbevl(y, coeffs):
    """Cephes ``chbevl``: Σ' coeffs[i] T_i(y/2) by Clenshaw's recurrence (zero order term last).
    Each b_k is read by the next two steps; the lowering emits a fused value once per kernel body
    (``lowering/lazy.py`` ``emit_shared``), so the whole recurrence stays one kernel."""
    b0 = torch.full_like(y, coeffs[0])
    b1 = torch.zeros_like(y)
    b2 = b1
    for c in coeffs[1:]:
        b2 = b1
        b1 = b0
        b0 = y * b1 - b2 + c
    return 0.5 * (b0 - b2)


def _negate_below_zero(x, out):
    return torch.where(x < 0, -out, out)


def _nan_like(x):
    return torch.full_like(x, math.nan)


def _inf_like(x, sign=1.0):
    return torch.full_like(x, sign * math.inf)


# --------------------------------------------------------------------------------------- I0, I1

def _i0_small(ax):
    """I0 for 0 <= ax <= 8: exp(ax) chbevl(ax/2 - 2, A)."""
    return torch.exp(ax) * _chbevl(ax / 2.0 - 2.0, C.I0E_A)


def _modified_i1_small(ax):
    """``modified_bessel_i1_forward``'s I1 for 0 <= ax <= 8: chbevl(ax/2 - 2, A) ax exp(ax)."""
    return _chbevl(ax / 2.0 - 2.0, C.I1E_A) * ax * torch.exp(ax)


def _i0_64(x):
    """``calc_i0`` (identical to ``modified_bessel_i0_forward``)."""
    ax = torch.abs(x)
    large = torch.exp(ax) * _chbevl(32.0 / ax - 2.0, C.I0E_B) / torch.sqrt(ax)
    return torch.where(ax <= 8.0, _i0_small(ax), large)


def _i0e_64(x):
    ax = torch.abs(x)
    small = _chbevl(ax / 2.0 - 2.0, C.I0E_A)
    large = _chbevl(32.0 / ax - 2.0, C.I0E_B) / torch.sqrt(ax)
    return torch.where(ax <= 8.0, small, large)


def _i1_64(x):
    ax = torch.abs(x)
    ex = torch.exp(ax)
    small = ex * ax * _chbevl(ax / 2.0 - 2.0, C.I1E_A)
    large = ex * _chbevl(32.0 / ax - 2.0, C.I1E_B) / torch.sqrt(ax)
    return _negate_below_zero(x, torch.where(ax <= 8.0, small, large))


def _i1e_64(x):
    ax = torch.abs(x)
    small = _chbevl(ax / 2.0 - 2.0, C.I1E_A) * ax
    large = _chbevl(32.0 / ax - 2.0, C.I1E_B) / torch.sqrt(ax)
    return _negate_below_zero(x, torch.where(ax <= 8.0, small, large))


def _modified_i1_64(x):
    """``modified_bessel_i1_forward``: ``calc_i1`` with the products on [0, 8] in another order."""
    ax = torch.abs(x)
    large = torch.exp(ax) * _chbevl(32.0 / ax - 2.0, C.I1E_B) / torch.sqrt(ax)
    return _negate_below_zero(x, torch.where(ax <= 8.0, _modified_i1_small(ax), large))


def i0(x):
    """``torch.i0`` / ``torch.special.i0``: I0(x), even, from ATen ``calc_i0`` (Cephes ``i0``).
    I0(0) = 1; inf once exp(|x|) overflows; I0(±inf) is NaN (ATen's large-x form gives inf/inf)."""
    return _i0_64(_f64(x)).to(_out_dtype(x))


def i0e(x):
    """``torch.special.i0e``: exp(-|x|) I0(x), from ATen ``calc_i0e`` (Cephes ``i0e``); 1 at 0, 0 at
    ±inf."""
    return _i0e_64(_f64(x)).to(_out_dtype(x))


def i1(x):
    """``torch.special.i1``: I1(x), odd, from ATen ``calc_i1`` (Cephes ``i1``); 0 at ±0, ±inf once
    exp(|x|) overflows, NaN at ±inf."""
    return _i1_64(_f64(x)).to(_out_dtype(x))


def i1e(x):
    """``torch.special.i1e``: exp(-|x|) I1(x), from ATen ``calc_i1e`` (Cephes ``i1e``); ±0 at ±inf."""
    return _i1e_64(_f64(x)).to(_out_dtype(x))


def modified_bessel_i0(x):
    """``torch.special.modified_bessel_i0``: ATen ``modified_bessel_i0_forward``, the same
    operations as ``calc_i0`` (see :func:`i0`)."""
    return _i0_64(_f64(x)).to(_out_dtype(x))


def modified_bessel_i1(x):
    """``torch.special.modified_bessel_i1``: ATen ``modified_bessel_i1_forward`` (Cephes ``i1``);
    values and special cases as :func:`i1`."""
    return _modified_i1_64(_f64(x)).to(_out_dtype(x))


# --------------------------------------------------------------------------------------- K0, K1

def _k_special(x, out):
    """ATen's K special cases: +inf at ±0, NaN for x < 0 (including -inf)."""
    out = torch.where(x < 0, _nan_like(x), out)
    return torch.where(x == 0, _inf_like(x), out)


def _k0_small(x):
    """K0 on (0, 2] (Cephes ``k0``): chbevl(x² - 2, A) - log(x/2) I0(x), I0 by its x <= 8 branch
    (the only one ATen's call reaches); x <= 0 is overridden by :func:`_k_special`."""
    return _chbevl(x * x - 2.0, C.K0_A) - torch.log(0.5 * x) * _i0_small(torch.abs(x))


def _k1_small(x):
    """K1 on (0, 2] (Cephes ``k1``): log(x/2) I1(x) + chbevl(x² - 2, A) / x, as :func:`_k0_small`."""
    return torch.log(0.5 * x) * _modified_i1_small(torch.abs(x)) + _chbevl(x * x - 2.0, C.K1_A) / x


def _k0_64(x):
    large = torch.exp(-x) * _chbevl(8.0 / x - 2.0, C.K0_B) / torch.sqrt(x)
    return _k_special(x, torch.where(x <= 2.0, _k0_small(x), large))


def _k1_64(x):
    large = torch.exp(-x) * _chbevl(8.0 / x - 2.0, C.K1_B) / torch.sqrt(x)
    return _k_special(x, torch.where(x <= 2.0, _k1_small(x), large))


def _k0e_64(x):
    large = _chbevl(8.0 / x - 2.0, C.K0_B) / torch.sqrt(x)
    return _k_special(x, torch.where(x <= 2.0, _k0_small(x) * torch.exp(x), large))


def _k1e_64(x):
    large = _chbevl(8.0 / x - 2.0, C.K1_B) / torch.sqrt(x)
    return _k_special(x, torch.where(x <= 2.0, _k1_small(x) * torch.exp(x), large))


def modified_bessel_k0(x):
    """``torch.special.modified_bessel_k0``: K0(x), from ATen ``modified_bessel_k0_forward`` (Cephes
    ``k0``). Defined for x > 0: +inf at ±0, NaN for x < 0 and at -inf, 0 at +inf (underflows past
    x ≈ 705)."""
    return _k0_64(_f64(x)).to(_out_dtype(x))


def modified_bessel_k1(x):
    """``torch.special.modified_bessel_k1``: K1(x), from ATen ``modified_bessel_k1_forward`` (Cephes
    ``k1``). Special cases as :func:`modified_bessel_k0`."""
    return _k1_64(_f64(x)).to(_out_dtype(x))


def scaled_modified_bessel_k0(x):
    """``torch.special.scaled_modified_bessel_k0``: exp(x) K0(x), from ATen
    ``scaled_modified_bessel_k0_forward`` (Cephes ``k0e``): +inf at ±0, NaN for x < 0, 0 at +inf."""
    return _k0e_64(_f64(x)).to(_out_dtype(x))


def scaled_modified_bessel_k1(x):
    """``torch.special.scaled_modified_bessel_k1``: exp(x) K1(x), from ATen
    ``scaled_modified_bessel_k1_forward`` (Cephes ``k1e``): +inf at ±0, NaN for x < 0, 0 at +inf."""
    return _k1e_64(_f64(x)).to(_out_dtype(x))


# --------------------------------------------------------------------------------------- J0, J1, Y0, Y1

def _hankel(x, w, pp, pq, qp, qq, phase, second_kind):
    """The x > 5 form of Cephes j0/j1/y0/y1: with P = pp/pq, Q = (5/x) qp/qq at w = (5/x)², and
    θ = x - phase, J = (P cos θ - Q sin θ) sqrt(2/(πx)) and Y = (P sin θ + Q cos θ) sqrt(2/(πx))."""
    p = _polevl(w, pp) / _polevl(w, pq)
    q = 5.0 / x * (_polevl(w, qp) / _polevl(w, qq))
    theta = x - phase
    if second_kind:
        mix = p * torch.sin(theta) + q * torch.cos(theta)
    else:
        mix = p * torch.cos(theta) - q * torch.sin(theta)
    return mix * C.SQ2OPI / torch.sqrt(x)


def _j0_nonneg(x):
    """``bessel_j0_forward`` for x >= 0 (or NaN)."""
    z = x * x
    tiny = 1.0 - z / 4.0
    small = (z - C.J0_DR1) * (z - C.J0_DR2) * _polevl(z, C.J0_RP) / _polevl(z, C.J0_RQ)
    small = torch.where(x < 0.00001, tiny, small)
    large = _hankel(x, 25.0 / z, C.J0_PP, C.J0_PQ, C.J0_QP, C.J0_QQ, C.PIO4, False)
    return torch.where(x <= 5.0, small, large)


def _j1_nonneg(x):
    """``bessel_j1_forward`` for x >= 0 (or NaN); the argument of the x > 5 form is (5/x)(5/x)."""
    z = x * x
    small = _polevl(z, C.J1_RP) / _polevl(z, C.J1_RQ) * x * (z - C.J1_Z1) * (z - C.J1_Z2)
    large = _hankel(x, 5.0 / x * (5.0 / x), C.J1_PP, C.J1_PQ, C.J1_QP, C.J1_QQ, C.THPIO4, False)
    return torch.where(x <= 5.0, small, large)


def _j0_64(x):
    return _j0_nonneg(torch.where(x < 0, -x, x))


def _j1_64(x):
    return _negate_below_zero(x, _j1_nonneg(torch.where(x < 0, -x, x)))   # keeps J1(-0) = -0


def _y0_64(x):
    z = x * x
    small = _polevl(z, C.Y0_YP) / _polevl(z, C.Y0_YQ) + C.TWOOPI * torch.log(x) * _j0_nonneg(x)
    large = _hankel(x, 25.0 / z, C.J0_PP, C.J0_PQ, C.J0_QP, C.J0_QQ, C.PIO4, True)
    out = torch.where(x <= 5.0, small, large)
    out = torch.where(x < 0, _nan_like(x), out)
    return torch.where(x == 0, _inf_like(x, -1.0), out)


def _y1_64(x):
    z = x * x
    small = x * (_polevl(z, C.Y1_YP) / _polevl(z, C.Y1_YQ)) + C.TWOOPI * (_j1_nonneg(x) * torch.log(x) - 1.0 / x)
    large = _hankel(x, 5.0 / x * (5.0 / x), C.J1_PP, C.J1_PQ, C.J1_QP, C.J1_QQ, C.THPIO4, True)
    out = torch.where(x <= 5.0, small, large)
    out = torch.where(x < 0, _nan_like(x), out)
    return torch.where(x == 0, _inf_like(x, -1.0), out)


def bessel_j0(x):
    """``torch.special.bessel_j0``: J0(x), even, from ATen ``bessel_j0_forward`` (Cephes ``j0``):
    1 - x²/4 below 1e-5, a rational in x² (with J0's first two zeros factored out) up to 5,
    Hankel's form above. J0(±inf) is NaN as in ATen (cos(inf))."""
    return _j0_64(_f64(x)).to(_out_dtype(x))


def bessel_j1(x):
    """``torch.special.bessel_j1``: J1(x), odd, from ATen ``bessel_j1_forward`` (Cephes ``j1``);
    J1(±0) = ±0, NaN at ±inf."""
    return _j1_64(_f64(x)).to(_out_dtype(x))


def bessel_y0(x):
    """``torch.special.bessel_y0``: Y0(x), from ATen ``bessel_y0_forward`` (Cephes ``y0``):
    -inf at ±0, NaN for x < 0 (and ±inf), a rational plus (2/π) log(x) J0(x) up to 5, Hankel's form
    above."""
    return _y0_64(_f64(x)).to(_out_dtype(x))


def bessel_y1(x):
    """``torch.special.bessel_y1``: Y1(x), from ATen ``bessel_y1_forward`` (Cephes ``y1``):
    -inf at ±0, NaN for x < 0 (and ±inf), x·rational + (2/π)(J1(x) log(x) - 1/x) up to 5, Hankel's
    form above."""
    return _y1_64(_f64(x)).to(_out_dtype(x))


# --------------------------------------------------------------------------------------- j0, Ai

def _spherical_j0_64(x):
    z = x * x
    series = 1.0 + z * (-1.0 / 6.0 + z * (1.0 / 120.0 + z * (-1.0 / 5040.0 + z * (
        1.0 / 362880.0 + z * (-1.0 / 39916800.0 + z * (1.0 / 6227020800.0))))))
    out = torch.where(torch.abs(x) < 0.5, series, torch.sin(x) / x)
    return torch.where(torch.isinf(x), torch.zeros_like(x), out)


def spherical_bessel_j0(x):
    """``torch.special.spherical_bessel_j0``: j0(x) = sin(x)/x, from ATen
    ``spherical_bessel_j0_forward``: its Taylor polynomial (to x¹²) for |x| < 0.5, 0 at ±inf."""
    return _spherical_j0_64(_f64(x)).to(_out_dtype(x))


def _airy_series(x):
    """f and g of Ai = c1 f - c2 g (Cephes ``airy``'s power series in z = x³, DLMF 9.4.1), with
    ATen's term recurrences. ATen stops once a term of f is below epsilon relative; the fixed count
    adds only terms below that, so the sums agree with ATen's to rounding (≤ 4e-15 relative in Ai)."""
    z = x * x * x
    f = torch.ones_like(x)
    g = x
    m = torch.ones_like(x)
    n = x
    k = 1.0
    for _ in range(_AIRY_TERMS):
        m = m * z / (k + 1.0)
        n = n * z / (k + 2.0)
        m = m / (k + 2.0)
        n = n / (k + 3.0)
        k += 3.0
        f = f + m
        g = g + n
    return f, g


def _airy_ai64(x):
    # x < -2.09: oscillatory asymptotic form in zeta = (2/3)(-x)^1.5.
    zeta_n = -2.0 * x * torch.sqrt(-x) / 3.0
    z = 1.0 / zeta_n
    zz = z * z
    uf = 1.0 + zz * _polevl(zz, C.AIRY_AFN) / _polevl(zz, C.AIRY_AFD)
    ug = z * _polevl(zz, C.AIRY_AGN) / _polevl(zz, C.AIRY_AGD)
    t = zeta_n + 0.25 * math.pi
    neg = C.AIRY_SQPII / torch.sqrt(torch.sqrt(-x)) * (torch.sin(t) * uf - torch.cos(t) * ug)
    # x >= 2.09: exponentially decaying form in zeta = (2/3) x^1.5.
    zeta = 2.0 * x * torch.sqrt(x) / 3.0
    w = 1.0 / zeta
    pos = C.AIRY_SQPII * (_polevl(w, C.AIRY_AN) / _polevl(w, C.AIRY_AD)) / (
        2.0 * torch.sqrt(torch.sqrt(x)) * torch.exp(zeta))
    # -2.09 <= x < 2.09: the power series (arguments outside zeroed so it stays finite there).
    outside = (x >= C.AIRY_ASYMP) | (x < -C.AIRY_ASYMP)
    f, g = _airy_series(torch.where(outside, torch.zeros_like(x), x))
    out = C.AIRY_C1 * f - C.AIRY_C2 * g
    out = torch.where(x >= C.AIRY_ASYMP, pos, out)
    out = torch.where(x < -C.AIRY_ASYMP, neg, out)
    out = torch.where(x > C.AIRY_MAXAIRY, torch.zeros_like(x), out)
    return torch.where(torch.isinf(x), _nan_like(x), out)


def airy_ai(x):
    """``torch.special.airy_ai``: Ai(x), from ATen ``airy_ai_forward`` (Cephes ``airy``): the
    asymptotic forms for x < -2.09 and x >= 2.09, c1 f(x) - c2 g(x) in between; 0 above 103.892,
    NaN at ±inf (as ATen)."""
    return _airy_ai64(_f64(x)).to(_out_dtype(x))
