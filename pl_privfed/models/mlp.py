"""Multilayer perceptron and multinomial logistic regression (plain ``nn.Module``s)."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from pl_privfed.checks import check_choice, check_positive_int

__all__ = ["MLP", "LogisticRegression"]

_ACTIVATIONS = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "gelu": nn.GELU}


class MLP(nn.Module):
    """Fully connected network ``in → hidden… → num_classes`` (logits).

    Args:
        in_features: input size (inputs are flattened from dimension 1 on).
        hidden_sizes: sizes of the hidden layers (empty = logistic regression).
        num_classes: number of output logits.
        activation: ``"relu"``, ``"sigmoid"``, ``"tanh"`` or ``"gelu"``.
        batch_norm: add ``BatchNorm1d`` after each hidden linear layer.

    >>> MLP(64, [32], 10)(__import__("torch").zeros(5, 64)).shape
    torch.Size([5, 10])
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: list[int] | None = None,
        num_classes: int = 10,
        activation: Literal["relu", "sigmoid", "tanh", "gelu"] = "relu",
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        hidden_sizes = list(hidden_sizes or [])
        check_positive_int("in_features", in_features)
        check_positive_int("num_classes", num_classes)
        if any(not isinstance(h, int) or h < 1 for h in hidden_sizes):
            raise ValueError(f"hidden_sizes must be positive integers, got {hidden_sizes!r}")
        check_choice("activation", activation, tuple(_ACTIVATIONS))
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden_sizes:
            layers.append(nn.Linear(width, h))
            if batch_norm:
                layers.append(nn.BatchNorm1d(h))
            layers.append(_ACTIVATIONS[activation]())
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class LogisticRegression(MLP):
    """Multinomial logistic regression: one linear layer to ``num_classes`` logits.

    Train it with ``nn.CrossEntropyLoss`` (softmax cross-entropy).
    """

    def __init__(self, in_features: int, num_classes: int = 10) -> None:
        super().__init__(in_features, [], num_classes)
