"""Lowering rules grouped by op family; each module registers its rules on import."""
