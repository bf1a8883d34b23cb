"""``neuron-compile compile FILE.py:FACTORY``: ahead-of-time compilation into the cache that a later
``torch.compile`` run reads, proved with ``NEURON_CACHE_STRICT=1`` in a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "neuron_compile.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_")}
    return {**env, **extra}


def dumped_graph_reference(graph_dump_dir: Path) -> tuple[list, list]:
    """The inputs and eager outputs of one dumped graph, from the ``repro.py`` its dump holds
    (``Repro`` is the FX graph's own code, run by eager PyTorch)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"repro_{graph_dump_dir.name}", graph_dump_dir / "repro.py")
    repro = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repro)
    args = repro.example_args()
    expected = repro.Repro()(*args)
    return args, list(expected) if isinstance(expected, (list, tuple)) else [expected]


def test_cli_compiles_the_digits_training_so_a_strict_run_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    out = subprocess.run(CLI + ["compile", f"{ROOT}/examples/train_digits.py:neuron_compile_factory", "--train",
                                "--cache-dir", str(cache), "--json"],
                         capture_output=True, text=True, timeout=600, env=_env())
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    # 3 input shapes: an inference graph each, and a forward and a backward graph each
    assert summary["graphs_compiled"] == 9 and len(summary["graph_keys"]) == 9
    run = subprocess.run([sys.executable, f"{ROOT}/examples/train_digits.py", "--epochs", "15"],
                         capture_output=True, text=True, timeout=600,
                         env=_env(NEURON_CACHE_STRICT="1", NEURON_CACHE_DIR=str(cache)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("OK")  # accuracy >= 95% and losses within 1e-4 of eager
    assert "0 compiled" in run.stdout


def test_emit_linalg_writes_mlir_that_compiles_from_linalg(tmp_path):
    dump = tmp_path / "dump"
    out = subprocess.run(CLI + ["compile", f"{ROOT}/examples/train_digits.py:neuron_compile_factory",
                                "--emit", "linalg", "-o", str(dump), "--json"],
                         capture_output=True, text=True, timeout=600, env=_env())
    assert out.returncode == 0, out.stderr
    emitted = json.loads(out.stdout)["emitted"]
    assert len(emitted) == 3 and all(p.endswith(".linalg.mlir") for p in emitted)
    assert not list(dump.glob("*/*.llvm.mlir")) and not list(dump.glob("*/*.obj.*"))  # stopped after linalg
    exe_dir = tmp_path / "exe"  # the plan of the same dump is found beside the linalg file
    back = subprocess.run(CLI + ["compile", emitted[0], "--from", "linalg", "--emit", "obj", "-o", str(exe_dir)],
                          capture_output=True, text=True, timeout=600, env=_env())
    assert back.returncode == 0, back.stderr
    from neuron_compile.executable import load_executable
    exe = load_executable(exe_dir)
    args, expected = dumped_graph_reference(Path(emitted[0]).parent)
    got = exe(args)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.double(), e.double(), rtol=1e-4, atol=1e-5)


def test_a_bad_factory_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from neuron_compile.cli import main
    for k in [k for k in os.environ if k.startswith("NEURON_") and k != "NEURON_CACHE_DIR"]:
        monkeypatch.delenv(k)
    monkeypatch.setattr(sys, "path", [*sys.path])   # the factory's folder and module go when the test ends
    for module in ("model", "broken", "unsupported"):
        monkeypatch.setitem(sys.modules, module, None)
    bad = tmp_path / "model.py"
    bad.write_text("def make():\n    return 3\n")
    broken = tmp_path / "broken.py"
    broken.write_text("def make(:\n")
    unsupported = tmp_path / "unsupported.py"
    unsupported.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                           "        return torch.nextafter(x, x + 1)\ndef make():\n    return M(), (torch.randn(3),)\n")
    for argv, rc, message in (([f"{bad}:make"], 1, "must return (model, example_inputs)"),
                              ([f"{bad}:missing"], 1, "has no function 'missing'"),
                              ([f"{tmp_path}/nope.py:make"], 1, "no such file"),
                              ([f"{broken}:make"], 1, "SyntaxError: invalid syntax"),
                              ([str(bad)], 2, "name the factory function too"),
                              ([f"{bad}:make", "--emit", "bogus"], 1, "unknown phase 'bogus'"),
                              ([f"{unsupported}:make"], 1, "cannot lower 1 op(s)")):
        # in this process (a process each took 19 s of the suite): the exit status main() returns
        # or argparse exits with, and stderr; the process itself is the case below
        capsys.readouterr()
        try:
            got = main(["compile", *argv])
        except SystemExit as exc:
            got = exc.code
        err = capsys.readouterr().err
        assert got == rc and message in err, err
        assert "Traceback" not in err
    out = subprocess.run(CLI + ["compile", f"{bad}:make"], capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 1 and "must return (model, example_inputs)" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


LOAD = """
import sys, torch, neuron_compile
sys.path.insert(0, sys.argv[1])
from train_digits import neuron_compile_factory
from torch._dynamo.utils import counters
model, sets = neuron_compile_factory()
model.eval()
with open(sys.argv[2], "rb") as f:
    fn = torch.compiler.load_compiled_function(f)
out = fn(model, *sets[0])
want = model.double()(sets[0][0].double())
print((out.double() - want).abs().max().item(), neuron_compile.metrics()["graphs_compiled"],
      counters["stats"].get("unique_graphs", 0))
"""


def test_save_function_loads_in_a_fresh_process_without_tracing(tmp_path):
    cache, saved = tmp_path / "cache", tmp_path / "digits.fn"
    out = subprocess.run(CLI + ["compile", f"{ROOT}/examples/train_digits.py:neuron_compile_factory",
                                "--save-function", str(saved), "--cache-dir", str(cache), "--json"],
                         capture_output=True, text=True, timeout=600, env=_env())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["saved_function"] == str(saved)
    run = subprocess.run([sys.executable, "-c", LOAD, f"{ROOT}/examples", str(saved)], capture_output=True,
                         text=True, timeout=600, env=_env(NEURON_CACHE_DIR=str(cache)))
    assert run.returncode == 0, run.stderr[-2000:]
    err, compiled, traced = run.stdout.split()
    assert float(err) < 1e-5 and compiled == "0" and traced == "0"


FACTORY = '''
import torch

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))

def inputs():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g),), (torch.randn(3, 16, generator=g),)]

def make():
    torch.manual_seed(0)
    model = MLP()
    return model, inputs(), torch.optim.AdamW(model.parameters(), lr=1e-2)
'''

TRAIN = '''
import json, sys, torch, neuron_compile
sys.path.insert(0, sys.argv[1])
from factory import make, inputs
model, sets, opt = make()
ref, _, ref_opt = make()
ref = ref.double()
ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
compiled = torch.compile(model, backend="neuron", dynamic=False)
step = torch.compile(opt.step, backend="neuron", dynamic=False)
for (x,) in sets * 2:  # the first and later steps, both input shapes
    opt.zero_grad(); compiled(x).pow(2).sum().backward(); step()
    ref_opt.zero_grad(); ref(x.double()).pow(2).sum().backward(); ref_opt.step()
with torch.no_grad():
    outs = [(compiled(x).double() - ref(x.double())).abs().max().item() for (x,) in sets]
err = max([(p.double() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters())] + outs)
m = neuron_compile.metrics()
print(json.dumps({"err": err, "compiled": m["graphs_compiled"], "hits": m["disk_hits"]}))
'''


def test_cli_jobs_compiles_the_optimizer_step_too_so_a_strict_training_run_compiles_nothing(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    (tmp_path / "train.py").write_text(TRAIN)
    cache = tmp_path / "cache"
    out = subprocess.run(CLI + ["compile", f"{tmp_path}/factory.py:make", "--train", "--jobs", "2",
                                "--cache-dir", str(cache), "-o", str(tmp_path / "mlp.tar.gz"), "--json"],
                         capture_output=True, text=True, timeout=600, env=_env())
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["optimizer"] and summary["jobs"] == 2
    # 2 input sets x (inference, forward, backward) and the optimizer step, each key once
    assert len(summary["graph_keys"]) == 7 == len({g["cache_key"] for g in summary["graph_keys"]})
    assert summary["bundle"]["entries"] == 7
    # the bundle, imported into an empty cache elsewhere, is all a strict training run needs
    other = tmp_path / "elsewhere" / "cache"
    imported = subprocess.run(CLI + ["bundle", "import", str(tmp_path / "mlp.tar.gz"), "--cache-dir", str(other)],
                              capture_output=True, text=True, timeout=300, env=_env())
    assert imported.returncode == 0 and "imported 7" in imported.stdout, imported.stderr
    run = subprocess.run([sys.executable, str(tmp_path / "train.py"), str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env=_env(NEURON_CACHE_STRICT="1", NEURON_CACHE_DIR=str(other)))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["compiled"] == 0 and result["hits"] == 7 and result["err"] < 1e-4


EXPORTED = '''
import json, sys, torch, neuron_compile
ep = torch.export.load(sys.argv[1])
x = ep.example_inputs[0][0]
with torch.no_grad():  # compiled without --train: the inference graph
    out = torch.compile(ep.module(), backend="neuron", dynamic=False)(x)
    want = ep.module()(x)
print(json.dumps({"err": (out - want).abs().max().item(), "compiled": neuron_compile.metrics()["graphs_compiled"]}))
'''


def test_cli_compiles_a_torch_export_program_file(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    program = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(5, 8),)), program)
    cache = tmp_path / "cache"
    out = subprocess.run(CLI + ["compile", str(program), "--cache-dir", str(cache), "--json"],
                         capture_output=True, text=True, timeout=600, env=_env())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["graphs_compiled"] == 1
    (tmp_path / "run.py").write_text(EXPORTED)
    run = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(program)], capture_output=True, text=True,
                         timeout=600, env=_env(NEURON_CACHE_STRICT="1", NEURON_CACHE_DIR=str(cache)))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["compiled"] == 0 and result["err"] < 1e-5
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    refused = subprocess.run(CLI + ["compile", str(bad), "--cache-dir", str(cache)], capture_output=True,
                             text=True, timeout=300, env=_env())
    assert refused.returncode == 1 and "not a torch.export program file" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_dict_output_model_gets_its_backward_compiled_and_bad_outputs_are_refused(tmp_path):
    """--train differentiates every output leaf (a dict here, as a Hugging Face ModelOutput); -o
    naming the model's own file and a disabled cache are refused before anything is written."""
    (tmp_path / "dictmodel.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.l = torch.nn.Linear(4, 3)\n"
        "    def forward(self, x):\n        return {'logits': self.l(x).tanh()}\n"
        "def make():\n    return M(), (torch.randn(2, 4),)\n")
    out = subprocess.run(CLI + ["compile", f"{tmp_path}/dictmodel.py:make", "--train", "--cache-dir",
                                str(tmp_path / "cache"), "--json"], capture_output=True, text=True, timeout=600,
                         env=_env())
    assert out.returncode == 0, out.stderr
    assert any(g["name"].endswith("backward") for g in json.loads(out.stdout)["graph_keys"])
    source = (tmp_path / "dictmodel.py").read_text()
    for argv, env, message in (([f"{tmp_path}/dictmodel.py:make", "-o", f"{tmp_path}/dictmodel.py"], {},
                                "give a new file name"),
                               ([f"{tmp_path}/dictmodel.py:make"], {"NEURON_CACHE": "0"}, "the cache is disabled")):
        refused = subprocess.run(CLI + ["compile", *argv], capture_output=True, text=True, timeout=300,
                                 env=_env(**env))
        assert refused.returncode == 1 and message in refused.stderr and "Traceback" not in refused.stderr
    assert (tmp_path / "dictmodel.py").read_text() == source
