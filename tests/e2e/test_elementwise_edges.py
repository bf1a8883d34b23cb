"""Every lowered elementwise function at the edges of float32 and float64 (issue 13, item 3): ±largest
finite, around log(max) where exp-like functions overflow, subnormals, ±0, ±inf and NaN, compared with
eager at the same dtype. One compiled graph per dtype computes every function, so a failure lists all
the functions that differ (the kind is "math near the edges of the range", not one function)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import neuron_compile

FUNCTIONS = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2,
    "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
    "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "erf": torch.erf, "erfc": torch.erfc, "sigmoid": torch.sigmoid, "logsigmoid": F.logsigmoid,
    "softplus": F.softplus, "silu": F.silu, "mish": F.mish, "elu": F.elu, "selu": F.selu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "hardswish": F.hardswish,
    "abs": torch.abs, "neg": torch.neg, "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "trunc": torch.trunc, "frac": torch.frac, "relu": torch.relu,
    "square": torch.square, "sqrt_pow": lambda x: x ** 0.5, "cube": lambda x: x ** 3,
}

X_TIMES = {"silu", "mish", "gelu", "gelu_tanh"}   # x·g(x)


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """Boundary inputs of ``dtype``: its extremes, log(max) ± a little (where exp, expm1, sinh,
    cosh overflow; beyond log(2·max) every one of them is inf), log(tiny) (exp underflows to
    subnormals), subnormals, ±0, ±inf, NaN, and a few ordinary values."""
    fi = torch.finfo(dtype)
    lmax, lmin = math.log(fi.max), math.log(fi.tiny)
    vals = [0.0, -0.0, fi.smallest_normal, fi.tiny / 8, -fi.tiny / 8, 1e-30, -1e-30, 1e-7, 0.5, -0.5, 1.0,
            -1.0, 2.5, -2.5, 20.0, -20.0, lmax - 4.5, lmax - 0.7, lmax - 0.02, lmax + 0.8, -lmax,
            lmin, lmin - 10, fi.max, -fi.max, fi.max / 3, math.inf, -math.inf, math.nan,
            # float32 exp's last subnormal (2^-149 near -103.28) and where it rounds to 0 (-103.97)
            -103.2, -103.9, -104.0, -104.5, -200.0]
    return torch.tensor(vals, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_elementwise_functions_match_eager_at_range_edges(dtype):
    x = edge_values(dtype)

    def every(t):
        return tuple(f(t) for f in FUNCTIONS.values())
    got = neuron_compile(every)(x)
    want = every(x)
    # eager's own vectorized kernels differ between CPUs at the edges (its AVX-512 float32 GELU
    # returns NaN at +inf, its AVX2 one inf): a float32 value may instead match eager in float64
    want64 = every(x.double()) if dtype == torch.float32 else want
    wrong = []
    fi = torch.finfo(dtype)
    subnormal_ulp = fi.smallest_normal * fi.eps   # the spacing of subnormals
    for name, g, w, w64 in zip(FUNCTIONS, got, want, want64):
        # the same infinities and NaNs, finite values within rtol of eager, subnormals within 8 ulps;
        # in x·g(x) forms a subnormal g(x) carries its few ulps of error into the product times |x|
        # (f64 mish(-718.4): ours -7.2571110854217e-310, exact -7.2571110854210e-310, eager ...386e-310)
        atol = 8 * subnormal_ulp * (x.abs().clamp(1, 1e6) if name in X_TIMES else 1)
        close = (g - w).abs() <= atol + (1e-5 if dtype == torch.float32 else 1e-12) * w.abs()
        close |= (g == w) | (g.isnan() & w.isnan())
        if dtype == torch.float32:
            w64 = w64.to(dtype)
            close |= (g == w64) | (g.isnan() & w64.isnan()) | ((g - w64).abs() <= atol + 1e-5 * w64.abs())
        if not bool(close.all()):
            bad = (~close).nonzero().flatten().tolist()
            wrong.append(f"{name}: at x={[x[i].item() for i in bad]} got {[g[i].item() for i in bad]}, "
                         f"eager {[w[i].item() for i in bad]}")
    assert not wrong, "\n".join(wrong)
