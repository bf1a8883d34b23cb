"""Shared test setup: a fresh Dynamo cache per test and helpers comparing against eager."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Tests (and the subprocesses they start) use their own artifact cache, never the user's."""
    import os
    old = os.environ.get("NEURON_CACHE_DIR")
    os.environ["NEURON_CACHE_DIR"] = str(tmp_path_factory.mktemp("neuron-cache"))
    yield
    if old is None:
        os.environ.pop("NEURON_CACHE_DIR", None)
    else:
        os.environ["NEURON_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def neuron_compile(fn, **kw):
    """``torch.compile(fn, backend="neuron", dynamic=False)`` (the way users are told to call it)."""
    return torch.compile(fn, backend="neuron", dynamic=False, **kw)


def pytest_addoption(parser):
    group = parser.getgroup("opinfo", "OpInfo sweep (tests/opinfo)")
    group.addoption("--opinfo", choices=("ci", "full"), default="ci",
                    help="ci: the first sample of a deterministic subset of cases (the default); "
                         "full: every sample of every case (run with -n 2; prints the coverage table)")
    group.addoption("--opinfo-dtypes", default="float32,int64,bool,float16,bfloat16",
                    help="comma-separated dtypes to sweep (default: float32,int64,bool,float16,bfloat16)")
    group.addoption("--opinfo-part", default="0/1", metavar="K/N",
                    help="only the ops whose name's CRC is K modulo N (a fixed share of the cases; default 0/1: all)")
    group.addoption("--opinfo-collect", action="store_true",
                    help="rewrite tests/opinfo/expectations.py from this run's outcomes instead of "
                         "checking them (wrong results and crashes still fail)")
    group.addoption("--opinfo-report", default=None, metavar="PATH",
                    help="also write every case's record (sample counts by outcome, notes) to PATH as JSON")
