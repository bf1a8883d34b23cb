"""ATen overloads that exist in some supported torch releases only.

neuron-compile supports torch 2.13 and 2.14 (``pyproject.toml``). A rule table keyed by an overload
that a release lacks would crash at import time (``aten.cholesky.default`` is gone from 2.14: its
Python-level ``torch.cholesky`` now calls ``linalg_cholesky``). Tables name such overloads through
:func:`aten_overload` and drop the missing ones with :func:`present`, so the rule is simply absent in
that release and a debug log line says so.

Known differences (keep this list in step with the call sites):

- ``aten.cholesky.default``: 2.13 has it; 2.14 does not.
"""
from __future__ import annotations

import logging
from typing import Optional, TypeVar

import torch

log = logging.getLogger(__name__)

V = TypeVar("V")


def aten_overload(name: str) -> Optional[torch._ops.OpOverload]:
    """``torch.ops.aten.<packet>.<overload>`` for ``name = "<packet>.<overload>"``, or ``None``.

    ``None`` (with a debug log naming the torch release) where this torch release has no such packet
    or overload. Raises ``ValueError`` when ``name`` is not of the form ``packet.overload``.
    """
    packet_name, sep, overload_name = name.partition(".")
    if not sep or not packet_name or not overload_name:
        raise ValueError(f"aten_overload wants 'packet.overload', e.g. 'cholesky.default'; got {name!r}")
    try:
        return getattr(getattr(torch.ops.aten, packet_name), overload_name)
    except (AttributeError, RuntimeError):
        log.debug("torch %s has no aten.%s: its rule is left out", torch.__version__, name)
        return None


def present(table: dict[Optional[torch._ops.OpOverload], V]) -> dict[torch._ops.OpOverload, V]:
    """``table`` without the entries whose key is ``None`` (an overload this torch release lacks)."""
    return {op: value for op, value in table.items() if op is not None}
