"""CIFAR ResNets (He et al., 2016, §4.2) with the option-A (zero-padding) shortcut.

As in the reference implementation the α-NormEC papers build on (Yerlan Idelbayev's
``pytorch_resnet_cifar10``): 3×3 convolutions without bias, widths 16/32/64, ``6n+2`` layers,
global average pooling and a linear classifier; a downsampling shortcut takes every other pixel
and zero-pads the new channels. ResNet-20 has 269,722 parameters.
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from pl_privfed.checks import check_choice

__all__ = ["CifarResNet", "resnet20", "resnet32", "resnet44", "resnet56"]

Norm = Literal["batch", "group"]


def _norm(kind: Norm, channels: int, groups: int) -> nn.Module:
    check_choice("norm", kind, ("batch", "group"))
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(min(groups, channels), channels)


class _ShortcutA(nn.Module):
    """Option A: subsample by 2 and zero-pad the extra channels (no parameters)."""

    def __init__(self, pad: int) -> None:
        super().__init__()
        self.pad = pad

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: Norm, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _norm(norm, cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _norm(norm, cout, groups)
        needs_shortcut = stride != 1 or cin != cout
        self.shortcut = _ShortcutA((cout - cin) // 2) if needs_shortcut else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6·blocks+2) for 32×32 images.

    Args:
        depth: 20, 32, 44, 56, … (``depth = 6n + 2``).
        num_classes: output logits.
        norm: ``"batch"`` (default, as in the paper) or ``"group"`` (GroupNorm, for per-example
            gradients / record-level DP).
        groups: number of GroupNorm groups.
        in_channels: input channels (3 for CIFAR-10).
    """

    def __init__(
        self,
        depth: int = 20,
        num_classes: int = 10,
        norm: Norm = "batch",
        groups: int = 8,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth must be 6n+2 with n >= 1 (20, 32, 44, 56, …), got {depth!r}")
        blocks = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = _norm(norm, 16, groups)
        layers: list[nn.Module] = []
        cin = 16
        for cout, stride in [(16, 1), (32, 2), (64, 2)]:
            for b in range(blocks):
                layers.append(_BasicBlock(cin, cout, stride if b == 0 else 1, norm, groups))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():  # Kaiming normal init of the reference implementation
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


def resnet20(num_classes: int = 10, norm: Norm = "batch") -> CifarResNet:
    return CifarResNet(20, num_classes, norm)


def resnet32(num_classes: int = 10, norm: Norm = "batch") -> CifarResNet:
    return CifarResNet(32, num_classes, norm)


def resnet44(num_classes: int = 10, norm: Norm = "batch") -> CifarResNet:
    return CifarResNet(44, num_classes, norm)


def resnet56(num_classes: int = 10, norm: Norm = "batch") -> CifarResNet:
    return CifarResNet(56, num_classes, norm)
