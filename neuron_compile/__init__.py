"""neuron-compile: a graph compiler for PyTorch built the MLIR way.

Use it through ``torch.compile(model, backend="neuron", dynamic=False)``. Importing this package is
cheap; MLIR tools run only when a graph is compiled.
"""
from neuron_compile.errors import (CacheError, DynamicShapeError, LoweringError, NeuronCompileError,
                                   PipelineError, RuntimeCallError, UnsupportedOpsError)

__version__ = "0.1.0"

__all__ = ["CacheError", "DynamicShapeError", "LoweringError", "NeuronCompileError", "PipelineError",
           "RuntimeCallError", "UnsupportedOpsError", "__version__"]
