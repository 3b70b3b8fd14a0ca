"""A package's names imported from their submodules on first use (PEP 562).

``pl_privfed``, ``pl_privfed.cli`` and ``pl_privfed.report`` export names whose modules import
torch or Lightning; loading them on first use lets ``pl-privfed --help``, ``report`` and
``compare`` start without the training stack (``benchmarks/startup.py``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, where: Mapping[str, str], exported: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__`` (under ``pl_privfed.lightning`` the mirror's, so that
            its names come from that namespace's modules).
        where: each exported name → the submodule (relative to ``package``) that defines it.
        exported: the package's ``__all__``.

    Returns:
        ``(__getattr__, __dir__)``: a name of ``where`` is imported from
        ``<package>.<where[name]>`` on first use and kept in the package's namespace; any other
        name raises ``AttributeError``.
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exported})

    return __getattr__, __dir__
