"""Cache entries under damage and constraints: corruption, read-only and unsafe dirs, eviction."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import neuron_compile.counters as M
from neuron_compile.cache import clear_memory_cache
from neuron_compile.cache_key import EXECUTABLE_FORMAT
from neuron_compile.executable import LLVM_MLIR, NATIVE, load_executable

LAYOUT = f"v{EXECUTABLE_FORMAT}"  # the cache's directory for this executable format


def f(x, w):
    return torch.tanh(x @ w).sum(-1)


def compile_and_run(cache_dir: Path, **options):
    """A fresh compile request (as a new process would make it) against ``cache_dir``."""
    torch._dynamo.reset()
    clear_memory_cache()
    M.reset_metrics()
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    out = torch.compile(f, backend="neuron", dynamic=False, options={"cache_dir": str(cache_dir), **options})(x, w)
    torch.testing.assert_close(out, f(x, w))
    return M.metrics()


def only_entry(cache_dir: Path) -> Path:
    (entry,) = [p.parent for p in (cache_dir / LAYOUT).glob("??/*/manifest.json")]
    return entry


@pytest.mark.parametrize("damage", ["flip_byte", "truncate_native", "truncate_llvm"])
def test_damaged_payload_is_quarantined_warned_and_recompiled(tmp_path, damage):
    assert compile_and_run(tmp_path)["graphs_compiled"] == 1
    entry = only_entry(tmp_path)
    if damage == "flip_byte":
        p = entry / NATIVE
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0x01
        p.write_bytes(bytes(data))
    else:
        p = entry / (NATIVE if damage == "truncate_native" else LLVM_MLIR)
        with open(p, "r+b") as fh:
            fh.truncate(p.stat().st_size // 3)
    with pytest.warns(RuntimeWarning, match=r"failed verification.*sha256.*quarantine"):
        m = compile_and_run(tmp_path)
    assert m["quarantined"] == 1 and m["graphs_compiled"] == 1 and m["disk_hits"] == 0
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    load_executable(only_entry(tmp_path))  # the new entry is intact


def test_load_executable_refuses_a_corrupt_payload_before_loading_code(tmp_path):
    from neuron_compile.errors import ExecutableError
    compile_and_run(tmp_path)
    entry = only_entry(tmp_path)
    (entry / NATIVE).write_bytes(b"\x7fELF not really")
    with pytest.raises(ExecutableError, match="does not match its sha256"):
        load_executable(entry)


def test_world_writable_cache_dir_is_refused_with_an_explanation(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.warns(RuntimeWarning, match=r"refuses cache dir .*writable by other users.*chmod go-w"):
        m = compile_and_run(root)
    assert m["graphs_compiled"] == 1
    assert list(root.iterdir()) == []  # nothing was written there


def _read_only_view(src: Path, mnt: Path) -> str:
    """A read-only view of ``src`` at ``mnt``: a read-only bind mount (root), else chmod (non-root)."""
    mnt.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", "-o", "ro", str(src), str(mnt)], check=True)
        return "mount"
    os.rmdir(mnt)
    os.chmod(src, 0o500)
    os.symlink(src, mnt)
    return "chmod"


def test_read_only_cache_dir_serves_hits_and_compiles_misses_in_memory(tmp_path):
    src, mnt = tmp_path / "cache", tmp_path / "ro"
    src.mkdir(mode=0o700)
    compile_and_run(src)                 # populate, then look at it read-only
    how = _read_only_view(src, mnt)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hit = compile_and_run(mnt)
            miss = compile_and_run(mnt, opt_level=2)   # another key: must compile, cannot store
            again = compile_and_run(mnt, opt_level=1)  # and again: the warning is not repeated
        assert hit["disk_hits"] == 1 and hit["graphs_compiled"] == 0
        assert miss["graphs_compiled"] == 1 and again["graphs_compiled"] == 1
        msgs = [str(w.message) for w in caught if "cannot write its cache dir" in str(w.message)]
        assert len(msgs) == 1, msgs
        assert "in memory only" in msgs[0] and str(mnt) in msgs[0]
        assert len(list(src.glob(f"{LAYOUT}/??/*/manifest.json"))) == 1  # nothing new was stored
    finally:
        if how == "mount":
            subprocess.run(["umount", str(mnt)], check=True)
        else:
            os.chmod(src, 0o700)


def _entries_bytes(root: Path) -> tuple[int, int]:
    entries = [p.parent for p in (root / LAYOUT).glob("??/*/manifest.json")]
    return len(entries), sum(f.stat().st_size for e in entries for f in e.iterdir())


def test_eviction_keeps_the_cache_under_a_tiny_bound(tmp_path):
    compile_and_run(tmp_path / "probe", opt_level=0)
    _, one = _entries_bytes(tmp_path / "probe")
    bound = int(one * 2.5)               # room for about two entries
    root = tmp_path / "bounded"
    evictions = 0
    for level in (0, 1, 2, 3):           # four different keys
        evictions += compile_and_run(root, opt_level=level, cache_max_bytes=bound)["evictions"]
        count, total = _entries_bytes(root)
        assert total <= bound, (level, total, bound)
    assert 1 <= count <= 2 and evictions == 4 - count
    # the survivors are the most recently used ones
    assert compile_and_run(root, opt_level=3, cache_max_bytes=bound)["disk_hits"] == 1


def test_eviction_never_removes_an_entry_another_process_holds_locked(tmp_path):
    from neuron_compile.compiler import cache_for
    from neuron_compile.config import Config
    compile_and_run(tmp_path, opt_level=0)
    locked = only_entry(tmp_path)
    cache = cache_for(Config(cache_dir=str(tmp_path), cache_max_bytes=1))
    held = cache.lock(locked.name)
    held.acquire()
    try:
        # holding a filelock from this process: `remove` must treat it as busy
        child = subprocess.run(
            [sys.executable, "-c", f"from neuron_compile.cache import ArtifactCache; from pathlib import Path; "
                             f"c = ArtifactCache(Path({str(tmp_path)!r}), 1); print(c.evict())"],
            capture_output=True, text=True, timeout=120)
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "0" and locked.is_dir()
    finally:
        held.release()


def test_an_entry_moved_under_another_key_is_refused(tmp_path):
    compile_and_run(tmp_path, opt_level=1)
    compile_and_run(tmp_path, opt_level=2)
    a, b = sorted(p.parent for p in (tmp_path / LAYOUT).glob("??/*/manifest.json"))
    tmp = a.with_name("swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)   # each entry now sits under the other's key
    with pytest.warns(RuntimeWarning, match="carries cache key"):
        m = compile_and_run(tmp_path, opt_level=1)
    assert m["quarantined"] == 1 and m["graphs_compiled"] == 1


def test_a_world_writable_entry_inside_a_safe_root_is_not_loaded(tmp_path):
    compile_and_run(tmp_path)
    entry = only_entry(tmp_path)
    os.chmod(entry, 0o777)
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        m = compile_and_run(tmp_path)
    assert m["disk_hits"] == 0 and m["quarantined"] == 1 and m["graphs_compiled"] == 1
