"""A grid of configurations as one batched federation against the same configurations run one
by one: time per round, measured in the same process.

For ``K`` α-NormEC configurations (a γ × β grid) over ``n`` clients it times the median round
of one single-configuration run (the baseline: what each of ``K`` separate runs pays per round)
and of the grid run (``GridModule(grid=...)``: one oracle call for all ``K·n`` client
gradients, then each configuration's algorithm), inside a real Trainer with evaluation off,
and prints ``grid / (K × single)``: the fraction of the separate runs' time that the grid
takes (the median over ``--trials`` back-to-back pairs, since a shared machine's speed drifts
between runs). Usage::

    python benchmarks/grid_rounds.py                                   # digits MLP, CPU
    python benchmarks/grid_rounds.py --workload cifar10 --configs 1 4 16 48 --cuda-graphs

The ``cifar10`` workload (ResNet-20, paper split, 32 per client) needs the CIFAR-10 copy
(``$PL_PRIVFED_DATA``, see docs/paper_experiments.md).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile

import pytorch_lightning as pl
import torch
from engine_rounds import RoundTimer

from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.datamodules import CIFAR10DataModule, DigitsDataModule, IIDPartitioner
from pl_privfed.grid import GridModule
from pl_privfed.models import MLP, resnet20

STEP_SIZES = [0.001, 0.01, 0.1, 1.0]
BETAS = [0.01, 0.1, 1.0, 10.0]
ALPHAS = [0.01, 0.1, 1.0]


def grid_of(size: int) -> dict[str, list] | None:
    """The first ``size`` points of paper 002's (α, β, γ) grid, as a ``grid`` argument."""
    if size == 1:
        return None
    points = list(itertools.product(ALPHAS, BETAS, STEP_SIZES))[:size]
    if len(points) < size:
        raise ValueError(f"--configs may not exceed {len(ALPHAS) * len(BETAS) * len(STEP_SIZES)}")
    # a grid is a product: take the smallest product of the axes that holds `size` points
    alphas = sorted({a for a, _, _ in points})
    betas = sorted({b for _, b, _ in points})
    steps = sorted({g for _, _, g in points})
    grid = {"alpha": alphas, "beta": betas, "step_size": steps}
    if len(alphas) * len(betas) * len(steps) != size:
        raise ValueError(f"--configs {size} is not a product of the grid's axes (use 4, 16, 48)")
    return grid


def run(args, clients: int, size: int) -> float:
    """Median milliseconds per round after the warm-up."""
    pl.seed_everything(42, verbose=False)
    if args.workload == "cifar10":
        dm = CIFAR10DataModule(split="paper", num_clients=clients, batch_size=32, seed=42,
                               partitioner=IIDPartitioner(seed=42))  # fmt: skip
        model = resnet20()
    else:
        dm = DigitsDataModule(num_clients=clients, batch_size=32,
                              partitioner=IIDPartitioner(seed=0))  # fmt: skip
        model = MLP(64, [32], 10)
    module = GridModule(model, AlphaNormEC(0.1, beta=0.1, alpha=0.01),
                             grad_backend=args.backend, cuda_graphs=args.cuda_graphs,
                             grid=grid_of(size))  # fmt: skip
    timer = RoundTimer()
    trainer = pl.Trainer(
        default_root_dir=tempfile.mkdtemp(prefix="grid_rounds_"),  # the grid's results.csv
        accelerator=args.accelerator, devices=1, max_steps=args.rounds, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, benchmark=True, callbacks=[timer],
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    steady = sorted(timer.times[args.warmup :])
    return 1e3 * steady[len(steady) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["digits", "cifar10"], default="digits")
    parser.add_argument("--clients", type=int, nargs="+", default=[10])
    parser.add_argument("--configs", type=int, nargs="+", default=[4, 16, 48])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--trials", type=int, default=3, help="(single, grid) pairs per cell")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--accelerator", default="gpu" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if args.rounds <= args.warmup:
        raise ValueError(f"--rounds must exceed --warmup, got {args.rounds} <= {args.warmup}")
    name = torch.cuda.get_device_name() if args.accelerator == "gpu" else "cpu"
    print(f"# {name}, torch {torch.__version__}, {args.workload}, backend {args.backend}, "
          f"CUDA graphs {args.cuda_graphs}, TF32 off")  # fmt: skip
    print(f"# median over {args.trials} trials, each trial timing the single run right before the "
          "grid run (ratio range over the trials in brackets)")  # fmt: skip
    print(f"{'clients':>7} {'K':>4} {'single ms':>10} {'grid ms':>10} {'grid/(K·single)':>16}")
    for n in args.clients:
        for size in args.configs:
            pairs = [(run(args, n, 1), run(args, n, size)) for _ in range(args.trials)]
            single = statistics.median(p[0] for p in pairs)
            grid = statistics.median(p[1] for p in pairs)
            ratios = [g / (size * s) for s, g in pairs]
            print(f"{n:>7} {size:>4} {single:>10.2f} {grid:>10.2f} "
                  f"{statistics.median(ratios):>7.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")  # fmt: skip


if __name__ == "__main__":
    main()
