"""A small CNN (conv, train-mode batchnorm, maxpool, adaptive avgpool, linear) against eager.

Tolerances: float32 throughout. Convolutions and batchnorm statistics sum in a different order
than eager's kernels, so activations agree to ~1e-6 relative; gradients pass back through two
convolutions and the batchnorm normalisation, hence 1e-4 relative; after five AdamW steps the
parameters agree to 1e-4 relative and the running statistics to 1e-5.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.conftest import neuron_compile
from tests.helpers import train_side_by_side


class SmallCNN(nn.Module):
    """conv → batchnorm (train) → relu → maxpool → conv (stride 2) → adaptive avgpool → linear."""

    def __init__(self):
        super().__init__()
        # no bias before batchnorm: its gradient is exactly zero in theory, so both eager's and ours
        # are rounding noise, which AdamW's normalisation would blow up into different updates
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.c2(x)), 1).flatten(1))


def _batch(g):
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 4, (4,), generator=g)


def test_eval_forward_matches_eager():
    torch.manual_seed(0)
    model = SmallCNN()
    model.bn.running_mean.uniform_(-1, 1), model.bn.running_var.uniform_(0.5, 2)
    model.eval()
    x, _ = _batch(torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(neuron_compile(copy.deepcopy(model), fullgraph=True)(x), model(x),
                                   rtol=1e-5, atol=1e-5)


def test_one_training_step_gradients_match_eager():
    torch.manual_seed(0)
    ours = SmallCNN()
    eager = copy.deepcopy(ours)
    x, y = _batch(torch.Generator().manual_seed(1))
    F.cross_entropy(neuron_compile(ours, fullgraph=True)(x), y).backward()
    F.cross_entropy(eager(x), y).backward()
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_five_adamw_steps_match_eager_including_batchnorm_running_stats():
    torch.manual_seed(0)
    ours, eager = train_side_by_side(SmallCNN(), 5, _batch, fullgraph=True)
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(ours.bn.running_mean, eager.bn.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.bn.running_var, eager.bn.running_var, rtol=1e-5, atol=1e-6)
    assert int(ours.bn.num_batches_tracked) == int(eager.bn.num_batches_tracked) == 5
