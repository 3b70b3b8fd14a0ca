"""The rule of ``nn.Conv1d`` and ``nn.Conv2d``: the linear rule over the input's patches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pl_privfed.compat.torch import conv_forward, conv_padding
from pl_privfed.layer_rules.registry import NormMode, Rule, register_rule

__all__ = ["ConvRule"]


@register_rule(nn.Conv1d, nn.Conv2d)
class ConvRule(Rule):
    """``Conv1d``/``Conv2d`` (any stride, padding and padding mode, dilation, groups): the
    linear rule over the input's patches (``unfold``, im2col)."""

    summary = (
        "the native `convolution_backward` per client (per example: the examples as groups); "
        "ghost norms over the patches when `2T² < (C/g·k)·(out/g)`"
    )

    def __init__(self, module):
        super().__init__(module)
        self.dims = module.weight.dim() - 2
        self.fn = F.conv1d if self.dims == 1 else F.conv2d

    def _pad(self, x: Tensor) -> Tensor:
        m = self.module
        pads = conv_padding(m)
        if not any(pads):
            return x
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        return F.pad(x, pads, mode=mode)

    def forward(self, x, p, n):
        m, w, b = self.module, p["weight"], p["bias"]
        if n is None:
            return conv_forward(m, x, w, b), x
        # clients as groups: [n·B, C, ...] -> [B, n·C, ...], weights [n·out, C/g, ...]
        batch = x.shape[0] // n
        xs = self._pad(x).view(n, batch, *x.shape[1:2], *self._pad(x[:1]).shape[2:])
        xs = xs.transpose(0, 1).reshape(batch, -1, *xs.shape[3:])
        bias = b.reshape(-1) if b is not None else None
        z = self.fn(xs, w.reshape(-1, *w.shape[2:]), bias, m.stride, 0, m.dilation, m.groups * n)
        z = z.view(batch, n, -1, *z.shape[2:]).transpose(0, 1)
        return z.reshape(n * batch, *z.shape[2:]), x

    def _padded(self, a: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """The input and the padding to give ``convolution_backward``."""
        m = self.module
        if m.padding_mode == "zeros" and not isinstance(m.padding, str):
            return a, tuple(m.padding)
        return self._pad(a), (0,) * self.dims

    def _weight_grad(self, a: Tensor, g: Tensor, groups: int, rows: int) -> Tensor:
        """``convolution_backward``'s weight gradient, for a weight of ``rows`` output
        channels and ``groups`` groups (the native kernels of a centralized backward)."""
        m = self.module
        x, padding = self._padded(a)
        weight = x.new_empty(rows, *m.weight.shape[1:])
        # stride, padding, dilation, transposed, output padding, groups; only the weight's
        options = (list(m.stride), list(padding), list(m.dilation), False, [0] * self.dims, groups)
        mask = [False, True, False]
        return torch.ops.aten.convolution_backward(g, x, weight, None, *options, mask)[1]

    def example_grads(self, a, g, want):
        """Every example's weight gradient in one grouped ``convolution_backward`` (the
        examples as groups: ``[1, N·C, ...]``)."""
        out, count, m = {}, a.shape[0], self.module
        if want["weight"]:
            x = a.reshape(1, -1, *a.shape[2:])
            grad = g.reshape(1, -1, *g.shape[2:])
            weight = self._weight_grad(x, grad, m.groups * count, m.out_channels * count)
            out["weight"] = weight.view(count, *m.weight.shape)
        if want["bias"]:
            out["bias"] = g.flatten(2).sum(2)
        return out

    def client_sums(self, a, g, n, want, dest=None):
        out, m = {}, self.module
        if want["weight"]:
            parts = [
                self._weight_grad(x, grad, m.groups, m.out_channels)
                for x, grad in zip(a.chunk(n), g.chunk(n))
            ]
            out["weight"] = torch.stack(parts)
        if want["bias"]:
            out["bias"] = g.flatten(2).sum(2).view(n, -1, g.shape[1]).sum(1)
        return out

    def _patches(self, a: Tensor) -> Tensor:
        """``[N, groups, C/g·k, L]``: every output position's input patch."""
        m = self.module
        a = self._pad(a)
        if self.dims == 1:
            cols = F.unfold(
                a.unsqueeze(2),
                (1, m.kernel_size[0]),
                dilation=(1, m.dilation[0]),
                stride=(1, m.stride[0]),
            )
        else:
            cols = F.unfold(a, m.kernel_size, dilation=m.dilation, stride=m.stride)
        return cols.view(a.shape[0], m.groups, -1, cols.shape[-1])

    def norm_mode(self, a: Tensor, g: Tensor) -> NormMode:
        m = self.module
        positions = g[0, 0].numel()
        rows = m.weight[0].numel()  # C/g · k
        ghost = 2 * positions * positions < rows * (m.out_channels // m.groups)
        return "ghost" if ghost else "instantiate"

    def ghost_norms2(self, a, g, want):
        total = a.new_zeros(a.shape[0])
        if want["weight"]:
            cols = self._patches(a)
            gs = g.reshape(g.shape[0], self.module.groups, -1, g[0, 0].numel())
            total += (cols.mT @ cols).mul_(gs.mT @ gs).sum((1, 2, 3))
        if want["bias"]:
            total += g.flatten(2).sum(2).square().sum(1)
        return total
