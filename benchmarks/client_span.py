"""Clients in the span of their data against clients in ``d`` dimensions, timed in one process on
a shipped config: the same run (or grid) with ``--model.client_span=on`` and ``off``
(:mod:`pl_privfed.layer_rules.span`), inside a real ``pl-privfed fit`` Trainer (loggers,
checkpoints and evaluation off). Prints the median round of each after the warm-up and
``span / dense``, the median over ``--trials`` back-to-back pairs, with the load average; the
final parameters of the two must agree (it says by how much). Usage::

    python benchmarks/client_span.py                    # DP-α-NormEC, 10,000 clients, one run
    python benchmarks/client_span.py --grid nine        # its frontier group: 3 γ × 3 seeds
    python benchmarks/client_span.py --config configs/private/mnist_dp_clip21.yaml

Each ``--config`` needs its data (``$PL_PRIVFED_DATA``, the MNIST copy).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
from engine_rounds import RoundTimer
from grid_paths import NINE, round_arguments

from pl_privfed.cli import PrivFedCLI


def run(args, span: str) -> tuple[float, torch.Tensor]:
    """Median milliseconds per round after the warm-up, and the final parameters."""
    folder = tempfile.mkdtemp(prefix="client_span_")
    grid = [f"--model.grid={args.grid}", f"--model.grid_dir={folder}/grid"] if args.grid else []
    cli = PrivFedCLI(
        args=["--config", args.config, *grid, f"--output_dir={folder}",
              f"--model.client_span={span}", f"--trainer.max_steps={args.rounds}",
              "--trainer.logger=false", "--trainer.enable_checkpointing=false",
              "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=0",
              "--trainer.limit_test_batches=0"],
        run=False,
    )  # fmt: skip
    timer = RoundTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steady = sorted(timer.times[args.warmup :])
    module = cli.model
    params = getattr(module, "grid_params", None)
    final = params.clone() if params is not None else module.layout.flatten(module.model)
    return 1e3 * steady[len(steady) // 2], final


def main() -> None:
    args = round_arguments(__doc__, None, "(span, dense) pairs")
    if args.grid == "nine":
        args.grid = json.dumps(NINE)
    points = len(json.loads(args.grid)) if args.grid else 1
    print(f"# {Path(args.config).name}, {points} configuration(s), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    pairs, gap = [], 0.0
    for _ in range(args.trials):
        (span, x_span), (dense, x_dense) = run(args, "on"), run(args, "off")
        pairs.append((span, dense))
        gap = max(gap, float((x_span - x_dense).abs().max()))
    span = statistics.median(p[0] for p in pairs)
    dense = statistics.median(p[1] for p in pairs)
    ratios = [s / d for s, d in pairs]
    print(f"span {span:.1f} ms/round, dense {dense:.1f} ms/round, span/dense "
          f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}], "
          f"largest parameter difference {gap:.2e} (load {os.getloadavg()[0]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
