"""``neuron-compile cache ...`` and ``load_executable`` on stored executables."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neuron_compile.cache_key import EXECUTABLE_FORMAT
from neuron_compile.executable import NATIVE, load_executable

LAYOUT = f"v{EXECUTABLE_FORMAT}"  # the cache's directory for this executable format
from tests.cache.test_cache_entries import compile_and_run, f, only_entry


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_compile.cli", *args], capture_output=True, text=True,
                          timeout=300)


def cli_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """``cli`` in this process (``main``'s exit status, or argparse's): a process costs ~1.3 s."""
    from neuron_compile.cli import main
    capsys.readouterr()
    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


def test_cache_info_list_verify_clear(tmp_path, capsys):
    compile_and_run(tmp_path)
    compile_and_run(tmp_path, opt_level=1)
    info = json.loads(cli("cache", "info", "--json", "--cache-dir", str(tmp_path)).stdout)
    assert info["entries"] == 2 and info["bytes"] > 0 and info["usable"]
    listing = json.loads(cli_here(capsys, "cache", "list", "--json", "--cache-dir", str(tmp_path)).stdout)
    assert len(listing) == 2 and all(r["ops"] >= 2 and r["name"].startswith("graph_") for r in listing)
    human = cli_here(capsys, "cache", "list", "--cache-dir", str(tmp_path)).stdout
    assert "graph_" in human and "KiB" in human
    ok = cli_here(capsys, "cache", "verify", "--cache-dir", str(tmp_path))
    assert ok.returncode == 0 and "2 ok, 0 bad" in ok.stdout
    victim = Path(listing[0]["key"][:2]) / listing[0]["key"]
    with open(tmp_path / LAYOUT / victim / NATIVE, "r+b") as fh:
        fh.truncate(10)
    bad = cli_here(capsys, "cache", "verify", "--json", "--cache-dir", str(tmp_path))
    assert bad.returncode == 1
    assert [r["ok"] for r in json.loads(bad.stdout)].count(False) == 1
    assert "removed 0" in cli_here(capsys, "cache", "clear", "--older-than", "1", "--cache-dir", str(tmp_path)).stdout
    for age in ("-5", "nan", "soon"):  # would have selected every entry, or is no age at all
        refused = cli_here(capsys, "cache", "clear", "--older-than", age, "--cache-dir", str(tmp_path))
        assert refused.returncode == 2 and "--older-than" in refused.stderr
    assert json.loads(cli_here(capsys, "cache", "info", "--json", "--cache-dir", str(tmp_path)).stdout)["entries"] == 2
    assert "removed 2" in cli_here(capsys, "cache", "clear", "--cache-dir", str(tmp_path)).stdout
    assert json.loads(cli_here(capsys, "cache", "info", "--json", "--cache-dir", str(tmp_path)).stdout)["entries"] == 0


@pytest.mark.parametrize("mode", ["native", "jit"])
def test_load_executable_runs_a_stored_graph(tmp_path, mode):
    compile_and_run(tmp_path)
    exe = load_executable(only_entry(tmp_path), mode=mode)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    (out,) = [o for o in exe([x, w]) if isinstance(o, torch.Tensor)][:1]
    torch.testing.assert_close(out, f(x, w))


def test_compile_cli_reproduces_a_stage_from_a_dumped_file(tmp_path):
    dump = tmp_path / "dump"
    compile_and_run(tmp_path / "cache", dump_dir=str(dump), cache=False)
    (linalg,) = dump.glob("*/??.linalg.mlir")
    out = cli("compile", str(linalg), "--from", "linalg", "--emit", "llvm", "-o", str(tmp_path / "k.llvm.mlir"))
    assert out.returncode == 0, out.stderr
    assert "llvm.func" in (tmp_path / "k.llvm.mlir").read_text()
    obj = cli("compile", str(linalg), "--from", "linalg", "--emit", "obj", "-o", str(tmp_path / "k.o"))
    assert obj.returncode == 0, obj.stderr
    assert (tmp_path / "k.o").read_bytes()[16] == 1  # ELF e_type ET_REL: a relocatable object
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump", "k.llvm.mlir", "k.o"]  # no work files left


def test_compile_cli_rebuilds_a_working_executable_from_dumped_linalg(tmp_path):
    dump = tmp_path / "dump"
    compile_and_run(tmp_path / "cache", dump_dir=str(dump), cache=False)
    (linalg,) = dump.glob("*/??.linalg.mlir")
    edited = tmp_path / "edited.linalg.mlir"  # the MLIR a user changed, away from its dump
    edited.write_text(linalg.read_text())
    (plan,) = dump.glob("*/??.plan.json")
    built = cli("compile", str(edited), "--from", "linalg", "--emit", "obj", "--plan", str(plan),
                "-o", str(tmp_path / "exe"))
    assert built.returncode == 0, built.stderr
    exe = load_executable(tmp_path / "exe")
    x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
    out = [o for o in exe([x.float(), w.float()]) if isinstance(o, torch.Tensor)][0]
    torch.testing.assert_close(out.double(), f(x, w), rtol=1e-5, atol=1e-5)
    # without a plan (none beside the file) it says what is missing; a used -o is not overwritten
    missing = cli("compile", str(edited), "--from", "linalg", "--emit", "obj", "-o", str(tmp_path / "exe2"))
    assert missing.returncode == 2 and "NN.plan.json" in missing.stderr and not (tmp_path / "exe2").exists()
    again = cli("compile", str(linalg), "--from", "linalg", "--emit", "obj", "-o", str(tmp_path / "exe"))
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    assert load_executable(tmp_path / "exe")  # still intact
    # a plan of another graph (here: other shapes) does not fit the kernel's signature: refused
    other = json.loads(plan.read_text())
    other["plan"]["inputs"][0]["shape"] = [5, 8]
    (tmp_path / "other.plan.json").write_text(json.dumps(other))
    wrong = cli("compile", str(edited), "--from", "linalg", "--emit", "obj", "--plan", str(tmp_path / "other.plan.json"),
                "-o", str(tmp_path / "exe3"))
    assert wrong.returncode == 2 and "does not fit" in wrong.stderr and not (tmp_path / "exe3").exists()


def test_compile_cli_names_a_missing_file():
    out = cli("compile", "/nonexistent/kernel.linalg.mlir")
    assert out.returncode == 2 and "no such file" in out.stderr and "PipelineError" not in out.stderr
