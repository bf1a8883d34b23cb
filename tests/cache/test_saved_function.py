"""``torch.compile(fn, backend="neuron").aot_compile(...)`` saves with ``save_compiled_function`` and
loads in a fresh process with ``torch.compiler.load_compiled_function``: no Dynamo tracing, no
compile, eager's results (forward and gradients)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, sys, time
    import torch
    import neuron_compile
    from torch._dynamo.utils import counters

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 64)
            self.b = torch.nn.Linear(64, 8)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x)))

    def run(model, x):
        return model(x)

    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 32, dtype=torch.float64)
    path = sys.argv[2]
    t0 = time.perf_counter()
    if sys.argv[1] == "save":
        fn = torch.compile(run, backend="neuron", dynamic=False, fullgraph=True).aot_compile(((model, x.float()), {}))
        fn.save_compiled_function(path)
    else:
        with open(path, "rb") as f:
            fn = torch.compiler.load_compiled_function(f)
    out = fn(model, x.float())
    out.sum().backward()
    first_call = time.perf_counter() - t0
    grads = [p.grad.double() for p in model.parameters()]
    ref = model.double()
    for p in ref.parameters():
        p.grad = None
    want = run(ref, x)
    want.sum().backward()
    err = max([(out.double() - want).abs().max().item()]
              + [(g - p.grad).abs().max().item() for g, p in zip(grads, ref.parameters())])
    m = neuron_compile.metrics()
    print(json.dumps({"seconds": first_call, "err": err, "compiled": m["graphs_compiled"],
                      "traced": counters["stats"].get("unique_graphs", 0)}))
''')


def _run(mode, script, path, cache):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_")}, "NEURON_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, str(script), mode, str(path)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_saved_function_loads_in_a_fresh_process_without_tracing_or_compiling(tmp_path):
    script = tmp_path / "mlp.py"
    script.write_text(SCRIPT)
    saved, cache = tmp_path / "mlp.fn", tmp_path / "cache"
    cold = _run("save", script, saved, cache)
    assert cold["compiled"] == 2 and cold["traced"] >= 1 and cold["err"] < 1e-5
    warm = _run("load", script, saved, cache)
    assert warm["compiled"] == 0 and warm["traced"] == 0  # guards and graphs came from the file
    assert warm["err"] < 1e-5
