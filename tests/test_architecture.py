"""Who may import whom inside ``pl_privfed``, checked on the source with :mod:`ast`.

The rules are :data:`RULES` below; the same rules are written for humans in ``docs/package.md``,
section "Rooms and who may import whom". Change both together: a new top-level module (a file or
a package directly under ``pl_privfed/``) must be placed in a layer here before the tests pass.

* **Layers**, lowest first. A module (the top-level name under ``pl_privfed``: a file or a
  package) may import its own submodules and modules of lower layers only: not a higher layer,
  and not another module of its own layer. The lowest layer (compat) therefore imports nothing of
  ``pl_privfed``.
* Nothing imports a module in ``imported_by_nobody`` (the command, ``cli``), and no module imports
  the package root (``pl_privfed/__init__.py``, which imports the public API); the root itself may
  import any other module.
* A module imports another one's public API only: no submodule and no name whose name starts with
  ``_`` (``callbacks._logging``, ``from pl_privfed.engine import _helper``).
* **No cycles** between files.

Every ``import`` and ``from ... import`` counts, wherever it stands: at the top, inside a function
(a lazy import), under ``if TYPE_CHECKING:``. Relative imports are resolved. An import resolves to
a file: ``import pl_privfed.x.y`` and ``from pl_privfed.x.y import z`` to ``pl_privfed/x/y.py`` or
``pl_privfed/x/y/__init__.py``; ``from pl_privfed.x import name`` to ``pl_privfed/x/name.py`` (or
``name/__init__.py``) when ``name`` is a submodule, else to ``pl_privfed/x/__init__.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers.architecture import (
    PACKAGE_DIR,
    ROOT,
    Import,
    all_imports,
    module_name,
    package_files,
    top_level,
)

#: The import rules (docs/package.md, "Rooms and who may import whom"). ``layers``: lowest first,
#: each a name and its modules; a module listed here need not exist yet.
RULES = {
    "layers": (
        # the run record (what a run reports, declared once; results.py derives its columns) and
        # every private name of another library, one module per library: import nothing of ours
        ("the run record and compatibility", ("record", "compat")),
        # mirror reads the package's files (ast) and imports none of them
        ("ground floor", ("rng", "results", "logdir", "checks", "communication", "mirror", "lazy")),
        # layer_rules imports nothing of the package and grads imports it: a building block
        (
            "building blocks",
            ("operators", "privacy", "sampling", "graphs", "models", "layer_rules"),
        ),
        ("engine", ("engine",)),
        (
            "gradients, data, algorithms",
            ("grads", "datamodules", "algorithms", "evaluation", "trainer_rounds", "resume"),
        ),
        # wiring builds the module's parts; callbacks read modules through protocols
        ("callbacks, the module's parts", ("callbacks", "wiring")),
        ("module", ("module",)),
        ("grid", ("grid",)),
        ("tools", ("sweep", "report", "demo")),
        ("command", ("cli",)),
        # the package again on lightning.pytorch: the root's code, rewritten by mirror
        ("lightning.pytorch namespace", ("lightning",)),
    ),
    "imported_by_nobody": ("cli", "lightning"),
}

#: The rooms inside the command package ``cli/``, lowest first (docs/package.md, "The command"): a
#: file imports files of lower rooms only. Every file of ``cli/`` is in one.
CLI_ROOMS = (
    ("environment", "errors", "seeds", "arguments", "folders", "print_config", "registry"),
    ("help",),
    ("app",),
    ("commands",),
    ("entry",),
    ("__init__",),
    ("__main__",),
)


def layer_index(rules: dict) -> dict[str, tuple[int, str]]:
    """Each module's layer: ``{module: (number, layer name)}``."""
    return {m: (i, name) for i, (name, modules) in enumerate(rules["layers"]) for m in modules}


