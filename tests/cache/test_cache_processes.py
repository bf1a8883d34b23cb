"""The artifact cache across fresh processes: reuse, concurrency, crashes mid-write."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from neuron_compile.cache_key import EXECUTABLE_FORMAT

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = f"v{EXECUTABLE_FORMAT}"  # the cache's directory for this executable format


def run_workload(cache_dir: Path, mode: str = "train", extra_env: dict | None = None,
                 code: str | None = None) -> dict:
    env = {**os.environ, "NEURON_CACHE_DIR": str(cache_dir), **(extra_env or {})}
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "tests.cache.workload", mode]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"stderr": proc.stderr}


def entries(cache_dir: Path) -> list[Path]:
    return sorted(p.parent for p in (cache_dir / LAYOUT).glob("??/*/manifest.json"))


def test_second_process_compiles_nothing_and_is_bit_identical(tmp_path):
    first = run_workload(tmp_path)
    second = run_workload(tmp_path)
    assert first["ok"] and second["ok"]
    assert first["graphs_compiled"] == 2 and first["disk_hits"] == 0      # forward + backward
    assert second["graphs_compiled"] == 0 and second["misses"] == 0
    assert second["disk_hits"] == 2
    assert second["sha256"] == first["sha256"]
    assert len(entries(tmp_path)) == 2


def test_eight_processes_on_an_empty_cache_compile_the_graph_once(tmp_path):
    env = {**os.environ, "NEURON_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.cache.workload", "infer"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    assert sum(r["graphs_compiled"] for r in results) == 1
    assert sum(r["disk_hits"] for r in results) == 7
    assert len({r["sha256"] for r in results}) == 1
    assert len(entries(tmp_path)) == 1


KILL_MID_WRITE = textwrap.dedent("""
    import os, signal, shutil
    import neuron_compile.executable as ex
    real_copy = shutil.copyfile
    def copy_then_die(src, dst, *a, **k):
        real_copy(src, dst, *a, **k)
        with open(dst, "r+b") as f:       # leave a half-written payload behind
            f.truncate(os.path.getsize(dst) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    ex.shutil.copyfile = copy_then_die
    import runpy, sys
    sys.argv = ["workload", "infer"]
    runpy.run_module("tests.cache.workload", run_name="__main__")
""")


def test_sigkill_while_writing_leaves_nothing_that_loads(tmp_path):
    env = {**os.environ, "NEURON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", KILL_MID_WRITE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert entries(tmp_path) == []                         # nothing was published
    assert any((tmp_path / LAYOUT / "tmp").iterdir())        # the half-written temp dir is what remains
    later = run_workload(tmp_path, "infer")
    assert later["ok"] and later["graphs_compiled"] == 1 and later["disk_hits"] == 0
    assert len(entries(tmp_path)) == 1
