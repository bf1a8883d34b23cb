"""Vision workloads (issue 41): ResNet-18, a MobileNetV2-style network and a small UNet, hand-built
(no torchvision), on 3×64×64 images; and a per-layer sweep of the convolution and pooling kinds
they use. Training steps are forward + cross-entropy + backward, as a user's step."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workloads import Workload, _seeded


class BasicBlock(nn.Module):
    """ResNet's basic block (He et al., 2016), with a 1×1 stride-2 projection where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.down(x) + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNet18(nn.Module):
    """torchvision's resnet18 layout: 7×7/2 stem, 3×3/2 max-pool, four stages of two blocks, 10 classes."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        chans, layers, cin = (64, 128, 256, 512), [], 64
        for i, c in enumerate(chans):
            layers += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block (Sandler et al., 2018): 1×1 expand, 3×3 depthwise, 1×1 project, ReLU6."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hid = cin * expand
        self.res = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.body(x) if self.res else self.body(x)


class MobileNetV2Style(nn.Module):
    """A shortened MobileNetV2: stem, seven inverted-residual blocks (expansion 6), 1×1 head, 10 classes."""

    def __init__(self, classes: int = 10):
        super().__init__()
        cfg = [(16, 24, 2), (24, 24, 1), (24, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 96, 1)]
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(*(InvertedResidual(a, b, s, 6) for a, b, s in cfg))
        self.head = nn.Sequential(nn.Conv2d(96, 320, 1, bias=False), nn.BatchNorm2d(320), nn.ReLU6())
        self.fc = nn.Linear(320, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.head(self.blocks(self.stem(x))), 1).flatten(1))


def _double_conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class SmallUNet(nn.Module):
    """A three-level UNet (Ronneberger et al., 2015): double convs, 2×2 max-pool down,
    ConvTranspose 2×2/2 up, skip ``cat``; per-pixel logits for ``classes``."""

    def __init__(self, classes: int = 4, c: int = 16):
        super().__init__()
        self.d1, self.d2, self.mid = _double_conv(3, c), _double_conv(c, 2 * c), _double_conv(2 * c, 4 * c)
        self.u2, self.c2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, 2), _double_conv(4 * c, 2 * c)
        self.u1, self.c1 = nn.ConvTranspose2d(2 * c, c, 2, 2), _double_conv(2 * c, c)
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        m = self.mid(F.max_pool2d(b, 2))
        b = self.c2(torch.cat([self.u2(m), b], 1))
        return self.out(self.c1(torch.cat([self.u1(b), a], 1)))


class WithLoss(nn.Module):
    """``cross_entropy(model(x), target)``: a training step's loss (fixed targets)."""

    def __init__(self, model: nn.Module, target: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("target", target)

    def forward(self, x):
        return F.cross_entropy(self.model(x), self.target)


def _model(name: str, factory: Callable[[], nn.Module], batch: int, pixel_targets: bool,
           classes: int) -> list[Workload]:
    g = torch.Generator().manual_seed(1)
    shape = (batch, 64, 64) if pixel_targets else (batch,)

    def inference():
        return _seeded(factory).eval(), (torch.randn(batch, 3, 64, 64, generator=g),)

    def train():
        target = torch.randint(0, classes, shape, generator=g)
        return WithLoss(_seeded(factory), target).train(), (torch.randn(batch, 3, 64, 64, generator=g),)
    return [Workload(f"{name} inference", "vision", inference, heavy=True),
            Workload(f"{name} train step", "vision", train, train=True, heavy=True, input_grad=False)]


def model_workloads() -> list[Workload]:
    """The three networks of issue 41, inference and training step."""
    return (_model("resnet18 b16", ResNet18, 16, False, 10) + _model("mobilenetv2 b16", MobileNetV2Style, 16, False, 10)
            + _model("unet b8", SmallUNet, 8, True, 4))


# (name, module factory, input shape): the layer kinds the networks use, one row each
LAYERS: list[tuple[str, Callable[[], nn.Module], tuple[int, ...]]] = [
    ("conv3x3 256ch 4x4", lambda: nn.Conv2d(256, 256, 3, padding=1, bias=False), (16, 256, 4, 4)),
    ("conv3x3 512ch 2x2", lambda: nn.Conv2d(512, 512, 3, padding=1, bias=False), (16, 512, 2, 2)),
    ("conv3x3 s2 128->256 8x8", lambda: nn.Conv2d(128, 256, 3, 2, 1, bias=False), (16, 128, 8, 8)),
    ("conv1x1 s2 256->512 4x4", lambda: nn.Conv2d(256, 512, 1, 2, bias=False), (16, 256, 4, 4)),
    ("conv7x7 s2 stem 3->64 64x64", lambda: nn.Conv2d(3, 64, 7, 2, 3, bias=False), (16, 3, 64, 64)),
    ("conv3x3 64ch 16x16", lambda: nn.Conv2d(64, 64, 3, padding=1, bias=False), (16, 64, 16, 16)),
    ("grouped conv3x3 g4 64ch 16x16", lambda: nn.Conv2d(64, 64, 3, padding=1, groups=4), (16, 64, 16, 16)),
    ("depthwise 3x3 128ch 28x28", lambda: nn.Conv2d(128, 128, 3, padding=1, groups=128), (16, 128, 28, 28)),
    ("depthwise 3x3 s2 96ch 32x32", lambda: nn.Conv2d(96, 96, 3, 2, 1, groups=96, bias=False), (16, 96, 32, 32)),
    ("convtranspose 2x2 s2 64->32 8x8", lambda: nn.ConvTranspose2d(64, 32, 2, 2), (8, 64, 8, 8)),
    ("convtranspose 3x3 s2 64->32 8x8", lambda: nn.ConvTranspose2d(64, 32, 3, 2, 1, 1), (8, 64, 8, 8)),
    ("maxpool 3x3 s2 64ch 32x32", lambda: nn.MaxPool2d(3, 2, 1), (16, 64, 32, 32)),
    ("avgpool 2x2 64ch 32x32", lambda: nn.AvgPool2d(2), (16, 64, 32, 32)),
    ("batchnorm+relu 64ch 32x32", lambda: nn.Sequential(nn.BatchNorm2d(64), nn.ReLU()), (16, 64, 32, 32)),
    ("conv1d k3 64ch 256", lambda: nn.Conv1d(64, 64, 3, padding=1), (16, 64, 256)),
]


def layer_workloads() -> list[Workload]:
    """One forward and one training row (``out.sum().backward()``) per layer of :data:`LAYERS`."""
    out = []
    for name, factory, shape in LAYERS:
        def make(factory=factory, shape=shape):
            return _seeded(factory), (torch.randn(shape, generator=torch.Generator().manual_seed(2)),)
        out += [Workload(f"{name} fwd", "layer", make), Workload(f"{name} train", "layer", make, train=True)]
    return out
