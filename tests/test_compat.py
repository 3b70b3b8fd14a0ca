"""Other libraries' internals are reached from ``pl_privfed/compat/`` only (issue 46, item 3).

Two parts:

* :func:`private_accesses` reads the package's source with :mod:`ast` and lists every private
  access of another library outside ``pl_privfed/compat/``; the package has none.
* each compatibility module states the versions of its library it was tested with; the installed
  version is inside that range, ``pyproject.toml`` pins the library to it, and each of the
  module's functions is exercised on the real library.

What counts as a private access of another library (the rule :func:`private_accesses` applies):

1. reading, writing or deleting ``obj._name`` (one leading underscore) on an object that is not
   ``self``/``cls``, ``super()`` included, or ``getattr``/``hasattr``/``setattr``/``delattr``
   with such a constant name, unless the name is the package's own: defined by the package (a
   ``def``/``class``, a class or module attribute, a ``self._name = ...``) and by none of the
   libraries scanned (:data:`LIBRARIES`), so that an attribute the package names like a
   library's (``trainer._logger_connector``) is reported even where the package defines one;
2. inside a class that has a base from a scanned library (directly or through the package's own
   classes): defining or reading ``self._name`` or ``def _name`` where that library defines
   ``_name`` (an override of, or a write to, the library's private state);
3. importing a private module or name of another library (``from pytorch_lightning.cli import
   _InstantiatorFn``, ``import torch._dynamo``);
4. assigning ``obj.__class__`` (a live object's class swapped).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "pl_privfed"
COMPAT_DIR = PACKAGE_DIR / "compat"

#: the libraries whose private names are read from their source: ``{top-level module: the
#: folders or files under it that are scanned}`` (torch: the parts a model and a trainer touch;
#: its whole source is some 2,300 files)
LIBRARIES = {
    "pytorch_lightning": ("",),
    "lightning_fabric": ("",),
    "lightning": ("pytorch", "fabric"),
    "jsonargparse": ("",),
    "argparse": ("",),
    "dp_accounting": ("",),
    "torch": ("nn", "optim", "utils/data", "distributed/distributed_c10d.py", "_tensor.py"),
    "wandb": ("sdk/wandb_run.py", "sdk/wandb_init.py"),
}
#: private names that the standard library documents as public API
DOCUMENTED = {("os", "_exit")}


@dataclass(frozen=True)
class Access:
    """One private access: where, and what."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: ``def``/``class`` names, module and class attributes,
    and ``self._x``/``cls._x`` targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
                elif (
                    isinstance(leaf, ast.Attribute)
                    and isinstance(leaf.value, ast.Name)
                    and leaf.value.id in ("self", "cls")
                ):
                    names.add(leaf.attr)
    return {name for name in names if _private(name)}


def _sources(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def library_names(library: str) -> frozenset[str]:
    """The private names ``library`` defines (the parts of :data:`LIBRARIES` scanned); empty
    when it is not installed."""
    spec = importlib.util.find_spec(library)
    if spec is None or spec.origin is None:
        return frozenset()
    origin = Path(spec.origin)
    base = origin.parent if origin.name == "__init__.py" else origin
    names: set[str] = set()
    for part in LIBRARIES[library]:
        root = base / part if part else base
        for path in _sources(root) if root.exists() else []:
            try:
                names |= defined_names(ast.parse(path.read_bytes()))
            except SyntaxError:  # pragma: no cover - a template file
                continue
    return frozenset(names)


def _imported_modules(tree: ast.AST) -> dict[str, tuple[str, str | None]]:
    """``{local name: (module, attribute or None)}`` for a file's absolute imports:
    ``import a.b as c`` → ``c: (a.b, None)``; ``import a.b`` → ``a: (a, None)``;
    ``from a import b`` → ``b: (a, b)``."""
    found: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.partition(".")[0]
                found[alias.asname or top] = (alias.name if alias.asname else top, None)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found[alias.asname or alias.name] = (node.module, alias.name)
    return found


def _library_of(cls: type) -> str | None:
    """The scanned library a class is defined in (``lightning.pytorch.x`` → lightning)."""
    top = str(getattr(cls, "__module__", "") or "").partition(".")[0]
    return top if top in LIBRARIES else None


@functools.cache
def _parsed(path: str) -> ast.Module:
    return ast.parse(Path(path).read_bytes(), filename=path)


@functools.cache
def class_private_names(cls: type) -> frozenset[str]:
    """The private names a library's class defines in its own body (methods, class attributes,
    ``self._x = ...`` anywhere in it), read from its source."""
    names = {name for name in vars(cls) if _private(name)}
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:  # a builtin
        path = None
    for node in ast.walk(_parsed(path)) if path else ():
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            names |= defined_names(node)
    return frozenset(names)


def _resolve(expr: ast.expr, imported: dict[str, tuple[str, str | None]]) -> object | None:
    """The object an expression of imported names denotes (``pl.Callback``, ``ModelCheckpoint``),
    imported for real; ``None`` when it is not made of imported names."""
    chain: list[str] = []
    while isinstance(expr, ast.Attribute):
        chain.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name) or expr.id not in imported:
        return None
    module, attribute = imported[expr.id]
    try:
        obj: object = importlib.import_module(module)
        for name in [*filter(None, [attribute]), *chain]:
            obj = getattr(obj, name)
    except (ImportError, AttributeError):
        return None
    return obj


