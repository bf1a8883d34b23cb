"""Values where eager raises (issue 13, item 5): ATen's argument checks that live only in its CPU
kernels (dtype agreement in the matmul family, integer inputs to softmax, fill values that overflow
the dtype) must raise in the compiled call too, with eager's message, never return a value."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import neuron_compile

f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16


def _t(*shape, dtype=f32):
    return torch.randn(*shape).to(dtype)


CASES = {
    "matmul f32@f64": (lambda a, b: a @ b, lambda: (_t(3, 4), _t(4, 2, dtype=f64))),
    "mm bf16,f32": (torch.mm, lambda: (_t(2, 3, dtype=bf16), _t(3, 2))),
    "linear f64 weight": (F.linear, lambda: (_t(2, 3), _t(4, 3, dtype=f64))),
    "linear f64 bias": (F.linear, lambda: (_t(2, 3), _t(4, 3), _t(4, dtype=f64))),
    "addmm f64 self": (torch.addmm, lambda: (_t(2, 2, dtype=f64), _t(2, 3), _t(3, 2))),
    "baddbmm f64 self": (torch.baddbmm, lambda: (_t(2, 2, 2, dtype=f64), _t(2, 2, 3), _t(2, 3, 2))),
    "mv": (torch.mv, lambda: (_t(2, 3), _t(3, dtype=f64))),
    "dot": (torch.dot, lambda: (_t(3), _t(3, dtype=f64))),
    "matmul 3-d by 2-d": (torch.matmul, lambda: (_t(2, 2, 3), _t(3, 2, dtype=f64))),
    # floating-only kernels given integers
    "softmax of int64": (lambda x: torch.softmax(x, -1), lambda: (torch.arange(6).reshape(2, 3),)),
    "log_softmax method of int64": (lambda x: x.log_softmax(0), lambda: (torch.arange(6).reshape(2, 3),)),
    # a clamp bound the dtype cannot hold; index_put values of another dtype (issue 40, item 6)
    "clamp float32 min -3.4e39": (lambda x: torch.clamp(x, min=-3.4e39), lambda: (_t(3),)),
    "clamp method max 1e39": (lambda x: (x * 2).clamp(max=1e39), lambda: (_t(3),)),
    "clamp_min float16 1e5": (lambda x: torch.clamp_min(x, 1e5), lambda: (_t(3, dtype=torch.float16),)),
    "index_put float64 into float32": (lambda t, i, v: t.index_put((i,), v),
                                       lambda: (torch.zeros(4), torch.tensor([0, 2]), _t(2, dtype=f64))),
    "index_put_ float64 into a float32 clone": (lambda t, i, v: t.clone().index_put_((i,), v, accumulate=True),
                                                lambda: (torch.zeros(4), torch.tensor([0, 2]), _t(2, dtype=f64))),
    # a fill value the dtype cannot hold (arithmetic with such a scalar wraps, as in eager)
    "fill_ uint8 with 300": (lambda x: x.clone().fill_(300), lambda: (torch.tensor([1, 2], dtype=torch.uint8),)),
    "full uint8 with 300": (lambda x: x + torch.full((2,), 300, dtype=torch.uint8),
                            lambda: (torch.tensor([1, 2], dtype=torch.uint8),)),
    "full int8 with -129": (lambda x: x * torch.full_like(x, -129), lambda: (torch.tensor([1, 2], dtype=torch.int8),)),
    "masked_fill uint8 with 300": (lambda x: x.masked_fill(x == 0, 300), lambda: (torch.zeros(3, dtype=torch.uint8),)),
    "new_full uint8 with 256": (lambda x: x + x.new_full((3,), 256), lambda: (torch.zeros(3, dtype=torch.uint8),)),
    "F.pad uint8 with 300": (lambda x: F.pad(x, (1, 2), value=300), lambda: (torch.zeros(2, 3, dtype=torch.uint8),)),
    "constant_pad_nd int8 with -129": (lambda x: torch.constant_pad_nd(x, (1, 1, 0, 2), -129) + 1,
                                       lambda: (torch.ones(2, 3, dtype=torch.int8),)),
    "fill_ float16 with 1e5": (lambda x: x.clone().fill_(1e5), lambda: (torch.zeros(3, dtype=torch.float16),)),
    "full bfloat16 with 1e39": (lambda x: x + torch.full((3,), 1e39, dtype=bf16), lambda: (torch.zeros(3, dtype=bf16),)),
    # kernels implemented for float32/float64 only, whose decompositions would take any dtype
    "bessel_j0 of bfloat16": (torch.special.bessel_j0, lambda: (_t(3, dtype=bf16),)),
    "erfcx of float16": (lambda x: torch.special.erfcx(x) + 1, lambda: (_t(3, dtype=torch.float16),)),
    "chebyshev_t of bfloat16": (lambda x: torch.special.chebyshev_polynomial_t(x, 3), lambda: (_t(3, dtype=bf16),)),
    "avg_pool3d of bfloat16": (lambda x: F.avg_pool3d(x, 2), lambda: (_t(1, 1, 4, 4, 4, dtype=bf16),)),
    "antialiased resize of bfloat16": (lambda x: F.interpolate(x, size=(3, 3), mode="bilinear", antialias=True),
                                       lambda: (_t(1, 1, 6, 6, dtype=bf16),)),
}


@pytest.mark.parametrize("case", CASES)
def test_compiled_call_raises_eagers_error(case):
    fn, make = CASES[case]
    args = make()
    with pytest.raises(RuntimeError) as eager:
        fn(*args)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError) as compiled:
        neuron_compile(fn)(*args)
    # ours carries eager's text; where Dynamo's fake-tensor meta function already checks (bmm,
    # baddbmm, dot), Dynamo raises its own RuntimeError before the backend runs
    msg = str(compiled.value)
    assert str(eager.value).splitlines()[0] in msg or "Dynamo failed to run FX node with fake tensors" in msg


@pytest.mark.parametrize("dtype", [torch.int64, bf16, f64], ids=str)
def test_matching_dtypes_still_compile(dtype):
    a, b = (torch.randint(-3, 4, (5, 6)).to(dtype), torch.randint(-3, 4, (6, 7)).to(dtype))
    torch._dynamo.reset()
    got = neuron_compile(torch.mm)(a, b)
    assert got.dtype == dtype and torch.equal(got, torch.mm(a.double(), b.double()).to(dtype))


def test_pads_that_fit_the_dtype_still_compile():
    # the pad probe checks the fill value alone: pad widths the real shape allows (2-D, negative:
    # cropping) compile as before, and a reflect pad has no value to check
    x = torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4)
    xf = torch.randn(1, 2, 5, 6)
    for fn, arg in ((lambda t: F.pad(t, (2, -1, 1, 3), value=255), x),
                    (lambda t: torch.constant_pad_nd(t, (1, 1, -1, 0), 7), x),
                    (lambda t: F.pad(t, (2, 1, 1, 2), mode="reflect"), xf)):
        torch._dynamo.reset()
        got = neuron_compile(fn)(arg)
        want = fn(arg.double()).to(arg.dtype)
        assert got.dtype == arg.dtype and torch.equal(got, want)


def test_an_input_on_another_device_is_named_as_such():
    """A ``meta`` tensor compiles (Dynamo traces it) but cannot run: the error names the device
    and what to do, not a shape mismatch (the shapes agree; found by a new user)."""
    from neuron_compile.errors import RuntimeCallError
    fn = neuron_compile(lambda x: x.softmax(-1))
    with pytest.raises(RuntimeCallError, match=r"input 0 is on meta.*host CPU.*\.cpu\(\)"):
        fn(torch.empty(3, 513, device="meta"))


def test_outputs_are_allocated_on_the_cpu_whatever_the_default_device():
    # torch.set_default_device("meta") made the runtime allocate the outputs on meta, and the kernel
    # wrote through their null data pointers: a segmentation fault
    x = torch.randn(8, 40)
    f = neuron_compile(lambda x: torch.sigmoid(x) * 2)
    want = f(x)
    torch.set_default_device("meta")
    try:
        out = f(x)
    finally:
        torch.set_default_device(None)
    assert out.device.type == "cpu" and torch.equal(out, want)
    torch.testing.assert_close(out, torch.sigmoid(x.double()).float() * 2)


def test_a_matmul_of_mixed_dtypes_inside_autocast_compiles():
    """Inside ``torch.autocast(bfloat16)`` eager casts a bfloat16 and a float32 matmul operand to one
    dtype: the probe replays the graph's autocast regions (it raised "expected m1 and m2 to have the
    same dtype" here). Forward against eager; the weight gradient against aot_eager (AOTAutograd's
    backward of an autocast region differs from eager's by bfloat16 rounding for every backend)."""
    x, w0 = _t(8, 16), _t(16, 16)

    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.relu(x @ w)
            with torch.autocast("cpu", enabled=False):
                z = (y * w[0]).sum() + (x @ w).sum()
            return z + (y @ w).float().sum()

    def run(fn):
        w = w0.clone().requires_grad_()
        out = fn(x, w)
        out.backward()
        return out.detach(), w.grad

    eager_out, _ = run(f)
    torch._dynamo.reset()
    ref_out, ref_grad = run(torch.compile(f, backend="aot_eager", dynamic=False))
    torch._dynamo.reset()
    out, grad = run(neuron_compile(f))
    torch.testing.assert_close(out, eager_out, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("f", [lambda x, s: torch.diagonal_scatter(x, s), lambda x, s: torch.slice_scatter(x, x, 0, 0, 2),
                               lambda x, s: x.select_scatter(s, 0, 1)],
                         ids=["diagonal_scatter", "slice_scatter", "select_scatter"])
def test_a_view_scatter_whose_source_has_the_wrong_shape_raises_as_eager(f):
    """The meta functions do not compare src with the view's shape; eager's kernels do."""
    x, s = torch.zeros(3, 3), torch.tensor([5.0, 6.0])
    with pytest.raises(RuntimeError) as eager:
        f(x, s)
    with pytest.raises(RuntimeError, match="size") as ours:
        neuron_compile(f)(x, s)
    assert str(eager.value).splitlines()[0] in str(ours.value)
