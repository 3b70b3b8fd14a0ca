"""The test suite's own layout: helpers shared by several test modules live in the ``helpers``
package (tests/helpers/); a test module never imports another test module (nor conftest), so
each can be read, run and moved on its own, and the rest of tests/ holds only test modules."""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def local_imports(source: str, local: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` for every import, wherever it stands (the top of the file, a function,
    a class), whose top-level module is one of ``local``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [(node.lineno, m) for m in modules if m.split(".")[0] in local]
    return sorted(found)


def test_local_imports_finds_nested_and_dotted_imports():
    source = (
        "import os\nfrom test_b import x\n\n\ndef f():\n    import conftest\n"
        "    from helpers.training import trainer\n    from pl_privfed import cli\n"
    )
    local = {"test_b", "conftest", "helpers"}
    assert local_imports(source, local) == [(2, "test_b"), (6, "conftest"), (7, "helpers.training")]


def test_tests_folder_holds_only_test_modules_conftest_and_helpers():
    stray = [
        p.name
        for p in TESTS.glob("*.py")
        if not (p.name.startswith("test_") or p.name == "conftest.py")
    ]
    assert stray == [], f"a shared helper belongs in tests/helpers/: {stray}"
    assert (TESTS / "helpers" / "__init__.py").is_file()


@pytest.mark.parametrize(
    "path", sorted(TESTS.rglob("*.py")), ids=lambda p: p.relative_to(TESTS).as_posix()
)
def test_no_test_module_imports_another(path):
    """Only ``helpers`` (and the package, libraries) may be imported: never a test module or
    conftest, neither by a test module nor by a helper."""
    modules = {p.stem for p in TESTS.glob("*.py")}  # the test modules and conftest
    wrong = local_imports(path.read_text(), modules)
    assert wrong == [], f"{path.name} imports test modules (move the helper to tests/helpers/)"
