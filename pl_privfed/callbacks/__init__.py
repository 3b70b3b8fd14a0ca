"""Callbacks usable in any Lightning project."""

from pl_privfed.callbacks.privacy_budget import PrivacyBudget
from pl_privfed.callbacks.summary import RunSummary

__all__ = ["PrivacyBudget", "RunSummary"]
