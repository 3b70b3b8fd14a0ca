"""Every name a public module exports in ``__all__`` exists (DESIGN: a test imports each)."""

import importlib
import pkgutil

import pytest

import pl_privfed

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(pl_privfed.__path__, prefix="pl_privfed.")
    if not m.name.rsplit(".", 1)[-1].startswith("_")
)


@pytest.mark.parametrize("name", MODULES)
def test_every_exported_name_exists(name):
    if name == "pl_privfed.lightning":  # the lightning.pytorch namespace: the optional extra
        pytest.importorskip("lightning.pytorch")
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", [])
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names {missing}, which it does not define"
    assert len(set(exported)) == len(exported)
