"""FX graph → MLIR (linalg/tensor/arith/math on tensors) lowering; imported as ``neuron_compile.lowering``."""
