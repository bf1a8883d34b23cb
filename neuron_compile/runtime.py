"""Calling compiled kernels on torch tensors.

A kernel is ``_mlir_ciface_neuron_kernel(MemRef* in.., MemRef* host.., MemRef* out..)`` in a shared
object. Each argument is a pointer to a ranked memref descriptor
``{allocated*, aligned*, offset, sizes[rank], strides[rank]}`` (MLIR "LLVM IR target" doc, memref
calling convention) filled from the tensor's ``data_ptr()``, shape and element strides: contiguous
inputs are read in place, outputs are allocated by torch (``empty_strided`` with eager's strides)
and written by the kernel. Views among the outputs are rebuilt with ``as_strided`` as planned at
compile time (AOTAutograd's aliasing contract).
"""
from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from neuron_compile import stack_guard
from neuron_compile.errors import RuntimeCallError
from neuron_compile.plan import CallPlan, HostOp, OutputSlot, TensorSpec

KERNEL_SYMBOL = "neuron_kernel"


def load_shared_object(path: Path) -> tuple[Callable[..., None], Any]:
    """``dlopen`` a kernel library; returns (entry function, library handle to keep alive). The
    entry is the packed ``neuron_entry(void **data)`` (:func:`~neuron_compile.kernel_runtime.entry_source`)
    when the library has one, else ``_mlir_ciface_neuron_kernel`` taking descriptors.

    Raises:
        ExecutableError: the library does not load (unresolved symbol, wrong architecture) or has
            no kernel entry point.
    """
    from neuron_compile.errors import ExecutableError
    from neuron_compile.kernel_runtime import ENTRY_SYMBOL
    try:
        lib = ctypes.CDLL(str(path))
        fn = getattr(lib, ENTRY_SYMBOL, None) or getattr(lib, f"_mlir_ciface_{KERNEL_SYMBOL}")
    except (OSError, AttributeError) as e:
        raise ExecutableError(f"cannot load kernel library {path}: {e}. Clear the cache entry "
                              "(neuron-compile cache clear) and recompile; if it persists, report it.") from e
    fn.restype = None
    fn.packed = fn.__name__ == ENTRY_SYMBOL
    from neuron_compile.kernel_runtime import bind
    bind(lib)  # parallel loops run on torch's OpenMP thread pool
    return fn, lib


@functools.lru_cache(maxsize=None)
def descriptor_type(rank: int) -> type[ctypes.Structure]:
    """The ctypes struct of a rank-``rank`` memref descriptor."""
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})


def _descriptor(t: torch.Tensor, spec: TensorSpec) -> ctypes.Structure:
    rank = len(spec.shape)
    d = descriptor_type(rank)()
    ptr = t.data_ptr()
    d.allocated = ptr
    d.aligned = ptr
    d.offset = 0
    if rank:
        d.sizes[:] = spec.shape
        d.strides[:] = spec.stride
    return d


def _layout_matches(t: torch.Tensor, spec: TensorSpec) -> bool:
    if t.numel() == 0:
        return True
    return all(st == sp or size == 1 for st, sp, size in zip(t.stride(), spec.stride, spec.shape))


