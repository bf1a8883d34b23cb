"""Chains of 1×1 and depthwise convolutions computed channels-last (``passes/conv_layout.py``).

The layout pass picks chains (MobileNet's inverted residuals in inference); the lowering computes
them in [N, H, W, C] and hands the result on as a lazy read of the channels-last tensor, transposed
once where a consumer needs [N, C, H, W] (a pooling head, a graph output). Values are checked
against float64 eager, and the choice itself on the lowered graph."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_compile.passes.conv_layout import LAYOUT
from tests.conftest import neuron_compile
from tests.e2e.test_conv_gemm import _kernels
from tests.ir.lower import lower


class _Block(nn.Module):
    """An inverted residual (1×1 expand, depthwise, 1×1 project, eval-mode batch norms, ReLU6)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, k: int = 3, dilation: int = 1,
                 bias: bool = False):
        super().__init__()
        hid = cin * expand
        self.res = stride == 1 and cin == cout and k % 2 == 1   # (an even kernel changes the size)
        pad = dilation * (k - 1) // 2
        self.body = nn.Sequential(
            nn.Conv2d(cin, hid, 1, bias=bias), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, hid, k, stride, pad, dilation, groups=hid, bias=bias), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, cout, 1, bias=bias), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.body(x) if self.res else self.body(x)


def _eval_model(*blocks: nn.Module, head: str = "mean") -> nn.Module:
    torch.manual_seed(0)
    body = nn.Sequential(*blocks)
    for m in body.modules():   # running statistics away from (0, 1), so eval-mode BN does something
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    heads = {"mean": lambda y: F.adaptive_avg_pool2d(y, 1).flatten(1),
             "max_pool": lambda y: F.max_pool2d(y, 2, ceil_mode=True),
             "flatten": lambda y: y.flatten(1),   # a view of the chain's value: stored NCHW
             "output": lambda y: y}
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = body

        def forward(self, x):
            return heads[head](self.body(x))
    return Model().eval()


