"""pl-privfed: simulate private, communication-efficient federated learning with Lightning.

The package's names load on first use (PEP 562): ``import pl_privfed`` alone imports neither
torch nor Lightning, so that ``pl-privfed --help``, ``report`` and ``compare`` start in a
fraction of the time ``import pytorch_lightning`` takes (``benchmarks/startup.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pl_privfed.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
