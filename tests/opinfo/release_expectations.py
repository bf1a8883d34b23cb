"""Expected outcomes of OpInfo cases whose op only some supported torch release has in its
``op_db`` (2.14 added entries). Hand-kept, unlike ``expectations.py``: that table is generated and
names ops through ``harness.op``, which fails loudly on an op the running release lacks.
``table.load`` adds a row when the running release has the op; ``table.write`` leaves these ops out.
"""
from tests.opinfo.harness import F32

# (op name, variant, dtype, outcome, note); the release that added the op in the comment
ROWS = [
    ("linalg.polar", "", F32, "unsupported", "aten.linalg_polar.default"),  # torch 2.14
    ("linalg.matrix_sqrth", "", F32, "unsupported", "aten.linalg_matrix_sqrth.default"),  # torch 2.14
]