def library_bases(node: ast.ClassDef, tree: ast.Module) -> list[type]:
    """The classes of scanned libraries among a class's ancestors: its bases resolved through the
    file's imports (and the file's own classes, by name), then their MROs."""
    imported = _imported_modules(tree)
    local = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    found: list[type] = []
    stack, seen = list(node.bases), {node.name}
    while stack:
        base = stack.pop()
        if isinstance(base, ast.Name) and base.id in local:
            if base.id not in seen:
                seen.add(base.id)
                stack.extend(local[base.id].bases)
            continue
        obj = _resolve(base, imported)
        if isinstance(obj, type):
            found += [k for k in obj.__mro__ if _library_of(k) and k not in found]
    return found


def _constant_attribute(node: ast.Call) -> tuple[ast.expr, str] | None:
    """``getattr(obj, "_x", ...)`` (and has/set/delattr) → ``(obj, "_x")``."""
    if (
        isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def private_accesses(
    files: dict[str, str], package: str = "pl_privfed", fenced: str = "compat"
) -> list[Access]:
    """Every private access of another library in ``files`` (``{path: source}``, paths relative
    to the package's parent, e.g. ``pl_privfed/logdir.py``), those under ``<package>/<fenced>/``
    aside (the rule: module docstring)."""
    trees = {path: ast.parse(text, filename=path) for path, text in files.items()}
    outside = {p: t for p, t in trees.items() if not p.startswith(f"{package}/{fenced}/")}
    every_library = frozenset().union(*(library_names(lib) for lib in LIBRARIES))
    own = set().union(*(defined_names(t) for t in outside.values())) - every_library
    found: list[Access] = []
    for path, tree in outside.items():
        lines = files[path].splitlines()
        for node in _private_statements(tree, package) + _private_reads(tree, own):
            found.append(Access(path, node.lineno, lines[node.lineno - 1].strip()))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for inner in _private_overrides(node, tree):
                    found.append(Access(path, inner.lineno, lines[inner.lineno - 1].strip()))
    return sorted(set(found), key=lambda a: (a.file, a.line, a.text))


def _private_statements(tree: ast.Module, package: str) -> list[ast.stmt]:
    """Imports of another library's private modules or names; ``obj.__class__ = ...``."""
    found: list[ast.stmt] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.partition(".")[0] != package and any(
                _private(p)
                for d in [node.module, *(a.name for a in node.names)]
                for p in d.split(".")
            ):
                found.append(node)
        elif isinstance(node, ast.Import):
            if any(
                a.name.partition(".")[0] != package and any(map(_private, a.name.split(".")))
                for a in node.names
            ):
                found.append(node)
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(t, ast.Attribute) and t.attr == "__class__" and not _is_self(t.value)
                for t in targets
            ):
                found.append(node)
    return found


