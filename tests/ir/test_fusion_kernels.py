"""How many loop-nest kernels common patterns lower to after fusion, and that they stay correct.

Chosen numbers (forward, inference):
  GELU                 1  (one pointwise generic)
  softmax              4  (amax | exp(x - max) | sum | exp / sum): exp feeds two kernels and is stored once
                          rather than recomputed; a reduction with the whole exp polynomial as prologue did
                          not vectorize (measured 0.47 ms vs 0.28 ms for 256x1024)
  layer_norm           3  (sum | sum of squares around the mean | normalise·scale·shift)
  linear + bias + GELU 2  loop nests in ONE fused kernel: the matmul accumulating onto the bias, then
                          the GELU epilogue (a second loop nest: no tiling yet to put both in one)
  cat(-x2, x1 * 2)     2  (each piece computed straight into its slice of the output; stored and then
                          copied, it was 4: 0.36 -> 0.18 ms for 64x1024, Sapphire Rapids)
  pad(relu(x))         1  (the ReLU written into the padded output's interior; the fill is no kernel)
  conv, BN, ReLU, conv 6  (pad copy | GEMM | BN scale | output crop | GEMM | crop: the eval-mode BN
                          + ReLU is computed straight into the second convolution's zero-padded
                          input instead of stored and copied there, 7 before; ResNet block 3x3 64ch
                          56x56 batch 8: the two kernels 3.0 -> 1.9 ms, Sapphire Rapids, 1 thread)
  affine, ReLU6,       2  (the prologue computed into the zero-padded input | the window contraction;
  depthwise conv          stored, then copied into the padding, it was 3: MobileNetV2-style inference
                          batch 16, those kernels 3.2-3.5 -> 2.5 ms, AMD Zen 4, 1 thread)
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import neuron_compile
from neuron_compile.cache import clear_memory_cache
from tests.conftest import neuron_compile as nc
from tests.e2e.modules import MLP, CausalSelfAttention
from tests.ir.lower import lower

CASES = {
    "gelu": (lambda x: F.gelu(x), lambda: [torch.randn(16, 64)], 1),
    "softmax": (lambda x: x.softmax(-1), lambda: [torch.randn(16, 64)], 4),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b), lambda: [torch.randn(16, 64), torch.randn(64),
                                                                          torch.randn(64)], 3),
    "linear_bias_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)),
                         lambda: [torch.randn(16, 32), torch.randn(64, 32), torch.randn(64)], 2),
    "cat_of_pointwise": (lambda x: torch.cat([-x[:, 32:], x[:, :32] * 2], -1), lambda: [torch.randn(16, 64)], 2),
    "pad_of_relu": (lambda x: F.pad(x.relu(), (1, 2, 3, 0), value=0.5), lambda: [torch.randn(16, 64)], 1),
    "conv_bn_relu_conv": (lambda x, w1, w2, m, v: F.conv2d(F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), m, v,
                                                                                training=False)), w2, padding=1),
                          lambda: [torch.randn(2, 16, 12, 12), torch.randn(16, 16, 3, 3), torch.randn(16, 16, 3, 3),
                                   torch.randn(16), torch.rand(16) + 0.5], 7),
    "affine_relu6_depthwise": (lambda x, s, b, w: F.conv2d(torch.clamp(x * s + b, 0, 6), w, None, 1, 1, 1, 8),
                               lambda: [torch.randn(2, 8, 11, 12), torch.randn(8, 1, 1), torch.randn(8, 1, 1),
                                        torch.randn(8, 1, 3, 3)], 3),
}
# (a value computed into a zero-padded buffer, as the ReLUs above, is one kernel with the border of
# each plane filled by another: a parallel loop over the planes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_lowers_to_the_expected_number_of_kernels(name):
    fn, make, expected = CASES[name]
    args = make()
    gm, lowered = lower(fn, *args)
    _, unfused = lower(fn, *args, passes="-fuse")
    print(f"{name}: {len(lowered.kernels)} kernels fused, {len(unfused.kernels)} without fusion")
    assert len(lowered.kernels) == expected
    assert len(unfused.kernels) >= len(lowered.kernels)
    torch.testing.assert_close(nc(fn)(*args).double(), fn(*[a.double() for a in args]), rtol=1e-5, atol=1e-4)


def test_linear_bias_gelu_is_one_fused_kernel():
    fn, make, _ = CASES["linear_bias_gelu"]
    gm, _ = lower(fn, *make())
    kernels = {n.meta.get("neuron_kernel") for n in gm.graph.nodes if n.op == "call_function"}
    assert len(kernels) == 1 and None not in kernels


def _counted(model, x, passes):
    torch._dynamo.reset()
    clear_memory_cache()
    neuron_compile.reset_metrics()
    f = torch.compile(model, backend="neuron", dynamic=False, options={"cache": False, "passes": passes})
    out = f(x)
    out.sum().backward()
    m = neuron_compile.metrics()
    return out, m["aten_ops"], m["kernels"]


@pytest.mark.parametrize("which", ["mlp", "attention"])
def test_mlp_and_attention_fuse_to_at_most_half_as_many_kernels_as_aten_ops(which):
    torch.manual_seed(0)
    if which == "mlp":
        model, x = MLP(32, 64, 10), torch.randn(16, 32)
    else:
        model, x = CausalSelfAttention(32, 4), torch.randn(2, 8, 32)
    ref = copy.deepcopy(model)
    out, ops, kernels = _counted(model, x, "default")
    _, ops_off, kernels_off = _counted(copy.deepcopy(ref), x, "-fuse")
    print(f"{which}: {ops} ATen ops -> {kernels} kernels fused ({kernels_off} without fusion)")
    assert kernels * 2 <= ops and kernels < kernels_off
    expected = ref(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for (name, p), pr in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, pr.grad, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def _fibonacci_chain(x, steps):
    a, b = x, x + 1
    for _ in range(steps):
        a, b = b, a * b + 0.5      # every value is read by the next two steps
    return b


def test_a_fused_value_read_twice_is_emitted_once():
    # a fused chain where each value has two consumers stays one kernel whose body grows linearly
    # with the chain (re-emitting a value at each use doubles the body per step: 2^30 here)
    x = torch.rand(64)
    short = lower(lambda t: _fibonacci_chain(t, 10), x)[1]
    long = lower(lambda t: _fibonacci_chain(t, 30), x)[1]
    assert len(short.kernels) == len(long.kernels) == 1
    assert len(long.mlir) < 4 * len(short.mlir)
    ref = _fibonacci_chain(x.double(), 6).float()
    torch.testing.assert_close(nc(lambda t: _fibonacci_chain(t, 6))(x), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pointwise_producers_fused_into_cat_and_pad_match_float64_eager(dtype):
    """The producers of a cat / pad run inside it (computed into the output's slices): the values,
    the untouched padding and a producer read by two pieces match eager at float64."""
    def fn(x, y):
        h = (x * 3).sigmoid()
        return torch.cat([h, y.relu(), h.neg()], 1), F.pad(torch.tanh(y), (2, 1, 0, 3), value=-1.0)
    x, y = torch.randn(8, 5, 7, dtype=dtype), torch.randn(8, 4, 7, dtype=dtype)
    got = nc(fn)(x, y)
    want = fn(x.double(), y.double())
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.shape == w.shape
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-6)
