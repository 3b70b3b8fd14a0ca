"""Paper 003's CNN for CIFAR-10 (plain ``nn.Module``)."""

from __future__ import annotations

from torch import Tensor, nn

from pl_privfed.checks import check_positive_int

__all__ = ["SimpleCNN"]


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
        for name, value in [
            ("in_channels", in_channels),
            ("image_size", image_size),
            ("num_classes", num_classes),
            ("hidden", hidden),
        ]:
            check_positive_int(name, value)
        if image_size % 4:
            raise ValueError(f"image_size must be a multiple of 4, got {image_size!r}")
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
