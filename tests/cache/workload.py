"""A workload run in fresh processes by the cache tests.

    python -m tests.cache.workload train|infer

Prints one JSON line: neuron-compile metrics and a sha256 of every output bit, so two runs can be
compared for bit-identical results.
"""
from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.nn.functional as F

import neuron_compile.counters as M


def main(mode: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.LayerNorm(24), torch.nn.GELU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(24, 5))
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    x = torch.randn(6, 12)
    y = torch.randint(0, 5, (6,))
    h = hashlib.sha256()
    if mode == "infer":
        model.eval()
        with torch.no_grad():
            out = compiled(x)
        h.update(out.numpy().tobytes())
        expected = model(x)
        ok = torch.allclose(out, expected, rtol=1e-5, atol=1e-6)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(compiled(x), y)
            loss.backward()
            opt.step()
            h.update(loss.detach().numpy().tobytes())
        for p in model.parameters():
            h.update(p.detach().numpy().tobytes())
        ok = bool(torch.isfinite(loss))
    m = M.metrics()
    print(json.dumps({"ok": ok, "sha256": h.hexdigest(), **{k: v for k, v in m.items() if k != "seconds"}}))


if __name__ == "__main__":
    main(sys.argv[1])