def unplaced_modules(package_dir: Path, rules: dict) -> list[str]:
    """The top-level modules (files and packages directly under ``package_dir``) in no layer."""
    names = {top_level(module_name(p)) for p in package_files(package_dir)}
    return sorted(names - {ROOT} - set(layer_index(rules)))


def violations(imports: list[Import], rules: dict) -> list[str]:
    """A message for every import that breaks a rule (modules in no layer aside: see
    :func:`unplaced_modules`)."""
    layers = layer_index(rules)
    messages = []
    for imp in imports:
        src, dst = top_level(module_name(imp.source)), top_level(imp.module)
        package = imp.module.split(".")[0]
        if src == dst:
            continue  # a module's own submodules, and the root's own names
        if dst == ROOT:
            messages.append(f"{imp.where()}: imports the package root {package}/__init__.py")
        elif dst in rules["imported_by_nobody"]:
            messages.append(f"{imp.where()}: nothing may import {package}.{dst}")
        elif src in layers and dst in layers and layers[dst][0] > layers[src][0]:
            messages.append(
                f"{imp.where()}: {src} (layer {layers[src][0]}, {layers[src][1]}) imports "
                f"{dst} of a higher layer ({layers[dst][0]}, {layers[dst][1]})"
            )
        elif src in layers and dst in layers and layers[dst][0] == layers[src][0]:
            messages.append(
                f"{imp.where()}: {src} imports {dst}, another module of its own layer "
                f"({layers[src][0]}, {layers[src][1]})"
            )
        parts = [*imp.module.split(".")[1:], *imp.names]
        private = [p for p in parts if p.startswith("_") and not p.startswith("__")]
        if private and src != ROOT:
            messages.append(f"{imp.where()}: {src} imports {', '.join(private)}, private to {dst}")
    return messages


def cycles(graph: dict[Path, set[Path]]) -> list[tuple[list[Path], list[Path]]]:
    """Every group of files that import each other, directly or not (a strongly connected
    component of ``graph``, found by Tarjan's algorithm; a file that imports itself is one), as
    ``(cycle, files)``: the shortest cycle ``[a, b, ..., a]`` through its first file, and all its
    files; sorted."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    groups: list[set[Path]] = []

    def visit(node: Path) -> None:  # recursion as deep as the longest import chain
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set(stack[stack.index(node) :])
            del stack[stack.index(node) :]
            if len(group) > 1 or node in graph[node]:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted((_shortest_cycle(graph, group), sorted(group)) for group in groups)


def _shortest_cycle(graph: dict[Path, set[Path]], group: set[Path]) -> list[Path]:
    """The shortest cycle through the group's first file (breadth first, inside the group)."""
    start = min(group)
    came_from: dict[Path, Path] = {}
    frontier = [start]
    while start not in came_from:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    cycle = [start]
    while len(cycle) == 1 or cycle[-1] != start:
        cycle.append(came_from[cycle[-1]])
    return cycle[::-1]


def import_graph(imports: list[Import]) -> dict[Path, set[Path]]:
    """File -> the files it imports (an import of a file that does not exist left out)."""
    graph: dict[Path, set[Path]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set())
        if imp.target is not None:
            graph[imp.source].add(imp.target)
            graph.setdefault(imp.target, set())
    return graph


def cycle_messages(graph: dict[Path, set[Path]]) -> list[str]:
    """One line per group of files in a cycle: a cycle, and the group's other files."""
    messages = []
    for cycle, files in cycles(graph):
        text = "import cycle: " + " -> ".join(p.as_posix() for p in cycle)
        others = [p.as_posix() for p in files if p not in cycle]
        messages.append(text + (f" (in cycles with these too: {', '.join(others)})" * bool(others)))
    return messages


# --------------------------------------------------------------------------- the package's rules


def test_the_rules_place_each_module_once():
    names = [m for _, modules in RULES["layers"] for m in modules]
    assert len(names) == len(set(names)), f"a module is in two layers: {names}"


