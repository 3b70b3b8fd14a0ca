"""The layer-rule backend (``grad_backend: layers``) against plain autograd, per client and per
example (float64, 1e-10): every layer type alone in several configurations, models that mix
them (the CNN, ResNet-20 with GroupNorm, a text model), the clipped per-example means, the
refusals, and the backend through the engine against the loop backend."""

import gc
import weakref
from pathlib import Path

import pytest
import torch
from helpers.engine import Digits64
from helpers.layer_rules import DT, TOL, B, N, check_all, data, mixed_model, reference
from helpers.training import trainer
from torch import nn

from pl_privfed import FederatedModule
from pl_privfed.algorithms import (
    AlphaNormEC,
    FedAvgPerSampleClipping,
    FedAvgPerUpdateClipping,
    LocalSGD,
)
from pl_privfed.datamodules import DirichletPartitioner
from pl_privfed.engine import CHUNK_ENV
from pl_privfed.grads import GradientOracle, ParameterLayout
from pl_privfed.layer_rules import (
    LayerGradients,
    Rule,
    layer_support,
    register_rule,
    registry,
    rule_table,
    supported_layers,
)
from pl_privfed.models import MLP, SimpleCNN, TextClassifier
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise


def headed(layer, sample, classes=3):
    """``layer → tanh → flatten → Linear(·, classes)`` (the head's size from ``sample``)."""
    with torch.no_grad():
        width = layer(sample).flatten(1).shape[1]
    return nn.Sequential(layer, nn.Tanh(), nn.Flatten(), nn.Linear(width, classes))


LAYERS = {
    "linear": (lambda: nn.Linear(5, 4), (5,), None, "ghost"),
    "linear_no_bias": (lambda: nn.Linear(5, 4, bias=False), (5,), None, "ghost"),
    "linear_sequence_ghost": (lambda: nn.Linear(8, 9), (3, 8), None, "ghost"),  # 2·3² < 72
    "linear_sequence_instantiated": (lambda: nn.Linear(3, 2), (2, 5, 3), None, "instantiate"),
    "conv1d_strided_padded": (
        lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1),
        (3, 9),
        None,
        "instantiate",
    ),
    "conv1d_grouped_dilated_circular": (
        lambda: nn.Conv1d(4, 6, 3, groups=2, dilation=2, padding=2, padding_mode="circular"),
        (4, 7),
        None,
        "instantiate",
    ),
    "conv2d_strided_padded": (
        lambda: nn.Conv2d(2, 4, 3, stride=2, padding=1),
        (2, 5, 5),
        None,
        "instantiate",
    ),
    "conv2d_grouped_dilated_same": (
        lambda: nn.Conv2d(4, 6, (3, 2), groups=2, dilation=(2, 1), padding="same", bias=False),
        (4, 5, 4),
        None,
        "instantiate",
    ),
    "conv2d_reflect": (
        lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
        (2, 4, 4),
        None,
        "instantiate",
    ),
    "conv2d_ghost": (lambda: nn.Conv2d(3, 8, 3), (3, 4, 4), None, "ghost"),  # 2·4² < 27·8
    "embedding_padding_idx": (lambda: nn.Embedding(6, 4, padding_idx=0), (7,), 6, "ghost"),
    "embedding": (lambda: nn.Embedding(5, 3), (2, 4), 5, "ghost"),
    "layernorm": (lambda: nn.LayerNorm(5), (3, 5), None, "instantiate"),
    "layernorm_2d_shape": (lambda: nn.LayerNorm((3, 5)), (3, 5), None, "instantiate"),
    "layernorm_no_bias": (lambda: nn.LayerNorm(5, bias=False), (2, 5), None, "instantiate"),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), (4, 3, 3), None, "instantiate"),
    "groupnorm_1d": (lambda: nn.GroupNorm(4, 4, eps=1e-3), (4, 5), None, "instantiate"),
    "groupnorm_no_affine": (lambda: nn.GroupNorm(2, 4, affine=False), (4, 3), None, None),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_each_layer_rule_equals_autograd(name):
    make, shape, vocab, mode = LAYERS[name]
    torch.manual_seed(0)
    inputs, targets = data(shape, integer=vocab, seed=1)
    if vocab is not None:  # repeated indices within examples, padding among them
        flat = inputs.view(N, B, -1)
        flat[:, :, 0] = flat[:, :, 1] = 1
        flat[0, 0, 2] = 0
    layer = make().to(DT)
    model = headed(layer, inputs[0, :1])
    modes = check_all(model, inputs, targets)
    assert modes.get("0") == mode, modes


