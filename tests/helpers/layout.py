"""The suite's layout as pytest-xdist sees it: which tests share a module-scoped fixture.

``make test`` runs the suite on a worker a core (``-n logical --dist loadgroup``). A
module-scoped fixture (a two-process run, a real sweep, subprocesses waiting for a signal) is set
up once in each worker that runs one of its tests, so the tests that use one must run on the same
worker. xdist's own ``xdist_group`` marker cannot say so under pytest 9 (xdist appends the group
to ``item._nodeid``, which pytest 9's ``nodeid`` no longer reads), so conftest.py gives xdist
:class:`FixtureGroupScheduling`: the tests of a module that use any of its module-scoped fixtures
(directly or through another of its fixtures) are one work unit, every other test its own.
"""

import ast
import functools
from pathlib import Path


def _fixture_scope(deco: ast.expr) -> tuple[bool, str | None, bool] | None:
    """``(is a fixture, its scope, autouse)`` for a decorator, ``None`` when not a fixture."""
    func = deco.func if isinstance(deco, ast.Call) else deco
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != "fixture":
        return None
    keywords = {k.arg: k.value for k in deco.keywords} if isinstance(deco, ast.Call) else {}
    scope, autouse = keywords.get("scope"), keywords.get("autouse")
    return (
        True,
        scope.value if isinstance(scope, ast.Constant) else None,
        isinstance(autouse, ast.Constant) and autouse.value is True,
    )


def module_fixtures(source: str) -> set[str]:
    """The fixtures that the test module ``source`` declares with ``scope="module"``
    (``@pytest.fixture(scope="module")`` or ``@fixture(scope="module")``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                found = _fixture_scope(deco)
                if found is not None and found[1] == "module":
                    names.add(node.name)
    return names


def _arguments(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = node.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


@functools.cache
def shared_fixture_users(path: Path) -> tuple[frozenset[str], bool]:
    """The names of the module's functions (tests and fixtures) that use one of its
    module-scoped fixtures, directly or through its other fixtures, and whether every test
    does (an autouse one)."""
    tree = ast.parse(path.read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    fixtures, autouse = {}, False
    for node in functions:
        for deco in node.decorator_list:
            found = _fixture_scope(deco)
            if found is not None:
                fixtures[node.name] = found[1]
                autouse |= found[1] == "module" and found[2]
    users = {name for name, scope in fixtures.items() if scope == "module"}
    changed = bool(users)
    while changed:  # fixtures of the module that request a user are users too
        changed = False
        for node in functions:
            if node.name in fixtures and node.name not in users and _arguments(node) & users:
                users.add(node.name)
                changed = True
    tests = {n.name for n in functions if n.name not in fixtures and _arguments(n) & users}
    return frozenset(users | tests) if users else frozenset(), autouse


def work_unit(nodeid: str, rootdir: Path) -> str:
    """The work unit of a test: ``<file>::module-scoped fixtures`` for a test that uses one of
    its module's module-scoped fixtures, else the test itself."""
    file, _, rest = nodeid.partition("::")
    name = rest.rpartition("::")[2].partition("[")[0]
    path = rootdir / file
    if not path.is_file() or not path.name.endswith(".py"):
        return nodeid
    users, autouse = shared_fixture_users(path)
    if users and (autouse or name in users):
        return f"{file}::module-scoped fixtures"
    return nodeid


def scheduler(config, log):
    """xdist's load-scope scheduling with :func:`work_unit` as the scope (imported here, so
    that conftest.py loads without xdist)."""
    from xdist.scheduler import LoadScopeScheduling

    class FixtureGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, config.rootpath)

    return FixtureGroupScheduling(config, log)
