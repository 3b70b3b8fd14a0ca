"""The former analytic backend (fully connected networks), now the Linear rules of the layer-rule
backend (``grad_backend: layers``, still accepted as ``analytic``)."""

import pytest
import torch
from torch import nn

from pl_privfed import FederatedModule
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.grads import GradientOracle, resolve_backend, resolve_example_backend
from pl_privfed.layer_rules import LayerGradients, layer_support
from pl_privfed.models import (
    MLP,
    LogisticRegression,
    NonconvexLogisticRegression,
    TextClassifier,
)

N, B = 5, 7


def reference(model, flat, inputs, targets):
    """Independent: a copy of the model per client, plain autograd on the mean cross-entropy."""
    grads, losses = [], []
    for i in range(inputs.shape[0]):
        params = [p.detach().clone().requires_grad_() for p in model.parameters()]
        torch.nn.utils.vector_to_parameters(flat if flat.dim() == 1 else flat[i], params)
        out = torch.func.functional_call(
            model, dict(zip([k for k, _ in model.named_parameters()], params)), (inputs[i],)
        )
        loss = nn.functional.cross_entropy(out, targets[i])
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
        losses.append(loss.detach())
    return torch.stack(grads), torch.stack(losses)


MODELS = {
    "relu": lambda: MLP(12, [9], 4),
    "sigmoid_two_hidden": lambda: MLP(12, [9, 6], 4, activation="sigmoid"),
    "tanh": lambda: MLP(12, [5], 4, activation="tanh"),
    "logistic": lambda: LogisticRegression(12, 4),
    "sequential_no_bias": lambda: nn.Sequential(
        nn.Linear(12, 6, bias=False), nn.ReLU(), nn.Linear(6, 4)
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("per_client", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_analytic_equals_autograd_and_the_other_backends(name, per_client, dtype):
    torch.manual_seed(0)
    model = MODELS[name]().to(dtype)
    g = torch.Generator().manual_seed(1)
    inputs = torch.randn(N, B, 3, 4, generator=g, dtype=dtype)  # flattened to 12 features
    targets = torch.randint(0, 4, (N, B), generator=g)
    if not isinstance(model, MLP):
        inputs = inputs.flatten(2)
    oracle = GradientOracle(model, nn.CrossEntropyLoss(), "layers")
    flat = oracle.layout.flatten(model)
    if per_client:
        flat = flat + 0.3 * torch.randn(N, flat.numel(), generator=g, dtype=dtype)
    out = oracle(flat, inputs, targets)
    tol = dict(atol=1e-12, rtol=1e-10) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    ref_grads, ref_losses = reference(model, flat, inputs, targets)
    torch.testing.assert_close(out.grads, ref_grads, **tol)
    torch.testing.assert_close(out.losses, ref_losses, **tol)
    for backend in ("vmap", "loop"):
        other = GradientOracle(model, nn.CrossEntropyLoss(), backend)(flat, inputs, targets)
        torch.testing.assert_close(out.grads, other.grads, **tol)


@pytest.mark.parametrize("per_client", [False, True])
def test_per_example_gradients_equal_vmap(per_client):
    torch.manual_seed(0)
    model = MLP(12, [9], 4, activation="sigmoid").double()
    g = torch.Generator().manual_seed(3)
    inputs = torch.randn(N, B, 12, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 4, (N, B), generator=g)
    analytic = GradientOracle(model, nn.CrossEntropyLoss(), "layers")
    vmapped = GradientOracle(model, nn.CrossEntropyLoss(), "vmap")
    flat = analytic.layout.flatten(model)
    if per_client:
        flat = flat + 0.3 * torch.randn(N, flat.numel(), generator=g, dtype=torch.float64)
    a = analytic(flat, inputs, targets, per_example=True)
    v = vmapped(flat, inputs, targets, per_example=True)
    assert a.grads.shape == (N, B, analytic.layout.dim) and a.losses.shape == (N, B)
    torch.testing.assert_close(a.grads, v.grads, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(a.losses, v.losses, atol=1e-12, rtol=1e-10)
    whole = analytic(flat, inputs, targets)  # the mean over B is the minibatch gradient
    torch.testing.assert_close(a.grads.mean(1), whole.grads, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "model, criterion, reason",
    [
        (lambda: MLP(4, [3], 2, batch_norm=True), nn.CrossEntropyLoss(), "buffers"),
        (lambda: MLP(4, [3], 2), nn.CrossEntropyLoss(reduction="sum"), "mean"),
        (lambda: MLP(4, [3], 2), nn.CrossEntropyLoss(weight=torch.ones(2)), "weights"),
        (lambda: NonconvexLogisticRegression(4), nn.CrossEntropyLoss(), "regularizer"),
        (lambda: nn.Sequential(nn.Linear(4, 3), nn.PReLU()), nn.CrossEntropyLoss(), "PReLU"),
        (lambda: nn.Sequential(nn.Conv3d(1, 2, 1), nn.Flatten()), nn.CrossEntropyLoss(), "Conv3d"),
    ],
)
def test_unsupported_models_are_refused_with_the_reason(model, criterion, reason):
    built = model()
    assert reason in layer_support(built, criterion)
    with pytest.raises(ValueError, match="layers"):
        LayerGradients(built, criterion)
    with pytest.raises(ValueError, match=reason):
        GradientOracle(built, criterion, "layers")
    # auto never picks it for them
    assert resolve_backend("auto", torch.device("cpu"), built, criterion) != "layers"


@pytest.mark.parametrize(
    "model, criterion",
    [
        (lambda: MLP(4, [3], 2, activation="gelu"), nn.CrossEntropyLoss()),
        (lambda: MLP(4, [3], 2), nn.MSELoss()),
        (lambda: MLP(4, [3], 2), nn.CrossEntropyLoss(label_smoothing=0.1)),
        (
            lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 2)),
            nn.CrossEntropyLoss(),
        ),
        (lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.CrossEntropyLoss()),
    ],
)
def test_what_the_analytic_backend_refused_the_layer_rules_compute(model, criterion):
    """GELU, MSE, label smoothing, convolutions, a network ending in an activation: exact."""
    torch.manual_seed(0)
    built = model().double()
    assert layer_support(built, criterion) is None
    g = torch.Generator().manual_seed(4)
    conv = isinstance(built[0], nn.Conv2d) if isinstance(built, nn.Sequential) else False
    inputs = torch.randn(3, 5, *((1, 3, 3) if conv else (4,)), generator=g, dtype=torch.float64)
    if isinstance(criterion, nn.MSELoss):
        targets = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)
    else:
        targets = torch.randint(0, 2, (3, 5), generator=g)
    layers = GradientOracle(built, criterion, "layers")
    loop = GradientOracle(built, criterion, "loop")
    flat = layers.layout.flatten(built)
    a, b = layers(flat, inputs, targets), loop(flat, inputs, targets)
    torch.testing.assert_close(a.grads, b.grads, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(a.losses, b.losses, atol=1e-12, rtol=1e-10)


def test_auto_picks_the_layer_rules_on_the_cpu_for_supported_networks():
    model = MLP(64, [32], 10)
    assert resolve_backend("auto", torch.device("cpu"), model, nn.CrossEntropyLoss()) == "layers"
    assert resolve_backend("auto", torch.device("cuda"), model, nn.CrossEntropyLoss()) == "vmap"
    assert resolve_backend("layers", torch.device("cpu")) == "layers"
    # per-example gradients and clipped means: the layer rules on every device
    for device in ("cpu", "cuda"):
        assert (
            resolve_example_backend("auto", torch.device(device), model, nn.CrossEntropyLoss())
            == "layers"
        )
    # a small sequence model: the plain loop for per-client gradients on the CPU
    text = TextClassifier(vocab_size=12, dim=6, hidden=8, num_classes=3)
    assert resolve_backend("auto", torch.device("cpu"), text, nn.CrossEntropyLoss()) == "loop"
    assert (
        resolve_example_backend("auto", torch.device("cpu"), text, nn.CrossEntropyLoss())
        == "layers"
    )
    # an explicit name, or a model the rules refuse, decides both
    assert resolve_example_backend("vmap", torch.device("cpu"), model) == "vmap"
    batch_norm = MLP(64, [32], 10, batch_norm=True)
    assert (
        resolve_example_backend("auto", torch.device("cuda"), batch_norm, nn.CrossEntropyLoss())
        == "vmap"
    )
    module = FederatedModule(model, AlphaNormEC(0.1, 0.1, 0.01))
    assert module.grad_backend == "auto"
    with pytest.raises(ValueError, match="grad_backend"):
        FederatedModule(model, module.algorithm, grad_backend="jit")
