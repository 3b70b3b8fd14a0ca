"""``RunSummary``: writes ``summary.json`` at the end of every fit (and on failure)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import yaml
from pytorch_lightning.utilities import rank_zero_only, rank_zero_warn
from typing_extensions import override

from pl_privfed import trainer_rounds
from pl_privfed.callbacks._logging import logged_names, warn_once
from pl_privfed.callbacks.interrupt import (
    restore_signals,
    stop_if_signalled,
    stop_signal,
    stopped_before_training,
    watch_setup_signals,
    watch_signals,
)
from pl_privfed.logdir import local_log_dir, log_artifact, wandb_loggers
from pl_privfed.record import FIELDS, make_record, privacy_entries, wandb_summary
from pl_privfed.results import finite_float, write_atomically

__all__ = ["RunSummary", "audit_line", "epsilon_line", "stop_entries"]


#: role: (RunSummary's argument, the module's declaration, the default)
_KEYS = {
    "accuracy": ("accuracy_key", "validation_accuracy_key", "val/acc"),
    "loss": ("loss_key", "training_loss_key", "train/loss"),
}


class RunSummary(pl.Callback):
    """Records the run's outcome in ``<log_dir>/summary.json`` and prints a one-line result.

    Works with any LightningModule. After every validation (``on_validation_end``, so that
    what the module logs in its own ``on_validation_epoch_end`` counts) it reads ``val/acc``
    (or ``accuracy_key``; by default a module's ``validation_accuracy_key`` where it declares
    one, as a grid does: ``grid/best_val_acc``, its best configuration's) and ``val/loss``
    (``val_loss_key``) from the logged metrics, and ``train/loss`` (``loss_key``; by default a
    module's ``training_loss_key``: a grid's ``grid/min_train_loss``) after every round.
    ``summary.json`` then holds

    * ``final_val_accuracy``, ``final_val_loss`` and ``final_val_round``: the last validation,
      which :class:`~pl_privfed.FederatedModule` runs after the last round (so they are the final
      model's; a fit from a finished checkpoint saved before that validation gives them through
      the module's ``summary_entries()``, and the best is then never below the final);
    * ``best_val_accuracy`` and ``best_val_round``: the highest validation accuracy and its round
      (a best-of value, named as such);
    * ``final_test_accuracy``, ``final_test_loss`` and ``final_test_round``: the held-out test set,
      evaluated once for the final model at the end of fit (from the module's
      ``summary_entries()``; ``None`` for a module that does not evaluate it).

    A key other than ``val/acc`` or ``train/loss`` is named in ``summary.json`` as
    ``val_accuracy_metric`` or ``train_loss_metric``.

    When an evaluation ends without ``accuracy_key`` or ``val_loss_key`` among the logged
    metrics, or a fit ends without ``loss_key`` ever logged, it warns once for each, naming the
    metrics that were logged, instead of writing ``null`` silently (a module that logs other
    names gives them here; a module with its own ``validation_accuracy_key``, a grid, logs no
    validation loss, and is not warned about the default ``val/loss``).

    From ``setup`` a SIGTERM or Ctrl-C ends the fit (:mod:`~pl_privfed.callbacks.interrupt`):
    before round 1 at once, with ``status: "interrupted: <signal> before training"``; during
    training after the round, with the checkpoint saved for it named.

    When the module has a ``privacy_report()`` method
    returning a dict (ε, δ, noise settings), includes it. If LightningCLI saved ``config.yaml``
    in the log directory, the resolved config is included too, and so are the
    ``summary_entries()`` of the module and of the other callbacks (client transmissions,
    communication totals, operator averages, a privacy-budget stop, rounds to a gradient-norm
    target). With a ``WandbLogger`` the scalars go to the run summary and the file
    is logged as an artifact.

    Args:
        dirpath: where to write; default ``trainer.log_dir``.
        filename: file name (default ``summary.json``).
        accuracy_key: logged metric holding the validation accuracy (default: the module's
            ``validation_accuracy_key`` if it has one, else ``val/acc``).
        loss_key: logged metric holding the training loss (default: the module's
            ``training_loss_key`` if it has one, else ``train/loss``).
        val_loss_key: logged metric holding the validation loss.
        verbose: print the result line at the end of fit.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str = "summary.json",
        accuracy_key: str | None = None,
        loss_key: str | None = None,
        verbose: bool = True,
        val_loss_key: str = "val/loss",
    ) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self.accuracy_key = accuracy_key
        self.loss_key = loss_key
        self.val_loss_key = val_loss_key
        self.verbose = verbose
        self._start: float | None = None
        #: the run's curves the record reads (:mod:`pl_privfed.record`): every scheduled
        #: validation's accuracy and loss, and the last round's training loss
        self.curves: dict[str, list[tuple[int, float]]] = {}
        self.first_loss: tuple[int, float] | None = None  # (round, training loss) of this fit
        self.path: Path | None = None
        self.interrupted: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None  # a failed fit's typed failure

    @property
    def best_accuracy(self) -> float | None:
        """The highest validation accuracy so far (``None`` before the first)."""
        return _read(self.curves, "best_val_accuracy")

    @property
    def best_round(self) -> int | None:
        """The round of :attr:`best_accuracy`."""
        return _read(self.curves, "best_val_round")

    @property
    def evaluated_round(self) -> int | None:
        """The round of the last scheduled validation."""
        return _read(self.curves, "final_val_round")

    @property
    def final_loss(self) -> float | None:
        """The last round's training loss."""
        return _read(self.curves, "final_train_loss")

    def key_of(self, pl_module: pl.LightningModule, role: str = "accuracy") -> str:
        """The logged metric read as the validation accuracy (``role="accuracy"``:
        ``accuracy_key``, else the module's ``validation_accuracy_key``, else ``val/acc``) or
        the training loss (``"loss"``: ``loss_key``, ``training_loss_key``, ``train/loss``)."""
        given, declared, default = _KEYS[role]
        if getattr(self, given) is not None:
            return getattr(self, given)
        return getattr(pl_module, declared, None) or default

    def _warn_missing(self, trainer: pl.Trainer, key: str, role: str, argument: str) -> None:
        warn_once(
            self,
            key,
            f"no metric {key!r} was logged, so summary.json has no {role} "
            f"(logged: {logged_names(trainer)}); name the right one with "
            f"RunSummary({argument}=...)",
        )

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # from here a signal ends the fit with a summary saying so
            watch_setup_signals(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        restore_signals(trainer)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()
        self.first_loss = None
        ledger = getattr(pl_module, "privacy_ledger", None)
        if self.verbose and trainer.fast_dev_run and trainer.is_global_zero:
            print(
                "[pl-privfed] fast_dev_run: a smoke test of the run's code, not a run: no "
                "summary.json and no privacy claim",
                flush=True,
            )
        elif self.verbose and ledger is not None and trainer.is_global_zero:
            print(f"[pl-privfed] privacy: {privacy_plan_line(ledger.report())}")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        watch_signals(trainer)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        loss = finite_float(loss) if loss is not None else None
        if loss is not None:
            self.curves["train/loss"] = [(trainer.global_step, loss)]  # the last round's
            if self.first_loss is None:
                self.first_loss = (trainer.global_step, loss)
        stop_if_signalled(trainer)  # SIGTERM or Ctrl-C: stop after this round

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or getattr(pl_module, "resume_evaluation", False):
            return  # a resumed run's evaluation of its first round: not a scheduled one
        key = self.key_of(pl_module)
        if key not in trainer.callback_metrics:
            self._warn_missing(trainer, key, "validation accuracy", "accuracy_key")
        own_key = getattr(pl_module, "validation_accuracy_key", None)  # a grid logs no loss
        default_loss = self.val_loss_key == "val/loss" and own_key is not None
        if self.val_loss_key not in trainer.callback_metrics and not default_loss:
            self._warn_missing(trainer, self.val_loss_key, "validation loss", "val_loss_key")
        acc = finite_float(trainer.callback_metrics.get(key))
        loss = finite_float(trainer.callback_metrics.get(self.val_loss_key))
        if acc is None and loss is None:
            return
        for metric, value in (("val/acc", acc), ("val/loss", loss)):
            points = [p for p in self.curves.get(metric, []) if p[0] != trainer.global_step]
            self.curves[metric] = points + (
                [(trainer.global_step, value)] if value is not None else []
            )

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        key = self.key_of(pl_module, "loss")
        if (
            self.final_loss is None
            and trainer.global_step > 0
            and key not in trainer.callback_metrics
        ):
            self._warn_missing(trainer, key, "training loss", "loss_key")
        self._warn_if_diverged(trainer)
        self._write(trainer, pl_module, status="finished")

    def _warn_if_diverged(self, trainer: pl.Trainer) -> None:
        """Say it when the training loss ends above twice its first value: the run diverged
        (a too large step size; a noise the model cannot learn under), which a result line
        with a large ``train loss`` alone does not say."""
        if self.first_loss is None or self.final_loss is None:
            return
        first_round, first = self.first_loss
        if first > 0 and self.final_loss > 2 * first:
            rank_zero_warn(
                f"RunSummary: the training loss grew from {first:.4g} (round {first_round}) to "
                f"{self.final_loss:.4g} (round {trainer.global_step}): the run diverged; try a "
                "smaller step size (model.algorithm.init_args.step_size)",
                category=UserWarning,
            )

    @override
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        try:
            self._write_stopped(trainer, pl_module, exception)
        finally:
            restore_signals(trainer)  # Lightning runs no teardown hook after an exception

    def _write_stopped(self, trainer, pl_module, exception: BaseException) -> None:
        """The summary of a fit that failed, or was stopped by a signal."""
        name = stop_signal(trainer, exception)
        if name is None:
            status = f"failed: {type(exception).__name__}: {exception}"
            describe = getattr(exception, "record", None)  # a typed failure's own description
            self.error = describe() if callable(describe) else {"type": type(exception).__name__}
            self._write(trainer, pl_module, status=status)
            return
        if stopped_before_training(trainer):  # set-up, calibration, a checkpoint's restore
            self.interrupted = {
                "signal": name,
                "round": trainer.global_step,
                "checkpoint": None,
                "before_training": True,
            }
            self._write(trainer, pl_module, status=f"interrupted: {name} before training")
            return
        # stopped on SIGTERM or Ctrl-C after a complete round: the checkpoint callbacks save it
        # first, so that the summary names the file to resume from
        saved = [
            getattr(cb, "save_on_interrupt", lambda _: None)(trainer)
            for cb in trainer.checkpoint_callbacks
        ]
        checkpoint = next((path for path in saved if path), None)
        self.interrupted = {
            "signal": name,
            "round": trainer.global_step,
            "checkpoint": checkpoint,
            "before_training": False,
        }
        self._write(
            trainer, pl_module, status=f"interrupted: {name} after round {trainer.global_step}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"curves": {k: [list(p) for p in v] for k, v in self.curves.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        curves = state_dict.get("curves")
        if curves is None:  # written before the record kept curves: its best and last values
            curves = {"val/acc": [], "val/loss": []}
            for metric, key, round_key in (
                ("val/acc", "best_accuracy", "best_round"),
                ("val/acc", "final_accuracy", "evaluated_round"),
                ("val/loss", "final_val_loss", "evaluated_round"),
            ):
                if state_dict.get(key) is not None and state_dict.get(round_key) is not None:
                    curves[metric].append((state_dict[round_key], state_dict[key]))
        self.curves = {k: sorted({(int(r), float(v)) for r, v in pts}) for k, pts in curves.items()}

    def summary(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str) -> dict:
        """The dictionary written to ``summary.json``: the run record
        (:func:`pl_privfed.record.make_record`) from this run's curves and entries."""
        curves = {k: list(v) for k, v in self.curves.items()}
        if "train/loss" not in curves:  # a module that logs its loss but returns none
            loss = finite_float(trainer.callback_metrics.get(self.key_of(pl_module, "loss")))
            curves["train/loss"] = [(trainer.global_step, loss)] if loss is not None else []
        entries: dict[str, Any] = {
            "epochs": trainer.current_epoch,
            "wall_time_s": None if self._start is None else time.perf_counter() - self._start,
        }
        for role, name in (("accuracy", "val_accuracy_metric"), ("loss", "train_loss_metric")):
            if (key := self.key_of(pl_module, role)) != _KEYS[role][2]:
                entries[name] = key  # a module's own metric, e.g. a grid's best configuration's
        entries.update(stop_entries(trainer, unexplained=self.interrupted is None))
        if self.interrupted is not None:
            entries["interrupted"] = self.interrupted
        entries["error"] = self.error
        nested: dict[str, Any] = {}  # entries for the privacy report (e.g. an audit's)
        for source in (pl_module, *trainer.callbacks):  # the module's entries, then callbacks'
            method = getattr(source, "summary_entries", None)
            if callable(method) and source is not self:
                values = dict(method())
                extra = values.pop("privacy", None)
                if isinstance(extra, dict):
                    nested.update(extra)
                entries.update(values)
        _final_evaluations(entries, curves)
        report = getattr(pl_module, "privacy_report", None)
        privacy = report() if callable(report) else None
        entries.update(
            privacy_entries(
                None if privacy is None else {**privacy, **nested}, entries.get("privacy_budget")
            )
        )
        if privacy is None and nested:
            entries["privacy"] = nested
        describe = getattr(trainer.datamodule, "describe", None)
        if callable(describe):
            entries["data"] = describe()
        algorithm = getattr(pl_module, "algorithm", None)
        if algorithm is not None:
            entries["algorithm"] = repr(algorithm)
        for directory in (self._dir(trainer), local_log_dir(trainer)):
            config_path = Path(directory or ".") / "config.yaml"
            if config_path.is_file():
                entries["config"] = yaml.safe_load(config_path.read_text())
                break
        return make_record(
            status=status, rounds=trainer.global_step, curves=curves, entries=entries
        )

    def _dir(self, trainer: pl.Trainer) -> str | None:
        return self.dirpath or local_log_dir(trainer)

    @rank_zero_only
    def _write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str) -> None:
        directory = self._dir(trainer)
        if directory is None or trainer.fast_dev_run:
            return  # fast_dev_run: a smoke test of a batch or two, not a run to record
        os.makedirs(directory, exist_ok=True)
        data = self.summary(trainer, pl_module, status)
        self.path = Path(directory) / self.filename
        try:  # all or nothing: a full disk leaves the previous summary, never a 0-byte one
            write_atomically(self.path, json.dumps(data, indent=2, default=str))
        except OSError as exc:
            if status == "finished":
                raise
            # while a run fails or is interrupted: say so, without hiding why it stopped
            rank_zero_warn(f"RunSummary: could not write {self.path}: {exc}")
            return
        for logger in wandb_loggers(trainer):
            logger.experiment.summary.update(wandb_summary(data))
        log_artifact(trainer, self.path, "run-summary")
        if self.verbose and self.interrupted is not None and status.startswith("interrupted"):
            where = self.interrupted["checkpoint"]
            resume = f"; resume with --ckpt_path {where}" if where else ""
            print(f"[pl-privfed] {status}{resume}  (summary: {self.path})", flush=True)
        if self.verbose and status == "finished":
            parts = [f"rounds={data['rounds']}"]
            if data["final_val_accuracy"] is not None:
                parts.append(
                    f"val accuracy={data['final_val_accuracy']:.4f} "
                    f"(round {data['final_val_round']})"
                )
            if data["final_test_accuracy"] is not None:
                parts.append(f"test accuracy={data['final_test_accuracy']:.4f}")
            if data["final_train_loss"] is not None:
                parts.append(f"train loss={data['final_train_loss']:.4f}")
            if data["private"]:
                parts.append(epsilon_line(data))
            elif (data.get("privacy") or {}).get("audit"):
                parts.append(audit_line(data["privacy"]["audit"]))
            elif "privacy_budget" in data:
                parts.append("not private (no noise)")
            if data.get("stopped_by"):
                parts.append(f"stopped by {data['stopped_by']}: {data['stopped_reason']}")
            print(f"[pl-privfed] {', '.join(parts)}  (summary: {self.path})")


def _read(curves: dict[str, list[tuple[int, float]]], name: str) -> Any:
    """The record field ``name`` as read from ``curves`` (``None`` without its curve)."""
    field = next(f for f in FIELDS if f.name == name)
    return field.read(curves)[1]


def _final_evaluations(entries: dict[str, Any], curves: dict[str, list]) -> None:
    """Move the module's end-of-fit evaluations (``final_val_*``, ``final_test_*`` in its
    ``summary_entries()``) from ``entries`` into the run's curves, where the record reads them:
    the test set's, and a validation of the final model that the curves lack (a fit from a
    finished checkpoint), which then also counts for the best."""
    for split in ("val", "test"):
        values = {
            key: entries.pop(f"final_{split}_{key}", None) for key in ("accuracy", "loss", "round")
        }
        if values["round"] is None:
            continue
        for metric, key in (("acc", "accuracy"), ("loss", "loss")):
            if values[key] is None:
                continue
            points = [p for p in curves.get(f"{split}/{metric}", []) if p[0] != values["round"]]
            curves[f"{split}/{metric}"] = [*points, (int(values["round"]), float(values[key]))]


#: how the result line names an adversary (:data:`pl_privfed.privacy.plan.ADVERSARIES`)
ADVERSARY_NAMES = {"server": "the server", "models": "whoever sees the models"}


def privacy_plan_line(privacy: dict[str, Any]) -> str:
    """What a private run will certify, printed when it starts: the unit, the headline
    adversary and what it sees, the target, what is trusted, and what no ε charges."""
    adversary = privacy.get("adversary")
    target = privacy.get("target_epsilon")
    goal = (
        f"ε = {target:g}"
        if target is not None and privacy.get("calibration") == "target"
        else f"noise std {privacy.get('noise_std', 0.0):.4g}"
    )
    search = privacy.get("calibrated_for") or {}
    if target is not None and privacy.get("calibration") == "random_search":
        goal = (
            f"total ε = {target:g} of a random search over such runs "
            f"({search.get('search_distribution')}, mean {search.get('search_mean'):g} "
            "candidates)"
        )
    line = (
        f"{privacy.get('privacy_unit')}; {goal} at δ = {privacy.get('delta'):g} against "
        f"{ADVERSARY_NAMES.get(adversary, adversary)} ({privacy.get('adversary_sees')})"
    )
    others = [a for a in privacy.get("adversaries") or {} if a != adversary]
    if others:
        line += "; also reported against " + ", ".join(ADVERSARY_NAMES.get(a, a) for a in others)
    if privacy.get("trusted"):
        line += f"; trusted: {privacy['trusted']}"
    if privacy.get("not_charged"):
        line += f"; NOT CHARGED: {privacy['not_charged']}"
    return line


def epsilon_line(data: dict[str, Any]) -> str:
    """``epsilon=… against <adversary> (…) at delta=…``: the headline ε named by its adversary,
    the other adversaries' and the papers' convention beside it, and a warning where the run
    revealed something no ε charges (``privacy.not_charged``)."""
    privacy = data.get("privacy") or {}
    eps = f"epsilon={data['epsilon']:.3f}"
    adversary = privacy.get("adversary")
    if adversary:
        eps += f" against {ADVERSARY_NAMES.get(adversary, adversary)}"
        others = [
            f"{ADVERSARY_NAMES.get(name, name)}: {entry['epsilon']:.3f}"
            for name, entry in (privacy.get("adversaries") or {}).items()
            if name != adversary
        ]
        if others:
            eps += f" ({', '.join(others)})"
    if data.get("epsilon_paper_convention") is not None:
        eps += f", papers' convention {data['epsilon_paper_convention']:.3f}"
    eps = f"{eps} at delta={data['delta']:g}"
    if privacy.get("not_charged"):  # e.g. the abort pattern of distributed noise, allow_aborts
        eps += "; NOT certified against whoever sees the models (summary: privacy.not_charged)"
    if privacy.get("audit"):
        eps += f"; {audit_line(privacy['audit'])}"
    return eps


def audit_line(audit: dict[str, Any]) -> str:
    """``audit: epsilon estimate … (every round's model; certified … against …)``: a
    :class:`~pl_privfed.callbacks.PrivacyAudit`'s headline beside the certified ε of the same
    adversary, and a warning when it is above it."""
    if audit.get("level") == "record":
        what = (
            f"epsilon >= {audit['epsilon_lower_bound']:.3f} at {audit['confidence']:.0%} "
            f"(ceiling {audit['ceiling']:.2f})"
        )
    else:
        what = f"epsilon estimate {audit['epsilon_estimate']:.3f}"
    where = {"every_round": "every round's model", "final_model": "the final model"}.get(
        audit.get("threat_model", "every_round"), audit.get("threat_model")
    )
    planted = f"{audit.get('canaries_inserted')} of {audit.get('canaries')} canaries in"
    line = f"audit ({planted}): {what} from {where}"
    cert = audit.get("certified_epsilon")
    if cert is not None:
        adversary = audit.get("certified_adversary")
        line += f", certified {cert:.3f} against {ADVERSARY_NAMES.get(adversary, adversary)}"
    white = (audit.get("threat_models") or {}).get("white_box")
    if white is not None:
        low, high = white["epsilon_interval"]
        line += f"; white box {white['epsilon_estimate']:.3f} [{low:.2f}, {high:.2f}]"
    if audit.get("exceeds_certified"):
        line += " -- AUDIT EXCEEDS THE CERTIFIED EPSILON"
    if (audit.get("noise_test") or {}).get("flagged"):
        line += " -- THE REALIZED NOISE DOES NOT MATCH THE DECLARED MECHANISM"
    if audit.get("exceeds_bound"):
        line += " -- A CANARY'S CONTRIBUTION EXCEEDS THE DECLARED BOUND"
    return line


def _stop_reason(callback: Any) -> str | None:
    """Why ``callback`` stopped the run, or ``None``: the package's callbacks say it in
    ``stop_reason``; Lightning's ``EarlyStopping`` (either namespace) in
    ``stopping_reason_message``, set only when it stops the run (its ``stopped_epoch`` counts
    epochs, which mean nothing in rounds)."""
    reason = getattr(callback, "stop_reason", None)
    if reason:
        return str(reason)
    message = getattr(callback, "stopping_reason_message", None)
    return str(message).replace(" Signaling Trainer to stop.", "") if message else None


def stop_entries(trainer: pl.Trainer, unexplained: bool = True) -> dict[str, Any]:
    """``summary.json``'s ``stopped_by`` (the callbacks that stopped the run, by class name)
    and ``stopped_reason`` (their reasons, joined by ``"; "``; Lightning's ``EarlyStopping``
    gets ``"early stopping at round r: <its message>"``, r being the round the run ended at).

    With ``unexplained``, a run told to stop (``trainer.should_stop``) before its last round
    by something that gives no reason is named as such (``stopped_by: trainer.should_stop``);
    both entries are ``None`` for a run that ran all its rounds, even when a callback asked to
    stop at the last one (an ``EarlyStopping`` that fired then stopped nothing).
    """
    names, reasons = [], []
    planned = trainer_rounds.num_rounds(trainer)
    if planned and trainer.global_step >= planned:
        return {"stopped_by": None, "stopped_reason": None}
    for callback in trainer.callbacks:
        reason = _stop_reason(callback)
        if reason is None:
            continue
        names.append(type(callback).__name__)
        if not getattr(callback, "stop_reason", None):  # EarlyStopping: its epoch says nothing
            reason = f"early stopping at round {trainer.global_step}: {reason}"
        reasons.append(reason)
    stopped = trainer.should_stop and 0 < trainer.global_step < planned
    if unexplained and not names and stopped:
        names.append("trainer.should_stop")
        reasons.append(
            f"stopped at round {trainer.global_step} of {planned}: trainer.should_stop was set "
            "by a callback or the module, which gave no reason"
        )
    return {
        "stopped_by": ", ".join(names) or None,
        "stopped_reason": "; ".join(reasons) or None,
    }
