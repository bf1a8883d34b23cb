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
