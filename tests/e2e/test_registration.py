"""The backend is found by name in a fresh interpreter, and a second 'neuron' registration is loud."""
from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
import textwrap

import pytest
import torch


def test_backend_by_name_in_fresh_interpreter_without_importing_us():
    code = textwrap.dedent("""
        import sys, torch
        f = torch.compile(lambda x: (x * 2).relu(), backend="neuron", dynamic=False)
        x = torch.tensor([-1.0, 0.5, 2.0])
        assert torch.equal(f(x), (x * 2).relu()), f(x)
        assert torch._dynamo.utils.counters["neuron"]["graphs"] == 1
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_set_default_backend_then_plain_torch_compile_uses_neuron():
    prev = torch.compiler.get_default_backend() if hasattr(torch.compiler, "get_default_backend") else "inductor"
    torch.compiler.set_default_backend("neuron")
    try:
        torch._dynamo.utils.counters["neuron"].clear()
        m = torch.nn.Linear(3, 2)
        x = torch.randn(4, 3)
        torch.testing.assert_close(torch.compile(m, dynamic=False)(x), m(x))
        assert torch._dynamo.utils.counters["neuron"]["graphs"] >= 1
    finally:
        torch.compiler.set_default_backend(prev)


def test_one_backend_object_so_dynamo_does_not_recompile():
    from neuron_compile.backend import neuron_backend
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("neuron") is neuron_backend
    torch._dynamo.utils.counters["neuron"].clear()
    for _ in range(3):
        f = torch.compile(lambda x: x + 1, backend="neuron", dynamic=False)
        f(torch.randn(3))
    assert torch._dynamo.utils.counters["neuron"]["graphs"] == 1


def test_conflicting_neuron_registration_warns_naming_both(monkeypatch):
    class FakeDist:
        name = "torch-neuronx"

    other = importlib.metadata.EntryPoint("neuron", "torch_neuronx.backend:neuron", "torch_dynamo_backends")
    ours = importlib.metadata.EntryPoint("neuron", "neuron_compile.backend:neuron_backend", "torch_dynamo_backends")
    other = other._for(FakeDist()) if hasattr(other, "_for") else other
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [ours, other])
    import neuron_compile.backend as backend
    with pytest.warns(RuntimeWarning, match=r"torch_neuronx\.backend:neuron.*torch-neuronx") as rec:
        backend._warn_on_conflicting_registration()
    assert "neuron_compile.backend:neuron_backend" in str(rec[0].message)
