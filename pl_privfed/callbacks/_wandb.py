"""Moved to :mod:`pl_privfed.logdir`; this name stays only until ``pl_privfed/module.py`` imports
``log_artifact`` from there (then this file goes)."""

from pl_privfed.logdir import log_artifact  # noqa: F401  (module.py still imports it from here)
