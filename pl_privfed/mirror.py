"""The package's Lightning-bound modules once more, on Lightning's other namespace.

Lightning ships one trainer under two names, ``pytorch_lightning`` (with ``lightning_fabric``)
and ``lightning.pytorch`` (with ``lightning.fabric``): two copies of one source whose classes are
distinct. ``lightning.pytorch.Trainer`` refuses a ``pytorch_lightning.LightningModule`` ("model
must be a LightningModule"), takes a ``pytorch_lightning`` progress bar or checkpoint callback for
a plain callback (and adds its own: two bars, two checkpoint writers), and a ``pytorch_lightning``
``isinstance`` check sees none of its loggers. Lightning builds ``lightning.pytorch`` from the
``pytorch_lightning`` source by rewriting its imports; this module does the same for
``pl_privfed``, when ``pl_privfed.lightning`` is imported, from the one source on disk:

* :func:`scan` reads the package's files with :mod:`ast` (it imports nothing) and finds the
  modules *bound* to Lightning: those that import ``pytorch_lightning`` or ``lightning_fabric``
  (anywhere: at the top, inside a function, under ``TYPE_CHECKING``), those that import a bound
  module, and the packages holding a bound module.
* :class:`Mirror`, a finder and loader on ``sys.meta_path``, serves ``pl_privfed.lightning.X``:
  for a bound ``pl_privfed.X``, the same file compiled a second time with its imports rewritten
  (:class:`ImportRewriter`); for any other module, the module ``pl_privfed.X`` itself. What does
  not touch Lightning (algorithms, noise, partitioners, models, the engine) is therefore one
  object under both namespaces; what does (``FederatedModule``, the datamodules, the callbacks,
  the log folder's logger checks) exists once per namespace, each on its own Lightning's classes.

Why rewriting the import statements and not another way:

* a class with both namespaces' bases (``class RoundProgressBar(pl.TQDMProgressBar,
  L.TQDMProgressBar)``) passes both trainers' ``isinstance`` checks but inherits one MRO: every
  method and ``super()`` call resolves to one namespace's implementation, which then meets the
  other namespace's trainer, and a ``LightningModule`` would carry two ``__init__`` chains;
* executing the source again while ``sys.modules["pytorch_lightning"]`` points at
  ``lightning.pytorch`` misses every import inside a function (they run later, after the swap is
  undone), and changes what every other library importing meanwhile gets;
* an ``__import__`` hook in the copy's builtins catches those, but not
  :func:`importlib.import_module`, and leaves nothing to read;
* a rewritten statement names its namespace for good, lazy imports included. The tree keeps the
  source's file name and line numbers, so tracebacks, :func:`inspect.getsource` and docstrings
  (which jsonargparse and ``--help`` read) are the source's; string literals are untouched.

The ``pl-privfed`` command (``cli``) stays on ``pytorch_lightning`` and is not served.

What it costs, and the cache that cuts it: reading the package with :mod:`ast` (:func:`scan`,
some 140 files) took 0.55 s of CPU and compiling the rewritten modules 0.15-0.19 s for the 22
that ``import pl_privfed.lightning`` loads (measured on this 2-core CPU; docs/engine.md, "Two
Lightning namespaces"). Both are kept on disk, in the package's ``__pycache__`` folders as
Python keeps its own bytecode: the scan's result under a hash of every file's content
(:func:`cached_scan`), each rewritten module's code under a hash of its source, the bound
modules and this file (:meth:`Mirror.code`). A changed file changes its hash, so nothing stale
is read; a folder that cannot be written (a read-only install) only means no cache. Where
Python is told not to write bytecode (``PYTHONDONTWRITEBYTECODE``, set on some machines for
every process) nothing is written into the package; the caches then go under
``$PL_PRIVFED_CACHE/mirror/`` when that variable is set (:func:`_cache_path`), else there is no
cache: ``import pl_privfed.lightning`` then cost 1.15 s of CPU above the modules both namespaces
share, 0.8 s of it in :func:`ast.parse` (this project's 2-core CPU, under load).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import marshal
import os
import sys
from dataclasses import dataclass
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

__all__ = [
    "MIRROR",
    "RENAMES",
    "ImportRewriter",
    "Mirror",
    "PackageMap",
    "cached_scan",
    "install",
    "scan",
]

PACKAGE = __name__.rpartition(".")[0]
PACKAGE_DIR = Path(__file__).resolve().parent
#: the namespace served: ``pl_privfed`` on ``lightning.pytorch``
MIRROR = f"{PACKAGE}.lightning"
#: each namespace of ``pl_privfed``'s own imports → the one the mirror imports instead
RENAMES = {"pytorch_lightning": "lightning.pytorch", "lightning_fabric": "lightning.fabric"}
#: top-level modules not served: the command (on ``pytorch_lightning``), the namespace itself
UNMIRRORED = ("cli", "lightning")
#: why a module of :data:`UNMIRRORED` is not served, where the user may have expected it
_WHY = {"cli": "the pl-privfed command runs on pytorch_lightning only"}
#: what a cached result depends on beside the package's files: this file (the rewriter) and the
#: interpreter (its bytecode)
_TOOL_KEY = hashlib.sha256(
    Path(__file__).read_bytes() + sys.implementation.cache_tag.encode()
).hexdigest()


@dataclass(frozen=True)
class PackageMap:
    """A package's modules and which of them are bound to Lightning.

    Attributes:
        package: its name, e.g. ``pl_privfed``.
        files: ``{module: (file, is a package)}`` for every module, the package itself included.
        bound: the modules that import Lightning, directly or through another module.
    """

    package: str
    files: dict[str, tuple[Path, bool]]
    bound: frozenset[str]

    def is_bound(self, module: str) -> bool:
        """Whether ``module`` (a dotted name inside the package) is served rewritten."""
        return module in self.bound


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from`` statement of ``module`` reads (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    here = parts if is_package else parts[:-1]
    base = here[: len(here) - node.level + 1]
    return ".".join([*base, *filter(None, [node.module])])


def _statements(tree: ast.AST) -> list[ast.stmt]:
    """Every statement of ``tree``, nested ones (in functions, classes, ``if``, ``try``, ...)
    included: an import is a statement, so this finds them all without visiting expressions."""
    found: list[ast.stmt] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, name, None)
            if isinstance(children, list):
                stack.extend(children)
                found.extend(c for c in children if isinstance(c, ast.stmt))
    return found


def _imported(node: ast.AST, module: str, is_package: bool, files: dict) -> set[str]:
    """The modules one statement imports: ``import a.b`` → ``a.b``; ``from a import b`` → ``a``,
    and ``a.b`` when that is a module of ``files``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = _resolve(node, module, is_package)
    return {base} | {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files}


