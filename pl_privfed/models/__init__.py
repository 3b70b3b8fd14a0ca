"""Models (plain ``nn.Module``s, no Lightning imports)."""

from pl_privfed.models.cnn import SimpleCNN, SmallCNN
from pl_privfed.models.logistic import NonconvexLogisticRegression
from pl_privfed.models.mlp import MLP, LogisticRegression
from pl_privfed.models.quadratic import HalfSquaredError, QuadraticModel
from pl_privfed.models.resnet_cifar import CifarResNet, resnet20, resnet32, resnet44, resnet56
from pl_privfed.models.text import TextClassifier

__all__ = [
    "MLP",
    "CifarResNet",
    "HalfSquaredError",
    "LogisticRegression",
    "NonconvexLogisticRegression",
    "QuadraticModel",
    "SimpleCNN",
    "SmallCNN",
    "TextClassifier",
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet56",
]
