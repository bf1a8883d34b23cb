"""A compiled graph that AOTAutograd can serialize: ``torch.compile(...).aot_compile(...)`` and
``torch.compiler.save_compiled_function`` / ``load_compiled_function`` (PyTorch 2.13,
``torch/_dynamo/aot_compile.py``).

With the bundled AOTAutograd cache that ``aot_compile`` turns on, AOTAutograd pickles each compiled
forward and backward as an ``OutputCode`` (Inductor's interface, ``torch/_inductor/output_code.py``)
along with its own runtime metadata, and the saved function carries Dynamo's guards. Ours pickles
to a reference, never to native code: the graph's cache key and name. Loaded in a fresh process it
finds the executable in the configured cache (``NEURON_CACHE_DIR``; a bundle moves it between
machines) on first use, so no Dynamo or AOTAutograd tracing and no compile happen.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from torch._inductor.output_code import OutputCode

from neuron_compile.errors import CacheError


@torch._disable_dynamo  # Dynamo must not trace our runtime when a compiled region calls it
def _run(exe: Any, inputs: list) -> Any:
    try:
        return exe(inputs)
    finally:
        inputs.clear()


@dataclasses.dataclass
class NeuronOutputCode(OutputCode):
    """A neuron executable by cache key, callable with AOTAutograd's boxed convention."""

    key: str = ""
    name: str = ""
    _exe: Any = dataclasses.field(default=None, repr=False, compare=False)

    _boxed_call = True

    def __post_init__(self) -> None:
        # in the instance's __dict__ too: AOTAutograd re-wraps a loaded backward in
        # torch._dynamo.disable, whose functools.wraps copies __dict__, not class attributes
        self.__dict__["_boxed_call"] = True

    @staticmethod
    def wrap(exe: Any) -> "NeuronOutputCode":
        code = NeuronOutputCode(key=exe.cache_key.digest if exe.cache_key else "", name=getattr(exe, "name", ""))
        code._exe = exe
        return code

    def _executable(self) -> Any:
        if self._exe is None:
            from neuron_compile import counters
            from neuron_compile.cache import _MEMORY
            from neuron_compile.compiler import cache_for
            from neuron_compile.config import resolve_config
            exe = _MEMORY.get(self.key)
            if exe is None:
                cache = cache_for(resolve_config())
                exe = cache.load(self.key) if cache.usable else None
                if exe is None:
                    raise CacheError(f"{self.name}: the saved compiled function needs executable {self.key[:16]}, "
                                     f"which is not in the cache at {cache.root}; import its bundle "
                                     "(neuron-compile bundle import) or point NEURON_CACHE_DIR at the cache "
                                     "it was compiled into")
                counters.bump("disk_hits")
                _MEMORY[self.key] = exe
            self._exe = exe
        return self._exe

    def __call__(self, *args: Any) -> Any:
        # boxed: one list, cleared so inputs die early (unboxed calls are taken too)
        inputs = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
        return _run(self._executable(), inputs)

    def prepare_for_serialization(self) -> None:
        self._exe = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        pass  # loaded lazily on the first call

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.key, self.name, self._exe = state["key"], state["name"], None
        self.__post_init__()


def serializable_guards(entries: Sequence[Any]) -> list[bool]:
    """A Dynamo ``guard_filter_fn`` for ``aot_compile``: keep each guard PyTorch 2.13 can serialize,
    drop the others. Pass it as ``torch.compile(fn, backend="neuron", dynamic=False, fullgraph=True,
    options={"guard_filter_fn": neuron_compile.serializable_guards}).aot_compile(...)``.

    ``aot_compile``'s default filter drops guards on globals and guards whose own type cannot be
    serialized (``CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES``: ``ID_MATCH``,
    ``CLASS_MATCH``, ``NN_MODULE``, ...), but keeps a guard that *derives* from one of them, e.g. a
    ``CONSTANT_MATCH`` on the code object of a decorator's closure (Hugging Face models' ``forward``),
    and ``save_compiled_function`` then fails with ``PackageError: ID_MATCH guard cannot be
    serialized``. This filter drops those too. Kept: the guards on tensors (shape, stride, dtype,
    device, requires_grad) and on constant values (config flags, ints) that decide the graph. Dropped:
    object-identity checks (the same classes, functions and modules as at save time), which a fresh
    process cannot check by identity anyway; load a saved function only for the model code it was
    saved from (as with ``torch.compiler.skip_guard_on_all_nn_modules_unsafe``).

    Args:
        entries: Dynamo's ``GuardFilterEntry`` list (``torch/_dynamo/types.py``).
    Returns:
        One bool per entry, ``True`` to keep the guard.
    """
    from torch._dynamo.guards import CheckFunctionManager
    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (e.is_global or e.guard_type in unsupported or unsupported.intersection(e.derived_guard_types))
            for e in entries]