def scan(package_dir: Path, package: str, renames: dict[str, str] = RENAMES) -> PackageMap:
    """The package's modules, read from ``package_dir``, and those bound to ``renames``' keys."""
    files: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if "__pycache__" in parts:
            continue
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    uses: dict[str, set[str]] = {}
    bound: set[str] = set()
    for module, (path, is_package) in files.items():
        tree = ast.parse(path.read_bytes(), filename=str(path))
        targets: set[str] = set()
        for statement in _statements(tree):
            targets |= _imported(statement, module, is_package, files)
        if any(t.partition(".")[0] in renames for t in targets):
            bound.add(module)
        uses[module] = {t for t in targets if t in files and t != module}
    grown = True
    while grown:  # importers of bound modules, and packages holding one, until nothing changes
        grown = False
        for module in files.keys() - bound:
            if uses[module] & bound or any(b.startswith(module + ".") for b in bound):
                bound.add(module)
                grown = True
    return PackageMap(package, files, frozenset(bound))


class ImportRewriter(ast.NodeTransformer):
    """Rewrites one bound module's imports for the mirror.

    ``pytorch_lightning[.x]`` → ``lightning.pytorch[.x]`` and ``lightning_fabric[.x]`` →
    ``lightning.fabric[.x]`` (:data:`RENAMES`); a bound ``pl_privfed.y`` → ``pl_privfed.lightning.y``,
    and any other module of the package is imported as it is (shared). Relative imports become
    absolute. ``from pkg import a, b`` where ``pkg`` is bound and ``pkg.a`` a shared module is
    split in two statements. ``import a.b`` (which binds ``a``) becomes ``import A.b as a`` and
    ``import A as a``, so ``a.b.name`` reads the rewritten modules. Every new statement keeps the
    line of the one it replaces.
    """

    def __init__(self, packages: PackageMap, module: str, mirror: str = MIRROR) -> None:
        self.packages = packages
        self.module = module
        self.is_package = packages.files[module][1]
        self.mirror = mirror

    def _inside(self, name: str) -> bool:
        package = self.packages.package
        return name == package or name.startswith(package + ".")

    def _served(self, name: str) -> str:
        """``name`` under the mirror's prefix, whether rewritten or shared."""
        return self.mirror + name[len(self.packages.package) :]

    def target(self, name: str) -> str:
        """The module the mirror imports for ``name``."""
        top, dot, rest = name.partition(".")
        if top in RENAMES:
            return RENAMES[top] + dot + rest
        if self._inside(name) and self.packages.is_bound(name):
            return self._served(name)
        return name

    def visit_Import(self, node: ast.Import) -> Any:
        statements: list[ast.stmt] = []
        for alias in node.names:
            top = alias.name.partition(".")[0]
            if self.target(alias.name) == alias.name and self.target(top) == top:
                new = [ast.Import(names=[alias])]
            elif alias.asname:
                new = [ast.Import(names=[ast.alias(self.target(alias.name), alias.asname)])]
            elif top == alias.name:
                new = [ast.Import(names=[ast.alias(self.target(top), top)])]
            else:  # `import a.b` binds `a`, through which the code reads `a.b`
                full = self._served(alias.name) if self._inside(top) else self.target(alias.name)
                new = [ast.Import(names=[ast.alias(full, top)])]
                new.append(ast.Import(names=[ast.alias(self.target(top), top)]))
            statements += [ast.copy_location(s, node) for s in new]
        return statements

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        if node.module == "__future__":
            return node
        base = _resolve(node, self.module, self.is_package)
        groups: dict[str, list[ast.alias]] = {}
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            shared = submodule in self.packages.files and not self.packages.is_bound(submodule)
            groups.setdefault(base if shared else self.target(base), []).append(alias)
        return [
            ast.copy_location(ast.ImportFrom(module=source, names=names, level=0), node)
            for source, names in groups.items()
        ]


