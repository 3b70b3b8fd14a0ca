"""The rule of ``nn.Embedding`` (without ``max_norm`` and ``scale_grad_by_freq``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pl_privfed.layer_rules.registry import NormMode, Rule, register_rule

__all__ = ["EmbeddingRule"]


@register_rule(nn.Embedding)
class EmbeddingRule(Rule):
    """``z = W[idx]``: the gradient scatters ``g`` into the looked-up rows (none for
    ``padding_idx``); per-example norms by the ghost rule ``Σ_{t,t'} [i_t = i_t'] ⟨g_t, g_t'⟩``."""

    names = ("weight",)
    summary = (
        "an `index_add` of `g` into each client's table (nothing for `padding_idx`); ghost norms"
    )

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        if module.max_norm is not None or module.scale_grad_by_freq:
            return "an Embedding with max_norm or scale_grad_by_freq"
        return None

    def forward(self, x, p, n):
        w = p["weight"]
        if n is None:
            return F.embedding(x, w), x
        rows = w.shape[1]
        offset = torch.arange(n, device=x.device).repeat_interleave(x.shape[0] // n) * rows
        idx = x + offset.view(-1, *([1] * (x.dim() - 1)))
        return F.embedding(idx, w.reshape(-1, w.shape[-1])), x

    def _masked(self, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        idx, g = a.reshape(a.shape[0], -1), g.reshape(g.shape[0], -1, g.shape[-1])
        pad = self.module.padding_idx
        if pad is not None:
            g = g * (idx != pad).unsqueeze(-1).to(g.dtype)
        return idx, g

    def _scatter(self, idx: Tensor, g: Tensor, groups: int) -> Tensor:
        """``[groups, V, D]``: the rows of ``g`` added at ``idx`` for ``groups`` equal parts."""
        vocab, width = self.module.weight.shape
        out = g.new_zeros(groups * vocab, width)
        per = idx.shape[0] // groups
        offset = torch.arange(groups, device=idx.device).repeat_interleave(per) * vocab
        out.index_add_(0, (idx + offset.unsqueeze(1)).reshape(-1), g.reshape(-1, width))
        return out.view(groups, vocab, width)

    def example_grads(self, a, g, want):
        idx, g = self._masked(a, g)
        return {"weight": self._scatter(idx, g, idx.shape[0])} if want["weight"] else {}

    def client_sums(self, a, g, n, want, dest=None):
        idx, g = self._masked(a, g)
        return {"weight": self._scatter(idx, g, n)} if want["weight"] else {}

    def norm_mode(self, a: Tensor, g: Tensor) -> NormMode:
        return "ghost"

    def ghost_norms2(self, a, g, want):
        idx, g = self._masked(a, g)
        same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
        return (same * torch.bmm(g, g.mT)).sum((1, 2))
