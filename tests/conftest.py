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