class _Shared(Loader):
    """Serves a module that is not bound to Lightning as itself under the mirror's name."""

    def __init__(self, original: str) -> None:
        self.original = original
        self.spec: ModuleSpec | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.original)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the mirror's spec: its own back


class Mirror(MetaPathFinder, Loader):
    """Finds and loads ``pl_privfed.lightning.X``: bound modules rewritten, the others shared.

    Args:
        packages: the package's map (:func:`scan`).
        mirror: the served namespace's name.
        unmirrored: top-level modules not served (importing one is a ``ModuleNotFoundError``).
    """

    def __init__(
        self, packages: PackageMap, mirror: str = MIRROR, unmirrored: tuple[str, ...] = UNMIRRORED
    ) -> None:
        self.packages = packages
        self.mirror = mirror
        self.unmirrored = unmirrored

    def original(self, fullname: str) -> str | None:
        """The package's module that ``fullname`` of the mirror is; ``None`` outside the mirror."""
        if not fullname.startswith(self.mirror + "."):
            return None
        return self.packages.package + fullname[len(self.mirror) :]

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        original = self.original(fullname)
        if original is None or original not in self.packages.files:
            return None
        top = original.split(".")[1]
        if top in self.unmirrored:
            why = _WHY.get(top, f"{original} has no {self.mirror} counterpart")
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: {why}; import {original}", name=fullname
            )
        file, is_package = self.packages.files[original]
        loader = self if self.packages.is_bound(original) else _Shared(original)
        return ModuleSpec(fullname, loader, origin=str(file), is_package=is_package)

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        original = self.original(module.__name__)
        assert original is not None
        module.__file__ = str(self.packages.files[original][0])
        exec(self.code(original), module.__dict__)

    def code(self, original: str) -> CodeType:
        """The code of the package's module ``original`` with its imports rewritten: read from
        its cache file when that was written for the same source and path, bound modules,
        mirror and interpreter, else compiled (and the cache file written, when its folder is
        writable)."""
        file = self.packages.files[original][0]
        source = file.read_bytes()
        parts = [source, str(file).encode(), _TOOL_KEY.encode(), self.mirror.encode()]
        parts += sorted(m.encode() for m in self.packages.bound)
        key = hashlib.sha256(b"\0".join(parts)).digest()
        cache = _cache_path(
            Path(importlib.util.cache_from_source(str(file), optimization="lightning"))
        )
        try:
            data = cache.read_bytes() if cache is not None else b""
            if data[: len(key)] == key:
                return marshal.loads(data[len(key) :])
        except (OSError, ValueError, EOFError, TypeError):
            pass  # no cache, or an unreadable one: compile
        tree = ast.parse(source, filename=str(file))
        tree = ast.fix_missing_locations(
            ImportRewriter(self.packages, original, self.mirror).visit(tree)
        )
        code = compile(tree, str(file), "exec", dont_inherit=True)
        _write(cache, key + marshal.dumps(code))
        return code


