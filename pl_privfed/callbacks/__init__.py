"""Callbacks usable in any Lightning project."""

from pl_privfed.callbacks.comm_cost import CommunicationCost
from pl_privfed.callbacks.gradient_norm import GradientNorm
from pl_privfed.callbacks.operator_stats import OperatorStatistics
from pl_privfed.callbacks.plots import TrainingCurves
from pl_privfed.callbacks.privacy_budget import PrivacyBudget
from pl_privfed.callbacks.summary import RunSummary

__all__ = [
    "CommunicationCost",
    "GradientNorm",
    "OperatorStatistics",
    "PrivacyBudget",
    "RunSummary",
    "TrainingCurves",
]
