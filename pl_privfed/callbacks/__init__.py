"""Callbacks usable in any Lightning project."""

from pl_privfed.callbacks.summary import RunSummary

__all__ = ["RunSummary"]
