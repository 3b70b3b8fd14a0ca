from typing import get_args

import pytest
import torch
from torch import nn

from pl_privfed.grads import (
    BACKENDS,
    Backend,
    GradientOracle,
    ParameterLayout,
    check_backend,
    resolve_backend,
)
from pl_privfed.models import MLP


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 16),
        nn.BatchNorm1d(16),
        nn.ReLU(),
        nn.Linear(16, 5),
    )


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 8, 1, 6, 6, generator=g), torch.randint(0, 5, (6, 8), generator=g)


def per_client_reference(model, flat, inputs, targets):
    """Independent reference: a fresh copy of the model per client, plain autograd."""
    grads, losses, means = [], [], []
    for i in range(inputs.shape[0]):
        m = bn_model()
        m.load_state_dict(model.state_dict())
        p = flat if flat.dim() == 1 else flat[i]
        torch.nn.utils.vector_to_parameters(p, m.parameters())
        loss = nn.functional.cross_entropy(m(inputs[i]), targets[i])
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, m.parameters())]))
        losses.append(loss.detach())
        means.append(m[1].running_mean.clone())
    return torch.stack(grads), torch.stack(losses), torch.stack(means).mean(0)


@pytest.mark.parametrize("per_client", [False, True])
def test_vmap_equals_loop_on_batchnorm_model(batch, per_client):
    inputs, targets = batch
    model = bn_model()
    layout = ParameterLayout(model)
    flat = layout.flatten(model)
    if per_client:
        flat = flat + 0.01 * torch.randn(
            6, flat.numel(), generator=torch.Generator().manual_seed(2)
        )
    outs = {}
    for backend in ("vmap", "loop"):
        oracle = GradientOracle(model, nn.CrossEntropyLoss(), backend)
        outs[backend] = oracle(flat, inputs, targets)
    torch.testing.assert_close(outs["vmap"].grads, outs["loop"].grads, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["vmap"].losses, outs["loop"].losses, atol=1e-5, rtol=1e-5)
    ref_grads, ref_losses, _ = per_client_reference(model, flat, inputs, targets)
    torch.testing.assert_close(outs["loop"].grads, ref_grads, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["loop"].losses, ref_losses, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_running_stats_are_client_average(batch, backend):
    inputs, targets = batch
    model = bn_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    oracle = GradientOracle(model, nn.CrossEntropyLoss(), backend)
    flat = oracle.layout.flatten(model)
    oracle(flat, inputs, targets)
    # a call never touches the model
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    oracle.commit_buffers()
    _, _, expected_mean = per_client_reference(bn_model(), flat, inputs, targets)
    torch.testing.assert_close(model[1].running_mean, expected_mean, atol=1e-6, rtol=1e-6)
    assert int(model[1].num_batches_tracked) == 1


def test_layout_roundtrip():
    model = MLP(5, [4], 3)
    layout = ParameterLayout(model)
    flat = layout.flatten(model)
    assert flat.shape == (5 * 4 + 4 + 4 * 3 + 3,)
    layout.assign(model, flat * 2)
    torch.testing.assert_close(layout.flatten(model), flat * 2)
    views = layout.unflatten(torch.zeros(7, layout.dim))
    assert views["net.1.weight"].shape == (7, 4, 5)


def test_backend_resolution_and_validation():
    assert resolve_backend("auto", torch.device("cuda"), bn_model()) == "vmap"
    assert resolve_backend("auto", torch.device("cpu"), bn_model()) == "loop"  # convolutional
    assert resolve_backend("auto", torch.device("cpu"), MLP(3, [4], 2)) == "vmap"
    assert resolve_backend("loop", torch.device("cuda")) == "loop"
    with pytest.raises(ValueError, match="grad_backend"):
        resolve_backend("jit", torch.device("cpu"))
    with pytest.raises(ValueError, match="backend"):
        GradientOracle(MLP(2, [], 2), nn.CrossEntropyLoss(), "jit")


def test_backend_names_are_checked_in_one_place():
    """``check_backend``: the choices a configuration may write are ``Backend``'s; anything else
    (the former name ``analytic`` too) names the argument and value."""
    assert get_args(Backend) == ("auto", *BACKENDS)
    assert check_backend("grad_backend", "layers") == "layers"
    with pytest.raises(ValueError, match=r"grad_backend must be .*'layers'.*got 'analytic'"):
        check_backend("grad_backend", "analytic")
    assert check_backend("grad_backend", "auto") == "auto"
    with pytest.raises(ValueError, match=r"grad_backend must be 'auto', 'vmap'.*got 'jit'"):
        check_backend("grad_backend", "jit")
    with pytest.raises(ValueError, match=r"backend must be 'vmap'.*got 'auto'"):
        check_backend("backend", "auto", auto=False)


def test_oracle_rejects_wrong_parameter_shape(batch):
    inputs, targets = batch
    oracle = GradientOracle(bn_model(), nn.CrossEntropyLoss(), "loop")
    with pytest.raises(ValueError, match="params must have shape"):
        oracle(torch.zeros(3), inputs, targets)


def gn_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.GroupNorm(2, 4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5),
    )


@pytest.mark.parametrize("backend", ["vmap", "loop"])
@pytest.mark.parametrize("per_client", [False, True])
def test_per_example_gradients_match_plain_autograd(batch, backend, per_client):
    inputs, targets = batch
    model = gn_model()
    layout = ParameterLayout(model)
    flat = layout.flatten(model)
    if per_client:
        flat = flat + 0.01 * torch.randn(6, layout.dim, generator=torch.Generator().manual_seed(3))
    oracle = GradientOracle(model, nn.CrossEntropyLoss(), backend)
    out = oracle(flat, inputs, targets, per_example=True)
    assert out.grads.shape == (6, 8, layout.dim) and out.losses.shape == (6, 8)
    for i in range(6):
        m = gn_model()
        torch.nn.utils.vector_to_parameters(flat if flat.dim() == 1 else flat[i], m.parameters())
        for j in range(8):
            loss = nn.functional.cross_entropy(m(inputs[i, j : j + 1]), targets[i, j : j + 1])
            g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, m.parameters())])
            torch.testing.assert_close(out.grads[i, j], g, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.losses[i, j], loss.detach(), atol=1e-6, rtol=1e-6)
    # the mean of the per-example gradients is the minibatch gradient
    full = oracle(flat, inputs, targets)
    torch.testing.assert_close(out.grads.mean(1), full.grads, atol=1e-5, rtol=1e-5)


def test_per_example_gradients_refuse_batchnorm(batch):
    inputs, targets = batch
    oracle = GradientOracle(bn_model(), nn.CrossEntropyLoss(), "vmap")
    with pytest.raises(ValueError, match="BatchNorm"):
        oracle(oracle.layout.flatten(oracle.model), inputs, targets, per_example=True)
