import pytest
import torch

from pl_privfed.models import (
    MLP,
    CifarResNet,
    HalfSquaredError,
    LogisticRegression,
    QuadraticModel,
    resnet20,
    resnet32,
    resnet44,
    resnet56,
)


def count(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "factory, expected",
    [(resnet20, 269_722), (resnet32, 464_154), (resnet44, 658_586), (resnet56, 853_018)],
)
def test_cifar_resnet_parameter_counts(factory, expected):
    assert count(factory()) == expected


def test_resnet_forward_and_group_norm():
    x = torch.randn(2, 3, 32, 32)
    assert resnet20()(x).shape == (2, 10)
    gn = resnet20(norm="group")
    assert count(gn) == 269_722 and not any(
        isinstance(m, torch.nn.BatchNorm2d) for m in gn.modules()
    )
    with pytest.raises(ValueError, match="depth"):
        CifarResNet(depth=21)
    with pytest.raises(ValueError, match="norm"):
        CifarResNet(norm="layer")


def test_mlp_and_logistic_regression():
    assert count(MLP(64, [32], 10)) == 64 * 32 + 32 + 32 * 10 + 10
    assert count(LogisticRegression(784, 10)) == 7850
    assert MLP(4, [3], 2, activation="sigmoid")(torch.zeros(5, 2, 2)).shape == (5, 2)
    with pytest.raises(ValueError, match="activation"):
        MLP(4, [3], 2, activation="swish")
    with pytest.raises(ValueError, match="hidden_sizes"):
        MLP(4, [0], 2)
    with pytest.raises(ValueError, match="in_features"):
        MLP(0, [], 2)


def test_quadratic_model_loss():
    model = QuadraticModel(2, [1.0, -1.0])
    target = torch.tensor([[3.0, 0.0], [0.0, 0.0]])
    loss = HalfSquaredError()(model(torch.zeros(2, 1)), target)
    assert loss.item() == pytest.approx(0.5 * ((4 + 1) + (1 + 1)) / 2)
    with pytest.raises(ValueError, match="init"):
        QuadraticModel(3, [1.0])