def _private_reads(tree: ast.Module, own: set[str]) -> list[ast.expr]:
    """``obj._x`` and ``getattr(obj, "_x")`` on an object not ``self``/``cls`` where ``_x`` is not
    the package's own (rule 1)."""
    imported = _imported_modules(tree)
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            obj, name = node.value, node.attr
        elif isinstance(node, ast.Call) and _constant_attribute(node):
            obj, name = _constant_attribute(node)  # type: ignore[misc]
        else:
            continue
        if not _private(name) or _is_self(obj) or name in own:
            continue
        if isinstance(obj, ast.Name) and (imported.get(obj.id, ("",))[0], name) in DOCUMENTED:
            continue
        found.append(node)
    return found


def _private_overrides(node: ast.ClassDef, tree: ast.Module) -> list[ast.AST]:
    """In a class with ancestors from a scanned library: ``def _x`` and ``self._x`` where one of
    those ancestors defines ``_x`` (rule 2)."""
    theirs = frozenset().union(*(class_private_names(k) for k in library_bases(node, tree)))
    if not theirs:
        return []
    found: list[ast.AST] = [
        inner
        for inner in node.body
        if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and inner.name in theirs
    ]
    found += [
        inner
        for inner in ast.walk(node)
        if isinstance(inner, ast.Attribute) and _is_self(inner.value) and inner.attr in theirs
    ]
    return found


