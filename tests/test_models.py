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


def test_small_cnn_parameter_count_shape_and_per_client_gradients():
    """SmallCNN (the client-level DP CNN of configs/private/mnist_cnn_dp_fedavg.yaml): 11,322
    parameters on MNIST as its docstring counts them, logits of the right shape, GroupNorm (no
    buffers), and the engine's layer rules give every client's gradient, at a shared model and
    at per-client models (local steps), as the plain autograd loop does."""
    from pl_privfed.grads import GradientOracle
    from pl_privfed.models import SmallCNN

    model = SmallCNN()
    assert (
        sum(p.numel() for p in model.parameters())
        == ((25 + 1) * 8 + 2 * 8 + (8 * 25 + 1) * 16 + 2 * 16 + (16 * 7 * 7 + 1) * 10)
        == 11_322
    )
    assert not list(model.buffers())
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert SmallCNN(3, 32, 100, channels=(4, 8), groups=(1, 2))(
        torch.zeros(2, 3, 32, 32)
    ).shape == (
        2,
        100,
    )
    for bad, match in [
        ({"image_size": 30}, "image_size"),
        ({"channels": (8,)}, "channels"),
        ({"channels": (8, 16), "groups": (3, 4)}, "groups"),
        ({"num_classes": 0}, "num_classes"),
    ]:
        with pytest.raises(ValueError, match=match):
            SmallCNN(**bad)
    torch.manual_seed(0)
    small = SmallCNN(image_size=8, channels=(4, 4), groups=(2, 2)).double()
    inputs, targets = torch.randn(3, 5, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (3, 5))
    layers = GradientOracle(small, torch.nn.CrossEntropyLoss(), "layers")
    loop = GradientOracle(small, torch.nn.CrossEntropyLoss(), "loop")
    flat = layers.layout.flatten(small)
    per_client = flat + 0.1 * torch.randn(3, flat.numel(), dtype=torch.float64)
    for params in (flat, per_client):
        torch.testing.assert_close(
            layers(params, inputs, targets).grads, loop(params, inputs, targets).grads
        )


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