def test_mixed_size_rule_and_in_place_activations():
    """The first layer followed by an in-place ReLU; a frozen bias; a layer unused by the
    loss."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, 5)
            self.relu = nn.ReLU(inplace=True)
            self.b = nn.Linear(5, 3)
            self.unused = nn.Linear(5, 2)

        def forward(self, x):
            h = self.relu(self.a(x))
            self.unused(h)
            return self.b(h)

    model = Net()
    model.b.bias.requires_grad_(False)
    inputs, targets = data((6,))
    check_all(model, inputs, targets)


def test_simple_cnn():
    modes = check_all(*mixed_model("cnn"))
    # the 5×5 convolutions over 8×8 (4×4) images instantiate; the fully connected layers ghost
    assert modes == {
        "features.0": "instantiate",
        "features.3": "ghost",
        "classifier.1": "ghost",
        "classifier.3": "ghost",
    }


def test_resnet20_with_groupnorm():
    check_all(*mixed_model("resnet20_groupnorm"))


def test_text_model():
    modes = check_all(*mixed_model("text"))
    assert modes == {"embed": "ghost", "norm": "instantiate", "ff": "instantiate", "head": "ghost"}


@pytest.mark.parametrize("name", ["cnn", "resnet20_groupnorm", "text", "frozen_and_unused"])
def test_one_client_takes_autograd_and_equals_the_reference(name):
    """A chunk of one client (``_one_client``: the ordinary forward and backward on views of
    the flat parameters), shared and own weights, against autograd per client."""
    if name != "frozen_and_unused":
        model, inputs, targets = mixed_model(name)
    else:  # a frozen bias and a layer whose output never reaches the loss (gradient 0)
        torch.manual_seed(0)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b, self.unused = nn.Linear(6, 5), nn.Linear(5, 3), nn.Linear(5, 2)

            def forward(self, x):
                h = torch.tanh(self.a(x))
                self.unused(h)
                return self.b(h)

        model = Net()
        model.b.bias.requires_grad_(False)
        inputs, targets = data((6,))
    model = model.to(DT)
    rules = LayerGradients(model, nn.CrossEntropyLoss())
    assert rules._chain is None
    flat = ParameterLayout(model).flatten(model)
    one_x, one_y = inputs[:1], targets[:1]
    for params in (flat, flat[None] + 0.05 * torch.randn(1, flat.numel(), dtype=DT)):
        want_g, want_l, _, _ = reference(model, nn.CrossEntropyLoss(), params, one_x, one_y)
        got_g, got_l = rules(params, one_x, one_y)
        torch.testing.assert_close(got_g, want_g, **TOL)
        torch.testing.assert_close(got_l, want_l, **TOL)


def test_mse_and_a_generic_criterion():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    inputs, _ = data((4,))
    targets = torch.randn(N, B, 2, generator=torch.Generator().manual_seed(9), dtype=DT)
    check_all(model, inputs, targets, criterion=nn.MSELoss())
    check_all(model, inputs, targets, criterion=nn.SmoothL1Loss())


def test_refusals_name_the_layer_and_the_backends():
    crit = nn.CrossEntropyLoss()
    reason = layer_support(nn.Sequential(nn.Linear(3, 3), nn.PReLU()), crit)
    assert "PReLU" in reason and "vmap or loop" in reason
    bn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    assert "BatchNorm" in layer_support(bn, crit)
    with pytest.raises(ValueError, match="max_norm"):
        LayerGradients(nn.Sequential(nn.Embedding(4, 2, max_norm=1.0), nn.Flatten()), crit)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(self.lin(x))

    rules = LayerGradients(Twice(), crit)
    with pytest.raises(ValueError, match="more than once"):
        rules(
            torch.zeros(ParameterLayout(rules.model).dim),
            torch.zeros(1, 2, 3),
            torch.zeros(1, 2, dtype=torch.long),
        )
    # the model's own forward is restored after the failure
    assert "forward" not in rules.model.lin.__dict__


def test_the_oracle_with_the_layer_rules_per_example():
    torch.manual_seed(0)
    model = SimpleCNN(1, 8, hidden=8).to(DT)
    inputs, targets = data((1, 8, 8), classes=10, seed=4)
    layers = GradientOracle(model, nn.CrossEntropyLoss(), "layers")
    vmapped = GradientOracle(model, nn.CrossEntropyLoss(), "vmap")
    flat = layers.layout.flatten(model)
    a = layers(flat, inputs, targets, per_example=True)
    v = vmapped(flat, inputs, targets, per_example=True)
    torch.testing.assert_close(a.grads, v.grads, **TOL)
    c = layers.clipped_mean(flat, inputs, targets, Clip(0.1).scale)
    torch.testing.assert_close(c.grads, Clip(0.1)(v.grads).mean(1), **TOL)


def test_per_client_gradients_by_one_backend_clipped_means_by_the_layer_rules():
    """``auto`` on the CPU for a sequence model: per-client gradients by the loop, per-example
    gradients and clipped means by the layer rules; each equals its backend alone."""
    torch.manual_seed(0)
    model = TextClassifier(vocab_size=12, dim=6, hidden=8, num_classes=3).to(DT)
    inputs, targets = data((9,), integer=12, seed=3)
    criterion = nn.CrossEntropyLoss()
    mixed = GradientOracle(model, criterion, "loop", example_backend="layers")
    layers = GradientOracle(model, criterion, "layers")
    loop = GradientOracle(model, criterion, "loop")
    assert (mixed.backend, mixed.example_backend) == ("loop", "layers")
    flat = mixed.layout.flatten(model)
    for params in (flat, flat + 0.05 * torch.randn(N, flat.numel(), dtype=DT)):
        torch.testing.assert_close(
            mixed(params, inputs, targets).grads,
            loop(params, inputs, targets).grads,
            rtol=0,
            atol=0,
        )
        want = layers(params, inputs, targets, per_example=True)
        got = mixed(params, inputs, targets, per_example=True)
        torch.testing.assert_close(got.grads, want.grads, rtol=0, atol=0)
        want = layers.clipped_mean(params, inputs, targets, Clip(0.1).scale)
        got = mixed.clipped_mean(params, inputs, targets, Clip(0.1).scale)
        torch.testing.assert_close(got.grads, want.grads, rtol=0, atol=0)
        torch.testing.assert_close(got.norms, want.norms, rtol=0, atol=0)
    with pytest.raises(ValueError, match="example_backend"):
        GradientOracle(model, criterion, "loop", example_backend="fast")


def test_auto_on_the_cpu_for_the_text_model_through_the_engine():
    """``grad_backend: auto``: FedAvg's per-client gradients by the loop, per-example clipping
    by the layer rules; both runs equal the layer rules alone (float64)."""
    from helpers.engine import Digits64

    class Tokens(Digits64):
        def preprocess(self, inputs, train, round_index):
            return (inputs * 0.7).round().long().clamp_(0, 11)  # 64 tokens of 12 in a vocabulary

    def fit(name, backend):
        make = ALGORITHMS[name][0]
        torch.manual_seed(0)
        dm = Tokens(
            num_clients=4,
            batch_size=4,
            seed=3,
            partitioner=DirichletPartitioner(concentration=0.5, seed=1),
        )
        model = TextClassifier(vocab_size=12, dim=6, hidden=8, num_classes=10).double()
        module = FederatedModule(model, make(), grad_backend=backend)
        trainer(max_steps=2).fit(module, datamodule=dm)
        return module

    for name in ("fedavg", "dp_sgd_per_example"):
        auto, layers = fit(name, "auto"), fit(name, "layers")
        assert (auto.oracle.backend, auto.oracle.example_backend) == ("loop", "layers")
        torch.testing.assert_close(
            auto.layout.flatten(auto.model),
            layers.layout.flatten(layers.model),
            rtol=1e-10,
            atol=1e-11,
        )


# ---------------------------------------------------------------------------- through the engine
class Image8(Digits64):
    def preprocess(self, inputs, train, round_index):
        return inputs.double().view(*inputs.shape[:-1], 1, 8, 8)


ALGORITHMS = {
    "fedavg": (
        lambda: FedAvgPerUpdateClipping(1.0, 0.1, clip_threshold=None, local_solver=LocalSGD(1)),
        {},
    ),
    "fedavg_local_steps": (
        lambda: FedAvgPerUpdateClipping(1.0, 0.1, clip_threshold=None, local_solver=LocalSGD(2)),
        {"local_batches": 2},
    ),
    "dp_sgd_per_example": (
        lambda: FedAvgPerSampleClipping(
            0.1,
            clip_threshold=0.5,
            local_solver=LocalSGD(1),
            clip_level="example",
            noise=DPNoise(noise_multiplier=1.0, seed=3),
        ),
        {},
    ),
    "alpha_normec": (lambda: AlphaNormEC(0.1, beta=0.3, alpha=0.01), {}),
}


def _fit(name, backend, chunk, rounds=2):
    make, kwargs = ALGORITHMS[name]
    torch.manual_seed(0)
    dm = Image8(
        num_clients=4,
        batch_size=4,
        seed=3,
        partitioner=DirichletPartitioner(concentration=0.5, seed=1),
        **kwargs,
    )
    module = FederatedModule(
        SimpleCNN(1, 8, hidden=8).double(), make(), grad_backend=backend, client_chunk=chunk
    )
    trainer(max_steps=rounds).fit(module, datamodule=dm)
    return module.layout.flatten(module.model)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_the_cnn_through_the_engine_equals_the_loop_backend(name, monkeypatch):
    monkeypatch.delenv(CHUNK_ENV, raising=False)
    want = _fit(name, "loop", "all")
    for chunk in (1, "all"):
        got = _fit(name, "layers", chunk)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    torch.manual_seed(0)
    assert not torch.equal(
        want, ParameterLayout(SimpleCNN(1, 8, 8)).flatten(SimpleCNN(1, 8, hidden=8).double())
    )


def test_the_graph_is_freed_without_the_cyclic_garbage_collector():
    """The hook on each layer's output must not keep the batch's graph alive (a reference
    cycle tensor → graph → hook → tensor held every call's activations: 2.4 GB at 100 CNN
    clients)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.GELU(), nn.Linear(3, 3)).to(DT)  # autograd path
    refs = []
    for layer in (model[0], model[2]):
        layer.register_forward_hook(lambda m, i, out: refs.append(weakref.ref(out)))
    rules = LayerGradients(model, nn.CrossEntropyLoss())
    flat = ParameterLayout(model).flatten(model)
    inputs, targets = data((4,))
    gc.collect()
    gc.disable()
    try:
        rules(flat, inputs, targets)
        rules.clipped_mean(flat, inputs, targets, Clip(0.1).scale)
        rules.per_example(flat, inputs, targets)
        assert len(refs) == 6 and all(ref() is None for ref in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh", "gelu"])
def test_a_chain_of_linear_layers(activation):
    """MLPs (the former analytic backend): ReLU/Sigmoid/Tanh chains propagate the output
    gradients by hand, a GELU one by autograd; both exact, shared and per client."""
    torch.manual_seed(0)
    model = MLP(6, [5, 4], 3, activation=activation).to(DT)
    assert (LayerGradients(model, nn.CrossEntropyLoss())._chain is None) == (activation == "gelu")
    check_all(model, *data((2, 3)))


# ============================================================================ the open registry
class Diagonal(nn.Module):
    """A layer of the test's own: ``z = x ⊙ w + b`` over the last axis (a diagonal ``Linear``)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x * self.weight + self.bias


class DiagonalRule(Rule):
    """:class:`Diagonal`'s rule (docs/engine.md, "Adding a layer rule"): per example
    ``Σ_t g_t ⊙ a_t`` and ``Σ_t g_t`` over the positions; the per-client sums, the norms and the
    clipped sums come from :class:`Rule`'s defaults."""

    summary = "`Σ g ⊙ a` and `Σ g` (a test's layer)"

    def forward(self, x, p, n):
        w, b = p["weight"], p["bias"]
        if n is None:
            return x * w + b, x
        xs = x.reshape(n, -1, x.shape[-1])  # [n, B·T, f] against [n, 1, f]
        return (xs * w.unsqueeze(1) + b.unsqueeze(1)).view(x.shape), x

    def example_grads(self, a, g, want):
        a, g = a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])
        out = {}
        if want["weight"]:
            out["weight"] = (g * a).sum(1)
        if want["bias"]:
            out["bias"] = g.sum(1)
        return out


