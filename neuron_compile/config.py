"""The one place that reads ``NEURON_*`` environment variables and ``torch.compile`` options.

A :class:`Config` is resolved once per compile: explicit ``options={...}`` from
``torch.compile(..., options=...)`` win over environment variables, which win over defaults.
Every field that changes generated code is listed by :meth:`Config.codegen_key`, which the cache key
uses.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from neuron_compile.errors import NeuronCompileError

_ENV = {
    "dump_dir": "NEURON_DUMP_DIR",
    "opt_level": "NEURON_OPT_LEVEL",
    "keep_tmp": "NEURON_KEEP_TMP",
    "compile_timeout": "NEURON_COMPILE_TIMEOUT",
    "cache": "NEURON_CACHE",
    "cache_dir": "NEURON_CACHE_DIR",
    "cache_max_bytes": "NEURON_CACHE_MAX_BYTES",
    "passes": "NEURON_PASSES",
    "schedule": "NEURON_SCHEDULE",
    "profile": "NEURON_PROFILE",
    "compile_jobs": "NEURON_COMPILE_JOBS",
    "fallback": "NEURON_FALLBACK",
    "cache_strict": "NEURON_CACHE_STRICT",
    "compile_only": "NEURON_COMPILE_ONLY",
}


@dataclass(frozen=True)
class Config:
    """Options of one compile.

    Attributes:
        dump_dir: directory for numbered per-phase IR dumps (``NEURON_DUMP_DIR``); ``None`` = off.
        opt_level: LLVM codegen optimisation level 0..3 (``NEURON_OPT_LEVEL``, default 3).
        keep_tmp: keep the per-graph work directory of external tools (``NEURON_KEEP_TMP``).
        compile_timeout: seconds before an external compiler stage is killed
            (``NEURON_COMPILE_TIMEOUT``, default 600).
        cache: use the on-disk artifact cache (``NEURON_CACHE``, default on; ``0`` = memory only).
        cache_dir: cache root (``NEURON_CACHE_DIR``; default ``$XDG_CACHE_HOME/neuron-compile`` or
            ``~/.cache/neuron-compile``).
        cache_max_bytes: disk bound of the cache, least-recently-used entries are evicted beyond it
            (``NEURON_CACHE_MAX_BYTES``, default 4 GiB).
        passes: the FX pass pipeline (``NEURON_PASSES``): ``default``, a comma list of pass names, or
            removals such as ``-fuse`` (see :mod:`neuron_compile.passes.registry`).
        schedule: per-kernel codegen overrides as JSON (``NEURON_SCHEDULE``; a dict in ``options``),
            e.g. ``{"matmul": "loops"}`` or ``{"3": {"strategy": ..., "params": {...}}}`` (see
            :func:`neuron_compile.codegen.strategy.parse_overrides`).
        profile: time every kernel and print a table per graph at exit (``NEURON_PROFILE``; see
            :mod:`neuron_compile.profile`). Profiled code is compiled (and cached) separately.
        compile_jobs: parallel ``opt``/``llc`` processes per graph (``NEURON_COMPILE_JOBS``; default
            0 = one per core this process may run on). The module is split by function, so the
            code is the same whatever the count; not part of the cache key.
        fallback: ``""`` (default: an op with no lowering rule fails compilation with
            :class:`~neuron_compile.errors.UnsupportedOpsError`) or ``"eager"`` (``NEURON_FALLBACK``):
            such ops run as host calls between kernel segments, with one warning per graph, listed
            by ``neuron_compile.get_fallback_ops()`` and counted in ``metrics()["fallback_ops"]``.
        cache_strict: a graph missing from the on-disk cache raises
            :class:`~neuron_compile.errors.CacheError` (naming the graph and the key parts that differ
            from the nearest stored entry) instead of compiling (``NEURON_CACHE_STRICT``), so a
            deployment can prove it compiles nothing.
        compile_only: compile and cache every graph but do not run it; outputs are zero-filled
            placeholders of the right shape and dtype, with one warning (``NEURON_COMPILE_ONLY``).
        stop_after: ``""`` (default), or a phase (``fx``, ``fx-opt``, ``linalg``, ``llvm``) after
            which compilation stops, for dumping IR (``neuron-compile compile --emit PHASE``); needs
            ``compile_only`` and ``cache`` off, since nothing runnable is built. The FX graph is
            still lowered (cheaply) for the placeholder outputs' call plan.
    """

    dump_dir: str | None = None
    opt_level: int = 3
    keep_tmp: bool = False
    compile_timeout: float = 600.0
    cache: bool = True
    cache_dir: str | None = None
    cache_max_bytes: int = 4 << 30
    passes: str = "default"
    schedule: str = ""
    profile: bool = False
    compile_jobs: int = 0
    fallback: str = ""
    cache_strict: bool = False
    compile_only: bool = False
    stop_after: str = ""

    @property
    def jobs(self) -> int:
        """:attr:`compile_jobs` resolved (``0`` → the cores of this process's affinity mask)."""
        return self.compile_jobs or len(os.sched_getaffinity(0))

    @property
    def pass_names(self) -> tuple[str, ...]:
        from neuron_compile.passes.registry import parse_pass_spec
        return parse_pass_spec(self.passes)

    @property
    def fuse(self) -> bool:
        return "fuse" in self.pass_names

    def codegen_key(self) -> dict[str, Any]:
        """Fields that change generated code (part of the cache key); dumps and timeouts do not."""
        key = {"opt_level": self.opt_level, "passes": list(self.pass_names), "schedule": self.schedule,
               "profile": self.profile}
        if self.fallback:  # which ops run on the host (absent when off: earlier keys stay valid)
            key["fallback"] = self.fallback
        return key

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coerce(name: str, raw: Any, default: Any) -> Any:
    if raw is None:
        return None
    if isinstance(default, bool):
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{raw!r} is not one of 1/true/yes/on or 0/false/no/off")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return str(raw)


def resolve_config(options: Mapping[str, Any] | None = None,
                   environ: Mapping[str, str] | None = None) -> Config:
    """Build the :class:`Config` for one compile.

    Args:
        options: ``torch.compile(options=...)`` dict; keys are :class:`Config` field names.
        environ: environment to read (default ``os.environ``).
    Raises:
        NeuronCompileError: an unknown option name or a value of the wrong type.
    """
    environ = os.environ if environ is None else environ
    options = dict(options or {})
    if isinstance(options.get("schedule"), dict):
        options["schedule"] = json.dumps(options["schedule"], sort_keys=True)
    names = {f.name: f for f in fields(Config)}
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise NeuronCompileError(
            f"unknown neuron-compile option(s) {unknown}; known options are {sorted(names)}")
    values: dict[str, Any] = {}
    for name, f in names.items():
        default = f.default
        raw = options.get(name, environ.get(_ENV.get(name, ""), None))
        if raw is None:
            continue
        try:
            values[name] = _coerce(name, raw, default if default is not None else "")
        except (TypeError, ValueError) as exc:
            src = "options" if name in options else _ENV.get(name)
            raise NeuronCompileError(f"neuron-compile option {name}={raw!r} (from {src}) "
                                     f"is not a valid {type(default).__name__}") from exc
    cfg = Config(**values)
    if not 0 <= cfg.opt_level <= 3:
        raise NeuronCompileError(f"opt_level must be 0..3, got {cfg.opt_level}")
    if cfg.cache_max_bytes < 0:
        raise NeuronCompileError(f"cache_max_bytes must be >= 0 bytes, got {cfg.cache_max_bytes}")
    if cfg.compile_jobs < 0:
        raise NeuronCompileError(f"compile_jobs must be >= 0 (0 = one per core), got {cfg.compile_jobs}")
    if cfg.compile_timeout <= 0:
        raise NeuronCompileError(f"compile_timeout must be > 0 seconds, got {cfg.compile_timeout}")
    if cfg.fallback not in ("", "eager"):
        raise NeuronCompileError(f"fallback must be '' (fail on an op with no lowering rule) or 'eager', "
                                 f"got {cfg.fallback!r}")
    if cfg.stop_after:
        from neuron_compile.phases import Phase
        if cfg.stop_after not in (Phase.FX, Phase.FX_OPT, Phase.LINALG, Phase.LLVM):
            raise NeuronCompileError(f"stop_after must be '', fx, fx-opt, linalg or llvm, got {cfg.stop_after!r}")
        if not cfg.compile_only or cfg.cache:
            raise NeuronCompileError("stop_after builds nothing runnable: use it with compile_only=True and "
                                     "cache=False (as neuron-compile compile --emit PHASE does)")
    cfg.pass_names  # noqa: B018  (validates the pass spec now, with a clear error)
    from neuron_compile.codegen.strategy import parse_overrides
    parse_overrides(cfg.schedule)  # likewise the schedule overrides
    return cfg