def package_sources(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """``{path relative to the package's parent: source}`` for every file of the package."""
    return {
        p.relative_to(package_dir.parent).as_posix(): p.read_text() for p in _sources(package_dir)
    }


# ------------------------------------------------------------------------------- the package


def test_no_private_access_of_another_library_outside_compat():
    found = private_accesses(package_sources())
    assert not found, (
        "private attributes of other libraries read outside pl_privfed/compat/ (move each into "
        "the library's module there, behind a named function):\n" + "\n".join(map(str, found))
    )


SNIPPET = """\
import os

import pytorch_lightning as pl
import torch._dynamo
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import _InstantiatorFn


class Rows:
    def __init__(self):
        self._rows = []
        self._version = 0

    def _pending(self):
        return self._rows


class Saver(ModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath):
        super()._save_checkpoint(trainer, filepath)
        self._last_checkpoint_saved = filepath
        self._mine = filepath


class Watcher(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        connector = trainer._logger_connector
        first = getattr(connector, "_first_loop_iter", None)
        rows = Rows()
        rows._rows.append(rows._pending())
        version = trainer.logger._version
        trainer.strategy.__class__ = type(trainer.strategy)
        self._mine = (first, version)
        os._exit(0)
"""


def test_the_rule_reports_each_kind_of_private_access_and_nothing_else():
    """A callback written outside ``compat`` that reaches into Lightning: each access is
    reported, the package's own private names (``rows._rows``, ``rows._pending()``), its own
    ``self._mine`` and the documented ``os._exit`` are not; ``_version``, defined by the
    snippet's own class too, is still reported on another object, since Lightning defines it;
    the same access inside ``compat`` is not reported."""
    files = {
        "pl_privfed/callbacks/watcher.py": SNIPPET,
        "pl_privfed/compat/lightning.py": "def f(trainer):\n    return trainer._logger_connector\n",
    }
    found = [(a.line, a.text) for a in private_accesses(files)]
    assert found == [
        (4, "import torch._dynamo"),
        (6, "from pytorch_lightning.cli import _InstantiatorFn"),
        (19, "def _save_checkpoint(self, trainer, filepath):"),
        (20, "super()._save_checkpoint(trainer, filepath)"),
        (21, "self._last_checkpoint_saved = filepath"),
        (27, "connector = trainer._logger_connector"),
        (28, 'first = getattr(connector, "_first_loop_iter", None)'),
        (31, "version = trainer.logger._version"),
        (32, "trainer.strategy.__class__ = type(trainer.strategy)"),
    ]
    assert {a.file for a in private_accesses(files)} == {"pl_privfed/callbacks/watcher.py"}


# ------------------------------------------------------------- versions: tested, installed, pinned

#: each library's distribution → the compat module that states its tested range
COMPAT_MODULES = {
    "pytorch-lightning": "pl_privfed.compat.lightning",
    "lightning": "pl_privfed.compat.lightning",
    "jsonargparse": "pl_privfed.compat.jsonargparse",
    "torch": "pl_privfed.compat.torch",
    "dp-accounting": "pl_privfed.compat.dp_accounting",
}
PYPROJECT = PACKAGE_DIR.parent / "pyproject.toml"


def _pins() -> dict[str, list[str]]:
    """``{distribution: [every specifier pyproject.toml gives it]}`` (dependencies and extras)."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = [*project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        lines += extra
    pins: dict[str, list[str]] = {}
    for line in lines:
        requirement = Requirement(line)
        pins.setdefault(requirement.name, []).append(str(requirement.specifier))
    return pins


@pytest.mark.parametrize("distribution", sorted(COMPAT_MODULES))
def test_the_installed_version_is_the_tested_one_and_pyproject_pins_it(distribution):
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    tested = importlib.import_module(COMPAT_MODULES[distribution]).TESTED
    installed = version(distribution)
    assert installed in SpecifierSet(tested), (
        f"{distribution} {installed} is installed; {COMPAT_MODULES[distribution]} was tested "
        f"with {tested}: run this test file against it and widen TESTED and pyproject.toml"
    )
    pins = _pins()[distribution]
    assert pins and all(SpecifierSet(p) == SpecifierSet(tested) for p in pins), (distribution, pins)


def test_the_compat_package_is_one_module_per_library():
    assert sorted(p.stem for p in COMPAT_DIR.glob("*.py")) == [
        "__init__",
        "dp_accounting",
        "jsonargparse",
        "lightning",
        "torch",
    ]
    for name in set(COMPAT_MODULES.values()):
        module = importlib.import_module(name)
        assert "TESTED" in module.__all__ and all(hasattr(module, n) for n in module.__all__)


# ------------------------------------------------------------------------------ torch


def test_torch_convolution_and_batch_norm_internals():
    import torch
    import torch.nn.functional as F
    from torch import nn

    from pl_privfed.compat.torch import conv_forward, conv_padding, is_batch_norm, is_convolution

    assert all(
        map(is_convolution, [nn.Conv1d(1, 1, 3), nn.Conv2d(1, 1, 3), nn.ConvTranspose2d(1, 1, 3)])
    )
    assert not any(map(is_convolution, [nn.Linear(2, 2), nn.BatchNorm1d(2)]))
    assert all(map(is_batch_norm, [nn.BatchNorm1d(2), nn.BatchNorm2d(2), nn.SyncBatchNorm(2)]))
    assert not any(map(is_batch_norm, [nn.LayerNorm(2), nn.GroupNorm(1, 2), nn.Conv1d(1, 1, 1)]))
    conv = nn.Conv2d(2, 3, 3, padding=(1, 2), padding_mode="reflect")
    assert conv_padding(conv) == (2, 2, 1, 1)  # F.pad's order: last dimension first
    x = torch.randn(4, 2, 6, 7, generator=torch.Generator().manual_seed(0))
    w, b = torch.randn_like(conv.weight), torch.randn_like(conv.bias)
    expected = F.conv2d(F.pad(x, (2, 2, 1, 1), mode="reflect"), w, b)
    assert torch.allclose(conv_forward(conv, x, w, b), expected, atol=1e-5)
    assert torch.allclose(conv_forward(conv, x, conv.weight, conv.bias), conv(x))


# ----------------------------------------------------------------------------- dp-accounting


def test_dp_accounting_dense_remove_pmf_gives_the_pld_delta():
    """The hockey-stick divergence of the dense PMF, ``δ(ε) = Σ p_i (1 − e^{ε − ℓ_i·h})₊ +
    p_∞``, is what dp-accounting computes for the same (symmetric) PLD."""
    import numpy as np
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    from pl_privfed.compat.dp_accounting import remove_pmf

    interval = 1e-3
    pld = pld_lib.from_gaussian_mechanism(
        standard_deviation=1.3, sensitivity=1.0, value_discretization_interval=interval
    )
    losses, probs, infinity = remove_pmf(pld)
    assert losses.dtype.kind == "i" and np.all(np.diff(losses) == 1)
    assert probs.shape == losses.shape and 0.0 <= infinity < 1e-6
    assert abs(probs.sum() + infinity - 1.0) < 1e-9
    for epsilon in (0.5, 1.0, 2.0):
        delta = float(np.sum(probs * np.clip(1 - np.exp(epsilon - losses * interval), 0, None)))
        assert delta + infinity == pytest.approx(pld.get_delta_for_epsilon(epsilon), rel=1e-9)


# ------------------------------------------------------------------ jsonargparse and argparse


def test_jsonargparse_parser_internals():
    from jsonargparse import ArgumentParser

    from pl_privfed.compat.jsonargparse import (
        parser_actions,
        subcommand_help_entries,
        subcommands_action,
    )

    parser = ArgumentParser(prog="p", exit_on_error=False)
    parser.add_argument("--rate", type=float, default=0.1, help="the rate")
    assert "rate" in [action.dest for action in parser_actions(parser)]
    assert subcommands_action(parser) is None
    subcommands = parser.add_subcommands()
    for name in ("fit", "test"):
        subcommands.add_subcommand(name, ArgumentParser(), help=f"{name} it")
    action = subcommands_action(parser)
    assert action is subcommands
    entries = subcommand_help_entries(action)
    assert [(e.dest, e.help) for e in entries] == [("fit", "fit it"), ("test", "test it")]
    entries[0].help = "train"
    assert "train" in parser.format_help()  # what --help prints is these entries


# ---------------------------------------------------------------------------------- Lightning


def _namespaces() -> list[str]:
    found = ["pytorch_lightning"]
    if importlib.util.find_spec("lightning") is not None:
        found.append("lightning.pytorch")
    return found


@pytest.mark.parametrize("namespace", _namespaces())
def test_lightning_loggers_modules_and_strategies(namespace, tmp_path):
    """Each function of ``compat.lightning`` on the objects of both namespaces."""
    from pl_privfed.compat import lightning as compat

    L = importlib.import_module(namespace)
    loggers = importlib.import_module(f"{namespace}.loggers")
    strategies = importlib.import_module(f"{namespace}.strategies")
    assert compat.lightning_module(L.Trainer, "strategies") is strategies

    logger = loggers.CSVLogger(save_dir=tmp_path)
    assert compat.logger_version(logger) is None
    compat.set_logger_version(logger, 7)
    assert compat.logger_version(logger) == 7 and logger.log_dir.endswith("version_7")
    wandb = loggers.WandbLogger(save_dir=str(tmp_path), offline=True, name="a-run")
    assert not compat.wandb_run_started(wandb)
    assert compat.wandb_init_arguments(wandb)["name"] == "a-run"

    class Module(L.LightningModule):
        def __init__(self, rate: float = 0.5) -> None:
            super().__init__()
            self.save_hyperparameters()

    module = Module()
    assert compat.saved_hyperparameters(module) == {"rate": 0.5}
    assert compat.saved_hyperparameters(object()) == {}
    assert not compat.hyperparameters_from_cli(module)
    module.hparams.update({"extra": 1})
    assert "extra" not in module.hparams_initial
    compat.reset_initial_hyperparameters(module)
    assert module.hparams_initial["extra"] == 1
    assert compat.attached_trainer(module) is None
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    module.trainer = trainer
    assert compat.attached_trainer(module) is trainer

    class Keyed(L.Callback):
        pass

    key = compat.callback_state_key(Keyed(), epsilon=1.0)
    assert key == f"{Keyed.__qualname__}{{'epsilon': 1.0}}"
    bar = importlib.import_module(f"{namespace}.callbacks").TQDMProgressBar()
    assert not compat.train_progress_bar_open(bar)

    assert compat.is_local_path(tmp_path / "a.ckpt") and compat.is_local_path("a.ckpt")
    assert not compat.is_local_path("s3://bucket/a.ckpt")
    fabric = "lightning.fabric" if namespace == "lightning.pytorch" else "lightning_fabric"
    theirs = importlib.import_module(f"{fabric}.utilities.cloud_io")._is_local_file_protocol
    for path in ("a.ckpt", "/x/a.ckpt", "file:///x/a.ckpt", "s3://b/a", "memory://a"):
        assert compat.is_local_path(path) == theirs(path), path

    first, second = strategies.DDPStrategy(), strategies.DDPStrategy()
    compat.shard_without_ddp_wrapper(first)
    compat.shard_without_ddp_wrapper(second)
    assert type(first) is type(second) and type(first).__name__ == "ClientShardingDDPStrategy"
    assert isinstance(first, strategies.DDPStrategy) and first.shards_clients
    assert first.configure_ddp() is None  # no DistributedDataParallel wrapper


@pytest.mark.parametrize("namespace", _namespaces())
def test_lightning_checkpoint_hooks_and_logging_state_on_a_real_fit(namespace, tmp_path):
    """A ``ModelCheckpoint`` with :class:`ModelCheckpointHooks` on a 3-step fit: Lightning saves
    through ``save_checkpoint_file`` and deletes through ``remove_checkpoint_file``; the other
    hooks answer as Lightning's private methods would; ``logging_state_kept`` restores the flag
    that an evaluation inside a training step resets."""
    from pl_privfed.compat.lightning import ModelCheckpointHooks, logging_state_kept

    L = importlib.import_module(namespace)
    boring = importlib.import_module(f"{namespace}.demos.boring_classes")
    ModelCheckpoint = importlib.import_module(f"{namespace}.callbacks").ModelCheckpoint
    calls: list[tuple[str, str]] = []

    class Recording(ModelCheckpointHooks, ModelCheckpoint):
        def save_checkpoint_file(self, trainer, filepath):
            calls.append(("save", Path(filepath).name))
            super().save_checkpoint_file(trainer, filepath)

        def remove_checkpoint_file(self, trainer, filepath):
            calls.append(("remove", Path(filepath).name))
            super().remove_checkpoint_file(trainer, filepath)

    callback = Recording(dirpath=tmp_path, filename="{step}", every_n_train_steps=1)
    trainer = L.Trainer(
        max_steps=3,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        default_root_dir=tmp_path,
    )
    trainer.fit(boring.BoringModel())
    assert calls == [
        ("save", "step=1.ckpt"),
        ("save", "step=2.ckpt"),
        ("remove", "step=1.ckpt"),
        ("save", "step=3.ckpt"),
        ("remove", "step=2.ckpt"),
    ]
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step=3.ckpt"]
    assert callback.saved_this_step(trainer) == str(tmp_path / "step=3.ckpt")
    assert callback.skips_saving(trainer)  # the step is saved already
    candidates = callback.monitor_candidates(trainer)
    assert int(candidates["step"]) == 3
    path = callback.checkpoint_path(candidates, trainer)  # the name taken: Lightning's -v1
    assert path == str(tmp_path / "step=3-v1.ckpt")
    callback.mark_saved(trainer, "elsewhere.ckpt")
    assert callback.saved_this_step(trainer) == "elsewhere.ckpt"

    connector = trainer._logger_connector  # a test may read it: it checks compat's function
    connector._first_loop_iter = True
    with logging_state_kept(trainer):
        connector._first_loop_iter = False
    assert connector._first_loop_iter is True


def test_lightning_cli_hooks_run_in_lightnings_order(tmp_path):
    """:class:`LightningCLIHooks` under ``LightningCLI``: each public hook is called where
    Lightning calls its private step, and ``instantiator`` is Lightning's (the model built from
    the config section saves it as its hyperparameters)."""
    from pytorch_lightning.cli import LightningCLI
    from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel

    from pl_privfed.compat.lightning import LightningCLIHooks, hyperparameters_from_cli

    calls: list[str] = []

    class Model(BoringModel):
        def __init__(self, width: int = 2) -> None:
            super().__init__()
            calls.append(f"model from the CLI: {hyperparameters_from_cli(self)}")
            self.save_hyperparameters()

    class CLI(LightningCLIHooks, LightningCLI):
        merge_checkpoint_hyperparameters = False

        def subcommands_added(self, parser, action):
            calls.append(f"subcommands {sorted(action.choices)}")

        def add_instantiators(self):
            calls.append("instantiators")
            self.parser.add_instantiator(self.instantiator("model"), Model, subclasses=True)

        def run_subcommand(self, subcommand):
            calls.append(f"run {subcommand}")
            super().run_subcommand(subcommand)

    args = [
        "fit",
        "--trainer.max_steps=1",
        "--trainer.limit_val_batches=0",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    cli = CLI(Model, BoringDataModule, args=args, save_config_callback=None)
    assert calls == [
        "subcommands ['fit', 'predict', 'test', 'validate']",
        "instantiators",
        "model from the CLI: True",
        "run fit",
    ]
    assert cli.trainer.global_step == 1
    assert "_instantiator" in cli.model.hparams  # built by Lightning's instantiator
    assert cli.model.hparams["width"] == 2
