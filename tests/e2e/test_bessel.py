"""Bessel and Airy functions (passes/bessel.py) under backend="neuron" against float64 eager.

The decompositions follow ATen's kernels in float64 and round once to the input dtype. On float32
inputs the reference is eager float64 on the same values rounded to float32, so the only expected
difference is that last rounding: rtol = 1e-6 (16 float32 ulps). There is no absolute floor: the
results span 1e-40 .. 1e38 (K tails, Ai for large x, Y near 0), and an atol would let the tails go
unchecked; exact zeros (I1(0), K0(inf), Ai(200)) must match exactly.

On float64 inputs the two evaluations differ by an ulp or so in intermediates, because ATen's CPU
kernels are compiled with FMA contraction (its Horner steps are fused multiply-adds) and ours are
not. That stays ~1e-15 relative except next to a zero of J, Y or Ai, where the function is a
difference of O(1) terms: there the ulp shows as ~1e-16 absolute (Y0 near 3.9577: 2e-12 relative).
Hence rtol = 1e-12 with atol = 1e-15. For Ai at x << 0 the phase (2/3)|x|^1.5 + π/4 itself carries
an ulp of rounding, so any float64 evaluation (eager's too) is only good to ~eps·|x|^1.5 absolute;
the atol there scales with that.
"""
from __future__ import annotations

import math

import pytest
import torch

F32_TOL = {"rtol": 1e-6, "atol": 0.0, "equal_nan": True}
F64_RTOL, F64_ATOL = 1e-12, 1e-15

FNS = {
    "i0": torch.i0,
    "i0e": torch.special.i0e,
    "i1": torch.special.i1,
    "i1e": torch.special.i1e,
    "bessel_j0": torch.special.bessel_j0,
    "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0,
    "bessel_y1": torch.special.bessel_y1,
    "modified_bessel_i0": torch.special.modified_bessel_i0,
    "modified_bessel_i1": torch.special.modified_bessel_i1,
    "modified_bessel_k0": torch.special.modified_bessel_k0,
    "modified_bessel_k1": torch.special.modified_bessel_k1,
    "scaled_modified_bessel_k0": torch.special.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": torch.special.scaled_modified_bessel_k1,
    "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "airy_ai": torch.special.airy_ai,
}

# Branch points of the ATen kernels: 1e-5 (J0), 0.5 (spherical j0), 2 (K), 2.09 and 8.3203353 (Ai),
# 5 (J, Y), 8 (I), 103.892 (Ai).
BOUNDARIES = [1e-5, 0.5, 2.0, 2.09, 5.0, 8.0, 8.3203353, 103.892]


def _compiled(fn):
    torch._dynamo.reset()  # the same builtins are compiled for several dtypes; start each afresh
    return torch.compile(fn, backend="neuron", fullgraph=True, dynamic=False)


def _inputs(dtype):
    """Signed zeros, infinities, NaN, tiny and huge values, both sides of every branch point, zeros of
    J0 / Y0 / Ai, the exp overflow region, and random spreads (one over Ai's power-series range)."""
    torch.manual_seed(0)
    special = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 25.0, -25.0, 30.0, 88.0, 90.0, 700.0, -700.0, 720.0, -720.0,
               1e4, -1e4, 1e10, -1e10, 3e38, -3e38, math.inf, -math.inf, math.nan,
               2.404825557695773, 3.957678419314858, -2.338107410459767, -1.9864]
    b = torch.tensor(BOUNDARIES, dtype=dtype)
    edges = torch.cat([b, torch.nextafter(b, b.new_tensor(math.inf)), torch.nextafter(b, b.new_tensor(0.0))])
    return torch.cat([torch.tensor(special, dtype=dtype), edges, -edges, torch.randn(256, dtype=dtype) * 8,
                      torch.rand(256, dtype=dtype) * 6 - 3, torch.randn(64, dtype=dtype) * 100])


def _zero_signs_match(out, ref):
    zero = ref == 0
    return torch.equal(torch.signbit(out[zero]), torch.signbit(ref[zero]))


@pytest.mark.parametrize("name", list(FNS))
def test_float32_matches_float64_eager(name):
    fn, x = FNS[name], _inputs(torch.float32)
    out = _compiled(fn)(x)
    ref = fn(x.double()).float()   # values beyond float32's range round to ±inf
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, **F32_TOL)
    assert _zero_signs_match(out, ref), "sign of a zero result differs (e.g. J1(-0) = -0, i1e(-inf) = -0)"


@pytest.mark.parametrize("name", list(FNS))
def test_float64_matches_eager(name):
    fn, x = FNS[name], _inputs(torch.float64)
    out = _compiled(fn)(x)
    ref = fn(x)
    assert out.dtype == torch.float64
    atol = torch.full_like(x, F64_ATOL)
    if name == "airy_ai":   # the phase (2/3)|x|^1.5 + π/4 is rounded: eps·|x|^1.5 absolute (see above)
        atol = torch.where(x < -1, F64_ATOL * x.abs() ** 1.5, atol)
    same_special = (torch.isnan(out) & torch.isnan(ref)) | (torch.isinf(ref) & (out == ref))
    bad = ~((out - ref).abs() <= atol + F64_RTOL * ref.abs()) & ~same_special
    assert not bad.any(), f"{name}: x={x[bad][:5].tolist()} got {out[bad][:5].tolist()} want {ref[bad][:5].tolist()}"
    assert _zero_signs_match(out, ref)


@pytest.mark.parametrize("name", ["i0", "i1", "modified_bessel_k0", "airy_ai"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_and_bool_inputs_promote_to_float(name, dtype):
    fn = FNS[name]
    x = torch.arange(-3, 7).to(dtype)
    out = _compiled(fn)(x)
    assert out.dtype == fn(x).dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, fn(x.double()).float(), **F32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["i0", "i1e"])
def test_gradients_match_float64_eager(name, dtype):
    # i0's derivative is i1; i1e's is i0e(x) - i1e(x) (sgn(x) + 1/x) (1/2 at 0). AOTAutograd puts
    # those forward ops in the backward graph, where they decompose like the forward.
    fn = FNS[name]
    torch.manual_seed(1)
    x = torch.cat([torch.tensor([-20.0, -8.5, -3.0, -1.0, -1e-3, 0.0, 1e-3, 0.7, 2.0, 5.0, 8.0, 9.0, 30.0]),
                   torch.randn(64) * 5]).to(dtype)
    w = torch.randn_like(x)
    xc = x.clone().requires_grad_()
    (_compiled(fn)(xc) * w).sum().backward()
    x64 = x.double().requires_grad_()
    (fn(x64) * w.double()).sum().backward()
    assert xc.grad is not None and xc.grad.dtype == dtype
    ref = x64.grad
    if dtype == torch.float64:
        torch.testing.assert_close(xc.grad, ref, rtol=1e-12, atol=1e-15)
        return
    # In float32 the backward formula runs in float32 arithmetic, as eager float32's does: its error
    # is float32 rounding of the terms it combines, which for i1e cancel (x = 30: 0.0731 - 0.0743).
    x64 = x64.detach()
    if name == "i0":
        terms = torch.special.i1(x64).abs()
    else:
        terms = torch.special.i0e(x64) + torch.special.i1e(x64).abs() * (1 + 1 / x64.abs())
        terms = torch.where(x64 == 0, 0.5, terms)
    bound = 1e-6 * w.double().abs() * terms
    err = (xc.grad.double() - ref).abs()
    assert (err <= bound).all(), f"x={x[err > bound].tolist()} err={err[err > bound].tolist()}"
