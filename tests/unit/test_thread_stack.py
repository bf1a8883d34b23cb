"""Stack temporaries must fit the threads that run them: a ``fused-rows`` block keeps its temporaries
on the stack (``memref.alloca``), and an OpenMP worker's stack is ``OMP_STACKSIZE``. With
``OMP_STACKSIZE=64K`` and the old fixed 128 KB budget, softmax over 4096×1024 at 2 threads put 64 KB
of temporaries on a 64 KB stack and the process died (SIGSEGV, measured)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from neuron_compile.codegen import TargetInfo
from neuron_compile.codegen.strategies.fused_rows import block_plan
from neuron_compile.target import DEFAULT_THREAD_STACK, omp_stack_bytes, thread_stack_bytes
from tests.ir.lower import lower


@pytest.mark.parametrize("text,expected", [("512K", 512 << 10), ("2M", 2 << 20), ("100", 100 << 10),
                                           ("1g", 1 << 30), ("4096B", 4096), (" 64 k ", 64 << 10), ("+64K", 64 << 10),
                                           ("lots", None), ("-1K", None), ("", None), ("64KB", None),
                                           ("1.5M", None), ("0x40K", None)])
def test_omp_stacksize_is_read_as_libgomp_reads_it(text, expected):
    assert omp_stack_bytes(text) == expected


def test_the_smallest_stack_wins(monkeypatch):
    import resource
    monkeypatch.delenv("OMP_STACKSIZE", raising=False)
    monkeypatch.delenv("GOMP_STACKSIZE", raising=False)
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    main = soft if soft not in (resource.RLIM_INFINITY, 0) else DEFAULT_THREAD_STACK
    assert thread_stack_bytes() == main
    monkeypatch.setenv("OMP_STACKSIZE", "256K")
    assert thread_stack_bytes() == min(main, 256 << 10)
    monkeypatch.setenv("GOMP_STACKSIZE", "64K")
    assert thread_stack_bytes() == min(main, 64 << 10)
    monkeypatch.setenv("OMP_STACKSIZE", "nonsense")  # ignored, as libgomp ignores it
    assert thread_stack_bytes() == min(main, 64 << 10)
    monkeypatch.delenv("GOMP_STACKSIZE")
    old = threading.stack_size(48 << 10)  # Python threads made from now on (a caller at one thread)
    try:
        assert thread_stack_bytes() == min(main, 48 << 10)
        assert threading.stack_size() == 48 << 10   # (reading it left the setting in place)
    finally:
        threading.stack_size(old)


def test_small_thread_stacks_move_block_temporaries_to_the_heap():
    # rows of 128 floats: blocks of 4 rows whose exp rows and scalars (2 KB) go on a roomy stack
    # and on a 256 KB thread stack (an eighth: 32 KB); a 8 KB one (1 KB) moves them to the heap
    _, lowered = lower(lambda x: x.softmax(-1), torch.empty(8192, 128))
    group = lowered.kernels
    roomy = TargetInfo("avx512", 512, 32, l2_bytes=1 << 20, stack_bytes=8 << 20)
    assert block_plan(group, roomy) == ([4], True)
    tight = TargetInfo("avx512", 512, 32, l2_bytes=1 << 20, stack_bytes=256 << 10)
    assert block_plan(group, tight) == ([4], True)
    assert block_plan(group, TargetInfo("avx512", 512, 32, l2_bytes=1 << 20, stack_bytes=8 << 10)) == ([4], False)
    # rows of 1024 floats run one row per block: 4 KB of temporaries fit a 256 KB stack, not a 16 KB one
    _, lowered = lower(lambda x: x.softmax(-1), torch.empty(4096, 1024))
    assert block_plan(lowered.kernels, tight) == ([1], True)
    assert block_plan(lowered.kernels, TargetInfo("avx512", 512, 32, l2_bytes=1 << 20, stack_bytes=16 << 10)) \
        == ([1], False)


def test_a_64k_openmp_stack_runs_a_fused_softmax(tmp_path):
    script = textwrap.dedent("""
        import torch
        from tests.conftest import neuron_compile
        torch.set_num_threads(2)
        x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0))
        out = neuron_compile(lambda x: x.softmax(-1))(x)
        torch.testing.assert_close(out, torch.softmax(x.double(), -1).float(), rtol=1e-5, atol=1e-6)
        print("ok")
    """)
    _run_prints_ok(script, tmp_path, OMP_STACKSIZE="64K")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_thread_with_a_smaller_stack_than_at_compile_time_gets_the_same_values(tmp_path, threads):
    # compiled on the main thread (8 MB): a row of 30,000 floats on the stack per block; then called
    # from a thread started with 128 KB, which overflowed (a segmentation fault) before the runtime
    # moved such calls to its large-stack worker
    script = textwrap.dedent(f"""
        import threading
        import torch
        from neuron_compile.stack_guard import stack_too_small
        from tests.conftest import neuron_compile
        torch.set_num_threads({threads})
        x = torch.randn(16, 30000, generator=torch.Generator().manual_seed(0)) * 3
        f = neuron_compile(lambda x: x.softmax(-1))
        main = f(x)
        threading.stack_size(128 * 1024)
        got = {{}}
        def run():
            got["small"] = stack_too_small(120000)
            got["out"] = f(x)
            with torch.inference_mode():
                got["inference"] = f(x).is_inference()   # the caller's mode, on the worker too
            torch.set_num_threads(1)
            f(x)   # the worker at 1 thread: not the default of threads started later
        t = threading.Thread(target=run)
        t.start()
        t.join()
        assert got["small"] and not stack_too_small(120000)
        assert torch.equal(got["out"], main) and got["inference"]
        torch.set_num_threads(2)
        later = {{}}
        threading.stack_size(0)
        t = threading.Thread(target=lambda: later.setdefault("n", torch.get_num_threads()))
        t.start()
        t.join()
        assert later["n"] == 2, later
        torch.testing.assert_close(main, torch.softmax(x.double(), -1).float(), rtol=1e-5, atol=1e-6)
        print("ok")
    """)
    _run_prints_ok(script, tmp_path)


def test_a_graph_with_many_tensors_runs_from_a_small_thread_stack(tmp_path):
    # 150 inputs and 150 outputs: the entry point's descriptors (~29 KB) overflowed a 32 KiB thread
    # before any kernel ran (a segmentation fault); the runtime counts them in the call's stack need
    script = textwrap.dedent("""
        import threading
        import torch
        from tests.conftest import neuron_compile
        xs = [torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(i)) for i in range(150)]
        f = neuron_compile(lambda *xs: [x * (i + 1) for i, x in enumerate(xs)])
        main = f(*xs)
        threading.stack_size(32 * 1024)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("out", f(*xs)))
        t.start()
        t.join()
        assert all(torch.equal(a, b) for a, b in zip(got["out"], main))
        assert all(torch.equal(a, x * (i + 1)) for i, (a, x) in enumerate(zip(main, xs)))
        print("ok")
    """)
    _run_prints_ok(script, tmp_path)


def _run_prints_ok(script: str, cache_dir, **env_vars: str) -> None:
    """``script`` in a fresh interpreter from the repository root (a crash fails this test, not the
    suite), with its own cache and ``env_vars``; it must exit 0 and print ``ok`` last."""
    env = {**os.environ, **env_vars, "NEURON_CACHE_DIR": str(cache_dir)}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])
