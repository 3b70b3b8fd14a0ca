"""One W&B run per point of a batched group, as its separate run would have had.

A batched group (:mod:`pl_privfed.sweep.batch`) trains its points in one ``pl-privfed fit``
process, whose loggers see the grid, not the points. When the points' separate runs would log
to W&B (their config has a ``WandbLogger``), the group's process runs with W&B disabled and,
once it has ended, each point gets its own W&B run from the sweep's process: named and grouped
as its separate run (``--run_name``, the sweep's name as group), in its own run folder
(``<run dir>/wandb/``, offline unless logged in, as the separate run), with

* the point's resolved config (its ``summary.json``'s ``config``: its own values, no grid) as
  the run config;
* its curves (``curves.csv``: validation and test accuracy and loss, training loss, ε, ...)
  logged against ``round``, the step metric every run of the package plots against;
* its run record's W&B fields (:func:`pl_privfed.record.wandb_summary`: status, final and
  best accuracies, ε, rounds, wall time, ...) as the run summary, as a separate run's;
* its ``summary.json`` and ``curves.csv`` as the ``run-summary`` and ``training-curves``
  artifacts, as :class:`~pl_privfed.callbacks.RunSummary` and the curves callback log them.

What a batched point's W&B run does not have is what the grid does not record per
configuration: the per-round communication and operator statistics (``comm/*``,
``operators/*``), which a separate run logs every ``log_every_n_steps`` rounds.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pl_privfed.record import wandb_summary

__all__ = ["log_point_runs", "wandb_logger_args"]


def wandb_logger_args(config: Any) -> dict[str, Any] | None:
    """The ``init_args`` of the ``WandbLogger`` among a resolved config's
    ``trainer.logger`` entries, or ``None`` when the run logs nothing to W&B."""
    trainer = config.get("trainer") if isinstance(config, dict) else None
    loggers = trainer.get("logger") if isinstance(trainer, dict) else None
    for entry in loggers if isinstance(loggers, list) else [loggers]:
        if isinstance(entry, dict) and str(entry.get("class_path", "")).endswith("WandbLogger"):
            return dict(entry.get("init_args") or {})
    return None


def _curves(path: Path) -> dict[int, dict[str, float]]:
    """``curves.csv`` (``metric,round,value`` rows) as ``{round: {metric: value}}``."""
    rows: dict[int, dict[str, float]] = {}
    if not path.is_file():
        return rows
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            rows.setdefault(int(row["round"]), {})[row["metric"]] = float(row["value"])
    return dict(sorted(rows.items()))


def log_point_runs(
    summaries: Sequence[dict[str, Any]],
    run_dirs: Sequence[Path],
    names: Sequence[str],
    group: str,
    env: dict[str, str] | None = None,
) -> list[str]:
    """Write one W&B run per point (module docstring); return the runs' directories.

    Points whose config has no ``WandbLogger`` get none. ``env`` is the environment the points'
    separate runs would have had (default: this process's): its ``WANDB_MODE`` (the sweep runs
    W&B offline unless it is set) and ``WANDB_PROJECT`` decide where the runs go.
    """
    env = dict(os.environ if env is None else env)
    written: list[str] = []
    for summary, run_dir, name in zip(summaries, run_dirs, names, strict=True):
        config = summary.get("config")
        args = wandb_logger_args(config)
        if args is None:
            continue
        import wandb  # only when a point logs to W&B: it need not be installed otherwise

        run = wandb.init(
            project=args.get("project") or env.get("WANDB_PROJECT"),
            entity=args.get("entity"),
            tags=args.get("tags"),
            name=name,
            group=group,
            dir=str(run_dir),
            config=config,
            reinit="create_new",
            mode=env.get("WANDB_MODE", "offline"),
        )
        try:
            run.define_metric("round")
            run.define_metric("*", step_metric="round", step_sync=True)
            for round_, values in _curves(run_dir / "curves.csv").items():
                run.log({**values, "round": round_})
            run.summary.update(wandb_summary(summary))
            for file, kind in (("summary.json", "run-summary"), ("curves.csv", "training-curves")):
                if (run_dir / file).is_file():
                    artifact = wandb.Artifact(name=f"{kind}-{run.id}", type=kind)
                    artifact.add_file(str(run_dir / file))
                    run.log_artifact(artifact)
            written.append(str(Path(run.dir).parent))
        finally:
            run.finish(exit_code=0 if summary.get("status") == "finished" else 1)
    return written
