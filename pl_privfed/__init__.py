"""pl-privfed: simulate private, communication-efficient federated learning with Lightning.

The package's names load on first use (PEP 562): ``import pl_privfed`` alone imports neither
torch nor Lightning, so that ``pl-privfed --help``, ``report`` and ``compare`` start in a
fraction of the time ``import pytorch_lightning`` takes (``benchmarks/startup.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pl_privfed.callbacks import default_callbacks
    from pl_privfed.datamodules import FederatedDataModule
    from pl_privfed.grads import GradientOracle, ParameterLayout
    from pl_privfed.module import FederatedModule, NonFiniteLossError

__all__ = [
    "FederatedDataModule",
    "FederatedModule",
    "GradientOracle",
    "NonFiniteLossError",
    "ParameterLayout",
    "default_callbacks",
]
__version__ = "0.1.0"

#: each exported name → the submodule that defines it (relative: under ``pl_privfed.lightning``
#: the same names come from that namespace's modules)
_LAZY = {
    "FederatedDataModule": "datamodules",
    "FederatedModule": "module",
    "GradientOracle": "grads",
    "NonFiniteLossError": "module",
    "ParameterLayout": "grads",
    "default_callbacks": "callbacks",
}


def __getattr__(name: str) -> Any:
    """An exported name, imported from its submodule on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
