"""Shared test setup: a fresh Dynamo cache per test and helpers comparing against eager."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def neuron_compile(fn, **kw):
    """``torch.compile(fn, backend="neuron", dynamic=False)`` (the way users are told to call it)."""
    return torch.compile(fn, backend="neuron", dynamic=False, **kw)
