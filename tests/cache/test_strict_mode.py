"""NEURON_CACHE_STRICT=1: a warm deployment proves it compiles nothing; a miss is a CacheError that
names the graph and the key parts differing from the nearest stored entry."""
from __future__ import annotations

import pytest
import torch

import neuron_compile
from neuron_compile.cache import clear_memory_cache
from neuron_compile.errors import CacheError
from tests.e2e.test_errors import unwrap


def _run(fn, x, cache_dir, strict):
    torch._dynamo.reset()
    clear_memory_cache()
    return torch.compile(fn, backend="neuron", dynamic=False,
                         options={"cache_dir": str(cache_dir), "cache_strict": strict})(x)


def f(x):
    return torch.tanh(x) * 3


def test_strict_mode_loads_what_was_compiled_and_refuses_the_rest(tmp_path):
    x = torch.randn(4, 5, dtype=torch.float64)
    want = torch.tanh(x) * 3
    with pytest.raises(Exception) as info:  # empty cache: nothing to load
        _run(f, x.float(), tmp_path, True)
    err = unwrap(info.value, CacheError)
    assert isinstance(err, CacheError) and "empty" in str(err) and "NEURON_CACHE_STRICT" in str(err)
    _run(f, x.float(), tmp_path, False)  # the ahead-of-time compile fills the cache
    neuron_compile.reset_metrics()
    got = _run(f, x.float(), tmp_path, True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert neuron_compile.metrics()["graphs_compiled"] == 0 and neuron_compile.metrics()["disk_hits"] == 1
    # another input shape: the nearest entry differs in the input specs (and the traced graph)
    with pytest.raises(Exception) as info:
        _run(f, torch.randn(4, 6), tmp_path, True)
    err = unwrap(info.value, CacheError)
    assert isinstance(err, CacheError)
    message = str(err)
    assert "graph_" in message and "inputs" in message.split("differs in:")[1].split(".")[0]


def test_compile_only_fills_the_cache_then_a_strict_run_computes(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU())
    x = torch.randn(3, 5)
    torch._dynamo.reset()
    clear_memory_cache()
    neuron_compile.reset_metrics()
    with pytest.warns(RuntimeWarning, match="compile_only"):
        out = torch.compile(model, backend="neuron", dynamic=False,
                            options={"cache_dir": str(tmp_path), "compile_only": True})(x)
        out.sum().backward()  # the backward graph compiles too
    assert out.shape == (3, 7) and out.dtype == torch.float32 and not out.any()  # a placeholder
    assert neuron_compile.metrics()["graphs_compiled"] == 2
    model.zero_grad()
    torch._dynamo.reset()
    clear_memory_cache()
    neuron_compile.reset_metrics()
    got = torch.compile(model, backend="neuron", dynamic=False,
                        options={"cache_dir": str(tmp_path), "cache_strict": True})(x)
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
    got.sum().backward()
    assert neuron_compile.metrics()["graphs_compiled"] == 0 and neuron_compile.metrics()["disk_hits"] == 2
