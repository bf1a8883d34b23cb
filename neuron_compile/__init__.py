"""neuron-compile: a graph compiler for PyTorch built the MLIR way.

Use it through ``torch.compile(model, backend="neuron", dynamic=False)``. Importing this package is
cheap; MLIR tools run only when a graph is compiled.
"""
from neuron_compile.errors import (CacheError, DynamicShapeError, LoweringError, NeuronCompileError,
                                   PipelineError, RuntimeCallError, UnsupportedOpsError)

__version__ = "0.1.0"


def __getattr__(name: str):
    # lazy, so `import neuron_compile` and backend lookup stay cheap
    if name in ("metrics", "reset_metrics", "get_fallback_ops"):
        from neuron_compile import counters as m
        return getattr(m, name)
    if name == "load_executable":
        from neuron_compile.executable import load_executable
        return load_executable
    if name in ("save_bundle", "load_bundle"):
        from neuron_compile import bundle
        return getattr(bundle, name)
    if name == "serializable_guards":
        from neuron_compile.serialized import serializable_guards
        return serializable_guards
    if name == "explain_key":
        from neuron_compile.cache_key import explain_key
        return explain_key
    raise AttributeError(f"module 'neuron_compile' has no attribute {name!r}")


__all__ = ["CacheError", "DynamicShapeError", "LoweringError", "NeuronCompileError", "PipelineError",
           "RuntimeCallError", "UnsupportedOpsError", "__version__", "explain_key", "get_fallback_ops", "load_bundle", "load_executable", "metrics",
           "reset_metrics", "save_bundle", "serializable_guards"]
