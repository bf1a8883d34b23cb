"""The expectation table of the OpInfo sweep: read it, merge a run into it, write it, summarise a run.

The table (``expectations.py``, generated) lists every (OpInfo, dtype) case that does not pass,
keyed by the OpInfo object itself (looked up with :func:`tests.opinfo.harness.op`, which raises on a
name op_db does not have); a case that is not listed must pass.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from tests.opinfo.harness import SEVERITY, op_id

TABLE_PATH = Path(__file__).with_name("expectations.py")
DTYPE_NAMES = {torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL", torch.float16: "F16",
               torch.bfloat16: "BF16"}

HEADER = '''"""Expected outcome of each OpInfo (op, dtype) case that does not pass. GENERATED: do not edit.

Regenerate from a run with ``pytest tests/opinfo --opinfo-collect`` (add ``--opinfo=full -n 2`` for
every sample). A case that is not listed must pass; ``unsupported`` means some samples raise a clean
UnsupportedOpsError (the comment names the ATen ops), ``dynamo`` that Dynamo refuses to capture some
samples under fullgraph=True before our backend runs. Wrong results and crashes are never entries.
"""
from tests.opinfo.harness import BF16, BOOL, F16, F32, I64, op

EXPECTED = [
'''


def load() -> dict[tuple[int, torch.dtype], tuple[object, str, str]]:
    """``{(id(opinfo), dtype): (opinfo, outcome, note)}`` from ``expectations.py``."""
    from tests.opinfo.expectations import EXPECTED
    from tests.opinfo.harness import op
    from tests.opinfo.release_expectations import ROWS
    out = {}
    for row in EXPECTED:
        opinfo, dtype, outcome = row[:3]
        note = row[3] if len(row) > 3 else ""
        out[(id(opinfo), dtype)] = (opinfo, outcome, note)
    for name, variant, dtype, outcome, note in ROWS:  # ops only some supported release has
        try:
            opinfo = op(name, variant)
        except KeyError:
            continue
        out[(id(opinfo), dtype)] = (opinfo, outcome, note)
    return out


def _release_only_ids() -> set[int]:
    from tests.opinfo.harness import op_db
    from tests.opinfo.release_expectations import ROWS
    names = {(name, variant) for name, variant, *_ in ROWS}
    return {id(o) for o in op_db if (o.name, o.variant_test_name) in names}


def merge(table, runs) -> dict:
    """Fold a run's case results into ``table``. A case that ran all its samples takes the outcome
    it observed; a case that ran only some keeps the worse of the old and the observed outcome
    (a first-sample pass says nothing about the rest)."""
    table = dict(table)
    for opinfo, dtype, outcome, note, complete in runs:
        key = (id(opinfo), dtype)
        old = table.get(key, (opinfo, "pass", ""))
        if not complete and SEVERITY[old[1]] >= SEVERITY[outcome]:
            continue
        if outcome == "pass":
            table.pop(key, None)
        else:
            table[key] = (opinfo, outcome, note)
    return table


def write(table, path: Path = TABLE_PATH) -> None:
    """Write the table as Python, sorted by op name then dtype (atomically: tmp file + rename)."""
    from tests.opinfo.harness import op_db
    order = {id(o): i for i, o in enumerate(op_db)}
    lines = [HEADER]
    release_only = _release_only_ids()  # kept by hand in release_expectations.py
    for (oid, dtype), (opinfo, outcome, note) in sorted(
            table.items(), key=lambda kv: (order[kv[0][0]], str(kv[0][1]))):
        if oid in release_only:
            continue
        args = f'"{opinfo.name}"' + (f', "{opinfo.variant_test_name}"' if opinfo.variant_test_name else "")
        lines.append(f'    (op({args}), {DTYPE_NAMES[dtype]}, "{outcome}", {note[:150]!r}),\n')
    lines.append("]\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(path)


def summary(records) -> list[str]:
    """Coverage table lines from the per-case records of a run: samples by outcome, per family and
    dtype, and the share of samples that pass."""
    outcomes = ("pass", "unsupported", "dynamo", "wrong", "crash", "hang")
    rows = defaultdict(lambda: defaultdict(int))
    for rec in records:
        for key in ((rec["dtype"], rec["family"]), (rec["dtype"], "ALL")):
            for k in outcomes:
                rows[key][k] += rec["counts"][k]
            rows[key]["cases"] += 1
    head = f"{'dtype':<9}{'family':<15}{'cases':>6}{'samples':>9}" + "".join(f"{k:>12}" for k in outcomes) + f"{'pass %':>8}"
    out = [head, "-" * len(head)]
    for (dtype, fam), r in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] == "ALL", kv[0][1])):
        n = sum(r[k] for k in outcomes)
        pct = 100.0 * r["pass"] / n if n else 0.0
        out.append(f"{dtype:<9}{fam:<15}{r['cases']:>6}{n:>9}" + "".join(f"{r[k]:>12}" for k in outcomes) + f"{pct:>7.1f}%")
    return out


def record(opinfo, dtype, family, result) -> dict:
    """The JSON-able record of one case's run (what the summary and the collector consume)."""
    notes = sorted({s.detail for s in result.samples if s.outcome == result.outcome() and s.detail})
    return {"op": op_id(opinfo), "dtype": str(dtype).replace("torch.", ""), "family": family,
            "counts": result.counts(), "outcome": result.outcome(), "note": "; ".join(notes),
            "complete": result.complete}
