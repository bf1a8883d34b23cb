"""The cache key: stable for the same graph, new for any change of a named part."""
from __future__ import annotations

import json
import subprocess
import sys

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.cache_key import canonical_graph, explain_key, make_cache_key
from neuron_compile.lowering.emit import graph_input_specs


def _key(fn, *args, options=None, target="host-cpu:x"):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    specs = [s.to_json() for s in graph_input_specs(gm)]
    return make_cache_key(gm, specs, options or {"opt_level": 3}, target)


def g(x, w):
    return (x @ w).relu() * 0.5


def test_same_graph_same_key_in_another_process():
    here = _key(g, torch.randn(3, 4), torch.randn(4, 5)).digest
    code = ("import torch; from tests.cache.test_cache_key import _key, g; "
            "print(_key(g, torch.randn(3, 4), torch.randn(4, 5)).digest)")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert there == here


def test_any_part_change_gives_a_new_key():
    base = _key(g, torch.randn(3, 4), torch.randn(4, 5))
    variants = {
        "graph": _key(lambda x, w: (x @ w).relu() * 0.25, torch.randn(3, 4), torch.randn(4, 5)),
        "inputs": _key(g, torch.randn(3, 4), torch.randn(5, 4).t()),   # same shapes, other strides
        "options": _key(g, torch.randn(3, 4), torch.randn(4, 5), options={"opt_level": 2}),
        "target": _key(g, torch.randn(3, 4), torch.randn(4, 5), target="host-cpu:y"),
    }
    for part, k in variants.items():
        assert k.digest != base.digest, part
        changed = {n for n, h in k.part_hashes().items() if h != base.part_hashes()[n]}
        assert part in changed, (part, changed)
    for part in ("torch", "mlir", "compiler", "format"):
        assert part in base.part_hashes()


def test_canonical_graph_has_no_names_addresses_or_paths():
    gm = make_fx(g, tracing_mode="fake")(torch.randn(3, 4), torch.randn(4, 5))
    text = canonical_graph(gm)
    assert "0x" not in text and "/" not in text and "arg0" not in text and "relu" in text
    assert "float32[3, 5][5, 1]" in text


def test_explain_key_lists_every_named_part():
    k = _key(g, torch.randn(3, 4), torch.randn(4, 5))
    text = explain_key(k)
    assert text.splitlines()[0] == f"cache key {k.digest}"
    names = [line.split()[0] for line in text.splitlines()[1:]]
    assert names == ["format", "graph", "inputs", "options", "compiler", "torch", "mlir", "target"]
    assert json.loads(dict(k.parts)["options"]) == {"opt_level": 3}
