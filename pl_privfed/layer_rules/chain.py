"""The pass of a chain of ``Linear`` layers and ReLU/Sigmoid/Tanh under the plain cross-entropy
(the MLPs, the logistic regressions): the output gradients are propagated by hand
(``δ_l = (δ_{l+1} W_{l+1}) ⊙ σ'(z_l)``, the former analytic backward) instead of by autograd,
whose per-operator bookkeeping is most of a small network's cost. The same
:class:`~pl_privfed.layer_rules.linear.LinearRule` turns the ``(a, g)`` into gradients."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pl_privfed.layer_rules.capture import BoundLayer, Captured
from pl_privfed.layer_rules.linear import LinearRule

__all__ = ["chain_pass", "linear_chain"]

_ACTIVATIONS = (nn.ReLU, nn.Sigmoid, nn.Tanh)


def linear_chain(
    model: nn.Module, criterion: nn.Module, layers: list[BoundLayer]
) -> list[nn.Module] | None:
    """The activations between the layers when ``model`` is a chain of ``Linear`` layers (with
    their :class:`LinearRule`) and ReLU/Sigmoid/Tanh (an ``nn.Sequential``, or one as ``.net``,
    with an optional leading ``Flatten``) under the plain cross-entropy, else ``None``."""
    net = model if isinstance(model, nn.Sequential) else getattr(model, "net", None)
    if not isinstance(net, nn.Sequential) or type(criterion) is not nn.CrossEntropyLoss:
        return None
    if criterion.label_smoothing != 0.0:
        return None
    modules = list(net)
    if modules and isinstance(modules[0], nn.Flatten):
        if (modules[0].start_dim, modules[0].end_dim) != (1, -1):
            return None
        modules = modules[1:]
    if not modules or len(modules) % 2 == 0:
        return None
    for k, module in enumerate(modules):
        allowed = (nn.Linear,) if k % 2 == 0 else _ACTIVATIONS
        if type(module) not in allowed:
            return None
    if [layer.rule.module for layer in layers] != modules[0::2]:
        return None  # a Linear with every parameter frozen
    if any(type(layer.rule) is not LinearRule for layer in layers):
        return None  # nn.Linear's rule was replaced: the propagation below assumes this one
    return modules[1::2]


def _back(act: nn.Module, back: Tensor, z: Tensor, out: Tensor) -> Tensor:
    """``back ⊙ σ'(z)`` in place, for the activation ``act`` with input ``z`` and output
    ``out``."""
    if isinstance(act, nn.ReLU):
        return back.mul_(z > 0)
    if isinstance(act, nn.Sigmoid):
        return back.mul_(out * (1 - out))
    return back.mul_(1 - out * out)


def chain_pass(
    layers: list[BoundLayer],
    activations: list[nn.Module],
    params: Tensor,
    inputs: Tensor,
    targets: Tensor,
    factor: float,
) -> tuple[list[Captured], Tensor]:
    """:func:`~pl_privfed.layer_rules.capture.capturing_pass` for a chain
    (:func:`linear_chain`): ``(every layer's (layer, a, g), example losses [n, B])``."""
    n, batch = inputs.shape[:2]
    per_client = None if params.dim() == 1 else n
    a = inputs.reshape(n * batch, -1).to(params.dtype)
    acts, pre, weights = [], [], []
    for k, layer in enumerate(layers):
        p = layer.params(params, per_client)
        z, _ = layer.rule.forward(a, p, per_client)
        acts.append(a)
        pre.append(z)
        weights.append(p["weight"])
        if k < len(activations):
            a = activations[k](z)
    logp = z.log_softmax(-1)
    index = targets.reshape(-1, 1).long()
    losses = -logp.gather(-1, index).squeeze(-1)
    delta = logp.exp_()
    delta.scatter_add_(-1, index, delta.new_full(index.shape, -1.0))  # softmax − onehot
    if factor != 1.0:
        delta.mul_(factor)
    result: list = [None] * len(layers)
    for k in range(len(layers) - 1, -1, -1):
        result[k] = (layers[k], acts[k], delta)
        if k == 0:
            break
        w = weights[k]
        if per_client is None:
            back = delta @ w
        else:
            back = torch.bmm(delta.view(n, batch, -1), w).view(n * batch, -1)
        delta = _back(activations[k - 1], back, pre[k - 1], acts[k])
    return result, losses.view(n, batch)
