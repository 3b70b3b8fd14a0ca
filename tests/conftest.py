import os
from pathlib import Path

# The privacy invariants' check mode (pl_privfed/privacy/invariants.py) is on in the whole suite,
# and in every process a test starts: read once, when the package is first imported, so set
# before anything imports it (PL_PRIVFED_CHECK_INVARIANTS=0 runs the suite without it).
os.environ.setdefault("PL_PRIVFED_CHECK_INVARIANTS", "1")

import pytest
import torch
from helpers import layout
from helpers.files import snapshot, snapshot_changes

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist (`make test`: a worker a core and one more) each worker, and each process a
# test starts, runs torch on one thread unless OMP_NUM_THREADS says otherwise: the workers
# already fill the cores, and a second OpenMP thread would wait for its descheduled sibling
# (CHANGELOG.md).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


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


@pytest.fixture(scope="session", autouse=True)
def _shared_data_unchanged():
    """The suite leaves ../shared/data as it found it: a test that extracts, decodes or caches
    anything next to the shared copies fails the session (an error at its teardown)."""
    before = snapshot(SHARED_DATA)
    yield
    changes = snapshot_changes(before, snapshot(SHARED_DATA))
    if changes:
        pytest.fail(f"the tests wrote into {SHARED_DATA}: " + "; ".join(changes[:20]))


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """One writable cache for the whole session (the CIFAR-10 JPEG copy is decoded once), shared
    by the pytest-xdist workers of one run (the decoding holds a file lock: the first worker
    decodes, the others load its arrays)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "pl_privfed_cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("pl_privfed_cache")


@pytest.fixture(autouse=True)
def _data_env(monkeypatch, data_cache):
    """Configs without a data_dir read ../shared/data; copies go to the session cache."""
    monkeypatch.setenv("PL_PRIVFED_DATA", str(SHARED_DATA))
    monkeypatch.setenv("PL_PRIVFED_CACHE", str(data_cache))


def pytest_collection_modifyitems(config, items):
    """On an xdist worker the ``slow`` tests come first (stable order otherwise), so that the
    workers start the long tests early and share the short ones at the end."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: ignored when xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: the tests of a module-scoped fixture on one worker, every other test
    on whichever worker is free (helpers/layout.py)."""
    if config.getvalue("dist") == "loadgroup":
        return layout.scheduler(config, log)
    return None