def test_every_module_is_in_a_layer():
    missing = unplaced_modules(PACKAGE_DIR, RULES)
    assert not missing, (
        f"modules of pl_privfed in no layer: {missing}; place each in RULES['layers'] of "
        f"{Path(__file__).name} (and in docs/package.md, 'Rooms and who may import whom')"
    )


def test_imports_follow_the_rules():
    messages = violations(all_imports(PACKAGE_DIR), RULES)
    assert not messages, "imports that break the rules:\n" + "\n".join(messages)


def test_no_import_cycles():
    messages = cycle_messages(import_graph(all_imports(PACKAGE_DIR)))
    assert not messages, "\n".join(messages)


def test_the_command_is_a_package_that_nothing_imports():
    """``cli`` is a package of several files, all of them in the command layer; no file outside
    it imports any of them (``imported_by_nobody``)."""
    files = [p for p in package_files(PACKAGE_DIR) if p.parts[1] == "cli"]
    assert len(files) > 1 and {top_level(module_name(p)) for p in files} == {"cli"}
    assert "cli" in RULES["imported_by_nobody"]
    importers = [
        imp.where()
        for imp in all_imports(PACKAGE_DIR)
        if top_level(imp.module) == "cli" and top_level(module_name(imp.source)) != "cli"
    ]
    assert not importers, importers


def test_the_command_files_import_lower_rooms_only():
    cli_dir = PACKAGE_DIR / "cli"
    room = {name: i for i, names in enumerate(CLI_ROOMS) for name in names}
    stems = sorted(p.stem for p in cli_dir.glob("*.py"))
    assert [s for s in stems if s not in room] == [], "place each file of cli/ in CLI_ROOMS"
    messages = []
    for imp in all_imports(PACKAGE_DIR):
        inside = imp.source.parts[:2] == ("pl_privfed", "cli")
        if inside and imp.target is not None and imp.target.parts[:2] == ("pl_privfed", "cli"):
            src, dst = imp.source.stem, imp.target.stem
            if room[dst] >= room[src]:
                messages.append(f"{imp.where()}: {src} (room {room[src]}) imports {dst}")
    assert not messages, "\n".join(messages)


# ------------------------------------------------------------- the checker on a tiny package


