"""Running a sweep's points: each as its own ``pl-privfed fit`` process, or, with ``batch``, the
points that can share a federation as one (:mod:`pl_privfed.sweep.batch`); stopped by a signal
as a fit is (:mod:`pl_privfed.sweep.signals`)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pl_privfed.results import column_names, render_value, write_atomically
from pl_privfed.sweep.batch import Group, group_args, groups, split, write_point_records
from pl_privfed.sweep.files import (
    Sweep,
    grid,
    identity,
    load_sweep,
    point_dir,
    read_summary,
    run_args,
    run_name,
    selected,
    sweep_lock,
    write_results,
)
from pl_privfed.sweep.signals import SignalGuard
from pl_privfed.sweep.wandb_runs import log_point_runs

__all__ = ["run_sweep"]


def run_sweep(
    path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    overrides: Sequence[str] = (),
    dry_run: bool = False,
    rerun: bool = False,
    python: str = sys.executable,
    batch: bool = False,
    where: Sequence[str] = (),
    check: Callable[[list[tuple[str, list[str]]]], None] | None = None,
) -> Path:
    """Run every point of a grid sweep file sequentially; return the path of ``results.csv``.

    Each point runs as ``[python, "-m", "pl_privfed.cli", *run_args(...), *overrides]`` in the
    current directory, with ``WANDB_RUN_GROUP=<sweep name>`` (W&B groups the runs of a sweep),
    ``WANDB_PROJECT=<project>`` when the sweep file names one, ``WANDB_MODE=offline`` unless
    ``WANDB_MODE`` is set, ``--run_name`` made of the swept parameters and ``--run_group`` the
    sweep's name; its output goes to
    ``<run dir>/output.log``. Points whose ``summary.json`` says ``finished`` are skipped
    (``rerun`` runs them again); failed ones are run again. A failing run does not stop the
    grid: its ``summary.json`` records the failure (see :func:`failed_runs`). One progress line
    is printed per point. The output folder is locked while the sweep runs
    (:func:`sweep_lock`).

    With ``batch``, the points left to run that differ only in the algorithm's arguments (the
    step size, the target ε, ...) and in their seed run as one process each group
    (:mod:`pl_privfed.sweep.batch`, in ``<out>/groups/``), and each point still gets its own
    run folder, ``summary.json`` and ``results.csv`` row, as its separate run would.

    Args:
        path: the sweep YAML.
        out_dir: output directory (default ``sweeps/<sweep name>``); runs go to ``runs/``.
        overrides: extra arguments appended to every run (``--trainer.max_steps=4``); they are
            part of each run's identity (its directory).
        dry_run: print the commands of the points that would run, run nothing, write nothing.
        rerun: run the points that finished before as well.
        python: the interpreter that runs the points.
        batch: train the points that can share a federation as one grid per group.
        where: conditions ``KEY=V1,V2`` that select the points to run (:func:`selected`:
            ``noise.epsilon=1.0,8.0``, ``seed=0``); the others are left as they are, and
            ``results.csv`` still lists every point that has a ``summary.json``.
        check: called once, before anything runs, with ``(label, arguments)`` of points that
            together take every value of every parameter (:meth:`_Runner.samples`); it raises
            for arguments a run would refuse (``pl-privfed sweep`` parses them as ``fit``
            does, so that a misspelt key is refused in one line, not once per process).

    Raises:
        SweepLockedError: when another sweep runs in ``out_dir``.
        ValueError: when a condition of ``where`` names no parameter or value of the sweep.
        SweepInterrupted: when a SIGTERM or Ctrl-C stopped the sweep
            (:mod:`~pl_privfed.sweep.signals`: its running fit saved its round and stopped,
            ``results.csv`` is written and the lock released; run again, it resumes).
    """
    sweep = load_sweep(path)
    out = Path(out_dir) if out_dir is not None else Path("sweeps") / sweep.name
    runner = _Runner(sweep, out, overrides, dry_run, python, selected(sweep, where))
    if dry_run:
        if check is not None:
            check(runner.samples())
        runner.run(rerun, batch)
        return out / "results.csv"
    with runner.guard:  # a signal from here on: one line, and the sweep stops
        if check is not None:
            check(runner.samples())
        runner.guard.stop_if_signalled()
        with sweep_lock(out):
            try:
                runner.run(rerun, batch)
            finally:
                write_results(sweep, out, overrides)
            runner.guard.stop_if_signalled()  # the last process stopped on it: not finished
    return out / "results.csv"


class _Runner:
    """The processes of one sweep: its points one by one, or its groups as grids."""

    def __init__(
        self,
        sweep: Sweep,
        out: Path,
        overrides: Sequence[str],
        dry_run: bool,
        python: str,
        chosen: Sequence[int],
    ) -> None:
        self.sweep, self.out, self.overrides = sweep, out, list(overrides)
        self.dry_run, self.python = dry_run, python
        self.env = dict(os.environ)
        self.env["WANDB_RUN_GROUP"] = sweep.name
        if sweep.project:
            self.env.setdefault("WANDB_PROJECT", sweep.project)
        self.env.setdefault("WANDB_MODE", "offline")
        self.names = column_names(list(sweep.parameters))
        self.shown = sweep.swept or list(sweep.parameters)
        self.points = grid(sweep)
        self.width = len(str(len(self.points)))
        self.identity = identity(sweep, overrides)
        self.chosen = list(chosen)
        self.guard = SignalGuard()

    def samples(self) -> list[tuple[str, list[str]]]:
        """``(label, fit arguments)`` of as few of the chosen points as take every value of
        every parameter among them (as many as the longest list of values): what the sweep's
        command refuses for one value (a misspelt key, a wrong type) it refuses for these."""
        values: dict[str, list[str]] = {}
        for index in self.chosen:
            for name, value in self.points[index].items():
                rendered = values.setdefault(name, [])
                if render_value(value) not in rendered:
                    rendered.append(render_value(value))
        picked: list[int] = []
        for k in range(max((len(v) for v in values.values()), default=0)):
            want = {name: vs[k % len(vs)] for name, vs in values.items()}
            index = next(
                (
                    i
                    for i in self.chosen
                    if all(render_value(self.points[i][n]) == v for n, v in want.items())
                ),
                None,
            )
            if index is not None and index not in picked:
                picked.append(index)
        out = []
        for index in picked:
            params = self.points[index]
            args = run_args(self.sweep, params, self.run_dir(index), None, self.sweep.name)
            out.append((self.label(index), [*args, *self.overrides]))
        return out

    def run_dir(self, index: int) -> Path:
        return point_dir(self.out, index, self.points[index], self.identity)

    def label(self, index: int) -> str:
        params = self.points[index]
        text = f"[{index + 1:>{self.width}}/{len(self.points)}] {self.run_dir(index).name}"
        return (
            text + f" {' '.join(f'{self.names[k]}={render_value(params[k])}' for k in self.shown)}"
        )

    def run(self, rerun: bool, batch: bool) -> None:
        todo: dict[int, dict] = {}
        if len(self.chosen) < len(self.points):
            print(f"--where: {len(self.chosen)} of the {len(self.points)} points", flush=True)
        for index in self.chosen:
            params = self.points[index]
            summary = read_summary(self.run_dir(index))
            if summary is not None and summary.get("status") == "finished" and not rerun:
                print(f"{self.label(index)}: finished before, skipped", flush=True)
                continue
            if not batch:
                self.run_point(index)
                continue
            todo[index] = params
        for group in groups(todo) if batch else []:
            if len(group.indices) > 1 and self.run_group(group):
                continue
            for index in group.indices:
                self.run_point(index)

    def run_point(self, index: int) -> None:
        """Point ``index`` as its own ``pl-privfed fit`` process."""
        params, run_dir = self.points[index], self.run_dir(index)
        name = run_name(params, self.shown)
        cmd = [self.python, "-m", "pl_privfed.cli"]
        cmd += [*run_args(self.sweep, params, run_dir, name, self.sweep.name), *self.overrides]
        resume = interrupted_checkpoint(run_dir)
        cmd += [f"--ckpt_path={resume}"] if resume is not None else []
        if self.dry_run:
            print(shlex.join(cmd), flush=True)
            return
        self.guard.stop_if_signalled()
        print(f"{self.label(index)}: {_resuming(resume)}", end="", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").unlink(missing_ok=True)  # a stale result must not linger
        (run_dir / "command.txt").write_text(shlex.join(cmd) + "\n")
        start = time.perf_counter()
        with (run_dir / "output.log").open("a" if resume else "w") as log:
            code = self.guard.call(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
        summary = read_summary(run_dir)
        if summary is None and self.guard.received is not None:  # stopped while it started
            summary = {"status": f"interrupted: {self.guard.name} before training"}
            write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2))
        elif summary is None:  # it failed before training started (e.g. a configuration error)
            lines = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()
            summary = {"status": f"failed: exit code {code}: {lines[-1] if lines else ''}"}
            write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2))
        elif code != 0 and summary.get("status") == "finished":
            summary["status"] = f"failed: exit code {code} after the fit finished"
            write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
        print(_outcome(summary, seconds, run_dir / "output.log"), flush=True)
        write_results(self.sweep, self.out, self.overrides)

    def run_group(self, group: Group) -> bool:
        """The points of ``group`` as one grid (:mod:`~pl_privfed.sweep.batch`); ``False``
        when its process failed before training (its points are then run one by one)."""
        folder = group.folder(self.out, self.identity)
        first = group.points[0]
        fixed = [k for k in self.shown if k not in group.varying]
        name = f"{run_name(first, fixed)} ({len(group.points)} points)"
        cmd = [self.python, "-m", "pl_privfed.cli"]
        cmd += [*run_args(self.sweep, first, folder, name, self.sweep.name)]
        cmd += [*group_args(group, folder), *self.overrides]
        resume = interrupted_checkpoint(folder)
        cmd += [f"--ckpt_path={resume}"] if resume is not None else []
        if self.dry_run:
            print(shlex.join(cmd), flush=True)
            return True
        self.guard.stop_if_signalled()
        numbers = ", ".join(str(i + 1) for i in group.indices)
        print(f"[batch of {len(group.indices)}: points {numbers}] {folder.name}: ", end="")
        print(_resuming(resume) or "running", flush=True)
        run_dirs = [self.run_dir(i) for i in group.indices]
        names = [run_name(self.points[i], self.shown) for i in group.indices]
        for run_dir in run_dirs:
            (run_dir / "summary.json").unlink(missing_ok=True)
        if resume is None:
            shutil.rmtree(folder, ignore_errors=True)  # an earlier try's results must not linger
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "command.txt").write_text(shlex.join(cmd) + "\n")
        start = time.perf_counter()
        # the group's own W&B run would hold the grid, not a point: each point gets its own
        # (log_point_runs, below), so the group's process logs nothing to W&B
        env = {**self.env, "WANDB_MODE": "disabled"}
        with (folder / "output.log").open("a" if resume else "w") as log:
            code = self.guard.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
        output = (folder / "output.log").read_text(errors="replace")
        parts = split(group, read_summary(folder)) if code != 0 else None
        if parts is not None:  # its configurations' client state would not fit together
            print(f"  too many configurations for memory: {len(parts)} groups of at most "
                  f"{len(parts[0].indices)}", flush=True)  # fmt: skip
            for part in parts:
                if len(part.indices) < 2 or not self.run_group(part):
                    for index in part.indices:
                        self.run_point(index)
            return True
        summaries = write_point_records(group, folder, run_dirs, names, code, seconds)
        if summaries is None and self.guard.received is not None:  # stopped while it started
            return True  # its points are left to the next run (no summary: not run)
        if summaries is None:
            lines = output.strip().splitlines()
            print(f"  the group failed before training ({lines[-1] if lines else code}): "
                  "running its points one by one", flush=True)  # fmt: skip
            return False
        log_point_runs(summaries, run_dirs, names, self.sweep.name, self.env)
        for index, summary in zip(group.indices, summaries, strict=True):
            print(f"{self.label(index)}: ", end="")
            print(_outcome(summary, seconds, folder / "output.log", batched=True), flush=True)
        write_results(self.sweep, self.out, self.overrides)
        return True


def interrupted_checkpoint(folder: Path) -> str | None:
    """The checkpoint to continue from when the run in ``folder`` was stopped by a signal
    after a round (its ``summary.json``'s ``interrupted.checkpoint``, a file that exists)."""
    summary = read_summary(folder) or {}
    stopped = summary.get("interrupted")
    if not str(summary.get("status", "")).startswith("interrupted") or not isinstance(
        stopped, dict
    ):
        return None
    checkpoint = stopped.get("checkpoint")
    return str(checkpoint) if checkpoint and Path(checkpoint).is_file() else None


def _resuming(checkpoint: str | None) -> str:
    return f"resuming from {checkpoint}: " if checkpoint else ""


def _outcome(summary: dict, seconds: float, log: Path, batched: bool = False) -> str:
    """A point's progress line: how it ended."""
    if summary.get("status") == "finished":
        acc = summary.get("final_val_accuracy")
        acc_text = f"{acc:.4f}" if isinstance(acc, int | float) else "n/a"
        where = " (its group's)" if batched else ""
        return f"finished in {seconds:.1f} s{where}, final val accuracy {acc_text}"
    status = str(summary.get("status")).strip().splitlines() or ["failed"]
    return f"{status[0]} (see {log})"
