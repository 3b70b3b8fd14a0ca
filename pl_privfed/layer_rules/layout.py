"""The flat parameter vector: :class:`ParameterLayout`, shared by the layer rules and the
gradient oracle (:mod:`pl_privfed.grads` exports it)."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

__all__ = ["ParameterLayout"]


class ParameterLayout:
    """Maps a module's parameters to and from one flat vector of length ``d``.

    The order is that of ``module.named_parameters()`` (trainable parameters only). Defined
    here, below :mod:`pl_privfed.grads` (which exports it), so that the layer rules use the
    same layout.

    Args:
        module: the model whose trainable parameters define the layout.
    """

    def __init__(self, module: nn.Module) -> None:
        named = [(k, p) for k, p in module.named_parameters() if p.requires_grad]
        self.names = [k for k, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.dim = sum(self.numels)
        starts = itertools.accumulate(self.numels, initial=0)
        #: name → (first column in the flat vector, shape)
        self.slots = {k: (s, tuple(shape)) for k, s, shape in zip(self.names, starts, self.shapes)}

    def flatten(self, module: nn.Module) -> Tensor:
        """The module's current parameters as one detached vector ``[d]``."""
        params = dict(module.named_parameters())
        return torch.cat([params[k].detach().reshape(-1) for k in self.names])

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Views of ``flat [..., d]`` shaped like the parameters (leading dims kept)."""
        lead = flat.shape[:-1]
        chunks = torch.split(flat, self.numels, dim=-1)
        return {k: c.view(*lead, *s) for k, c, s in zip(self.names, chunks, self.shapes)}

    @torch.no_grad()
    def assign(self, module: nn.Module, flat: Tensor) -> None:
        """Copy ``flat [d]`` into the module's parameters in place."""
        params = dict(module.named_parameters())
        for k, v in self.unflatten(flat).items():
            params[k].copy_(v)
