"""The rules of the normalization layers with parameters: ``nn.LayerNorm`` and ``nn.GroupNorm``
(``BatchNorm`` has buffers and is refused: an example's output depends on its batch)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from pl_privfed.layer_rules.registry import Rule, register_rule

__all__ = ["GroupNormRule", "LayerNormRule"]


@register_rule(nn.LayerNorm)
class LayerNormRule(Rule):
    """``z = x̂ ⊙ w + b`` over the trailing ``normalized_shape``: per example
    ``Σ g ⊙ x̂`` and ``Σ g`` over the leading positions (instantiated: they are small)."""

    summary = "`Σ g ⊙ x̂` and `Σ g` over the normalized positions (`x̂` the normalized input)"

    def _normalize(self, x: Tensor) -> Tensor:
        m = self.module
        return F.layer_norm(x, m.normalized_shape, None, None, m.eps)

    def _affine(self, xhat: Tensor, p: dict, n: int | None) -> Tensor:
        w, b = p["weight"], p["bias"]
        if n is None:
            z = xhat * w if w is not None else xhat
            return z + b if b is not None else z
        view = xhat.view(n, -1, *xhat.shape[1:])
        shape = (n, *([1] * (view.dim() - 1 - len(self._param_shape()))), *self._param_shape())
        z = view * w.view(shape) if w is not None else view
        z = z + b.view(shape) if b is not None else z
        return z.view(xhat.shape)

    def _param_shape(self) -> tuple[int, ...]:
        return tuple(self.module.normalized_shape)

    def forward(self, x, p, n):
        xhat = self._normalize(x)
        return self._affine(xhat, p, n), xhat.detach()

    def _reduce_dims(self, g: Tensor) -> tuple[int, ...]:
        return tuple(range(1, g.dim() - len(self.module.normalized_shape)))

    def example_grads(self, a, g, want):
        dims, out = self._reduce_dims(g), {}
        if want["weight"]:
            out["weight"] = (g * a).sum(dims) if dims else g * a
        if want["bias"]:
            out["bias"] = g.sum(dims) if dims else g
        return out


@register_rule(nn.GroupNorm)
class GroupNormRule(LayerNormRule):
    """``z = x̂ ⊙ w_c + b_c`` per channel ``c`` of ``[N, C, ...]``: per example
    ``Σ_positions g ⊙ x̂`` and ``Σ_positions g``."""

    summary = "`Σ g ⊙ x̂` and `Σ g` per channel over the positions"

    def _normalize(self, x):
        m = self.module
        return F.group_norm(x, m.num_groups, None, None, m.eps)

    def _affine(self, xhat, p, n):
        w, b = p["weight"], p["bias"]
        extra = (1,) * (xhat.dim() - 2)
        if n is None:
            z = xhat * w.view(-1, *extra) if w is not None else xhat
            return z + b.view(-1, *extra) if b is not None else z
        view = xhat.view(n, -1, *xhat.shape[1:])
        z = view * w.view(n, 1, -1, *extra) if w is not None else view
        z = z + b.view(n, 1, -1, *extra) if b is not None else z
        return z.view(xhat.shape)

    def _reduce_dims(self, g):
        return tuple(range(2, g.dim()))