def _resolve(a: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> Any:
    """A host op's argument with its references filled in. Module-level on purpose: a recursive
    nested closure is a reference cycle that keeps ``inputs``/``outputs`` alive until the garbage
    collector runs (see :func:`neuron_compile.segments._resolve`)."""
    if isinstance(a, tuple) and a and a[0] == "input":
        return inputs[a[1]]
    if isinstance(a, tuple) and a and a[0] == "output":
        return outputs[a[1]]
    if isinstance(a, tuple) and a and a[0] == "empty":
        spec, zeroed = a[1], a[2]
        return (torch.zeros if zeroed else torch.empty)(spec.shape, dtype=spec.dtype)
    if isinstance(a, list):
        return [_resolve(x, inputs, outputs) for x in a]
    return a


def _dtype_view(base: torch.Tensor, slot: OutputSlot) -> torch.Tensor:
    """The output ``slot`` that reads ``base``'s bytes as ``slot.dtype`` (``y.view(torch.int32)``,
    possibly viewed further). Eager's ``y.view(dtype)`` has no ``_base`` (``view.dtype`` is not an
    autograd view), a slice of it has: so a slot laid out as ``base.view(dtype)`` is a tensor of its
    own on the storage, any other a view of the whole storage read as ``dtype``."""
    storage, geometry = base.untyped_storage(), (slot.size, slot.stride, slot.offset)
    try:
        direct = base.view(slot.dtype)
        direct = (tuple(direct.shape), tuple(direct.stride()), direct.storage_offset()) == geometry
    except RuntimeError:   # (strides that ``view(dtype)`` refuses: the slot came another way)
        direct = False
    if direct:
        return torch.empty(0, dtype=slot.dtype).set_(storage, slot.offset, slot.size, slot.stride)
    whole = torch.empty(0, dtype=slot.dtype).set_(storage)
    return torch.as_strided(whole, slot.size, slot.stride, slot.offset)


class Executable:
    """A compiled graph: callable on a list of tensors, returns the graph's outputs (a list).

    Raises:
        RuntimeCallError: an input's shape or dtype differs from the compiled one (a guard bug or a
            direct call with wrong inputs).
    """

    def __init__(self, plan: CallPlan, kernel: Callable[..., None] | None, name: str, keepalive: Any = None,
                 kernels: Sequence[dict] = ()):
        self.name = name
        self.kernels = list(kernels)  # KernelInfo JSON with each kernel's schedule (manifest)
        self.plan = plan
        self.input_specs = plan.input_specs
        self.host_ops = plan.host_ops
        self.host_specs = plan.host_specs
        self.output_specs = plan.output_specs
        self.outputs: list[OutputSlot] = plan.outputs
        self._fn = kernel
        self._packed = bool(getattr(kernel, "packed", False))
        n = len(plan.input_specs) + len(plan.host_specs) + len(plan.output_specs)
        self._pointers = ctypes.c_void_p * n
        self._sizes = [torch.Size(s.shape) for s in plan.input_specs]
        self._keepalive = keepalive  # the loaded library / JIT engine owning the code
        # bytes of stack a call needs below its caller (neuron_compile.stack_guard): the frames of the
        # entry point and the graph's function, which hold a descriptor per memref (a graph with 400
        # inputs and 400 outputs overflowed a 64 KiB thread before it ran a kernel), and the most
        # stack temporaries a kernel keeps per block
        from neuron_compile.kernel_runtime import entry_frame_bytes
        self._stack_need = entry_frame_bytes([*plan.input_specs, *plan.host_specs, *plan.output_specs]) + max(
            (int(k.get("schedule", {}).get("params", {}).get("stack_bytes", 0)) for k in self.kernels), default=0)
        from neuron_compile import profile
        self.profile = profile.attach(self, keepalive)  # None unless compiled with NEURON_PROFILE

    def __del__(self) -> None:
        trim = getattr(self._keepalive, "neuron_runtime_trim", None)
        if trim is not None:
            try:
                trim()  # the runtime's cached temporaries
            except Exception:  # interpreter shutdown: nothing left to give back to
                pass

    def _prepare_input(self, i: int, t: Any) -> torch.Tensor:
        spec = self.input_specs[i]
        if t is None and math.prod(spec.shape) == 0:  # AOTAutograd's effect tokens arrive as None
            return torch.empty(spec.shape, dtype=spec.dtype, device="cpu")
        if not isinstance(t, torch.Tensor):
            raise RuntimeCallError(f"{self.name}: input {i} must be a tensor, got {type(t).__name__}")
        if t.shape != self._sizes[i] or t.dtype != spec.dtype or not t.is_cpu:
            if t.shape == self._sizes[i] and t.dtype == spec.dtype:
                raise RuntimeCallError(
                    f"{self.name}: input {i} is on {t.device}, but neuron-compile's executables run on the "
                    f"host CPU; move the inputs there first (`.cpu()`), or use another backend for {t.device}")
            raise RuntimeCallError(
                f"{self.name}: input {i} is {tuple(t.shape)} {t.dtype} on {t.device}, but the executable was "
                f"compiled for {spec.shape} {spec.dtype} on cpu; recompile for the new shape")
        if t.stride() != spec.stride and not _layout_matches(t, spec):  # never read with the wrong strides: copy
            t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device="cpu").copy_(t)
        return t

    def _run_host_op(self, op: HostOp, inputs: Sequence[torch.Tensor],
                     outputs: Sequence[torch.Tensor] = ()) -> Any:
        out = op.target(*[_resolve(a, inputs, outputs) for a in op.args],
                        **{k: _resolve(v, inputs, outputs) for k, v in op.kwargs.items()})
        return out.contiguous() if isinstance(out, torch.Tensor) else out

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        if stack_guard.stack_too_small(self._stack_need):
            return stack_guard.run_on_large_stack(lambda: self._call(args))
        return self._call(args)

    def _call(self, args: Sequence[Any]) -> list[Any]:
        if len(args) != len(self.input_specs):
            raise RuntimeCallError(f"{self.name}: expected {len(self.input_specs)} inputs, got {len(args)}")
        inputs = [self._prepare_input(i, t) for i, t in enumerate(args)]
        host = [self._run_host_op(op, inputs) for op in self.host_ops]
        # (on the CPU whatever torch.set_default_device says: the kernels write through data_ptr())
        outs = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device="cpu") for s in self.output_specs]
        if self._packed:  # one foreign call; descriptors are built in C from the static specs
            self._fn(self._pointers(*[t.data_ptr() for t in (*inputs, *host, *outs)]))
        elif self._fn is not None:
            descs = [_descriptor(t, s) for t, s in zip(inputs, self.input_specs)]
            descs += [_descriptor(t, s) for t, s in zip(host, self.host_specs)]
            descs += [_descriptor(t, s) for t, s in zip(outs, self.output_specs)]
            self._fn(*[ctypes.byref(d) for d in descs])
        pools = {"input": list(args), "host": host, "kernel": outs}
        placed: dict[int, torch.Tensor] = {}

        def buffer(kind: str, index: int, placement) -> torch.Tensor:
            if placement is None:
                return pools[kind][index]
            if index not in placed:   # eager's non-dense strides: a copy laid out so, shared by its slots
                size, stride, offset = placement
                span = offset + sum((n - 1) * st for n, st in zip(size, stride)) + 1
                dense = pools[kind][index]
                placed[index] = torch.empty(span, dtype=dense.dtype).as_strided(size, stride, offset).copy_(dense)
            return placed[index]
        result: list[Any] = []
        for slot in self.outputs:
            if slot.kind == "const":
                result.append(slot.value)
            elif slot.kind == "view":
                base = buffer(*slot.base, slot.placed)
                if slot.dtype is not None and slot.dtype != base.dtype:
                    result.append(_dtype_view(base, slot))
                else:
                    result.append(torch.as_strided(base, slot.size, slot.stride, slot.offset))
            else:
                result.append(buffer(slot.kind, slot.index, slot.placed))
        for check in self.plan.checks:  # e.g. torch.linalg's LinAlgError on a singular matrix
            self._run_host_op(check, inputs, result)
        return result[:len(result) - len(self.plan.checks)] if self.plan.checks else result
