"""The package's modules and every import they make, read with ast."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "pl_privfed"
ROOT = "__init__"  # the top-level name this test gives the package root, pl_privfed/__init__.py


@dataclass(frozen=True)
class Import:
    """What one statement imports from one module of the package, and the file that is."""

    source: Path  # the importing file, relative to the package's parent
    line: int
    text: str  # the statement, as ast.unparse writes it
    module: str  # the dotted module, e.g. pl_privfed.engine.distributed
    names: tuple[str, ...]  # the names taken from it that are not submodules
    target: Path | None  # the module's file (relative); None when there is no such file

    def where(self) -> str:
        return f"{self.source.as_posix()}:{self.line}: `{self.text}`"


def top_level(module: str) -> str:
    """``pl_privfed.engine.chunk`` -> ``engine``; the package itself -> :data:`ROOT`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def module_name(path: Path) -> str:
    """The dotted module of a file relative to the package's parent (``__init__`` dropped)."""
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(module: str, base: Path) -> Path | None:
    """The file of a dotted module under ``base`` (the package's parent), relative to ``base``."""
    stem = Path(*module.split("."))
    for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
        if (base / candidate).is_file():
            return candidate
    return None


def package_files(package_dir: Path) -> list[Path]:
    """Every ``.py`` file of the package, relative to its parent."""
    return sorted(
        p.relative_to(package_dir.parent)
        for p in package_dir.rglob("*.py")
        if "__pycache__" not in p.parts
    )


def _imported(node: ast.Import | ast.ImportFrom, here: str, base: Path) -> dict[str, list[str]]:
    """``{module: [names taken from it that are not submodules]}`` for one statement."""
    if isinstance(node, ast.Import):
        return {alias.name: [] for alias in node.names}
    start = node.module or ""
    if node.level:  # relative: ``here`` is the package the statement stands in
        parts = here.split(".")
        start = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [node.module])])
    modules: dict[str, list[str]] = {}
    for alias in node.names:
        submodule = f"{start}.{alias.name}"
        if alias.name != "*" and module_file(submodule, base) is not None:
            modules.setdefault(submodule, [])
        else:
            modules.setdefault(start, []).append(alias.name)
    return modules


def imports_of(path: Path, base: Path) -> list[Import]:
    """Every import of a module of the file's own package in the file ``base / path``."""
    package = path.parts[0]
    tree = ast.parse((base / path).read_text(), filename=str(path))
    own = module_name(path)
    here = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for module, names in _imported(node, here, base).items():
            if module == package or module.startswith(package + "."):
                target = module_file(module, base)
                found.append(
                    Import(path, node.lineno, ast.unparse(node), module, (*names,), target)
                )
    return sorted(found, key=lambda i: i.line)  # ast.walk visits nested statements last


def all_imports(package_dir: Path) -> list[Import]:
    """The imports of every file of the package."""
    return [i for p in package_files(package_dir) for i in imports_of(p, package_dir.parent)]
