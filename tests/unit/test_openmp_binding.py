"""Kernels run their parallel loops on torch's own OpenMP runtime, even when another package has
loaded a second libgomp into the process (scikit-learn's wheel bundles one)."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_loops_bind_to_the_runtime_torch_set_num_threads_controls(tmp_path):
    script = textwrap.dedent(f"""
        import ctypes, shutil
        from pathlib import Path
        import torch
        torch_gomp = next(l.split()[-1] for l in Path("/proc/self/maps").read_text().splitlines()
                          if "libgomp" in l and l.split()[-1].startswith("/"))
        # a second OpenMP runtime, at a path that sorts before torch's
        other = Path({str(tmp_path)!r}) / "libgomp-other.so.1"
        shutil.copyfile(torch_gomp, other)
        ctypes.CDLL(str(other), mode=ctypes.RTLD_LOCAL)
        from neuron_compile.kernel_runtime import _libgomp
        parallel = _libgomp()[0]
        owner = next(l.split()[-1] for l in Path("/proc/self/maps").read_text().splitlines()
                     if int(l.split()[0].split("-")[0], 16) <= parallel < int(l.split()[0].split("-")[1], 16))
        max_threads = ctypes.CDLL(owner).omp_get_max_threads
        seen = []
        for n in (1, 2):
            torch.set_num_threads(n)
            seen.append(max_threads())
        print(owner == torch_gomp, seen)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "True [1, 2]", out.stdout
