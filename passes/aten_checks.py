"""ATen's argument checks that live only in its CPU kernels, run at compile time with eager's message.

Fake-tensor tracing uses meta functions, and some of ATen's checks exist only in the CPU kernels:
``torch.mm`` of a float32 and a float64 matrix traces to ``aten.mm`` returning float32, where eager
raises ``RuntimeError: expected m1 and m2 to have the same dtype``; ``softmax`` of an integer
tensor and ``fill_(300)`` or ``F.pad(value=300)`` of a uint8 one return values where eager
raises. :func:`check_arguments` calls each such op of the graph (:data:`PROBED`: the matmul
family of ``aten/src/ATen/native/Blas.cpp`` and ``LinearAlgebra.cpp``, softmax, fill, the view scatters'
source shapes; and the ops we decompose whose CPU kernels implement only
some dtypes, :data:`DTYPE_LIMITED`: special functions, orthogonal polynomials, 3-D average pooling,
antialiased resize) once on all-ones tensors of the same dtypes and ranks, every dim 1 (the real
shapes for :data:`SHAPED` ops), so shapes always agree and only the dtype and value checks can fire. An exception becomes an
:class:`~neuron_compile.errors.ArgumentCheckError` with ATen's exact text and the user's line, so a
compiled call raises where eager raises instead of returning a value.
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from neuron_compile.errors import ArgumentCheckError

aten = torch.ops.aten

PROBED = frozenset({
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.addbmm.default,
    aten.mv.default, aten.addmv.default, aten.dot.default, aten.vdot.default,
    aten._softmax.default, aten._log_softmax.default,
    # the same ops as Dynamo records them (the backend checks its graph before AOTAutograd decomposes
    # mv, matmul and softmax away; compile_graph checks ATen graphs from any source)
    torch.mm, torch.addmm, torch.bmm, torch.baddbmm, torch.addbmm, torch.mv, torch.addmv, torch.dot, torch.vdot,
    torch.matmul, operator.matmul, F.linear,
    torch.softmax, torch.log_softmax, F.softmax, F.log_softmax,    # not implemented for integer dtypes
})
# Ops we decompose whose CPU kernels implement only some dtypes (the special functions and
# orthogonal polynomials: float32/float64, "bessel_j0_cpu" not implemented for 'BFloat16'; the 3-D
# average pool and antialiased resize: no float16/bfloat16), probed in every dtype.
_SPECIAL = ("bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0", "modified_bessel_i1",
            "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1",
            "spherical_bessel_j0", "airy_ai", "erfcx", "ndtri", "log_ndtr", "i0e", "i1", "i1e",
            *(f"{s}chebyshev_polynomial_{k}" for s in ("", "shifted_") for k in "tuvw"),
            "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p")
DTYPE_LIMITED = frozenset(
    [getattr(torch.special, n) for n in _SPECIAL]
    + [o for n in _SPECIAL for o in (getattr(getattr(aten, f"special_{n}"), ov, None)
                                     for ov in ("default", "x_scalar", "n_scalar")) if o is not None]
    + [torch.i0, torch.special.i0, torch.erfinv, torch.special.erfinv, aten.i0.default, aten.erfinv.default,
       F.avg_pool3d, aten.avg_pool3d.default, F.interpolate,
       aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default])
# Bounds that the dtype cannot hold (float32 ``clamp(min=-3.4e39)``: "value cannot be converted to
# type float without overflow"), and an ``index_put`` whose values' dtype differs from the
# destination's ("Index put requires the source and destination dtypes match"; ``t[i] = v`` casts
# ``v`` first and never reaches it). index_put is probed as Dynamo records it only: an ATen graph's
# index_put may come from a decomposition, not from the user.
BOUNDED = frozenset({torch.clamp, torch.clip, torch.clamp_min, torch.clamp_max, aten.clamp.default,
                     aten.clamp_min.default, aten.clamp_max.default})
# View scatters whose src does not have the view's shape ("expected src to have a size equal to the
# slice of self"): the meta functions do not compare them. Probed at the real shapes; not
# as_strided_scatter, whose view is placed in the real input's storage.
VIEW_SCATTERS = frozenset({torch.slice_scatter, torch.select_scatter, torch.diagonal_scatter,
                           aten.slice_scatter.default, aten.select_scatter.default, aten.diagonal_scatter.default,
                           "slice_scatter", "select_scatter", "diagonal_scatter"})
PROBED = PROBED | DTYPE_LIMITED | BOUNDED | {torch.index_put} | VIEW_SCATTERS
# probed at the real shapes (their checks also compare sizes with the kernel and output sizes)
SHAPED = frozenset({F.avg_pool3d, aten.avg_pool3d.default, F.interpolate, aten._upsample_bilinear2d_aa.default,
                    aten._upsample_bicubic2d_aa.default}) | VIEW_SCATTERS
PROBED_METHODS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul",
                            "__matmul__", "softmax", "log_softmax", "i0", "erfinv", "clamp", "clamp_", "clip",
                            "clip_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "index_put",
                            "index_put_", "slice_scatter", "select_scatter", "diagonal_scatter"})
# Fills whose value must fit the dtype (uint8 300, float16 1e5). Probed on 2 elements: ATen's
# one-element fill path skips the overflow check for float16/bfloat16.
FILLS = frozenset({aten.fill.Scalar, aten.masked_fill.Scalar, torch.full, torch.full_like, torch.fill,
                   torch.masked_fill})
FILL_METHODS = frozenset({"fill_", "masked_fill", "masked_fill_", "new_full"})


def _pad_fill(t: torch.Tensor, pad: object, mode: str = "constant", value: object = None) -> None:
    """``F.pad``: a constant pad fills its border with ``value`` (``constant_pad_nd`` in
    ``aten/src/ATen/native/PadNd.cpp`` calls ``fill_``), so the fill's overflow check is probed
    alone: the pad itself on the probe tensor would reject pad widths the real shape allows."""
    if mode == "constant" and value is not None:
        t.new_empty(2).fill_(value)


def _constant_pad_fill(t: torch.Tensor, pad: object, value: object = 0) -> None:
    """``constant_pad_nd(input, pad, value)``: as :func:`_pad_fill`."""
    _pad_fill(t, pad, "constant", value)


PADS = {F.pad: _pad_fill, torch._C._nn.pad: _pad_fill, aten.pad.default: _pad_fill,
        torch.constant_pad_nd: _constant_pad_fill, aten.constant_pad_nd.default: _constant_pad_fill}
FILLS = FILLS | frozenset(PADS)
# Targets whose probe is not the op itself on the probe tensors: sizes become (2,)
def _index_put(t: torch.Tensor, indices: object, values: torch.Tensor, accumulate: bool = False) -> None:
    """``index_put`` on the probe tensors with every index 0 (the probe's dims are 1 long), so
    only its dtype check can fire."""
    zeros = [torch.zeros_like(i) if isinstance(i, torch.Tensor) else i for i in indices]
    t.index_put(zeros, values, accumulate)


PROBE_WITH = {
    torch.full: lambda size, value, *a, **k: torch.full((2,), value, *a, **k),
    "new_full": lambda t, size, value, *a, **k: t.new_full((2,), value, *a, **k),
    torch.index_put: _index_put, "index_put": _index_put, "index_put_": _index_put,
    **PADS,
}


def _probe(a: object, fill: bool = False, shaped: bool = False) -> object:
    if not isinstance(a, torch.fx.Node):
        return a
    val = a.meta.get("val", a.meta.get("example_value"))
    if isinstance(val, torch.Tensor):
        if shaped:
            return torch.ones([int(d) for d in val.shape], dtype=val.dtype)
        return torch.ones(2 if fill and val.dim() else [1] * val.dim(), dtype=val.dtype)
    return a


def check_arguments(gm: torch.fx.GraphModule) -> None:
    """Raise :class:`~neuron_compile.errors.ArgumentCheckError` (a ``RuntimeError``) with eager's
    message if an op of :data:`PROBED` (or a :data:`PROBED_METHODS` method call) in ``gm`` has
    arguments its CPU kernel rejects (dtypes that differ, a dtype it does not implement, a fill value
    the dtype cannot hold). Works on
    Dynamo's graph (torch functions, ``example_value`` metadata) and on ATen graphs (``val``). The
    graph is not changed."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from neuron_compile.lowering.locations import user_location
    with unset_fake_temporarily():
        regions = _AutocastRegions()
        try:
            for n in gm.graph.nodes:
                if not regions.follow(n):
                    _check_node(n, user_location)
        finally:
            regions.close()


class _AutocastRegions:
    """The autocast state of Dynamo's graph replayed while probing: inside ``torch.autocast(bfloat16)``
    eager casts a float32 and a bfloat16 matmul operand to one dtype, so probing ``y @ w`` outside
    that region raised where eager does not. ``_enter_autocast``/``_exit_autocast`` nodes (Dynamo's
    record of a ``with torch.autocast``) enter and leave the same state; an ATen graph has none."""

    def __init__(self):
        self.modes: dict[torch.fx.Node, object] = {}

    def follow(self, n: torch.fx.Node) -> bool:
        """Enter or leave a region for an autocast node (True), else nothing (False)."""
        from torch.amp import autocast_mode
        if n.op != "call_function":
            return False
        if n.target is autocast_mode._enter_autocast:
            self.modes[n] = autocast_mode._UnmanagedAutocast(*n.args, **n.kwargs)
            self.modes[n].__enter__()
            return True
        if n.target is autocast_mode._exit_autocast and n.args and n.args[0] in self.modes:
            self.modes.pop(n.args[0]).__exit__(None, None, None)
            return True
        return False

    def close(self) -> None:
        """Leave the regions still open (a graph that ends inside one, or a probe that raised)."""
        for mode in reversed(list(self.modes.values())):
            mode.__exit__(None, None, None)
        self.modes.clear()


def _check_node(n: torch.fx.Node, user_location) -> None:
    """Probe one node of :func:`check_arguments` (under the caller's autocast state)."""
    method = n.op == "call_method" and n.target in PROBED_METHODS | FILL_METHODS
    if not method and (n.op != "call_function" or n.target not in PROBED | FILLS):
        return
    fill = n.target in FILL_METHODS | FILLS
    shaped = n.target in SHAPED
    args, kwargs = torch.fx.node.map_aggregate((n.args, n.kwargs), lambda a: _probe(a, fill, shaped))
    if any(isinstance(a, torch.fx.Node) for a in (*args, *kwargs.values())):
        return  # an argument without a recorded value: nothing to probe with
    try:
        if n.target in PROBE_WITH:  # (a method's name, or a function)
            PROBE_WITH[n.target](*args, **kwargs)
        elif method:
            getattr(args[0], n.target)(*args[1:], **kwargs)
        else:
            n.target(*args, **kwargs)
    except (RuntimeError, TypeError) as exc:
        op = n.target if method else getattr(n.target, "__name__", str(n.target))
        raise ArgumentCheckError(f"{exc}\n  (eager raises this too: {op}, FX node '{n.name}', at "
                                 f"{user_location(n)}; eager rejects these arguments' dtypes or values)") from None
