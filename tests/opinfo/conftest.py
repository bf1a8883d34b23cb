"""Parametrize the OpInfo sweep, gather each case's record, print coverage, regenerate the table."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.opinfo import harness, table

_RECORDS: list[dict] = []


def pytest_generate_tests(metafunc):
    if "opinfo_case" not in metafunc.fixturenames:
        return
    cfg = metafunc.config
    dtypes = tuple(getattr(torch, d.strip()) for d in cfg.getoption("--opinfo-dtypes").split(","))
    full = cfg.getoption("--opinfo") == "full"
    part = harness.OpShare.parse(cfg.getoption("--opinfo-part"))
    cs = [c for c in harness.cases(dtypes) if (full or harness.in_ci_sample(*c)) and part.holds(c[0])]
    metafunc.parametrize("opinfo_case", cs,
                         ids=[f"{harness.op_id(o)}-{table.DTYPE_NAMES[d]}" for o, d in cs])


def pytest_runtest_logreport(report):
    if report.when == "call":
        _RECORDS.extend(rec for name, rec in report.user_properties if name == "opinfo")


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _RECORDS and _is_controller(config):
        terminalreporter.section("neuron-compile OpInfo coverage (samples by outcome)")
        for line in table.summary(_RECORDS):
            terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    report = config.getoption("--opinfo-report")
    if report and _RECORDS and _is_controller(config):
        Path(report).write_text(json.dumps(_RECORDS, indent=1))
    if not (config.getoption("--opinfo-collect") and _RECORDS and _is_controller(config)):
        return
    runs = []
    for rec in _RECORDS:
        if rec["outcome"] in harness.SEVERITY:
            runs.append((harness.op_db_by_id(rec["op"]), getattr(torch, rec["dtype"]), rec["outcome"],
                         rec["note"], rec["complete"]))
    table.write(table.merge(table.load(), runs))
