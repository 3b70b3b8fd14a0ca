"""Per-client and per-example gradients by layer rules: one batched forward/backward, then a
closed-form rule per layer type (:mod:`pl_privfed.layer_rules.registry`).

For every layer with parameters the gradient of a loss is a function of the layer's input
``a`` and of the gradient ``g = ∂loss/∂z`` of its output ``z``: a ``Linear`` layer's weight
gradient is ``Σ_t g_tᵀ a_t`` (over the positions ``t`` of a sequence), a convolution's the same
over the patches of its input, an ``Embedding``'s a scatter of ``g`` into the rows of the
looked-up indices, a norm's ``Σ g ⊙ x̂`` and ``Σ g``. So one forward over all examples of a chunk
of clients (stacked: ``[n·B, ...]``, the centralized pass) and one backward that only propagates
``g`` (:mod:`~pl_privfed.layer_rules.capture`) give every layer's ``(a, g)`` for every example,
and the rules turn them into

* per-client gradient sums (:meth:`Rule.client_sums`);
* per-example gradient norms, by the cheaper of two rules per layer (mixed ghost clipping,
  Bu et al. 2022; Li et al. 2021): the *ghost norm* ``||Gᵀ A||² = ⟨A Aᵀ, G Gᵀ⟩`` (cost ``~T²``
  per example, ``T`` the sequence length or the number of patches) or the *instantiated*
  per-example gradient ``Gᵀ A`` (cost ``~p·d``), as :meth:`Rule.norm_mode` says;
* per-example clipped sums: the per-client sum rule applied to the reweighted output gradients
  ``s_b g_b`` (``s_b`` the clipping factor of example ``b``), or the weighted sum of the
  instantiated per-example gradients where they were kept: the reweighted reduction of the
  captured tensors that replaces a second backward.

Parameters per client (local steps: every client's model differs) are handled by the rules'
per-client forwards; the rules are the same. A chain of ``Linear`` layers and ReLU/Sigmoid/Tanh
under the plain cross-entropy propagates the output gradients by hand
(:mod:`~pl_privfed.layer_rules.chain`). The supported models: :func:`layer_support`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.profiler import record_function

from pl_privfed.layer_rules.capture import (
    BoundLayer,
    Captured,
    bind_layers,
    capturing_pass,
    example_losses,
)
from pl_privfed.layer_rules.chain import chain_pass, linear_chain
from pl_privfed.layer_rules.layout import ParameterLayout
from pl_privfed.layer_rules.linear import LinearRule
from pl_privfed.layer_rules.registry import NormMode, Rule
from pl_privfed.layer_rules.span import ClientSpan
from pl_privfed.layer_rules.support import layer_support

__all__ = ["LayerGradients"]


class LayerGradients:
    """``(params, inputs [n, B, ...], targets [n, B, ...]) -> (grads [n, d], losses [n])``
    by layer rules (module docstring); also :meth:`per_example` and :meth:`clipped_mean`.

    Args:
        model: a model :func:`layer_support` accepts (else ``ValueError`` with the reason).
        criterion: the loss, a mean over the minibatch of per-example losses.

    ``params``: shared ``[d]`` or per client ``[n, d]``, laid out as
    :class:`~pl_privfed.grads.ParameterLayout` (trainable ``named_parameters`` in order).
    """

    def __init__(self, model: nn.Module, criterion: nn.Module) -> None:
        reason = layer_support(model, criterion)
        if reason is not None:
            raise ValueError(f"grad_backend 'layers' does not support this model: {reason}")
        self.model = model
        self.criterion = criterion
        #: bytes of one layer's per-example gradients that :meth:`clipped_mean` keeps
        self.keep_bytes = 256 * 2**20
        self.layout = ParameterLayout(model)
        self.dim = self.layout.dim
        self._probed = False  # whether one capturing pass has checked the model (__call__)
        self.layers: list[BoundLayer] = bind_layers(model, self.layout)
        self._chain = linear_chain(model, criterion, self.layers)
        #: each layer's per-example norm rule in the last :meth:`clipped_mean` (:meth:`modes`)
        self._modes: dict[str, NormMode | None] = {layer.name: None for layer in self.layers}

    def _pass(
        self, params: Tensor, inputs: Tensor, targets: Tensor, factor: float = 1.0
    ) -> tuple[list[Captured], Tensor]:
        """Every layer's ``(layer, a, g)`` and the example losses ``[n, B]``; ``g`` is the
        gradient of each example's own loss times ``factor``."""
        with record_function("layer_rules.forward_backward"):
            if self._chain is not None:
                with torch.no_grad():
                    return chain_pass(
                        self.layers, self._chain, params.detach(), inputs, targets, factor
                    )
            return capturing_pass(
                self.model, self.criterion, self.layers, params, inputs, targets, factor
            )

    def __call__(self, params: Tensor, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Per-client gradients of the mean minibatch loss ``[n, d]`` and the losses ``[n]``."""
        n, batch = inputs.shape[:2]
        if n == 1 and self._chain is None:
            if not self._probed:  # the capturing pass refuses what the rules cannot do (e.g.
                # shared weights) whatever the chunk: run it once, on one example, to check
                self._pass(params, inputs[:, :1], targets[:, :1])
                self._probed = True
            return self._one_client(params.reshape(-1), inputs[0], targets[0])
        layers, losses = self._pass(params, inputs, targets, factor=1.0 / batch)
        out = params.new_empty(n, self.dim)  # every trainable parameter has its rule
        with record_function("layer_rules.client_sums"):
            for layer, a, g in layers:
                layer.write(out, layer.rule.client_sums(a, g, n, layer.want(), layer.views(out)))
        return out, losses.mean(1)

    def _one_client(self, flat: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """One client's gradient ``[1, d]`` and loss ``[1]``: with nothing to batch over, the
        per-client sum of every rule is autograd's own parameter gradient, so the model runs
        its ordinary forward and backward on leaves that are views of ``flat`` (no capturing
        hooks; each gradient lands in its parameter's columns once). Measured on the CNN, one
        client step with its SGD update: 1.02× the plain loop's, where the capturing pass took
        1.25× (CHANGELOG.md)."""
        with record_function("layer_rules.one_client"), torch.enable_grad():
            leaves = {
                k: v.detach().requires_grad_() for k, v in self.layout.unflatten(flat).items()
            }
            if x.is_floating_point():
                x = x.to(flat.dtype)
            out = functional_call(self.model, leaves, (x,), strict=False)
            loss = example_losses(self.criterion, out, y).mean()
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        # a parameter that does not reach the loss has gradient 0
        flat_grads = [
            (torch.zeros_like(v) if g is None else g).reshape(-1)
            for v, g in zip(leaves.values(), grads)
        ]
        return torch.cat(flat_grads)[None], loss.detach().view(1)

    def per_example(self, params: Tensor, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Every example's gradient ``[n, B, d]`` and loss ``[n, B]``."""
        n, batch = inputs.shape[:2]
        layers, losses = self._pass(params, inputs, targets)
        out = params.new_empty(n * batch, self.dim)
        for layer, a, g in layers:
            layer.write(out, layer.rule.example_grads(a, g, layer.want()))
        return out.view(n, batch, self.dim), losses

    def _norms(self, layers: list[Captured], params: Tensor, count: int) -> tuple[Tensor, list]:
        """Every example's gradient norm ``[count]`` (``count = n·B``) by each layer's rule (:meth:`Rule.norm_mode`,
        recorded for :meth:`modes`), and per layer the instantiated per-example gradients
        where they fit in :attr:`keep_bytes` (else ``None``)."""
        squared = params.new_zeros(count)
        kept: list[dict[str, Tensor] | None] = []
        for layer, a, g in layers:
            rule: Rule = layer.rule
            mode = self._modes[layer.name] = rule.norm_mode(a, g)
            if mode == "instantiate":
                grads = rule.example_grads(a, g, layer.want())
                for v in grads.values():
                    squared += torch.linalg.vector_norm(v.flatten(1), dim=1).square_()
                size = sum(v.numel() for v in grads.values()) * params.element_size()
                kept.append(grads if size <= self.keep_bytes else None)
            else:
                squared += rule.ghost_norms2(a, g, layer.want())
                kept.append(None)
        return squared.sqrt_(), kept

    def clipped_mean(
        self, params: Tensor, inputs: Tensor, targets: Tensor, scale: Callable[[Tensor], Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(1/B) Σ_b s(||g_b||) g_b`` per client without a second backward:
        ``(grads [n, d], example losses [n, B], example gradient norms [n, B])``.

        Each layer's per-example squared norms by its rule (ghost, or from the instantiated
        per-example gradients, which are then kept while they fit in :attr:`keep_bytes` per
        layer); the clipped sum is the weighted sum of the kept per-example gradients, or the
        per-client sum rule on the reweighted output gradients ``s_b g_b / B``."""
        n, batch = inputs.shape[:2]
        layers, losses = self._pass(params, inputs, targets)
        with record_function("layer_rules.norms"):
            norms, kept = self._norms(layers, params, n * batch)
        weights = scale(norms).div(batch)
        out = params.new_empty(n, self.dim)
        with record_function("layer_rules.clipped_sums"):
            for (layer, a, g), grads in zip(layers, kept):
                if grads is not None:  # Σ_b w_b G_b per client: [n, 1, B] @ [n, B, p]
                    w = weights.view(n, 1, batch)
                    sums = {k: torch.bmm(w, v.reshape(n, batch, -1)) for k, v in grads.items()}
                else:
                    g = g * weights.view(-1, *([1] * (g.dim() - 1)))
                    sums = layer.rule.client_sums(a, g, n, layer.want(), layer.views(out))
                layer.write(out, sums)
        return out, losses, norms.view(n, batch)

    # ------------------------------------------------------------------ the clients' data span
    def span_refusal(self) -> str | None:
        """Why the clients' gradients cannot run in the span of their data
        (:mod:`~pl_privfed.layer_rules.span`), or ``None``: the model must be one ``Linear``
        layer on the flattened input, trained in full, under the plain cross-entropy."""
        if self._chain is None or len(self.layers) != 1:
            return "the model is not one Linear layer under the cross-entropy"
        layer = self.layers[0]
        if not isinstance(layer.rule, LinearRule) or layer.slots.get("weight") is None:
            return "the model's layer is not a trained Linear layer"
        if self.dim != sum(
            int(torch.Size(s).numel()) for _, s in filter(None, layer.slots.values())
        ):
            return "the model has parameters outside its Linear layer"
        return None

    def span(self, examples: Tensor, members: Tensor) -> ClientSpan:
        """The :class:`~pl_privfed.layer_rules.span.ClientSpan` of the clients' examples
        ``[N, m, in]`` (float64, zero rows padding a short shard) for this model, with their
        dataset indices ``members [N, m]`` (:class:`ClientSpan`); :meth:`span_refusal` must be
        ``None``."""
        reason = self.span_refusal()
        if reason is not None:
            raise ValueError(f"client_span: {reason}")
        basis = ClientSpan.orthonormal(examples)  # float64
        coords = torch.bmm(examples, basis.transpose(1, 2))  # p_bj = a_b · q_j
        layer = self.layers[0].slots
        start, (out, _) = layer["weight"]
        bias = layer.get("bias")
        return ClientSpan(
            basis, (start, out), None if bias is None else (bias[0], out), self.dim, coords, members
        )

    def modes(self) -> dict[str, NormMode | None]:
        """Each layer's per-example norm rule of the last :meth:`clipped_mean` (``ghost`` or
        ``instantiate``; ``None`` before the first)."""
        return dict(self._modes)
