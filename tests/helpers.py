"""Helpers for comparing compiled results with independently computed references."""
from __future__ import annotations

import copy

import torch


def float64_reference(module: torch.nn.Module, *inputs: torch.Tensor):
    """Run ``module`` in float64 eager on float64 copies of floating inputs; returns (output, grads)."""
    ref = copy.deepcopy(module).double()
    xs = [x.double().detach().requires_grad_(x.requires_grad) if x.is_floating_point() else x for x in inputs]
    out = ref(*xs)
    return ref, xs, out


def assert_close_rel(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
