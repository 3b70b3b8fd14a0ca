"""Convolutional networks (plain ``nn.Module``s): paper 003's CNN and a small one for client-level DP."""

from __future__ import annotations

from torch import Tensor, nn

from pl_privfed.checks import check_positive_int

__all__ = ["SimpleCNN", "SmallCNN"]


def _check_image(in_channels: int, image_size: int, num_classes: int) -> None:
    """The input and output arguments both CNNs share: positive integers, and a side that two
    halvings (two poolings or two stride-2 convolutions) divide."""
    for name, value in [
        ("in_channels", in_channels),
        ("image_size", image_size),
        ("num_classes", num_classes),
    ]:
        check_positive_int(name, value)
    if image_size % 4:
        raise ValueError(f"image_size must be a multiple of 4, got {image_size!r}")


class SimpleCNN(nn.Module):
    """Two convolution layers (32 and 64 channels) and two fully connected layers (hidden 512).

    Paper 003 App. I (line 1705): "a simple deep neural network with two convolution layers (32
    and 64 channels) and two fully connected layers (hidden dimension 512)". The paper gives no
    kernel sizes; this is the CNN of McMahan et al. (2017) it follows: 5×5 convolutions with
    ``same`` padding, each followed by ReLU and 2×2 max pooling, then 512 ReLU units and the
    logits. On ``[3, 32, 32]`` inputs it has 2,156,490 parameters.

    Args:
        in_channels: input channels (3 for CIFAR-10, 1 for MNIST).
        image_size: input height = width (32 for CIFAR-10, 28 for MNIST).
        num_classes: logits.
        hidden: width of the first fully connected layer.
    """

    def __init__(
        self, in_channels: int = 3, image_size: int = 32, num_classes: int = 10, hidden: int = 512
    ) -> None:
        super().__init__()
        _check_image(in_channels, image_size, num_classes)
        check_positive_int("hidden", hidden)
        side = image_size // 4
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * side * side, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


class SmallCNN(nn.Module):
    """A CNN small enough for client-level DP with about a thousand clients: two 5×5
    convolutions of stride 2 (``channels`` = 8 and 16 by default, padding 2), each followed by
    GroupNorm and ReLU, then one linear layer to the logits.

    Client-level DP adds noise of a fixed standard deviation to every coordinate of the sum of
    clipped updates, so the noise grows with ``√d`` while the signal does not: with ~100
    clients a round the 2.2 M parameters of :class:`SimpleCNN` drown, this network's ~11 k do
    not. GroupNorm (``groups`` groups per layer) instead of BatchNorm: a client's gradient must
    be a function of its own examples only, and the engine's per-client layer rules refuse
    buffers (docs/engine.md). Strided convolutions instead of convolution and pooling: a
    quarter of the multiply-adds at each layer and no pooling (about a fifth of the CPU time
    of :class:`SimpleCNN`'s round, CHANGELOG.md). On ``[1, 28, 28]`` inputs (MNIST) with
    the defaults it has 11,322 parameters: conv 1→8 (208), GroupNorm(2, 8) (16), conv 8→16
    (3,216), GroupNorm(4, 16) (32), linear 16·7·7→10 (7,850).

    Args:
        in_channels: input channels (1 for MNIST).
        image_size: input height = width (28 for MNIST), a multiple of 4.
        num_classes: logits.
        channels: output channels of the two convolutions.
        groups: GroupNorm groups of the two layers (each must divide its ``channels``).
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int = 28,
        num_classes: int = 10,
        channels: tuple[int, int] | list[int] = (8, 16),
        groups: tuple[int, int] | list[int] = (2, 4),
    ) -> None:
        super().__init__()
        _check_image(in_channels, image_size, num_classes)
        for name, pair in [("channels", channels), ("groups", groups)]:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise ValueError(f"{name} must be two positive integers, got {pair!r}")
            for value in pair:
                check_positive_int(name, value)
        if any(c % g for c, g in zip(channels, groups, strict=True)):
            raise ValueError(f"groups {list(groups)!r} must divide channels {list(channels)!r}")
        (c1, c2), side = channels, image_size // 4
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, stride=2, padding=2),
            nn.GroupNorm(groups[0], c1),
            nn.ReLU(),
            nn.Conv2d(c1, c2, 5, stride=2, padding=2),
            nn.GroupNorm(groups[1], c2),
            nn.ReLU(),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(c2 * side * side, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
