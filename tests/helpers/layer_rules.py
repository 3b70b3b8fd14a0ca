"""Per-example gradients of every layer rule against a reference computed one example at a time."""

import torch
from torch import nn
from torch.func import functional_call

from pl_privfed.grads import ParameterLayout
from pl_privfed.layer_rules import LayerGradients
from pl_privfed.models import SimpleCNN, TextClassifier, resnet20
from pl_privfed.operators import Clip

DT = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)
N, B = 3, 4


def reference(model, criterion, flat, inputs, targets):
    """Plain autograd on a model per client (``flat`` shared ``[d]`` or ``[n, d]``): the clients'
    gradients and losses, every example's gradient and loss (the example as a batch of one)."""
    layout = ParameterLayout(model)
    client_g, client_l, example_g, example_l = [], [], [], []
    for i in range(inputs.shape[0]):
        leaf = (flat if flat.dim() == 1 else flat[i]).clone().requires_grad_()

        def loss_of(x, y, leaf=leaf):
            return criterion(functional_call(model, layout.unflatten(leaf), (x,)), y)

        loss = loss_of(inputs[i], targets[i])
        client_g.append(torch.autograd.grad(loss, leaf)[0])
        client_l.append(loss.detach())
        for b in range(inputs.shape[1]):
            loss = loss_of(inputs[i, b : b + 1], targets[i, b : b + 1])
            example_g.append(torch.autograd.grad(loss, leaf)[0])
            example_l.append(loss.detach())
    n, batch = inputs.shape[:2]
    return (
        torch.stack(client_g),
        torch.stack(client_l),
        torch.stack(example_g).view(n, batch, -1),
        torch.stack(example_l).view(n, batch),
    )


def check_all(model, inputs, targets, criterion=None, per_client=True, device="cpu"):
    """Per-client gradients, per-example gradients, clipped means and norms, with shared and
    per-client parameters, against :func:`reference` (on ``device``). Returns the rules' norm
    modes."""
    criterion = criterion or nn.CrossEntropyLoss()
    model = model.to(device, DT)
    inputs, targets = inputs.to(device), targets.to(device)
    rules = LayerGradients(model, criterion)
    flat = ParameterLayout(model).flatten(model)
    g = torch.Generator().manual_seed(5)
    params_list = [flat]
    if per_client:
        noise = torch.randn(inputs.shape[0], flat.numel(), generator=g, dtype=DT)
        params_list.append(flat + 0.05 * noise.to(device))
    for params in params_list:
        want_g, want_l, want_eg, want_el = reference(model, criterion, params, inputs, targets)
        got_g, got_l = rules(params, inputs, targets)
        torch.testing.assert_close(got_g, want_g, **TOL)
        torch.testing.assert_close(got_l, want_l, **TOL)
        got_eg, got_el = rules.per_example(params, inputs, targets)
        torch.testing.assert_close(got_eg, want_eg, **TOL)
        torch.testing.assert_close(got_el, want_el, **TOL)
        norms = torch.linalg.vector_norm(want_eg, dim=-1)
        op = Clip(float(norms.median()))  # some examples clipped, some not
        got_c, got_cl, got_norms = rules.clipped_mean(params, inputs, targets, op.scale)
        torch.testing.assert_close(got_norms, norms, **TOL)
        torch.testing.assert_close(got_c, op(want_eg).mean(1), **TOL)
        torch.testing.assert_close(got_cl, want_el, **TOL)
    return rules.modes()


def data(shape, classes=3, seed=0, integer=None):
    g = torch.Generator().manual_seed(seed)
    if integer is not None:
        inputs = torch.randint(0, integer, (N, B, *shape), generator=g)
    else:
        inputs = torch.randn(N, B, *shape, generator=g, dtype=DT)
    return inputs, torch.randint(0, classes, (N, B), generator=g)


def mixed_model(name):
    """``(model, inputs, targets)``: the CNN, ResNet-20 with GroupNorm or the text model (with
    padding), small, seeded (also for tests/test_gpu.py)."""
    torch.manual_seed(0)
    if name == "cnn":
        return SimpleCNN(1, 8, hidden=16), *data((1, 8, 8), classes=10)
    if name == "resnet20_groupnorm":
        g = torch.Generator().manual_seed(2)
        inputs = torch.randn(2, 2, 3, 8, 8, generator=g, dtype=DT)
        return resnet20(norm="group"), inputs, torch.randint(0, 10, (2, 2), generator=g)
    model = TextClassifier(vocab_size=12, dim=6, hidden=8, num_classes=3)
    inputs, targets = data((9,), integer=12, seed=3)
    inputs[:, :, -2:] = 0  # padding
    return model, inputs, targets
