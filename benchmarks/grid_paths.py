"""A grid's two ways of computing its gradients, timed in one process on a shipped config: one
stacked oracle call with per-client parameters ``[K·c, d]`` (the configurations' data along the
client axis) against one call per configuration at its parameters ``[d]`` shared by its clients
(on its seed's data, fetched once per seed), which copies neither.

:class:`~pl_privfed.grid.GridModule` takes the stacked call while its parameter copy is at most
``pl_privfed.grid.module.STACKED_PARAMETER_BYTES`` (8 MiB, on the CPU); this benchmark forces each path in
turn (the constant set to infinity, then 0) on the same grid, inside a real ``pl-privfed fit``
Trainer (loggers, checkpoints and evaluation off), and prints the median round of each after the
warm-up and ``per-configuration / stacked``, the median over ``--trials`` back-to-back pairs
(a shared machine's speed drifts between runs), with the load average. Usage::

    python benchmarks/grid_paths.py                      # DP-α-NormEC, 10,000 clients, 3 γ × 3 seeds
    python benchmarks/grid_paths.py --config configs/private/mnist_dp_fedavg_clip.yaml \\
        --grid '[{"--seed": 0, "step_size": 0.5}, {"--seed": 1, "step_size": 0.5}]'

Each ``--config`` needs its data (``$PL_PRIVFED_DATA``, the MNIST copy).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from pathlib import Path

import torch
from engine_rounds import RoundTimer

from pl_privfed.cli import PrivFedCLI
from pl_privfed.grid import module as grid_module

REPO = Path(__file__).resolve().parents[1]
NINE = [{"--seed": s, "step_size": g} for s in (0, 1, 2) for g in (0.03, 0.1, 0.3)]


def round_ms(args, stacked: bool) -> float:
    """Median milliseconds per round after the warm-up, with the path forced."""
    grid_module.STACKED_PARAMETER_BYTES = math.inf if stacked else 0
    folder = tempfile.mkdtemp(prefix="grid_paths_")
    cli = PrivFedCLI(
        args=["--config", args.config, f"--model.grid={args.grid}", f"--output_dir={folder}",
              f"--model.grid_dir={folder}/grid", f"--trainer.max_steps={args.rounds}",
              "--trainer.logger=false", "--trainer.enable_checkpointing=false",
              "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=0",
              "--trainer.limit_test_batches=0"],
        run=False,
    )  # fmt: skip
    timer = RoundTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steady = sorted(timer.times[args.warmup :])
    return 1e3 * steady[len(steady) // 2]


def round_arguments(doc: str, grid: str | None, pairs: str) -> argparse.Namespace:
    """The arguments of a benchmark that times rounds of a shipped config (and a grid)
    back to back: ``--config``, ``--grid`` (default ``grid``), ``--rounds``, ``--warmup``,
    ``--trials`` (``pairs``: what a trial times); ``--rounds`` must exceed ``--warmup``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--config", default=str(REPO / "configs/private/mnist_dp_alpha_normec.yaml")
    )
    parser.add_argument("--grid", default=grid, help="a --model.grid list of points")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--trials", type=int, default=2, help=pairs)
    args = parser.parse_args()
    if args.rounds <= args.warmup:
        raise ValueError(f"--rounds must exceed --warmup, got {args.rounds} <= {args.warmup}")
    return args


def main() -> None:
    args = round_arguments(__doc__, json.dumps(NINE), "(stacked, per-configuration) pairs")
    points = len(json.loads(args.grid))
    print(f"# {Path(args.config).name}, {points} configurations, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    pairs = [(round_ms(args, True), round_ms(args, False)) for _ in range(args.trials)]
    stacked = statistics.median(p[0] for p in pairs)
    alone = statistics.median(p[1] for p in pairs)
    ratios = [a / s for s, a in pairs]
    print(f"stacked {stacked:.1f} ms/round, per-configuration {alone:.1f} ms/round, "
          f"per-configuration/stacked {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}, {max(ratios):.3f}] (load {os.getloadavg()[0]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
