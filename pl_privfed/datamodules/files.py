"""Where datasets are read from and cached, and the papers' train/test split."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np

from pl_privfed.checks import check_choice

__all__ = [
    "DataFileError",
    "Split",
    "cache_dir",
    "check_split",
    "data_root",
    "resplit",
    "where_searched",
]

Split = Literal["standard", "paper"]


def check_split(split: str) -> Split:
    """``split`` if it is ``"standard"`` or ``"paper"``, else a ``ValueError`` naming it."""
    return check_choice("split", split, ("standard", "paper"))


class DataFileError(RuntimeError):
    """A dataset file that is present but cannot be read (truncated, corrupted, the wrong
    format); the message names the file, the directory searched and ``PL_PRIVFED_DATA``. A
    missing file is a ``FileNotFoundError`` with the same details."""


def data_root(data_dir: str | os.PathLike | None) -> Path:
    """``data_dir``, or ``$PL_PRIVFED_DATA``, or ``./data``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    return Path(os.environ.get("PL_PRIVFED_DATA", "data")).expanduser()


def where_searched(data_dir: str | os.PathLike | None) -> str:
    """Which directory :func:`data_root` chose and why, for error messages: the ``data_dir``
    argument, else ``$PL_PRIVFED_DATA``, else ``./data``."""
    root = data_root(data_dir)
    if data_dir is not None:
        why = "data_dir"
    elif "PL_PRIVFED_DATA" in os.environ:
        why = "from PL_PRIVFED_DATA"
    else:
        why = "the default ./data: set data_dir or PL_PRIVFED_DATA to where the datasets are"
    return f"searched {str(root.resolve())!r} ({why})"


def cache_dir(cache: str | os.PathLike | None, name: str) -> Path:
    """A writable directory for extracted/decoded copies: ``cache``, or ``$PL_PRIVFED_CACHE``,
    or ``~/.cache/pl-privfed``; ``/<name>`` appended."""
    if cache is None:
        cache = os.environ.get("PL_PRIVFED_CACHE", Path.home() / ".cache" / "pl-privfed")
    path = Path(cache).expanduser() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def resplit(
    split: Split,
    seed: int,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The standard split unchanged, or the α-NormEC papers' split: "The dataset was split into
    train (90%) and test (10%) sets. [...] The random seed was fixed to 42" (paper 002 App. C,
    line 853; paper 000 line 678). Train and test are pooled and split with scikit-learn's
    ``train_test_split(test_size=0.1, random_state=seed, shuffle=True)``."""
    if check_split(split) == "standard":
        return x_train, y_train, x_test, y_test
    x = np.concatenate([x_train, x_test])
    y = np.concatenate([y_train, y_test])
    from sklearn.model_selection import train_test_split  # on use: 0.3 s of CPU to import

    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.1, random_state=seed, shuffle=True)
    return x_tr, y_tr, x_te, y_te
