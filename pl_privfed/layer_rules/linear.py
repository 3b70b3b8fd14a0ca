"""The rule of ``nn.Linear``, also over sequences (``T`` positions per example)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pl_privfed.layer_rules.registry import NormMode, Rule, register_rule

__all__ = ["LinearRule"]


def _flat_seq(t: Tensor) -> Tensor:
    """``[N, ..., f]`` as ``[N, T, f]``."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


@register_rule(nn.Linear)
class LinearRule(Rule):
    """``z = a Wᵀ + b`` over inputs ``[N, ..., in]`` (sequences: ``T`` positions); per client
    ``[n, out, B·T] @ [n, B·T, in]``; per-example norms by the ghost rule when
    ``2 T² < in·out`` (always for ``T = 1``: ``||δ||² ||a||²``), else instantiated."""

    summary = "`[n, out, B·T] @ [n, B·T, in]`; ghost norms when `2T² < in·out`"

    def forward(self, x, p, n):
        w, b = p["weight"], p["bias"]
        if n is None:
            return F.linear(x, w, b), x
        xs = x.reshape(n, -1, x.shape[-1])
        z = torch.baddbmm(b.unsqueeze(1), xs, w.transpose(1, 2)) if b is not None else xs @ w.mT
        return z.view(*x.shape[:-1], w.shape[1]), x

    def example_grads(self, a, g, want):
        a, g = _flat_seq(a), _flat_seq(g)
        out = {}
        if want["weight"]:
            out["weight"] = torch.bmm(g.transpose(1, 2), a)
        if want["bias"]:
            out["bias"] = g.sum(1)
        return out

    def client_sums(self, a, g, n, want, dest=None):
        a = a.reshape(n, -1, a.shape[-1])
        g = g.reshape(n, -1, g.shape[-1])
        out = {}
        if want["weight"]:
            view = None if dest is None else dest["weight"]
            if view is not None and view.is_contiguous():  # straight into the flat vector
                torch.bmm(g.transpose(1, 2), a, out=view)
            else:
                out["weight"] = torch.bmm(g.transpose(1, 2), a)
        if want["bias"]:
            out["bias"] = g.sum(1)
        return out

    def norm_mode(self, a: Tensor, g: Tensor) -> NormMode:
        steps = a[0].numel() // a.shape[-1]
        ghost = steps == 1 or 2 * steps * steps < a.shape[-1] * g.shape[-1]
        return "ghost" if ghost else "instantiate"

    def ghost_norms2(self, a, g, want):
        a, g = _flat_seq(a), _flat_seq(g)
        total = a.new_zeros(a.shape[0])
        if want["weight"]:
            if a.shape[1] == 1:  # the outer product δ aᵀ: ||δ||² ||a||²
                total += g.square().sum((1, 2)) * a.square().sum((1, 2))
            else:
                total += (torch.bmm(a, a.mT) * torch.bmm(g, g.mT)).sum((1, 2))
        if want["bias"]:
            total += g.sum(1).square().sum(1)
        return total
