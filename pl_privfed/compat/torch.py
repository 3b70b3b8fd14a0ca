"""torch's private names that the package uses: the convolution and batch-norm base classes, a
convolution's padding and its forward with given weights.

Tested with torch ``TESTED`` (``tests/test_compat.py``).
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["TESTED", "conv_forward", "conv_padding", "is_batch_norm", "is_convolution"]

#: the torch versions this module was checked against (``pyproject.toml`` pins torch to them)
TESTED = ">=2.14,<2.15"


def is_convolution(module: nn.Module) -> bool:
    """Whether ``module`` is one of torch's convolutions (``Conv1d/2d/3d`` and their transposed
    and lazy forms: subclasses of the private ``_ConvNd``)."""
    return isinstance(module, nn.modules.conv._ConvNd)


def is_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` is one of torch's batch norms (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``
    and the lazy forms: subclasses of the private ``_BatchNorm``)."""
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


def conv_padding(conv: nn.Module) -> tuple[int, ...]:
    """The padding of a ``Conv1d``/``Conv2d`` in :func:`torch.nn.functional.pad`'s order (last
    dimension first, each side), as the layer pads a non-``zeros`` padding mode itself."""
    return tuple(conv._reversed_padding_repeated_twice)


def conv_forward(conv: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The layer's own forward with ``weight`` and ``bias`` in place of its parameters (its
    padding mode, stride, dilation and groups)."""
    return conv._conv_forward(x, weight, bias)
