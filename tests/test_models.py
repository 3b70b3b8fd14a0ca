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


def test_paper_models_parameter_counts():
    from pl_privfed.models import MLP, LogisticRegression, SimpleCNN

    def count(m):
        return sum(p.numel() for p in m.parameters())

    assert count(SimpleCNN()) == (3 * 25 + 1) * 32 + (32 * 25 + 1) * 64 + 4097 * 512 + 513 * 10
    assert count(SimpleCNN(in_channels=1, image_size=28)) == 1_663_370
    assert count(MLP(784, [64], 10, activation="sigmoid")) == 784 * 64 + 64 + 64 * 10 + 10
    assert count(LogisticRegression(784, 10)) == 7850
    assert SimpleCNN()(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_nonconvex_logistic_regression_is_paper_001_loss():
    """CE on the two logits + regularizer = log(1 + exp(−b xᵀf)) + λ Σ x²/(1+x²), b = 2l − 1;
    the oracle's per-client gradients include the regularizer."""
    from pl_privfed.grads import GradientOracle
    from pl_privfed.models import NonconvexLogisticRegression

    torch.manual_seed(0)
    model = NonconvexLogisticRegression(6, lam=0.2)
    with torch.no_grad():
        model.weight.copy_(torch.randn(6))
    x = torch.randn(3, 5, 6)
    labels = torch.randint(0, 2, (3, 5))
    oracle = GradientOracle(model, torch.nn.CrossEntropyLoss(), "vmap")
    out = oracle(model.weight.detach().clone(), x, labels)
    for i in range(3):
        w = model.weight.detach().clone().requires_grad_(True)
        b = 2.0 * labels[i] - 1
        loss = torch.log1p(torch.exp(-b * (x[i] @ w))).mean() + 0.2 * (w**2 / (1 + w**2)).sum()
        (g,) = torch.autograd.grad(loss, w)
        assert torch.allclose(out.losses[i], loss.detach(), atol=1e-6)
        assert torch.allclose(out.grads[i], g, atol=1e-6)
    loop = GradientOracle(model, torch.nn.CrossEntropyLoss(), "loop")
    assert torch.allclose(loop(model.weight.detach(), x, labels).grads, out.grads, atol=1e-6)
    with pytest.raises(ValueError, match="lam"):
        NonconvexLogisticRegression(3, lam=-1.0)