#: with ``PYTHONDONTWRITEBYTECODE``, the folder that holds the mirror's caches instead of the
#: package's ``__pycache__`` folders, when this variable names one (else no cache)
CACHE_ENV = "PL_PRIVFED_CACHE"


def _cache_path(default: Path) -> Path | None:
    """Where a cache file goes: ``default`` (in a ``__pycache__`` folder, as Python's bytecode),
    or, when Python is told not to write bytecode (``PYTHONDONTWRITEBYTECODE``, which some
    machines set for every process), a file under ``$PL_PRIVFED_CACHE/mirror/`` named after
    ``default`` if that variable is set, else ``None`` (no cache: the mirror then reads and
    compiles the package in every process, 1.15 s of CPU on this project's 2-core CPU)."""
    if not sys.dont_write_bytecode:
        return default
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        return None
    tag = hashlib.sha256(str(default).encode()).hexdigest()[:16]
    return Path(folder).expanduser() / "mirror" / f"{tag}-{default.name}"


def _write(path: Path | None, data: bytes) -> None:
    """Write ``path`` atomically (a temporary file renamed into place); nothing without a path
    (:func:`_cache_path`) or if the folder cannot be written."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        pass


def cached_scan(package_dir: Path, package: str, renames: dict[str, str] = RENAMES) -> PackageMap:
    """:func:`scan`'s result, kept in ``package_dir/__pycache__`` under a hash of every file's
    path and content (reading and hashing the files costs a fraction of parsing them)."""
    paths = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256(f"{_TOOL_KEY}{package}{sorted(renames.items())}".encode())
    for path in paths:
        digest.update(f"\0{path.relative_to(package_dir).as_posix()}\0".encode())
        digest.update(path.read_bytes())
    key = digest.hexdigest()
    name = f"mirror-scan.{sys.implementation.cache_tag}.json"
    cache = _cache_path(package_dir / "__pycache__" / name)
    try:
        saved = json.loads(cache.read_text() if cache is not None else "")
        if saved["key"] == key:
            files = {m: (package_dir / f, bool(p)) for m, (f, p) in saved["files"].items()}
            return PackageMap(package, files, frozenset(saved["bound"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache, or an unreadable one: scan
    packages = scan(package_dir, package, renames)
    files = {m: (f.relative_to(package_dir).as_posix(), p) for m, (f, p) in packages.files.items()}
    text = json.dumps({"key": key, "files": files, "bound": sorted(packages.bound)})
    _write(cache, text.encode())
    return packages


def install() -> Mirror:
    """The package's :class:`Mirror`, put first on ``sys.meta_path`` on the first call."""
    for finder in sys.meta_path:
        if isinstance(finder, Mirror) and finder.mirror == MIRROR:
            return finder
    finder = Mirror(cached_scan(PACKAGE_DIR, PACKAGE))
    sys.meta_path.insert(0, finder)
    return finder
