"""The capturing pass: every layer with a rule runs the rule's forward on views of the flat
parameter vector, recording its capture ``a`` and, through a tensor hook, the gradient ``g`` of
its output; one forward over the stacked examples and one backward that propagates ``g`` only
(the parameters do not require grad) give every layer's ``(a, g)`` for every example."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import vmap

from pl_privfed.layer_rules.layout import ParameterLayout
from pl_privfed.layer_rules.registry import Rule, rule_for

__all__ = ["BoundLayer", "Captured", "bind_layers", "capturing_pass", "example_losses"]

#: ``(layer, a, g)`` of one layer after a pass
Captured = tuple["BoundLayer", Tensor, Tensor]


@dataclass
class BoundLayer:
    """A module of the model with its rule and its parameters' places in the flat vector."""

    name: str
    rule: Rule
    #: per parameter name: ``(offset in the flat vector, shape)`` when trainable, else ``None``
    slots: dict[str, tuple[int, tuple[int, ...]] | None]

    def want(self) -> dict[str, bool]:
        """Per parameter name whether its gradient is needed (trainable)."""
        return {k: self.slots.get(k) is not None for k in self.rule.names}

    def params(self, flat: Tensor, n: int | None) -> dict[str, Tensor | None]:
        """The layer's parameters as views of ``flat`` (``[d]``, or ``[n, d]`` per client);
        frozen or absent ones (``bias=False``): the module's own tensor (expanded per client)."""
        out = {}
        for pname in self.rule.names:
            slot = self.slots[pname]
            if slot is None:
                own = getattr(self.rule.module, pname, None)
                if own is not None and n is not None:
                    own = own.detach().unsqueeze(0).expand(n, *own.shape)
                out[pname] = None if own is None else own.detach().to(flat.dtype)
            else:
                start, shape = slot
                numel = int(torch.Size(shape).numel())
                out[pname] = flat[..., start : start + numel].view(*flat.shape[:-1], *shape)
        return out

    def views(self, out: Tensor) -> dict[str, Tensor | None]:
        """The layer's parameters' columns of ``out [n, d]`` as ``[n, *shape]`` views."""
        views = {}
        for pname, slot in self.slots.items():
            if slot is not None:
                start, shape = slot
                numel = int(torch.Size(shape).numel())
                views[pname] = out[:, start : start + numel].view(out.shape[0], *shape)
        return views

    def write(self, out: Tensor, grads: dict[str, Tensor]) -> None:
        """Copy ``grads`` (``{name: [..., *shape]}``) into their columns of ``out [..., d]``."""
        for pname, value in grads.items():
            start, shape = self.slots[pname]
            numel = int(torch.Size(shape).numel())
            out[..., start : start + numel].copy_(value.reshape(*out.shape[:-1], numel))


def bind_layers(model: nn.Module, layout: ParameterLayout) -> list[BoundLayer]:
    """Every module of ``model`` that has a rule and a trainable parameter, in module order."""
    layers = []
    for name, module in model.named_modules():
        rule = rule_for(module)
        if rule is None:
            continue
        slots = {}
        for pname in rule.names:
            slots[pname] = layout.slots.get(f"{name}.{pname}" if name else pname)
        if any(s is not None for s in slots.values()):
            layers.append(BoundLayer(name, rule, slots))
    return layers


def _capturing_forward(layer: BoundLayer, p: dict, n: int | None, dtype, captured: list, calls):
    """The forward that replaces ``layer``'s module's during a pass."""

    def forward(x, *rest):
        if rest:
            raise ValueError(f"layer {layer.name} was called with extra arguments")
        calls[layer.name] = calls.get(layer.name, 0) + 1
        if calls[layer.name] > 1:
            raise ValueError(
                f"layer {layer.name} ({type(layer.rule.module).__name__}) is called more "
                "than once per forward (shared weights): use the vmap or loop backend"
            )
        if x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
        z, a = layer.rule.forward(x, p, n)
        start = z
        if not z.requires_grad:  # the first layers: the graph starts at their output
            start = z.detach().requires_grad_()
            z = start.clone()  # (an in-place activation may follow)
        slot = [a, None, start, z]
        captured.append((layer, slot))

        def hook(grad, slot=slot):
            slot[1] = grad

        z.register_hook(hook)  # the gradient of z before any in-place change
        return z

    return forward


@contextlib.contextmanager
def _patched(layers: list[BoundLayer], params: Tensor, n: int | None, captured: list) -> Iterator:
    """Every rule's module runs the rule's forward (with the flat ``params``), capturing
    ``(a, z)`` and a hook for ``g``; the modules' own forwards are restored afterwards."""
    calls: dict[str, int] = {}
    modules = [layer.rule.module for layer in layers]
    try:
        for layer, module in zip(layers, modules):
            p = layer.params(params, n)
            module.forward = _capturing_forward(layer, p, n, params.dtype, captured, calls)
        yield
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)


def example_losses(criterion: nn.Module, out: Tensor, targets: Tensor) -> Tensor:
    """``[N]``: the criterion on each example as a batch of one."""
    if type(criterion) is nn.CrossEntropyLoss:
        return F.cross_entropy(
            out,
            targets,
            reduction="none",
            ignore_index=criterion.ignore_index,
            label_smoothing=criterion.label_smoothing,
        )
    if type(criterion) is nn.MSELoss:
        return F.mse_loss(out, targets.to(out.dtype), reduction="none").flatten(1).mean(1)
    return vmap(lambda o, t: criterion(o.unsqueeze(0), t.unsqueeze(0)))(out, targets)


def capturing_pass(
    model: nn.Module,
    criterion: nn.Module,
    layers: list[BoundLayer],
    params: Tensor,
    inputs: Tensor,
    targets: Tensor,
    factor: float = 1.0,
) -> tuple[list[Captured], Tensor]:
    """One forward/backward over the ``n·B`` stacked examples: ``(every layer's (layer, a, g),
    example losses [n, B])``; ``g`` is the gradient of each example's own loss times
    ``factor``."""
    n, batch = inputs.shape[:2]
    if params.dim() == 2 and n == 1:  # one client's own weights: the ordinary forward
        params = params[0]
    shared = params.dim() == 1
    x = inputs.reshape(n * batch, *inputs.shape[2:])
    if x.is_floating_point():
        x = x.to(params.dtype)
    y = targets.reshape(n * batch, *targets.shape[2:])
    captured: list = []
    with torch.enable_grad(), _patched(layers, params.detach(), None if shared else n, captured):
        out = model(x)
        losses = example_losses(criterion, out, y)
        starts = [slot[2] for _, slot in captured]
        if starts:  # runs the hooks; the values are the hooks' (before in-place changes)
            total = losses.sum() if factor == 1.0 else losses.sum() * factor
            torch.autograd.grad(total, starts, allow_unused=True)
    result = []
    for layer, slot in captured:
        a, g, _, z = slot
        if g is None:  # the layer's output does not reach the loss
            g = torch.zeros_like(z)
        result.append((layer, a.detach(), g.detach()))
        slot.clear()  # z → its graph → the hook → slot → z: break the cycle, free the graph
    return result, losses.detach().view(n, batch)
