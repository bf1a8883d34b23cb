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


def _save_then_load(tmp_path, name: str, text: str) -> tuple[dict, dict]:
    """Run ``text`` as a script that saves a compiled function, then as one that loads it, each in a
    fresh process against one cache; their JSON reports."""
    script = tmp_path / f"{name}.py"
    script.write_text(text)
    saved, cache = tmp_path / f"{name}.fn", tmp_path / "cache"
    return _run("save", script, saved, cache), _run("load", script, saved, cache)


def test_saved_function_loads_in_a_fresh_process_without_tracing_or_compiling(tmp_path):
    cold, warm = _save_then_load(tmp_path, "mlp", SCRIPT)
    assert cold["compiled"] == 2 and cold["traced"] >= 1 and cold["err"] < 1e-5
    assert warm["compiled"] == 0 and warm["traced"] == 0  # guards and graphs came from the file
    assert warm["err"] < 1e-5


GPT2 = textwrap.dedent('''
    import json, sys, warnings
    import torch, transformers
    import neuron_compile
    from torch._dynamo.utils import counters

    def make():
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                                      bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
        model.loss_type = "ForCausalLM"
        return model

    def run(model, ids):
        return model(input_ids=ids, labels=ids).loss

    model, ids = make(), torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    path = sys.argv[2]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. AOTAutograd's "not boxed" on a loaded backward
        if sys.argv[1] == "save":
            fn = torch.compile(run, backend="neuron", dynamic=False, fullgraph=True,
                               options={"guard_filter_fn": neuron_compile.serializable_guards}
                               ).aot_compile(((model, ids), {}))
            fn.save_compiled_function(path)
        else:
            with open(path, "rb") as f:
                fn = torch.compiler.load_compiled_function(f)
        loss = fn(model, ids)
        loss.backward()
    ref = make().double()
    want = run(ref, ids)
    want.backward()
    err = max([abs(loss.item() - want.item())]
              + [(p.grad.double() - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters())])
    m = neuron_compile.metrics()
    print(json.dumps({"err": err, "compiled": m["graphs_compiled"], "traced": counters["stats"].get("unique_graphs", 0)}))
''')


def test_a_saved_gpt2_training_step_loads_without_tracing_with_serializable_guards(tmp_path):
    """Hugging Face GPT-2 keeps a guard derived from ID_MATCH (a closure's code object) that
    aot_compile's default filter keeps and save_compiled_function refuses; serializable_guards
    drops it, and the loaded step (loss and every gradient) matches float64 eager."""
    cold, warm = _save_then_load(tmp_path, "gpt2", GPT2)
    assert cold["compiled"] == 2 and cold["traced"] >= 1 and cold["err"] < 1e-4
    assert warm["compiled"] == 0 and warm["traced"] == 0 and warm["err"] < 1e-4
