import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch):
    """No test needs the network: W&B always runs offline."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture
def repo() -> Path:
    return REPO


# ../shared/data beside the checkout; a worktree elsewhere names it in PL_PRIVFED_SHARED_DATA
SHARED_DATA = Path(os.environ.get("PL_PRIVFED_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real dataset copies beside the repository (``../shared/data``; CI has them)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real datasets expected in {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """One writable cache for the whole session (the CIFAR-10 JPEG copy is decoded once)."""
    return tmp_path_factory.mktemp("pl_privfed_cache")


@pytest.fixture(autouse=True)
def _data_env(monkeypatch, data_cache):
    """Configs without a data_dir read ../shared/data; copies go to the session cache."""
    monkeypatch.setenv("PL_PRIVFED_DATA", str(SHARED_DATA))
    monkeypatch.setenv("PL_PRIVFED_CACHE", str(data_cache))