def _assert_as_float64(model: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        got = neuron_compile(model)(x)
        want = model.double()(x.double())
        eager = model.float()(x) if x.dtype == torch.float32 else model(x)
    err = (got.double() - want).abs().max().item()
    err_eager = (eager.double() - want).abs().max().item()
    assert got.shape == want.shape and got.dtype == x.dtype
    assert err <= 4 * err_eager + 16 * torch.finfo(x.dtype).eps * want.abs().max().item(), (err, err_eager)


CHAINS = {
    "stride 2 then residual": ([(16, 24, 2, 6), (24, 24, 1, 6)], (4, 16, 16, 16)),
    "4x4 planes, 384 channels": ([(64, 64, 1, 6)], (4, 64, 4, 4)),
    "odd channels and sizes": ([(5, 7, 2, 3), (7, 7, 1, 5)], (3, 5, 11, 9)),
    "5x5 dilated with bias": ([(8, 8, 1, 4, 5, 2, True)], (2, 8, 12, 10)),
    "wider than a vector row (600 channels)": ([(100, 100, 1, 6)], (2, 100, 3, 3)),
    "batch 1, 1x1 planes": ([(16, 16, 1, 6), (16, 32, 2, 6)], (1, 16, 2, 2)),
}


HEADS = ["mean", "max_pool", "flatten", "output"]


@pytest.mark.parametrize("case,head", [("stride 2 then residual", h) for h in HEADS if h != "mean"]
                         + [(c, "mean") for c in CHAINS if c != "stride 2 then residual"])
def test_channels_last_chains_match_float64(case, head):
    """Every way out of the chain (a pooling head, a view, a graph output) on one chain; the
    other geometries with a mean head."""
    cfgs, shape = CHAINS[case]
    model = _eval_model(*(_Block(*c) for c in cfgs), head=head)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    _assert_as_float64(model, x)
    if case == "stride 2 then residual":   # (an input in channels-last memory format: once is enough)
        _assert_as_float64(model, x.contiguous(memory_format=torch.channels_last))


def test_float64_chain_matches_float64_eager():
    model = _eval_model(_Block(8, 16, 2, 4), _Block(16, 16, 1, 4)).double()
    x = torch.randn(2, 8, 10, 10, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(neuron_compile(model)(x), model(x), rtol=1e-12, atol=1e-12)


@settings(max_examples=8, deadline=None)
@given(c=st.integers(1, 40), expand=st.integers(1, 4), k=st.sampled_from([1, 2, 3, 5]), stride=st.integers(1, 3),
       dilation=st.integers(1, 2), hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), bias=st.booleans(),
       n=st.integers(1, 3))
def test_any_depthwise_geometry_in_a_chain_matches_float64(c, expand, k, stride, dilation, hw, bias, n):
    """Kernel, stride, dilation and padding (``(k - 1)·d / 2``, as the block writes it; even kernels
    give asymmetric windows) over any plane, with and without bias."""
    pad = dilation * (k - 1) // 2
    if (hw[0] + 2 * pad - dilation * (k - 1)) < 1 or (hw[1] + 2 * pad - dilation * (k - 1)) < 1:
        return
    model = _eval_model(_Block(c, c, stride, expand, k, dilation, bias), head="output")
    _assert_as_float64(model, torch.randn(n, c, *hw, generator=torch.Generator().manual_seed(c)))


def _functional(model: nn.Module):
    """``model`` as a function of (x, *parameters and buffers), for tracing with fake tensors."""
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    values = [t.detach() for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]

    def fn(x, *vals):
        return torch.func.functional_call(model, dict(zip(names, vals)), (x,))
    return fn, values


def _layouts(fn, *args) -> list[str | None]:
    gm, _ = lower(fn, *args)
    return [n.meta.get(LAYOUT) for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]


def test_the_pass_picks_chains_with_a_depthwise_convolution_and_no_saved_values():
    x = torch.randn(2, 16, 8, 8)
    for head in ("mean", "flatten", "output"):
        fn, params = _functional(_eval_model(_Block(16, 24, 2, 6), head=head))
        assert _layouts(fn, x, *params) == ["channels_last"] * 3
    # a lone depthwise convolution: converting in and out would cost more than it saves
    w = torch.randn(16, 1, 3, 3)
    assert _layouts(lambda x, w: F.conv2d(x, w, None, 2, 1, 1, 16), x, w) == [None]
    # a 3×3 convolution (ResNet) is not in a chain; nor is a chain with several graph outputs (a
    # training forward saves them for the backward, in NCHW)
    w1, w2 = torch.randn(32, 16, 1, 1), torch.randn(32, 16, 3, 3)
    assert _layouts(lambda x, w1, w2: F.relu(F.conv2d(x, w2, padding=1)) + F.conv2d(x, w1), x, w1, w2) == [None, None]
    wd = torch.randn(32, 1, 3, 3)

    def saved(x, w1, wd):
        y = F.relu(F.conv2d(x, w1))
        return F.conv2d(y, wd, padding=1, groups=32), y
    assert _layouts(saved, x, w1, wd) == [None, None]


def test_depthwise_convolutions_of_the_chain_are_vectorized_over_channels():
    """Stride 2 and 4×4 planes (rows shorter than a register in NCHW: scalar ``loops``) take
    ``window-stencil`` over the channel dim; the 1×1 convolutions are GEMMs."""
    fn, params = _functional(_eval_model(_Block(16, 24, 2, 6), _Block(24, 24, 1, 6), head="mean"))
    ks = _kernels(fn, torch.randn(2, 16, 8, 8), *params)
    stencils = [(k, s) for k, s in ks if k.kind == "reduction" and len(k.ranges) == 6]
    assert len(stencils) == 2 and all(s.strategy == "window-stencil" for _, s in stencils)
    assert [k.ranges[3] for k, _ in stencils] == [96, 144]   # (n, oh, ow, c, kh, kw): c innermost
    assert sum(k.kind == "matmul" and s.strategy == "matmul" for k, s in ks) == 4
    # inside the chain nothing is transposed: only the input (in) and the 3×3 weights
    assert [k.ranges for k, _ in ks if k.kind == "transpose"] == [(2, 8, 8, 16), (3, 3, 96), (3, 3, 144)]


@pytest.mark.parametrize("c, stride", [(384, 1), (600, 2)])
def test_channels_last_depthwise_rows_are_cut_into_pieces_of_a_few_registers(c, stride):
    """A channels-last depthwise row (384 channels at 4×4) is cut into pieces of at most
    ``STENCIL_REGISTERS`` registers, each dividing the row: taken whole (48 AVX2 registers for
    the accumulator alone) every multiply-add spilled (2.5 GFLOP/s; AMD Zen 3, 1 thread). A row
    longer than ``WINDOW_ROW`` (600 channels) is taken in pieces too, where it fell to
    ``loops-forall`` (a new user's trial)."""
    from neuron_compile.codegen.strategies.window import STENCIL_REGISTERS
    from neuron_compile.target import HostCPU

    def block(x, w1, w2, w3):
        h = F.relu6(F.conv2d(x, w1))
        return F.conv2d(F.relu6(F.conv2d(h, w2, stride=stride, padding=1, groups=c)), w3)
    g = torch.Generator().manual_seed(5)
    args = (torch.randn(4, 64, 4, 4, generator=g), torch.randn(c, 64, 1, 1, generator=g) / 8,
            torch.randn(c, 1, 3, 3, generator=g) / 3, torch.randn(64, c, 1, 1, generator=g) / 20)
    ks = _kernels(block, *args)
    steps = [s.params["step"] for k, s in ks if s.strategy == "window-stencil" and c in k.ranges]
    most = STENCIL_REGISTERS * HostCPU.detect().info().vector_bits // 32
    assert steps and all(st <= most and c % st == 0 for st in steps), steps
    assert not [k for k, s in ks if k.kind == "reduction" and s.strategy.startswith("loops")]
    torch.testing.assert_close(neuron_compile(block)(*args).double(), block(*(a.double() for a in args)),
                               rtol=1e-5, atol=1e-4)
