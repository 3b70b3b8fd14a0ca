"""pl-privfed: simulate private, communication-efficient federated learning with Lightning."""

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
