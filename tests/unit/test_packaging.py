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


def _torch_requirement() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if d.replace(" ", "").startswith("torch>"))


def test_the_declared_torch_range_is_the_range_ci_runs():
    """``pyproject.toml`` admits exactly the torch releases CI runs: its lower bound is the release
    ``constraints.txt`` pins (the README's test command), its upper bound the one ``.ci/run``'s second
    venv installs (a plain ``pip install`` takes the newest release the range admits)."""
    lower, upper = (part.strip() for part in _torch_requirement().replace(" ", "")[len("torch"):].split(","))
    pinned = next(line.split("==")[1].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()
                  if line.startswith("torch=="))
    newest = next(line.split("=", 1)[1].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                  if line.startswith("NEWEST_TORCH="))
    assert lower == f">={pinned}", f"pyproject.toml's torch lower bound {lower} is not CI's pinned {pinned}"
    assert upper == f"<={newest}", f"pyproject.toml's torch upper bound {upper} is not .ci/run's {newest}"