def _write(base: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return base / "pkg"


TINY_RULES = {
    "layers": (
        ("floor", ("low", "other_low")),
        ("middle", ("sub",)),
        ("top", ("high",)),
        ("command", ("cmd",)),
    ),
    "imported_by_nobody": ("cmd",),
}
TINY = {
    "pkg/__init__.py": "from pkg.high import f\nfrom pkg.sub import _hidden\n",
    "pkg/low.py": """\
        import os
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from pkg.high import f

        def lazy():
            import pkg.other_low
        """,
    "pkg/other_low.py": "import numpy\n",
    "pkg/high.py": """\
        from . import low
        from .sub import g
        from pkg import sub
        from pkg.sub._private import h
        from pkg.sub import _hidden, g
        """,
    "pkg/sub/__init__.py": "from .inner import g\nfrom ._private import h\n_hidden = 1\n",
    "pkg/sub/inner.py": "from pkg.sub import g\nfrom .. import low\n",
    "pkg/sub/_private.py": "from pkg import cmd\n",
    "pkg/cmd.py": "import pkg\nfrom pkg.high import f\n",
    "pkg/stray.py": "",
}


def test_resolver_follows_relative_submodule_lazy_and_type_checking_imports(tmp_path):
    package_dir = _write(tmp_path, TINY)
    resolved = {
        (i.source.as_posix(), i.line, i.target.as_posix() if i.target else None, i.names)
        for i in all_imports(package_dir)
    }
    assert resolved == {
        ("pkg/__init__.py", 1, "pkg/high.py", ("f",)),
        ("pkg/__init__.py", 2, "pkg/sub/__init__.py", ("_hidden",)),  # the root may, private too
        ("pkg/low.py", 5, "pkg/high.py", ("f",)),  # under TYPE_CHECKING
        ("pkg/low.py", 8, "pkg/other_low.py", ()),  # inside a function
        ("pkg/high.py", 1, "pkg/low.py", ()),  # `from . import low`: a submodule
        ("pkg/high.py", 2, "pkg/sub/__init__.py", ("g",)),  # `from .sub import g`: a name
        ("pkg/high.py", 3, "pkg/sub/__init__.py", ()),  # `from pkg import sub`: a subpackage
        ("pkg/high.py", 4, "pkg/sub/_private.py", ("h",)),
        ("pkg/high.py", 5, "pkg/sub/__init__.py", ("_hidden", "g")),
        ("pkg/sub/__init__.py", 1, "pkg/sub/inner.py", ("g",)),
        ("pkg/sub/__init__.py", 2, "pkg/sub/_private.py", ("h",)),
        ("pkg/sub/inner.py", 1, "pkg/sub/__init__.py", ("g",)),
        ("pkg/sub/inner.py", 2, "pkg/low.py", ()),  # `from .. import low`: two levels up
        ("pkg/sub/_private.py", 1, "pkg/cmd.py", ()),
        ("pkg/cmd.py", 1, "pkg/__init__.py", ()),  # `import pkg`: the root
        ("pkg/cmd.py", 2, "pkg/high.py", ("f",)),
    }  # os, typing and numpy are not the package's


def test_checker_reports_every_kind_of_violation(tmp_path):
    package_dir = _write(tmp_path, TINY)
    assert unplaced_modules(package_dir, TINY_RULES) == ["stray"]
    assert violations(all_imports(package_dir), TINY_RULES) == [
        "pkg/cmd.py:1: `import pkg`: imports the package root pkg/__init__.py",
        "pkg/high.py:4: `from pkg.sub._private import h`: high imports _private, private to sub",
        "pkg/high.py:5: `from pkg.sub import _hidden, g`: high imports _hidden, private to sub",
        "pkg/low.py:5: `from pkg.high import f`: low (layer 0, floor) imports high of a higher "
        "layer (2, top)",
        "pkg/low.py:8: `import pkg.other_low`: low imports other_low, another module of its own "
        "layer (0, floor)",
        "pkg/sub/_private.py:1: `from pkg import cmd`: nothing may import pkg.cmd",
    ]


def test_checker_finds_cycles_through_lazy_and_relative_imports(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import x\n",
        "pkg/b.py": "x = 1\n\ndef later():\n    from . import a\n",
        "pkg/c/__init__.py": "from pkg.c.d import y\n",
        "pkg/c/d.py": "y = 1\n\nif False:\n    from pkg.c import y\n",
        "pkg/e.py": "from pkg import a, c\n",
    }
    package_dir = _write(tmp_path, files)
    assert cycle_messages(import_graph(all_imports(package_dir))) == [
        "import cycle: pkg/a.py -> pkg/b.py -> pkg/a.py",
        "import cycle: pkg/c/__init__.py -> pkg/c/d.py -> pkg/c/__init__.py",
    ]
    clean = _write(tmp_path / "clean", {**files, "pkg/b.py": "x = 1\n", "pkg/c/d.py": "y = 1\n"})
    assert cycle_messages(import_graph(all_imports(clean))) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": "b", "b": "c", "c": ""}, []),
        ({"a": "a"}, ["import cycle: a -> a"]),
        ({"a": "b", "b": "c", "c": "ad", "d": ""}, ["import cycle: a -> b -> c -> a"]),
        (
            {"a": "b", "b": "a", "c": "d", "d": "c"},
            ["import cycle: a -> b -> a", "import cycle: c -> d -> c"],
        ),
        (
            {"a": "bc", "b": "a", "c": "a"},
            ["import cycle: a -> b -> a (in cycles with these too: c)"],
        ),
    ],
)
def test_cycle_finder(graph, expected):
    assert cycle_messages({Path(k): {Path(v) for v in vs} for k, vs in graph.items()}) == expected