class ScaledLinear(nn.Linear):
    """A subclass of ``Linear`` with its own forward: a new layer type, without a rule."""

    def forward(self, x):
        return 2.0 * super().forward(x)


@pytest.fixture
def diagonal_rule(monkeypatch):
    """:class:`DiagonalRule` registered for :class:`Diagonal` during one test (the registry is
    restored afterwards)."""
    monkeypatch.setattr(registry, "_RULES", registry.registered_rules())
    return register_rule(Diagonal)(DiagonalRule)


@pytest.mark.parametrize("shape", [(5,), (2, 5)])
def test_a_rule_registered_for_a_new_layer_equals_autograd(diagonal_rule, shape):
    """A user's layer with its registered rule: per-client gradients (shared and per-client
    parameters), per-example gradients, norms and clipped means equal autograd in float64."""
    torch.manual_seed(0)
    inputs, targets = data(shape)
    width = 4 * (shape[0] if len(shape) == 2 else 1)
    model = nn.Sequential(
        nn.Linear(5, 4), Diagonal(4), nn.Tanh(), nn.Flatten(), nn.Linear(width, 3)
    )
    assert layer_support(model, nn.CrossEntropyLoss()) is None
    modes = check_all(model, inputs, targets)
    assert modes["1"] == "instantiate"
    assert "Diagonal" in supported_layers() and "`DiagonalRule`" in rule_table()


