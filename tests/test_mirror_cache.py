"""The mirror's caches (issue 46, item 3): ``pl_privfed.lightning`` read the package with
:mod:`ast` and compiled its Lightning-bound modules again in every process (0.6-0.75 s of CPU
on this machine); the scan's result and each rewritten module's code are now kept on disk under
a hash of what they were made from. A cache gives what a fresh computation gives, a changed file
is never read stale, and a folder that cannot be written (or ``PYTHONDONTWRITEBYTECODE``) only
means no cache."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import pl_privfed.mirror as mirror
from pl_privfed.mirror import Mirror, cached_scan, scan


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    """A tiny package: one module bound to Lightning, one not; bytecode writing on."""
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "shared.py").write_text("helper = 1\n")
    (root / "bound.py").write_text("import pytorch_lightning as pl\n\nthing = pl.__name__\n")
    return root


def _no(name: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} called: the cache was not used")

    return refuse


def test_the_scan_is_cached_until_a_file_changes(package, monkeypatch):
    first = cached_scan(package, "pkg")
    assert first == scan(package, "pkg") and first.bound == {"pkg", "pkg.bound"}
    assert list((package / "__pycache__").glob("mirror-scan.*.json"))
    with monkeypatch.context() as patched:
        patched.setattr(mirror, "scan", _no("scan"))
        assert cached_scan(package, "pkg") == first  # read back, not scanned
    (package / "shared.py").write_text("import lightning_fabric\nhelper = 1\n")  # now bound too
    assert cached_scan(package, "pkg").bound == {"pkg", "pkg.bound", "pkg.shared"}
    (package / "extra.py").write_text("from pkg import bound\n")  # a new file
    assert "pkg.extra" in cached_scan(package, "pkg").bound


def _run(code) -> dict:
    namespace: dict = {}
    exec(code, namespace)
    return namespace


def test_the_rewritten_code_is_cached_until_its_source_changes(package, monkeypatch):
    finder = Mirror(scan(package, "pkg"), mirror="pkg.lightning")
    code = finder.code("pkg.bound")
    assert _run(code)["thing"] == "lightning.pytorch"  # rewritten onto the other namespace
    cache = Path(
        importlib.util.cache_from_source(str(package / "bound.py"), optimization="lightning")
    )
    assert cache.is_file()
    with monkeypatch.context() as patched:
        patched.setattr(ast, "parse", _no("ast.parse"))
        again = finder.code("pkg.bound")
    assert again == code and again.co_filename == str(package / "bound.py")
    (package / "bound.py").write_text("import pytorch_lightning as pl\n\nthing = 'changed'\n")
    assert _run(finder.code("pkg.bound"))["thing"] == "changed"
    cache.write_bytes(b"not a cache")  # damaged: compiled again, and rewritten
    assert _run(finder.code("pkg.bound"))["thing"] == "changed"
    assert cache.read_bytes() != b"not a cache"
    other = Mirror(scan(package, "pkg"), mirror="pkg.elsewhere")  # another key: not this cache
    with monkeypatch.context() as patched:
        patched.setattr(ast, "parse", _no("ast.parse"))
        with pytest.raises(AssertionError, match=r"ast\.parse called"):
            other.code("pkg.bound")


def test_no_cache_is_written_when_python_writes_no_bytecode(package, monkeypatch):
    monkeypatch.setattr("sys.dont_write_bytecode", True)
    cached_scan(package, "pkg")
    assert _run(Mirror(scan(package, "pkg"), mirror="pkg.lightning").code("pkg.bound"))
    assert not (package / "__pycache__").exists()


def test_without_bytecode_the_caches_go_to_pl_privfed_cache(package, monkeypatch, tmp_path):
    """PYTHONDONTWRITEBYTECODE (set on this project's machines) turned the caches off: with
    $PL_PRIVFED_CACHE set they are kept there instead, nothing written into the package."""
    monkeypatch.setattr("sys.dont_write_bytecode", True)
    monkeypatch.setenv("PL_PRIVFED_CACHE", str(tmp_path / "cache"))
    first = cached_scan(package, "pkg")
    code = Mirror(first, mirror="pkg.lightning").code("pkg.bound")
    assert len(list((tmp_path / "cache" / "mirror").iterdir())) == 2
    assert not (package / "__pycache__").exists()
    with monkeypatch.context() as patched:
        patched.setattr(mirror, "scan", _no("scan"))
        patched.setattr(ast, "parse", _no("ast.parse"))
        assert cached_scan(package, "pkg") == first
        again = Mirror(first, mirror="pkg.lightning").code("pkg.bound")
    assert _run(again) == _run(code)


def test_a_folder_that_cannot_be_written_only_means_no_cache(package, monkeypatch):
    (package / "__pycache__").write_text("a file where the folder would be")
    assert cached_scan(package, "pkg") == scan(package, "pkg")
    code = Mirror(scan(package, "pkg"), mirror="pkg.lightning").code("pkg.bound")
    assert _run(code)["thing"] == "lightning.pytorch"
