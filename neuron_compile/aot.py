"""Ahead-of-time compilation of a model: ``neuron-compile compile FILE.py:FACTORY | FILE.pt2``.

The factory is a function in the user's file returning ``(model, example_inputs)`` or
``(model, example_inputs, optimizer)``; ``example_inputs`` is one tuple of positional arguments or
a list of such tuples (one per input shape the program will call the model with: with
``dynamic=False`` each shape is its own graph). A ``.pt2`` file is a ``torch.export`` program: its
module, called with the example inputs it was exported with. For each input set the model is compiled with
``torch.compile(model, backend="neuron", dynamic=False)`` in compile-only mode
(:class:`~neuron_compile.config.Config` ``compile_only``), in eval mode under ``no_grad`` (the
inference graph) and, with ``train``, in train mode with a backward pass (the forward and backward
graphs). Those are the very graphs, and so the very cache keys, that a later ``torch.compile`` of
the same model with the same options looks up: that run compiles nothing (check it with
``NEURON_CACHE_STRICT=1``). As ``iree-compile`` does for IREE, and TorchNeuron's
``neuron_parallel_compile`` did for its XLA path.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

import torch


def load_factory(spec: str) -> Callable[[], Any]:
    """``path/to/file.py:function`` → the function (the file is imported as a module named after
    it, with its directory on ``sys.path`` so its own imports work).

    Raises:
        ValueError: not ``FILE.py:NAME``, no such file, or no such function in it.
    """
    path, sep, name = spec.rpartition(":")
    if not sep or not path.lower().endswith(".py") or not name.isidentifier():
        raise ValueError(f"{spec!r}: expected path/to/file.py:factory_function")
    file = Path(path).resolve()
    if not file.is_file():
        raise ValueError(f"{spec!r}: no such file {file}")
    sys.path.insert(0, str(file.parent))
    loader = importlib.machinery.SourceFileLoader(file.stem, str(file))  # any suffix case (.PY)
    module_spec = importlib.util.spec_from_file_location(file.stem, file, loader=loader)
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
    """Backward from every floating-point output that requires grad (outputs are any pytree: a
    tensor, tuples, dicts, a Hugging Face ``ModelOutput``), with ones as their gradients.

    Raises:
        ValueError: no output requires grad, so there is no backward graph to compile.
    """
    from torch.utils._pytree import tree_leaves
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not tensors:
        raise ValueError("--train: no output of the model requires grad (no parameters or inputs require "
                         "grad?), so there is no backward graph to compile")
    if tensors:
        torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])


@dataclass
class Target:
    """What ``neuron-compile compile`` compiles: a model, the input sets it is called with, and
    optionally an optimizer whose ``step`` is compiled too (``--train``)."""

    model: torch.nn.Module
    input_sets: list[tuple]
    optimizer: torch.optim.Optimizer | None = None


def load_target(spec: str) -> Target:
    """``FILE.py:FACTORY`` (the factory returns ``(model, example_inputs[, optimizer])``) or a
    ``torch.export`` program file ``FILE.pt2`` (``torch.export.save``; its module and the example
    inputs it was exported with).

    Raises:
        ValueError: a missing file or function, a factory returning something else, or a program
            without example inputs (or with keyword inputs).
    """
    if spec.lower().endswith(".pt2"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"{spec!r}: no such file")
        import zipfile
        if not zipfile.is_zipfile(path):  # (torch.export.load logs a traceback before raising)
            raise ValueError(f"{spec}: not a torch.export program file (not a .pt2 archive)")
        try:
            ep = torch.export.load(path)
        except Exception as exc:
            raise ValueError(f"{spec}: not a torch.export program file ({type(exc).__name__}: {exc})") from None
        example = ep.example_inputs
        if example is None or example[1]:
            raise ValueError(f"{spec}: the program carries no positional example inputs; export it with "
                             "torch.export.export(model, args) and no keyword arguments")
        return Target(ep.module(), [tuple(example[0])])
    made = load_factory(spec)()
    if not isinstance(made, tuple) or len(made) not in (2, 3) or not isinstance(made[0], torch.nn.Module):
        raise ValueError(f"{spec}: the factory must return (model, example_inputs) or "
                         "(model, example_inputs, optimizer) with an nn.Module model")
    optimizer = made[2] if len(made) == 3 else None
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"{spec}: the factory's third value must be a torch.optim.Optimizer, "
                         f"got {type(optimizer).__name__}")
    return Target(made[0], _input_sets(made[1]), optimizer)


def _set_mode(model: torch.nn.Module, train: bool) -> None:
    """``model.train(train)``, except for a ``torch.export`` module, whose mode was fixed at export
    (its ``train``/``eval`` raise ``NotImplementedError`` in torch 2.13)."""
    try:
        model.train(train)
    except NotImplementedError:
        pass


def call_model(model: torch.nn.Module, *args: Any) -> Any:
    """``model(*args)``: the function ``--save-function`` compiles and saves (load it with
    ``torch.compiler.load_compiled_function`` and call it as ``fn(model, *args)``)."""
    return model(*args)


def save_function(spec: str, path: str, options: dict | None = None) -> dict[str, Any]:
    """``torch.compile(call_model, backend="neuron", dynamic=False, fullgraph=True).aot_compile``
    on the target's model and first input set (inference), saved to ``path`` with
    ``save_compiled_function``: a later process loads it with no tracing (README, *Warm starts*).
    Guards that cannot be serialized are dropped (:func:`~neuron_compile.serialized.serializable_guards`)."""
    target = load_target(spec)
    model, args = target.model, target.input_sets[0]
    _set_mode(model, False)
    t0 = time.perf_counter()
    from neuron_compile.serialized import serializable_guards
    opts = {**(options or {}), "guard_filter_fn": serializable_guards}
    fn = torch.compile(call_model, backend="neuron", dynamic=False, fullgraph=True,
                       options=opts).aot_compile(((model, *args), {}))
    fn.save_compiled_function(path)
    return {"saved_function": path, "seconds": round(time.perf_counter() - t0, 3)}


def _units(target: Target, train: bool) -> list[tuple[int, str]]:
    """The compile units: (input set, ``inference`` | ``train``), in order."""
    n = len(target.input_sets)
    return [(i, "inference") for i in range(n)] + ([(i, "train") for i in range(n)] if train else [])


def compile_units(spec: str, units: list[tuple[int, str]], options: dict[str, Any], progress: Any = None,
                  target: Target | None = None) -> dict[str, Any]:
    """Compile ``units`` of ``spec``'s target in this process, in compile-only mode; returns this
    process's metrics and the cache keys of the graphs it compiled or found. A ``train`` unit runs
    forward and backward and, when the target has an optimizer, ``optimizer.step`` compiled with
    ``torch.compile(optimizer.step, backend="neuron", dynamic=False)`` (so a run that compiles its
    step the same way finds it cached). ``target``: ``spec`` already loaded in this process."""
    import warnings

    import neuron_compile
    from neuron_compile.cache import _MEMORY
    target = target or load_target(spec)
    model = target.model
    opts = {**options, "compile_only": True}
    compiled = torch.compile(model, backend="neuron", dynamic=False, options=opts)
    step = (torch.compile(target.optimizer.step, backend="neuron", dynamic=False, options=opts)
            if target.optimizer is not None else None)
    neuron_compile.reset_metrics()
    before = set(_MEMORY)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="neuron-compile compile_only")
        for index, mode in units:
            args = target.input_sets[index]
            if mode == "inference":
                _set_mode(model, False)
                with torch.no_grad():
                    compiled(*args)
            else:
                _set_mode(model, True)
                _backward(compiled(*args))
                if step is not None:
                    step()
                model.zero_grad(set_to_none=True)
            if progress is not None:
                progress()
    m = neuron_compile.metrics()
    return {"graphs": m["graphs"], "graphs_compiled": m["graphs_compiled"], "disk_hits": m["disk_hits"],
            "memory_hits": m["memory_hits"], "kernels": m["kernels"], "host_calls": m["host_calls"],
            "phase_seconds": {k: v for k, v in m["seconds"].items() if not k.startswith("pass:")},
            "graph_keys": [{"name": getattr(e, "name", "?"), "cache_key": k} for k, e in _MEMORY.items()
                           if k not in before]}


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {k: sum(p[k] for p in parts) for k in
                             ("graphs", "graphs_compiled", "disk_hits", "memory_hits", "kernels", "host_calls")}
    seconds: dict[str, float] = {}
    for p in parts:
        for k, v in p["phase_seconds"].items():
            seconds[k] = seconds.get(k, 0.0) + v
    total["phase_seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    # a graph two processes both reached (the optimizer step of each input set's training) once
    total["graph_keys"] = list({g["cache_key"]: g for p in parts for g in p["graph_keys"]}.values())
    return total


def compile_target(spec: str, train: bool = False, options: dict | None = None, progress: bool = True,
                   jobs: int = 1) -> dict[str, Any]:
    """Compile (and cache) every graph of ``spec``'s target (``FILE.py:FACTORY`` or ``FILE.pt2``);
    returns a summary: input sets, graphs handed to the backend, graphs compiled, cache hits,
    kernels, the cache keys of the graphs and seconds per compile phase (summed over processes).

    Args:
        jobs: compile units (input set x inference/training) in this many processes at once
            (``spawn``ed; each imports the target itself); 1 compiles in this process.
    Raises:
        ValueError: a bad target (:func:`load_target`) or ``jobs`` < 1.
        NeuronCompileError: a graph did not compile (from the first unit that failed).
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be 1 or more, got {jobs}")
    target = load_target(spec)
    units = _units(target, train)
    options = dict(options or {})
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(units), desc="compiling", unit="graph set", file=sys.stderr)
    try:
        if jobs == 1 or len(units) == 1:
            parts = [compile_units(spec, units, options, bar.update if bar is not None else None, target)]
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed
            groups = [units[i::jobs] for i in range(min(jobs, len(units)))]
            with ProcessPoolExecutor(len(groups), mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(compile_units, spec, g, options): len(g) for g in groups}
                parts = []
                for fut in as_completed(futures):
                    parts.append(fut.result())
                    if bar is not None:
                        bar.update(futures[fut])
    finally:
        if bar is not None:
            bar.close()
    return {"target": spec, "factory": spec, "input_sets": len(target.input_sets), "train": train,
            "optimizer": target.optimizer is not None and train, "jobs": jobs, **_merge(parts),
            "seconds": round(time.perf_counter() - t0, 3)}
