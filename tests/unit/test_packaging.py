"""The installed package holds every module: ``pyproject.toml`` lists packages by hand (``passes/`` and
``lowering/`` install as ``neuron_compile.passes`` / ``neuron_compile.lowering`` through
``package-dir``), and a package missing from the list is absent from a wheel or ``pip install .``
while the editable install used by the tests still finds it (``neuron_compile.codegen`` was missing:
a wheel install failed every compile with ``ModuleNotFoundError``)."""
from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the dev extra installs tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _packages_on_disk() -> set[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {"neuron_compile": ROOT / "neuron_compile",
             **{name: ROOT / path for name, path in cfg.get("package-dir", {}).items()}}
    found = set()
    for name, path in roots.items():
        for init in path.rglob("__init__.py"):
            rel = init.parent.relative_to(path).parts
            found.add(".".join((name, *rel)))
    return found


def test_every_package_directory_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = _packages_on_disk()
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert listed <= on_disk, f"listed but not on disk: {sorted(listed - on_disk)}"
