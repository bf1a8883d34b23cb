"""Ahead-of-time compilation of a model from a factory: ``neuron-compile compile FILE.py:FACTORY``.

The factory is a function in the user's file returning ``(model, example_inputs)`` or
``(model, example_inputs, optimizer)``; ``example_inputs`` is one tuple of positional arguments or
a list of such tuples (one per input shape the program will call the model with: with
``dynamic=False`` each shape is its own graph). For each input set the model is compiled with
``torch.compile(model, backend="neuron", dynamic=False)`` in compile-only mode
(:class:`~neuron_compile.config.Config` ``compile_only``), in eval mode under ``no_grad`` (the
inference graph) and, with ``train``, in train mode with a backward pass (the forward and backward
graphs). Those are the very graphs, and so the very cache keys, that a later ``torch.compile`` of
the same model with the same options looks up: that run compiles nothing (check it with
``NEURON_CACHE_STRICT=1``). As ``iree-compile`` does for IREE, and TorchNeuron's
``neuron_parallel_compile`` did for its XLA path.
"""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch


def load_factory(spec: str) -> Callable[[], Any]:
    """``path/to/file.py:function`` → the function (the file is imported as a module named after
    it, with its directory on ``sys.path`` so its own imports work).

    Raises:
        ValueError: not ``FILE.py:NAME``, no such file, or no such function in it.
    """
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ValueError(f"{spec!r}: expected path/to/file.py:factory_function")
    file = Path(path).resolve()
    if not file.is_file():
        raise ValueError(f"{spec!r}: no such file {file}")
    sys.path.insert(0, str(file.parent))
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[file.stem] = module
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"{spec!r}: {file.name} has no function {name!r}")
    if not callable(fn):
        raise ValueError(f"{spec!r}: {name!r} in {file.name} is a {type(fn).__name__}, not a function")
    return fn


def _input_sets(example_inputs: Any) -> list[tuple]:
    if isinstance(example_inputs, torch.Tensor):
        return [(example_inputs,)]
    if isinstance(example_inputs, (list, tuple)) and not example_inputs:
        raise ValueError("the factory returned no example inputs")
    if isinstance(example_inputs, list) and all(isinstance(x, (tuple, list)) for x in example_inputs):
        return [tuple(x) for x in example_inputs]
    if isinstance(example_inputs, (tuple, list)):
        return [tuple(example_inputs)]
    raise ValueError(f"example inputs must be a tensor, a tuple of arguments or a list of such tuples, "
                     f"got {type(example_inputs).__name__}")


def _backward(out: Any) -> None:
    tensors = [t for t in (out if isinstance(out, (tuple, list)) else [out])
               if isinstance(t, torch.Tensor) and t.requires_grad]
    if tensors:
        torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])


def call_model(model: torch.nn.Module, *args: Any) -> Any:
    """``model(*args)``: the function ``--save-function`` compiles and saves (load it with
    ``torch.compiler.load_compiled_function`` and call it as ``fn(model, *args)``)."""
    return model(*args)


def save_function(spec: str, path: str, options: dict | None = None) -> dict[str, Any]:
    """``torch.compile(call_model, backend="neuron", dynamic=False, fullgraph=True).aot_compile``
    on the factory's model and first input set (inference), saved to ``path`` with
    ``save_compiled_function``: a later process loads it with no tracing (README, *Warm starts*).
    Guards that cannot be serialized are dropped (:func:`~neuron_compile.serialized.serializable_guards`)."""
    made = load_factory(spec)()
    model, args = made[0], _input_sets(made[1])[0]
    model.eval()
    t0 = time.perf_counter()
    from neuron_compile.serialized import serializable_guards
    opts = {**(options or {}), "guard_filter_fn": serializable_guards}
    fn = torch.compile(call_model, backend="neuron", dynamic=False, fullgraph=True,
                       options=opts).aot_compile(((model, *args), {}))
    fn.save_compiled_function(path)
    return {"saved_function": path, "seconds": round(time.perf_counter() - t0, 3)}


def compile_factory(spec: str, train: bool = False, options: dict | None = None,
                    progress: bool = True) -> dict[str, Any]:
    """Compile (and cache) every graph of the factory's model; returns a summary: input sets,
    graphs handed to the backend, graphs compiled, cache hits, kernels, the cache keys of the
    graphs and seconds per compile phase (``metrics()``)."""
    import neuron_compile
    from neuron_compile.cache import _MEMORY
    made = load_factory(spec)()
    if not isinstance(made, tuple) or len(made) not in (2, 3) or not isinstance(made[0], torch.nn.Module):
        raise ValueError(f"{spec}: the factory must return (model, example_inputs) or "
                         "(model, example_inputs, optimizer) with an nn.Module model")
    model, sets = made[0], _input_sets(made[1])
    opts = {**(options or {}), "compile_only": True}
    compiled = torch.compile(model, backend="neuron", dynamic=False, options=opts)
    units = [(s, "inference") for s in sets] + ([(s, "train") for s in sets] if train else [])
    neuron_compile.reset_metrics()
    before = set(_MEMORY)
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(units), desc="compiling", unit="graph set", file=sys.stderr)
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="neuron-compile compile_only")
            for args, mode in units:
                if mode == "inference":
                    model.eval()
                    with torch.no_grad():
                        compiled(*args)
                else:
                    model.train()
                    _backward(compiled(*args))
                    model.zero_grad(set_to_none=True)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    m = neuron_compile.metrics()
    graphs = [{"name": getattr(e, "name", "?"), "cache_key": k} for k, e in _MEMORY.items() if k not in before]
    return {"factory": spec, "input_sets": len(sets), "train": train, "graphs": m["graphs"],
            "graphs_compiled": m["graphs_compiled"], "disk_hits": m["disk_hits"], "memory_hits": m["memory_hits"],
            "kernels": m["kernels"], "host_calls": m["host_calls"], "seconds": round(time.perf_counter() - t0, 3),
            "phase_seconds": {k: round(v, 3) for k, v in m["seconds"].items() if not k.startswith("pass:")},
            "graph_keys": graphs}
