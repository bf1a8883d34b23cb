"""The content-addressed artifact cache: compile once, load everywhere.

Layout ``<root>/v<format>/<key[:2]>/<key>/`` (an executable directory, see
:mod:`neuron_compile.executable`), with ``<root>/v<format>/tmp`` for writes in progress,
``<root>/v<format>/locks`` for per-key inter-process locks (``filelock``) and
``<root>/quarantine`` for entries that failed verification. As Inductor's ``codecache`` and JAX's
compilation cache do: writes go to a temp dir on the same filesystem and are published with one
atomic ``rename``; a reader never sees a half-written entry. An in-process memory cache sits in
front of the disk.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from neuron_compile import counters
from neuron_compile.cache_key import EXECUTABLE_FORMAT, CacheKey
from neuron_compile.errors import CacheError, ExecutableError
from neuron_compile.executable import MANIFEST, Build, load_executable, write_executable
from neuron_compile.runtime import Executable

_MEMORY: dict[str, Executable] = {}
_warned: set[str] = set()
STALE_TMP_SECONDS = 3600
_QUARANTINED = re.compile(r"[0-9a-f]{64}\.\d+\.\d+")  # Cache.quarantine's names: <key>.<time>.<pid>


def _warn_once(tag: str, message: str) -> None:
    if tag not in _warned:
        _warned.add(tag)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def clear_memory_cache() -> None:
    """Forget executables held by this process (disk entries stay)."""
    _MEMORY.clear()


def default_root() -> Path:
    """``$XDG_CACHE_HOME/neuron-compile``, else ``~/.cache/neuron-compile``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neuron-compile"


def unsafe_reason(root: Path) -> str | None:
    """Why ``root`` must not hold native code we will load, or ``None`` if it is safe.

    Refused: writable by group or others (anyone could plant code we would run), or owned by
    another user than us or root (a root-owned read-only cache, e.g. baked into an image, is fine).
    """
    try:
        st = root.stat()
    except FileNotFoundError:
        return None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{root} is writable by other users (mode {stat.filemode(st.st_mode)}); entries are native code "
                f"this process would run. Fix with: chmod go-w {root}")
    if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
        return f"{root} is owned by another user (uid {st.st_uid})"
    return None


@dataclass
class EntryInfo:
    key: str
    path: Path
    bytes: int
    last_used: float


