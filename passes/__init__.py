"""FX-graph passes (decomposition, canonicalization, checks); imported as ``neuron_compile.passes``."""
