"""Lightning's private names that the package uses, behind functions and two mixins.

It imports no Lightning: it reads attributes of the objects it is given, and where it needs a
module of Lightning it takes the one of the object's own namespace (``pytorch_lightning`` or
``lightning.pytorch``, :func:`lightning_module`). :mod:`pl_privfed.mirror` therefore shares this
module between ``pl_privfed`` and ``pl_privfed.lightning``, and a module importing it is not
bound to Lightning by that import.

Tested with pytorch-lightning and lightning ``TESTED`` (``tests/test_compat.py``).
"""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from pl_privfed.compat.jsonargparse import subcommands_action

__all__ = [
    "NAMESPACES",
    "TESTED",
    "LightningCLIHooks",
    "ModelCheckpointHooks",
    "attached_trainer",
    "callback_state_key",
    "check_namespaces",
    "hyperparameters_from_cli",
    "is_local_path",
    "lightning_module",
    "logger_version",
    "logging_state_kept",
    "name_namespace_mismatches",
    "namespace_mismatch",
    "namespace_of",
    "reset_initial_hyperparameters",
    "saved_hyperparameters",
    "set_logger_version",
    "shard_without_ddp_wrapper",
    "train_progress_bar_open",
    "wandb_init_arguments",
    "wandb_run_started",
]

#: the versions of pytorch-lightning and lightning this module was checked against
#: (``pyproject.toml`` pins both to them)
TESTED = ">=2.6,<2.7"
#: Lightning's two namespaces, each the package its trainer is in
NAMESPACES = ("pytorch_lightning", "lightning.pytorch")


def lightning_module(obj: Any, module: str) -> ModuleType:
    """Lightning's ``module`` (e.g. ``"strategies"``) in the namespace of ``obj``'s class: the
    namespace of the first class of its MRO that belongs to one (``pytorch_lightning`` for an
    object of neither)."""
    namespace = NAMESPACES[0]
    for cls in type(obj).__mro__ if not isinstance(obj, type) else obj.__mro__:
        found = [n for n in NAMESPACES if cls.__module__.startswith(n + ".")]
        if found:
            namespace = found[0]
            break
    return importlib.import_module(f"{namespace}.{module}")


# ------------------------------------------------------------------------------------ loggers


def logger_version(logger: Any) -> int | str | None:
    """The version a ``CSVLogger``/``TensorBoardLogger`` was given or has chosen; ``None`` while
    it has none (reading ``logger.version`` would choose one)."""
    return logger._version


def set_logger_version(logger: Any, version: int | str) -> None:
    """Give a ``CSVLogger``/``TensorBoardLogger`` its version (its ``version_<k>`` folder)."""
    logger._version = version


def wandb_run_started(logger: Any) -> bool:
    """Whether a ``WandbLogger`` has started its run (``logger.experiment`` would start one)."""
    return logger._experiment is not None


def wandb_init_arguments(logger: Any) -> dict[str, Any] | None:
    """The keyword arguments a ``WandbLogger`` will give ``wandb.init`` (the dict itself: a
    change is what ``wandb.init`` gets), or ``None`` if it keeps none."""
    init = getattr(logger, "_wandb_init", None)
    return init if isinstance(init, dict) else None


# ------------------------------------------------------------------- modules and callbacks


def saved_hyperparameters(obj: Any) -> dict[str, Any]:
    """The hyperparameters ``obj.save_hyperparameters()`` kept (empty when none were kept;
    ``obj.hparams`` would create them)."""
    return dict(getattr(obj, "_hparams", None) or {})


def reset_initial_hyperparameters(module: Any) -> None:
    """Make the module's current hyperparameters its initial ones too (what a checkpoint saves
    and ``hparams_initial`` reports), after they were updated in place."""
    module._hparams_initial = copy.deepcopy(module._hparams)


def hyperparameters_from_cli(module: Any) -> bool:
    """Whether ``module`` is being built by LightningCLI, which hands the config's section over
    as the hyperparameters ``save_hyperparameters()`` keeps."""
    mixin = lightning_module(module, "core.mixins.hparams_mixin")
    return mixin._given_hyperparameters.get() is not None


def attached_trainer(module: Any) -> Any | None:
    """The trainer a ``LightningModule`` is attached to, or ``None`` (``module.trainer`` raises
    then)."""
    return module._trainer


def callback_state_key(callback: Any, **key: Any) -> str:
    """A callback's ``state_key`` made of its class and ``key`` (Lightning's own form, so that
    two instances with different ``key`` keep separate state in a checkpoint)."""
    return callback._generate_state_key(**key)


def train_progress_bar_open(bar: Any) -> bool:
    """Whether a ``TQDMProgressBar`` has a training bar (``bar.train_progress_bar`` raises
    otherwise)."""
    return bar._train_progress_bar is not None


@contextmanager
def logging_state_kept(trainer: Any) -> Iterator[None]:
    """Restore the trainer's logging state for the training loop after running a loop inside it
    (an evaluation started from a training step: it resets the flag that tells the training
    loop's next logged value it is the first of its loop)."""
    connector = trainer._logger_connector
    first_loop_iter = connector._first_loop_iter
    try:
        yield
    finally:
        connector._first_loop_iter = first_loop_iter


