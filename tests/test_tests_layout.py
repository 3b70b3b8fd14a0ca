"""The test suite's own layout: helpers shared by several test modules live in the ``helpers``
package (tests/helpers/); a test module never imports another test module (nor conftest), so
each can be read, run and moved on its own, and the rest of tests/ holds only test modules.
Under pytest-xdist the tests of one module-scoped fixture run on one worker (helpers/layout.py)."""

import ast
from pathlib import Path

import pytest
from helpers.layout import module_fixtures, work_unit

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


SHARED = """\
import pytest
from pytest import fixture


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return 1


@fixture(scope="module")
def other():
    return 2


@pytest.fixture
def per_test(shared):
    return 3


@pytest.fixture(scope="session")
def per_session():
    return 4


@pytest.mark.parametrize("x", [1], scope="module")
def test_direct(x, other):
    pass


def test_through_a_fixture(per_test):
    pass


class TestIt:
    def test_method(self, shared):
        pass


def test_alone(per_session, tmp_path):
    pass
"""


def test_module_fixtures_are_the_module_scoped_ones():
    assert module_fixtures(SHARED) == {"shared", "other"}


def test_tests_of_module_fixtures_are_one_work_unit(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_shared.py").write_text(SHARED)
    unit = "tests/test_shared.py::module-scoped fixtures"
    for test in ["test_direct[1]", "test_through_a_fixture", "TestIt::test_method"]:
        assert work_unit(f"tests/test_shared.py::{test}", tmp_path) == unit
    alone = "tests/test_shared.py::test_alone"
    assert work_unit(alone, tmp_path) == alone
    (tmp_path / "tests" / "test_autouse.py").write_text(
        '@pytest.fixture(scope="module", autouse=True)\ndef setup():\n    pass\n\n\n'
        "def test_a():\n    pass\n"
    )
    assert work_unit("tests/test_autouse.py::test_a", tmp_path).endswith("module-scoped fixtures")


def test_work_units_follow_the_collected_fixtures(request):
    """For every test of this session, the work unit read from the source agrees with pytest's
    own fixture closure: a test is grouped exactly when it uses a module-scoped fixture."""
    items = request.session.items
    grouped, declared = {}, {}
    for item in items:
        if item.path not in declared:
            declared[item.path] = module_fixtures(item.path.read_text())
        uses = bool(declared[item.path] & set(item.fixturenames))
        unit = work_unit(item.nodeid, request.config.rootpath)
        assert (unit != item.nodeid) == uses, item.nodeid
        grouped.setdefault(unit, []).append(item.nodeid)
    if not any(len(tests) > 1 for tests in grouped.values()):
        pytest.skip("no test of a module-scoped fixture in this session")
