"""Bundles: cache entries packed into one file to move compiled executables between machines.

A bundle is a tar archive: ``bundle.json`` (format version, the executable format, and per entry
its cache key, target and the sha256 of every file) and ``entries/<key>/<file>``. Importing is
all-or-nothing for integrity (every file is checked against ``bundle.json`` before anything is
published; a truncated or corrupted archive or another format version imports nothing) and
append-only for the cache (a valid entry already there is never overwritten); an entry compiled
for another CPU is skipped with a message and the rest are imported. Entries are published with
one ``rename`` each, like a fresh compile, so a crash mid-import never leaves a loadable half entry.
Cache keys hold no paths, so a bundle made under one cache root hits under any other.

Trust: the index and names are validated so that importing never writes, deletes or reads outside
the cache, but a bundle carries native code, and a cache key cannot be checked against the code
without recompiling: a forged entry runs when its key is looked up. Import bundles you made or
trust, as you would a wheel.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from neuron_compile.cache_key import EXECUTABLE_FORMAT
from neuron_compile.errors import CacheError
from neuron_compile.executable import MANIFEST, read_manifest, sha256_file, verify_payloads

BUNDLE_FORMAT = 1
INDEX = "bundle.json"
# A bundle is untrusted input: keys and file names become paths, so they are checked to be a
# sha256 digest and a plain file name before anything is read from the archive.
_KEY = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}")
INDEX_SCHEMA = {
    "type": "object",
    "required": ["kind", "format", "executable_format", "entries"],
    "properties": {
        "kind": {"const": "neuron-compile bundle"},
        "format": {"type": "integer"},
        "executable_format": {"type": "integer"},
        "entries": {"type": "array", "items": {
            "type": "object",
            "required": ["key", "files"],
            "properties": {
                "key": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "target": {"type": ["object", "null"]},
                "files": {"type": "object", "minProperties": 1,
                          "propertyNames": {"pattern": "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}$"},
                          "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
            }}},
    },
}


class BundleError(CacheError):
    """A bundle that cannot be imported: unreadable, truncated, corrupted or of another format."""


def _cache(cache_dir: str | os.PathLike | None):
    from neuron_compile.compiler import cache_for
    from neuron_compile.config import resolve_config
    return cache_for(resolve_config({"cache_dir": str(cache_dir)} if cache_dir else None))


def save_bundle(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                keys: list[str] | None = None) -> dict[str, Any]:
    """Write the cache's entries (all, or those whose key starts with one of ``keys``) to the
    bundle ``path`` (written to a temporary file, then renamed). Entries that fail verification
    are left out. Returns ``{"path", "entries", "skipped"}``."""
    cache = _cache(cache_dir)
    index: dict[str, Any] = {"kind": "neuron-compile bundle", "format": BUNDLE_FORMAT,
                             "executable_format": EXECUTABLE_FORMAT, "entries": []}
    chosen, skipped = [], []
    for e in cache.entries():
        if keys and not any(e.key.startswith(k) for k in keys):
            continue
        try:
            manifest = read_manifest(e.path)
            problems = verify_payloads(e.path, manifest)
        except Exception as exc:  # an unreadable entry is not bundled
            problems = [str(exc)]
        if problems:
            skipped.append({"key": e.key, "problems": problems})
            continue
        files = {f.name: sha256_file(f) for f in sorted(e.path.iterdir()) if f.is_file()}
        index["entries"].append({"key": e.key, "name": manifest.get("name"), "target": manifest.get("target"),
                                 "files": files})
        chosen.append(e)
    dest = Path(path)
    if not dest.parent.is_dir():
        raise BundleError(f"cannot write the bundle {dest}: its directory {dest.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", dir=dest.parent or ".")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            data = json.dumps(index, indent=1).encode()
            info = tarfile.TarInfo(INDEX)
            info.size = len(data)
            import io
            tar.addfile(info, io.BytesIO(data))
            for e in chosen:
                for f in sorted(e.path.iterdir()):
                    if f.is_file():
                        tar.add(f, arcname=f"entries/{e.key}/{f.name}", recursive=False)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"path": str(dest), "entries": len(chosen), "skipped": skipped}


def read_index(path: str | os.PathLike) -> dict[str, Any]:
    """``bundle.json`` of the bundle at ``path``; raises :class:`BundleError`."""
    try:
        with tarfile.open(path, "r:*") as tar:
            member = tar.getmember(INDEX)
            index = json.loads(tar.extractfile(member).read())
    except (OSError, tarfile.TarError, KeyError, ValueError, EOFError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""  # tarfile lists every compression it tried
        raise BundleError(f"{path} is not a readable neuron-compile bundle, truncated or not a bundle "
                          f"({type(exc).__name__}: {first}); nothing imported") from None
    import jsonschema
    try:
        jsonschema.validate(index, INDEX_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the index"
        raise BundleError(f"{path} is not a valid neuron-compile bundle: {where}: {exc.message}; "
                          "nothing imported") from None
    for e in index["entries"]:  # JSON-schema patterns are searches ("$" matches before a final newline)
        if not _KEY.fullmatch(e["key"]) or not all(_NAME.fullmatch(n) for n in e["files"]):
            raise BundleError(f"{path}: entry {e['key'][:16]!r} has a malformed key or file name; nothing imported")
    if len({e["key"] for e in index["entries"]}) != len(index["entries"]):
        raise BundleError(f"{path} lists an entry twice; nothing imported")
    if index["format"] != BUNDLE_FORMAT or index["executable_format"] != EXECUTABLE_FORMAT:
        raise BundleError(f"{path} has bundle format {index.get('format')} / executable format "
                          f"{index.get('executable_format')}; this neuron-compile reads {BUNDLE_FORMAT} / "
                          f"{EXECUTABLE_FORMAT}: re-export it with this version")
    return index


def _entry_problems(entry: Path, key: str) -> list[str]:
    """Why the entry directory is not the executable its key names (a manifest carrying that key,
    intact payloads); empty when it is."""
    try:
        manifest = read_manifest(entry)
        problems = verify_payloads(entry, manifest)
        if manifest.get("cache_key") != key:
            problems.append(f"its manifest carries key {str(manifest.get('cache_key'))[:16]}")
    except Exception as exc:  # unreadable manifest: ExecutableError, or JSON of the wrong shape
        problems = [str(exc)]
    return problems


def load_bundle(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Import the bundle at ``path`` into the cache (default: the configured one).

    Returns ``{"imported": [...], "existing": [...], "other_cpu": [...], "repaired": [...]}`` (cache
    keys; ``repaired``: entries already in the cache but damaged, quarantined and imported again,
    also listed in ``imported``).
    Raises:
        BundleError: unreadable, truncated, corrupted (a file missing or not matching its sha256),
            or another format version; nothing is imported then.
    """
    from neuron_compile.target import HostCPU
    index = read_index(path)
    cache = _cache(cache_dir)
    if not cache.usable:
        raise BundleError(f"the cache at {cache.root} is not usable; nothing imported")
    (cache.base / "tmp").mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix="bundle.", dir=cache.base / "tmp"))
    try:
        wanted = {f"entries/{e['key']}/{name}" for e in index["entries"] for name in e["files"]}
        unpacked = 0
        try:
            with tarfile.open(path, "r:*") as tar:
                for m in tar:
                    if m.name == INDEX:
                        continue
                    if m.name not in wanted or not m.isfile():
                        raise BundleError(f"{path}: unexpected member {m.name!r}; nothing imported")
                    unpacked += m.size  # a bundle unpacks to at most the cache's bound (a gzip bomb does not)
                    if unpacked > cache.max_bytes:
                        raise BundleError(f"{path} unpacks to more than the cache's bound of {cache.max_bytes} "
                                          "bytes (NEURON_CACHE_MAX_BYTES); nothing imported")
                    target = staging / m.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(m) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise BundleError(f"{path} is truncated or unreadable ({type(exc).__name__}: {exc}); "
                              "nothing imported") from None
        for e in index["entries"]:  # integrity of everything before anything is published
            for name, digest in e["files"].items():
                f = staging / "entries" / e["key"] / name
                if not f.is_file() or sha256_file(f) != digest:
                    raise BundleError(f"{path}: {e['key'][:16]}/{name} is missing or does not match its sha256; "
                                      "the bundle is corrupted, nothing imported")
            entry = staging / "entries" / e["key"]
            problems = _entry_problems(entry, e["key"])
            if problems:
                raise BundleError(f"{path}: entry {e['key'][:16]} is not a valid executable ({'; '.join(problems)}); "
                                  "nothing imported")
        host = HostCPU.detect()
        result: dict[str, list[str]] = {"imported": [], "existing": [], "other_cpu": [], "repaired": []}
        for e in index["entries"]:
            key, tgt = e["key"], e.get("target") or {}
            if (tgt.get("triple"), tgt.get("cpu"), tgt.get("cpu_features_sha256")) != (host.triple, host.cpu,
                                                                                         host.features):
                result["other_cpu"].append(key)
                continue
            final = cache.entry_dir(key)
            if (final / MANIFEST).is_file():  # append-only: never overwrite a valid entry
                damaged = _entry_problems(final, key)
                if not damaged:
                    result["existing"].append(key)
                    continue
                cache.quarantine(final, "; ".join(damaged))  # a damaged one is replaced by the bundle's
                result["repaired"].append(key)
            final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if final.is_symlink():  # not ours to follow: the link goes, whatever it points at stays
                final.unlink()
            elif final.exists():  # a directory without a manifest never loads: replace it
                shutil.rmtree(final)
            os.rename(staging / "entries" / key, final)
            result["imported"].append(key)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)