class ArtifactCache:
    """One cache root. Disk use is bounded by ``max_bytes`` with least-recently-used eviction."""

    def __init__(self, root: Path, max_bytes: int):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.base = self.root / f"v{EXECUTABLE_FORMAT}"
        self.usable = True
        self.writable = True
        reason = unsafe_reason(self.root)
        if reason:
            self.usable = False
            _warn_once(f"unsafe:{root}", f"neuron-compile refuses cache dir {root}: {reason}. "
                                         "Compiling without a disk cache.")
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            for d in (self.base / "tmp", self.base / "locks"):
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            self._write_failed(exc)

    # -- paths and locks -------------------------------------------------------------------------
    def entry_dir(self, digest: str) -> Path:
        return self.base / digest[:2] / digest

    def lock(self, digest: str, timeout: float = -1) -> FileLock:
        return FileLock(str(self.base / "locks" / f"{digest}.lock"), timeout=timeout)

    def _write_failed(self, exc: OSError) -> None:
        self.writable = False
        counters.bump("cache_write_failures")
        _warn_once(f"write:{self.root}", f"neuron-compile cannot write its cache dir {self.root} ({exc}); "
                                         "compiled graphs are kept in memory only for this process.")

    # -- lookup ------------------------------------------------------------------------------------
    def load(self, digest: str) -> Executable | None:
        """The stored executable for ``digest``; a corrupt entry is quarantined and ``None`` returned."""
        d = self.entry_dir(digest)
        if not (d / MANIFEST).is_file():
            return None
        unsafe = next((r for p in (self.base, d.parent, d, *d.iterdir()) if (r := unsafe_reason(p))), None)
        if unsafe:
            self.quarantine(d, f"part of it is unsafe to load: {unsafe}")
            return None
        try:
            exe = load_executable(d, expect_key=digest)
        except ExecutableError as exc:
            self.quarantine(d, str(exc))
            return None
        try:
            os.utime(d / MANIFEST)  # last use, for LRU eviction
        except OSError:
            pass
        return exe

    def quarantine(self, d: Path, why: str) -> None:
        dest = self.root / "quarantine" / f"{d.name}.{int(time.time())}.{os.getpid()}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.rename(d, dest)
            where = f"moved to {dest}"
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
            where = "removed"
        counters.bump("quarantined")
        warnings.warn(f"neuron-compile cache entry {d} failed verification ({why}); {where}, recompiling.",
                      RuntimeWarning, stacklevel=2)

    # -- store -------------------------------------------------------------------------------------
    def store(self, digest: str, build: Build, key: CacheKey, target) -> Path | None:
        """Publish ``build`` under ``digest`` atomically; ``None`` if the disk cache is unwritable."""
        if not self.writable:
            return None
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f"{digest}.", dir=self.base / "tmp"))
            write_executable(tmp, build, key, target)
            final = self.entry_dir(digest)
            final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / MANIFEST).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process published it first
            tmp = None
            self.evict(keep=digest)
            return final
        except OSError as exc:
            self._write_failed(exc)
            return None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    # -- inventory and eviction ------------------------------------------------------------------
    def entries(self) -> Iterator[EntryInfo]:
        if not self.base.is_dir():
            return
        for shard in sorted(self.base.iterdir()):
            if len(shard.name) != 2 or not shard.is_dir():
                continue
            for d in sorted(shard.iterdir()):
                m = d / MANIFEST
                if not m.is_file():
                    continue
                size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
                yield EntryInfo(d.name, d, size, m.stat().st_mtime)

    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.entries())

    def quarantined(self) -> list[Path]:
        """Entries :meth:`quarantine` moved aside (``<key>.<time>.<pid>``; nothing else in that
        directory is ours to list or delete)."""
        q = self.root / "quarantine"
        return sorted(p for p in q.iterdir() if _QUARANTINED.fullmatch(p.name)) if q.is_dir() else []

    def clear_side_dirs(self) -> int:
        """Remove quarantined entries, unused lock files and temp dirs; returns how many were removed."""
        removed = 0
        for p in self.quarantined():
            shutil.rmtree(p, ignore_errors=True)
            removed += 1
        live = {e.key for e in self.entries()}
        for lock in (self.base / "locks").glob("*.lock") if (self.base / "locks").is_dir() else []:
            if lock.stem not in live:
                try:
                    with FileLock(str(lock), timeout=0):
                        lock.unlink()
                except (Timeout, OSError):
                    continue
        for t in (self.base / "tmp").iterdir() if (self.base / "tmp").is_dir() else []:
            shutil.rmtree(t, ignore_errors=True)
        return removed

    def remove(self, e: EntryInfo) -> bool:
        """Delete one entry unless another process holds its lock; True if removed."""
        try:
            with self.lock(e.key, timeout=0):
                trash = Path(tempfile.mkdtemp(prefix="evict.", dir=self.base / "tmp"))
                os.rename(e.path, trash / e.key)
        except (Timeout, OSError):
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def evict(self, keep: str | None = None) -> int:
        """Remove least-recently-used entries until the cache is within ``max_bytes``."""
        entries = sorted(self.entries(), key=lambda e: e.last_used)
        total = sum(e.bytes for e in entries)
        removed = 0
        for e in entries:
            if total <= self.max_bytes:
                break
            if e.key == keep:
                continue
            if self.remove(e):
                total -= e.bytes
                removed += 1
        if removed:
            counters.bump("evictions", removed)
        self._clean_stale_tmp()
        return removed

    def _clean_stale_tmp(self) -> None:
        now = time.time()
        for t in (self.base / "tmp").glob("*"):
            try:
                if now - t.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(t, ignore_errors=True)
            except OSError:
                pass

    def nearest(self, key: CacheKey) -> tuple[str, list[str]] | None:
        """The stored entry whose key shares the most named parts with ``key``, and the names of
        the parts that differ (from each manifest's ``key_parts``); ``None`` if the cache is empty."""
        want = key.part_hashes()
        best = None
        for e in self.entries():
            try:
                parts = json.loads((e.path / MANIFEST).read_text()).get("key_parts", {})
            except (OSError, ValueError):
                continue
            differ = [name for name, h in want.items() if parts.get(name) != h]
            if best is None or len(differ) < len(best[1]):
                best = (e.key, differ)
        return best

    def strict_miss(self, key: CacheKey, name: str) -> CacheError:
        """The error of a miss under ``NEURON_CACHE_STRICT=1``: the graph, its key, and how it
        differs from the nearest stored entry."""
        near = self.nearest(key)
        if near is None:
            detail = f"the cache at {self.root} is empty"
        else:
            detail = (f"the nearest entry {near[0][:16]} differs in: {', '.join(near[1]) or 'nothing (a race?)'}")
        return CacheError(f"{name}: no cache entry for key {key.digest[:16]} and NEURON_CACHE_STRICT=1 forbids "
                          f"compiling; {detail}.\n{key.explain()}\nCompile it ahead of time with the same "
                          "torch, neuron-compile, options and CPU, or unset NEURON_CACHE_STRICT.")

    # -- the compile-or-load protocol ---------------------------------------------------------------
    def get_or_compile(self, key: CacheKey, compile_fn: Callable[[], Build], target,
                       lock_timeout: float, strict: str | None = None) -> Executable:
        """Memory → disk (under the per-key lock) → compile and publish.

        Args:
            strict: a graph name: a miss raises :meth:`strict_miss`'s :class:`CacheError` instead
                of compiling (``NEURON_CACHE_STRICT``).
        """
        digest = key.digest
        if digest in _MEMORY:
            counters.bump("memory_hits")
            return _MEMORY[digest]
        if strict and not (self.usable and (self.entry_dir(digest) / MANIFEST).is_file()):
            raise self.strict_miss(key, strict)
        if not self.usable:
            exe = _compile_in_memory(compile_fn)
        else:
            try:
                lock = self.lock(digest, timeout=lock_timeout)
                lock.acquire()
            except OSError as exc:  # read-only or full: no lock file possible
                self._write_failed(exc)
                lock = None
            try:
                exe = self.load(digest)
                if exe is not None:
                    counters.bump("disk_hits")
                else:
                    if strict:  # the entry was there but failed verification (now quarantined)
                        raise self.strict_miss(key, strict)
                    counters.bump("misses")
                    build = compile_fn()
                    final = self.store(digest, build, key, target)
                    exe = (self.load(digest) if final is not None else None) or build_to_executable(build)
            finally:
                if lock is not None:
                    lock.release()
        _MEMORY[digest] = exe
        return exe


def _compile_in_memory(compile_fn: Callable[[], Build]) -> Executable:
    counters.bump("misses")
    return build_to_executable(compile_fn())


def build_to_executable(build: Build) -> Executable:
    """Load a fresh build straight from its work dir (no disk cache)."""
    from neuron_compile.executable import NATIVE
    from neuron_compile.runtime import load_shared_object
    if build.program is not None:
        from neuron_compile.segments import Program, SegmentedExecutable
        return SegmentedExecutable(build.name, Program.from_json(build.program), build.segment_executables)
    if NATIVE not in build.payloads:
        return Executable(build.plan, None, build.name, kernels=build.kernels)
    fn, lib = load_shared_object(build.payloads[NATIVE])
    return Executable(build.plan, fn, build.name, keepalive=lib, kernels=build.kernels)


def compile_without_disk(key: CacheKey, compile_fn: Callable[[], Build]) -> Executable:
    """Memory cache only (``cache=False``)."""
    if key.digest in _MEMORY:
        counters.bump("memory_hits")
        return _MEMORY[key.digest]
    exe = _compile_in_memory(compile_fn)
    _MEMORY[key.digest] = exe
    return exe
