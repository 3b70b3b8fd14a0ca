"""pl-privfed: simulate private, communication-efficient federated learning with Lightning."""

from pl_privfed.grads import GradientOracle, ParameterLayout
from pl_privfed.module import FederatedModule, NonFiniteLossError

__all__ = ["FederatedModule", "GradientOracle", "NonFiniteLossError", "ParameterLayout"]
__version__ = "0.1.0"
