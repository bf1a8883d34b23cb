"""Every OpInfo case either matches eager or is refused cleanly, exactly as the table expects.

``pytest tests/opinfo`` runs the CI subset (first sample of each case); ``pytest tests/opinfo
--opinfo=full -n 2`` runs every sample and prints the coverage table; ``--opinfo-collect``
regenerates ``expectations.py``. See :mod:`tests.opinfo.harness` for how a sample is judged.
"""
from __future__ import annotations

from tests.opinfo import harness, table

EXPECTED = table.load()


def test_opinfo_case_matches_table(opinfo_case, request):
    opinfo, dtype = opinfo_case
    full = request.config.getoption("--opinfo") == "full"
    result = harness.run_case(opinfo, dtype, None if full else 1)
    request.node.user_properties.append(
        ("opinfo", table.record(opinfo, dtype, harness.family(opinfo), result)))

    failures = result.failures()
    assert not failures, "wrong results or crashes (never acceptable):\n" + "\n".join(failures)
    if request.config.getoption("--opinfo-collect"):
        return
    expected = EXPECTED.get((id(opinfo), dtype), (opinfo, "pass", ""))[1]
    observed = result.outcome()
    counts = result.counts()
    assert harness.SEVERITY[observed] <= harness.SEVERITY[expected], (
        f"expected {expected}, observed {observed} ({counts}): "
        f"{'; '.join(s.detail for s in result.samples if s.outcome == observed)}. "
        "If this refusal is intended, regenerate the table with --opinfo-collect.")
    assert not (result.complete and harness.SEVERITY[observed] < harness.SEVERITY[expected]), (
        f"unexpected improvement: the table says {expected}, every sample gave at worst {observed} "
        f"({counts}); regenerate the table with --opinfo-collect.")
