"""Bundles move executables between caches (and machines): integrity-checked, all-or-nothing,
append-only, entries for another CPU skipped."""
from __future__ import annotations

import io
import json
import tarfile

import pytest
import torch

import neuron_compile
from neuron_compile.bundle import BundleError, load_bundle, read_index, save_bundle
from neuron_compile.cache import clear_memory_cache


def f(x):
    return torch.sigmoid(x) * x


def g(x):
    return (x @ x.T).relu()


def _compile(cache_dir, strict=False):
    torch._dynamo.reset()
    clear_memory_cache()
    neuron_compile.reset_metrics()
    x = torch.randn(6, 6)
    opts = {"cache_dir": str(cache_dir), "cache_strict": strict}
    out = [torch.compile(fn, backend="neuron", dynamic=False, options=opts)(x) for fn in (f, g)]
    torch.testing.assert_close(out[0], f(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[1], g(x), rtol=1e-5, atol=1e-5)
    return neuron_compile.metrics()


def _entries(cache_dir):
    return sorted(p.parent.name for p in cache_dir.rglob("manifest.json"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    src = tmp_path_factory.mktemp("machine-a") / "cache"
    assert _compile(src)["graphs_compiled"] == 2
    path = tmp_path_factory.mktemp("out") / "two.tar.gz"
    assert save_bundle(path, src)["entries"] == 2
    return path


def test_a_bundle_imported_under_another_path_gives_warm_starts(bundle, tmp_path):
    dest = tmp_path / "elsewhere" / "cache"
    r = load_bundle(bundle, dest)
    assert len(r["imported"]) == 2 and not r["existing"] and not r["other_cpu"]
    m = _compile(dest, strict=True)  # strict: a miss would raise
    assert m["graphs_compiled"] == 0 and m["disk_hits"] == 2
    again = load_bundle(bundle, dest)  # append-only: nothing overwritten
    assert again["existing"] == r["imported"] and not again["imported"]


def _rewrite(bundle, out, edit_index=None, edit_file=None):
    """A copy of ``bundle`` with its index or one member changed."""
    with tarfile.open(bundle) as tar, tarfile.open(out, "w:gz") as new:
        for m in tar:
            data = tar.extractfile(m).read()
            if m.name == "bundle.json" and edit_index:
                data = json.dumps(edit_index(json.loads(data))).encode()
            elif m.name != "bundle.json" and edit_file and edit_file(m.name):
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            m.size = len(data)
            new.addfile(m, io.BytesIO(data))
    return out


def test_corrupted_truncated_and_other_format_bundles_import_nothing(bundle, tmp_path):
    corrupted = _rewrite(bundle, tmp_path / "bad.tar.gz", edit_file=lambda n: n.endswith("kernel.so"))
    truncated = tmp_path / "short.tar.gz"
    truncated.write_bytes(bundle.read_bytes()[: bundle.stat().st_size // 2])
    other = _rewrite(bundle, tmp_path / "v99.tar.gz", edit_index=lambda d: {**d, "format": 99})
    for path, message in ((corrupted, "does not match its sha256"), (truncated, "truncated or not a bundle"),
                          (other, "bundle format 99")):
        dest = tmp_path / f"cache-{path.stem}"
        with pytest.raises(BundleError, match=message):
            load_bundle(path, dest)
        assert _entries(dest) == []


def test_an_entry_for_another_cpu_is_skipped_and_the_rest_imported(bundle, tmp_path):
    first = read_index(bundle)["entries"][0]["key"]

    def other_cpu(index):
        index["entries"][0]["target"] = {**index["entries"][0]["target"], "cpu": "some-other-cpu"}
        return index
    path = _rewrite(bundle, tmp_path / "mixed.tar.gz", edit_index=other_cpu)
    dest = tmp_path / "cache"
    r = load_bundle(path, dest)
    assert r["other_cpu"] == [first] and len(r["imported"]) == 1
    assert _entries(dest) == r["imported"]


def test_cli_bundle_export_import_and_inspect(bundle, tmp_path, capsys):
    from neuron_compile.cli import main
    dest = tmp_path / "cache"
    assert main(["bundle", "import", str(bundle), "--cache-dir", str(dest), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["imported"]) == 2
    out = tmp_path / "again.tar.gz"
    assert main(["bundle", "export", "-o", str(out), "--cache-dir", str(dest)]) == 0
    assert "wrote 2 entries" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == 1
    key = _entries(dest)[0]
    assert main(["inspect", key[:12], "--cache-dir", str(dest)]) == 0
    assert json.loads(capsys.readouterr().out)["cache_key"] == key
    assert main(["bundle", "import", str(tmp_path / "missing.tar.gz"), "--cache-dir", str(dest)]) == 1
    assert "not a readable neuron-compile bundle" in capsys.readouterr().err


@pytest.mark.parametrize("edit, message", [
    (lambda d: {**d, "entries": [{**d["entries"][0], "key": "../../../../tmp/escaped"}]}, "does not match"),
    (lambda d: {**d, "entries": [{**d["entries"][0], "files": {"../../escaped": "0" * 64}}]}, "does not match"),
    (lambda d: [d], "is not of type 'object'"),
    (lambda d: {k: v for k, v in d.items() if k != "entries"}, "'entries' is a required property"),
    (lambda d: {**d, "entries": "abc"}, "is not of type 'array'"),
    (lambda d: {**d, "entries": [{"key": d["entries"][0]["key"]}]}, "'files' is a required property"),
    (lambda d: {**d, "entries": [d["entries"][0], d["entries"][0]]}, "lists an entry twice"),
])
def test_a_crafted_index_is_refused_before_any_path_is_built(bundle, tmp_path, edit, message):
    """A bundle is untrusted input: keys and file names become paths (helper found a key of
    ``../..`` writing and deleting outside the cache before this check)."""
    path = _rewrite(bundle, tmp_path / "evil.tar.gz", edit_index=edit)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    with pytest.raises(BundleError, match=message):
        load_bundle(path, tmp_path / "cache")
    assert _entries(tmp_path / "cache") == [] and (victim / "precious.txt").read_text() == "keep"
    assert not list(tmp_path.rglob("escaped"))


def test_an_entry_whose_manifest_has_another_key_is_refused(bundle, tmp_path):
    first = read_index(bundle)["entries"][0]
    fake = "0" * 64

    def rename(d):
        d["entries"][0] = {**first, "key": fake}
        return d
    src = _rewrite(bundle, tmp_path / "renamed.tar.gz", edit_index=rename)
    # move the members to the fake key's directory too
    out = tmp_path / "renamed2.tar.gz"
    with tarfile.open(src) as tar, tarfile.open(out, "w:gz") as new:
        for m in tar:
            data = tar.extractfile(m).read()
            m.name = m.name.replace(first["key"], fake)
            new.addfile(m, io.BytesIO(data))
    with pytest.raises(BundleError, match="manifest carries key"):
        load_bundle(out, tmp_path / "cache")
    assert _entries(tmp_path / "cache") == []


def test_a_key_or_name_with_a_trailing_newline_is_refused(bundle, tmp_path):
    """JSON-schema patterns are searches: "$" also matches before a final newline."""
    first = read_index(bundle)["entries"][0]
    for edit in (lambda d: {**d, "entries": [{**first, "key": first["key"] + "\n"}]},
                 lambda d: {**d, "entries": [{**first, "files": {n + "\n": h for n, h in first["files"].items()}}]}):
        path = _rewrite(bundle, tmp_path / "nl.tar.gz", edit_index=edit)
        with pytest.raises(BundleError, match="malformed key or file name"):
            load_bundle(path, tmp_path / "cache")
        assert _entries(tmp_path / "cache") == []


def test_a_manifest_payload_outside_its_entry_is_a_problem(tmp_path):
    from neuron_compile.executable import verify_payloads
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    problems = verify_payloads(tmp_path, {"payloads": {str(secret): "0" * 64, "../secret.txt": "0" * 64}})
    assert len(problems) == 2 and all("not a plain file name" in p for p in problems)


def test_a_bundle_larger_than_the_cache_bound_imports_nothing(bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_CACHE_MAX_BYTES", "4096")  # smaller than the two executables
    dest = tmp_path / "cache"
    with pytest.raises(BundleError, match="unpacks to more than the cache's bound"):
        load_bundle(bundle, dest)
    assert _entries(dest) == []


def test_a_symlink_in_an_entrys_place_is_replaced_not_followed(bundle, tmp_path):
    from neuron_compile.bundle import _cache
    dest = tmp_path / "cache"
    key = read_index(bundle)["entries"][0]["key"]
    elsewhere = tmp_path / "not-the-cache"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep me")
    link = _cache(dest).entry_dir(key)
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere, target_is_directory=True)
    r = load_bundle(bundle, dest)
    assert key in r["imported"] and not link.is_symlink() and (link / "manifest.json").is_file()
    assert (elsewhere / "precious.txt").read_text() == "keep me" and len(list(elsewhere.iterdir())) == 1


def test_a_damaged_entry_is_replaced_by_the_bundles_and_user_files_beside_the_quarantine_stay(bundle, tmp_path):
    from neuron_compile.bundle import _cache
    from neuron_compile.executable import NATIVE
    dest = tmp_path / "cache"
    load_bundle(bundle, dest)
    key = read_index(bundle)["entries"][0]["key"]
    so = _cache(dest).entry_dir(key) / NATIVE
    so.write_bytes(so.read_bytes()[:100])  # damaged in place
    notes = dest / "quarantine" / "my-notes"  # not ours: a name no quarantined entry has
    notes.mkdir(parents=True)
    (notes / "f.txt").write_text("x")
    with pytest.warns(RuntimeWarning, match="failed verification"):
        r = load_bundle(bundle, dest)
    assert r["repaired"] == [key] and key in r["imported"] and len(r["existing"]) == 1
    m = _compile(dest, strict=True)
    assert m["graphs_compiled"] == 0 and m["disk_hits"] == 2
    cache = _cache(dest)
    assert [p.name.split(".")[0] for p in cache.quarantined()] == [key]
    cache.clear_side_dirs()
    assert (notes / "f.txt").read_text() == "x" and not cache.quarantined()