def is_local_path(path: Any) -> bool:
    """Whether ``path`` is on the local file system (Lightning's private
    ``_is_local_file_protocol``, written out: fsspec's protocol of the path is ``file``)."""
    import fsspec.utils  # imported with Lightning; not needed before a checkpoint is written

    return fsspec.utils.get_protocol(str(path)) == "file"


# ----------------------------------------------------------------------------- strategies

_WITHOUT_WRAPPER: dict[type, type] = {}


def _configure_ddp(self: Any) -> None:
    """No ``DistributedDataParallel`` wrapper: there is no backward pass to synchronize."""
    return None


def shard_without_ddp_wrapper(strategy: Any) -> None:
    """Make a live ``DDPStrategy`` (any subclass) one that does not wrap the module in
    ``DistributedDataParallel``, and mark it ``shards_clients``: its class becomes a subclass
    adding only ``configure_ddp`` (made once per class; the instance keeps its state, since a
    subclass adding only methods has the same layout). The trainer made the strategy from its
    arguments, so this is how a module adapts the one it was given."""
    base = type(strategy)
    if base not in _WITHOUT_WRAPPER:
        namespace = {"configure_ddp": _configure_ddp, "shards_clients": True}
        _WITHOUT_WRAPPER[base] = type(f"ClientSharding{base.__name__}", (base,), namespace)
    strategy.__class__ = _WITHOUT_WRAPPER[base]


# --------------------------------------------------------------------------------- mixins


class ModelCheckpointHooks:
    """Public names for ``ModelCheckpoint``'s private steps; put it before ``ModelCheckpoint``
    in the bases (``class C(ModelCheckpointHooks, ModelCheckpoint)``) and override
    :meth:`save_checkpoint_file` / :meth:`remove_checkpoint_file` rather than Lightning's
    private methods."""

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        self.save_checkpoint_file(trainer, filepath)

    def _remove_checkpoint(self, trainer: Any, filepath: str) -> None:
        self.remove_checkpoint_file(trainer, filepath)

    def save_checkpoint_file(self, trainer: Any, filepath: str) -> None:
        """Write the checkpoint ``filepath`` (Lightning's way, unless overridden)."""
        super()._save_checkpoint(trainer, filepath)  # type: ignore[misc]

    def remove_checkpoint_file(self, trainer: Any, filepath: str) -> None:
        """Delete the superseded checkpoint ``filepath`` (Lightning's way, unless overridden)."""
        super()._remove_checkpoint(trainer, filepath)  # type: ignore[misc]

    def mark_saved(self, trainer: Any, filepath: str) -> None:
        """Record ``filepath`` as the checkpoint of the trainer's current step (what Lightning's
        own saving records: it then saves no second file of that step)."""
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath

    def saved_this_step(self, trainer: Any) -> str | None:
        """The checkpoint saved at the trainer's current step, or ``None``."""
        if self._last_global_step_saved == trainer.global_step and self._last_checkpoint_saved:
            return self._last_checkpoint_saved
        return None

    def skips_saving(self, trainer: Any) -> bool:
        """Whether Lightning would save nothing now (a sanity check, a fast dev run, a step saved
        already)."""
        return self._should_skip_saving_checkpoint(trainer)  # type: ignore[attr-defined]

    def monitor_candidates(self, trainer: Any) -> dict[str, Any]:
        """The logged metrics (and ``epoch``/``step``) a file name and ``monitor`` can use."""
        return self._monitor_candidates(trainer)  # type: ignore[attr-defined]

    def checkpoint_path(self, candidates: dict[str, Any], trainer: Any) -> str:
        """The file name template filled in with ``candidates``, in ``dirpath``."""
        return self._get_metric_interpolated_filepath_name(candidates, trainer)  # type: ignore[attr-defined]

    def save_top_k_and_last(self, trainer: Any, candidates: dict[str, Any]) -> None:
        """Save as Lightning does at a step: the top-k file (ranked by ``monitor``) and
        ``last.ckpt`` when asked for."""
        self._save_topk_checkpoint(trainer, candidates)  # type: ignore[attr-defined]
        self._save_last_checkpoint(trainer, candidates)  # type: ignore[attr-defined]