def test_layers_without_a_rule_are_refused_naming_the_registered_ones(diagonal_rule):
    """Rules match the exact type: a subclass of ``Linear`` is refused, and the message lists
    the registry (with the test's own layer while it is registered)."""
    reason = layer_support(nn.Sequential(ScaledLinear(3, 3)), nn.CrossEntropyLoss())
    assert reason.startswith("layer 0 is ScaledLinear, which has no layer rule")
    assert f"(supported: {', '.join(supported_layers())})" in reason
    assert "Diagonal" in reason and "vmap or loop" in reason
    with pytest.raises(ValueError, match="ScaledLinear"):
        GradientOracle(nn.Sequential(ScaledLinear(3, 3)), nn.CrossEntropyLoss(), "layers")


def test_register_rule_refuses_what_it_cannot_register(diagonal_rule):
    with pytest.raises(ValueError, match="Diagonal already has the rule DiagonalRule"):
        register_rule(Diagonal)(DiagonalRule)
    assert register_rule(Diagonal, replace=True)(DiagonalRule) is DiagonalRule
    with pytest.raises(ValueError, match="at least one layer type"):
        register_rule()
    with pytest.raises(ValueError, match="Module classes"):
        register_rule(Diagonal(2))
    with pytest.raises(ValueError, match="Rule subclass"):
        register_rule(ScaledLinear)(Diagonal)


def test_the_docs_table_is_the_registry():
    """docs/engine.md ("Layer rules") shows :func:`rule_table` of the built-in rules."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "engine.md").read_text()
    assert rule_table() in docs
    assert supported_layers() == (
        "Linear",
        "Conv1d",
        "Conv2d",
        "Embedding",
        "LayerNorm",
        "GroupNorm",
    )
