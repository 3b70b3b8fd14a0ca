"""Run a W&B grid sweep file locally, without a W&B server: ``pl-privfed sweep <sweep.yaml>``.

The sweep files in ``configs/sweeps/`` are ordinary W&B sweep configurations (``wandb sweep``
accepts them, and ``wandb agent`` runs their command lines unchanged). This runner expands their
grid and runs every point (or every batched group of points, below) sequentially as its own ``pl-privfed fit`` process with
``--output_dir <out>/runs/<index>-<hash>``, where the hash covers the point's parameters, the
sweep's command and every extra argument (``overrides``): a shortened smoke run
(``-- --trainer.max_steps=20``) gets its own directories and is never taken for a full run. A
point whose ``summary.json`` says ``finished`` is skipped (unless ``rerun``), so running a
half-finished grid again resumes it; failed runs are re-run. After each run
``<out>/results.csv`` is rewritten: one row per run (one per configuration of a run that trains a
grid, :mod:`pl_privfed.grid`), from each run's ``summary.json`` (the columns and the writer are
:mod:`pl_privfed.results`'s); ``pl-privfed report`` draws it.

A sweep holds a lock on its output folder (``<out>/.sweep.lock``, holding the process id): a
second sweep into the same folder is refused while the first runs; a lock left by a process that
is no longer running is detected and taken over. Each run's CSV logs and offline W&B files live in
its own directory, its W&B run is named after its parameters (``--run_name``) and grouped by the
sweep's name (``WANDB_RUN_GROUP``).

With ``batch`` (the default of ``pl-privfed sweep``; ``--separate`` runs one process per point)
the points that differ only in the algorithm's
arguments (the step size, the target ε ``model.algorithm.init_args.noise.epsilon``, ...) and in
their ``seed`` train as one grid federation per group (:mod:`pl_privfed.sweep.batch`), each point still with its own run
folder, ``summary.json`` and ``results.csv`` row. A SIGTERM or Ctrl-C stops a sweep as it
stops a fit (:mod:`~pl_privfed.sweep.signals`): one line, the running fit saves its round and
stops, exit status 143 or 130, and the sweep run again continues that fit from its checkpoint.
The package: :mod:`~pl_privfed.sweep.files` (the sweep file, its points, ``results.csv``, the
lock), :mod:`~pl_privfed.sweep.batch`, :mod:`~pl_privfed.sweep.runner` (the processes) and
:mod:`~pl_privfed.sweep.signals`.

Seeds: a parameter ``seed`` (``seed: {values: [0, 1, 2]}``) is passed as ``--seed``, which sets
every seed of a run (:class:`pl_privfed.cli.PrivFedCLI`); ``pl-privfed report`` and
``pl-privfed compare`` aggregate the seeds of a configuration (mean ± std, 95 % interval).
"""

from pl_privfed.sweep.files import (
    Sweep,
    SweepLockedError,
    failed_runs,
    grid,
    load_sweep,
    run_args,
    run_name,
    selected,
    sweep_lock,
    write_results,
)
from pl_privfed.sweep.runner import run_sweep
from pl_privfed.sweep.signals import SweepInterrupted

__all__ = [
    "Sweep",
    "SweepInterrupted",
    "SweepLockedError",
    "failed_runs",
    "grid",
    "load_sweep",
    "run_args",
    "run_name",
    "run_sweep",
    "selected",
    "sweep_lock",
    "write_results",
]