class LightningCLIHooks:
    """Public names for the steps of ``LightningCLI`` that it keeps private; put it before
    ``LightningCLI`` in the bases (``class C(LightningCLIHooks, LightningCLI)``) and override
    these rather than Lightning's private methods.

    Attributes:
        merge_checkpoint_hyperparameters: whether ``--ckpt_path``'s saved hyperparameters are
            merged into the config before the classes are built (Lightning's default, ``True``).
    """

    merge_checkpoint_hyperparameters = True

    def _add_subcommands(self, parser: Any, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)  # type: ignore[misc]
        self.subcommands_added(parser, subcommands_action(parser))

    def subcommands_added(self, parser: Any, action: Any | None) -> None:
        """Called once Lightning has added its subcommands to the root ``parser``; ``action``
        is its subcommands action (``None`` without subcommands)."""

    def _parse_ckpt_path(self) -> None:
        if self.merge_checkpoint_hyperparameters:
            super()._parse_ckpt_path()  # type: ignore[misc]

    def _add_instantiators(self) -> None:
        self.add_instantiators()

    def add_instantiators(self) -> None:
        """Give the parser the functions that build the model and the datamodule (Lightning's,
        unless overridden; :meth:`instantiator` makes one)."""
        super()._add_instantiators()  # type: ignore[misc]

    def instantiator(self, key: str) -> Any:
        """Lightning's instantiator of the config section ``key`` (``"model"``, ``"data"``): it
        builds the class with the section as the hyperparameters it saves."""
        return lightning_module(self, "cli")._InstantiatorFn(cli=self, key=key)

    def _run_subcommand(self, subcommand: str) -> None:
        self.run_subcommand(subcommand)

    def run_subcommand(self, subcommand: str) -> None:
        """Run ``subcommand`` (``fit``, ``validate``, ...) with the hooks ``before_<it>`` and
        ``after_<it>`` around it (Lightning's, unless overridden)."""
        super()._run_subcommand(subcommand)  # type: ignore[misc]


# --------------------------------------------------------------------------------- namespaces

#: the package's module of each namespace, the one to import from
_PACKAGE_OF = {"pytorch_lightning": "pl_privfed", "lightning.pytorch": "pl_privfed.lightning"}


def namespace_of(obj: Any) -> str | None:
    """The Lightning namespace (``pytorch_lightning`` or ``lightning.pytorch``) of the first
    class of ``obj``'s MRO that belongs to one; ``None`` for an object of neither."""
    for cls in type(obj).__mro__:
        found = [n for n in NAMESPACES if cls.__module__.startswith(n + ".")]
        if found:
            return found[0]
    return None


def namespace_mismatch(obj: Any, what: str, namespace: str) -> str | None:
    """One line naming a mismatch: ``obj`` (the trainer's ``what``: ``model``, a callback, the
    datamodule) of the other Lightning namespace than the trainer's ``namespace``, and which
    import to use; ``None`` when it matches or is of neither."""
    own = namespace_of(obj)
    if own is None or own == namespace:
        return None
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    return (
        f"{what} {name} is a {own} object, but the Trainer is {namespace}'s: one process may "
        f"use both, not in one fit; with `import {namespace}` take the package's classes from "
        f"{_PACKAGE_OF[namespace]} (`from {_PACKAGE_OF[namespace]} import FederatedModule, "
        f"RunSummary, ...`), or use {own}'s Trainer"
    )


def check_namespaces(trainer: Any) -> None:
    """Refuse, in one line each, callbacks and a datamodule of the other Lightning namespace
    than ``trainer``'s: Lightning takes another namespace's callbacks for plain callbacks (its
    own progress bar and checkpoints beside the package's) without a word.

    Raises:
        TypeError: naming the object, both namespaces and the import to use.
    """
    namespace = namespace_of(trainer) or NAMESPACES[0]
    things = [("callback:", c) for c in trainer.callbacks]
    things.append(("datamodule:", getattr(trainer, "datamodule", None)))
    for what, obj in things:
        message = namespace_mismatch(obj, what.rstrip(":"), namespace)
        if message is not None:
            raise TypeError(message)


def _role(obj: Any) -> str:
    """What ``obj`` is to a trainer, by its Lightning base: ``model``, ``datamodule``,
    ``callback`` (else ``object``)."""
    names = {cls.__name__ for cls in type(obj).__mro__}
    for base, role in (("LightningModule", "model"), ("LightningDataModule", "datamodule")):
        if base in names:
            return role
    return "callback" if "Callback" in names else "object"


def name_namespace_mismatches() -> None:
    """Make Lightning's refusal of a model of the other namespace name it, in every Lightning
    namespace imported so far (once each; called whenever a ``FederatedModule`` is built).

    Lightning's own check of mixed imports (``_check_mixed_imports``, called where ``fit``
    refuses a model that is not its ``LightningModule``) reads the class's own module only, so
    ``pl_privfed.lightning.FederatedModule`` given to a ``pytorch_lightning.Trainer`` ended in
    "`model` must be a `LightningModule` ..., got `FederatedModule`". The check is wrapped to
    look at the class's bases first (:func:`namespace_mismatch`); anything else is Lightning's.

    """
    for namespace, name in (
        (n, m) for n in NAMESPACES for m in ("utilities.model_helpers", "utilities.compile")
    ):
        if namespace not in sys.modules:
            continue
        module = importlib.import_module(f"{namespace}.{name}")
        original = getattr(module, "_check_mixed_imports", None)
        if original is None or getattr(original, "_pl_privfed", False):
            continue

        def check(instance: object, _original: Any = original, _namespace: str = namespace) -> None:
            message = namespace_mismatch(instance, _role(instance), _namespace)
            if message is not None:
                raise TypeError(message)
            _original(instance)

        check._pl_privfed = True  # type: ignore[attr-defined]
        module._check_mixed_imports = check
