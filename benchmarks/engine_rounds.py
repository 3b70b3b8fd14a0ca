"""Time per round of the whole engine (data, augmentation, gradients, algorithm, Lightning).

Runs α-NormEC on CIFAR-10 / ResNet-20 (the paper 002 workload, paper split, IID, 32 per client)
inside a real Trainer with evaluation off, and reports the median time of the rounds after a
warm-up (which holds CUDA-graph capture and cuDNN autotuning), for each number of clients and
for the eager and CUDA-graph engines. Beside it, the gradient oracle alone on the same shapes
(from ``round_time.py``) tells how much the rest of the round costs. Usage::

    python benchmarks/engine_rounds.py --clients 10 20 100 --rounds 400

Needs the CIFAR-10 copy (``$PL_PRIVFED_DATA``, see docs/paper_experiments.md).
"""

from __future__ import annotations

import argparse
import time

import pytorch_lightning as pl
import torch

from pl_privfed import FederatedModule
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.datamodules import CIFAR10DataModule, IIDPartitioner
from pl_privfed.models import resnet20


class RoundTimer(pl.Callback):
    """Wall time of every round, synchronised with the device."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def _sync(self, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, *args) -> None:
        self._sync(pl_module)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self._sync(pl_module)
        self.times.append(time.perf_counter() - self._start)


def run(clients: int, rounds: int, warmup: int, graphs: bool, accelerator: str) -> float:
    """Median milliseconds per round after ``warmup`` rounds."""
    pl.seed_everything(42, verbose=False)
    dm = CIFAR10DataModule(
        split="paper", num_clients=clients, batch_size=32, seed=42,
        partitioner=IIDPartitioner(seed=42),
    )  # fmt: skip
    module = FederatedModule(
        resnet20(), AlphaNormEC(0.1, beta=0.1, alpha=0.01), grad_backend="vmap",
        cuda_graphs=graphs,
    )  # fmt: skip
    timer = RoundTimer()
    trainer = pl.Trainer(
        accelerator=accelerator, devices=1, max_steps=rounds, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, benchmark=True, callbacks=[timer],
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    steady = sorted(timer.times[warmup:])
    return 1e3 * steady[len(steady) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 20, 100])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--accelerator", default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--graph-only", action="store_true", help="time only the CUDA-graph engine")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if args.rounds <= args.warmup:
        raise ValueError(f"--rounds must exceed --warmup, got {args.rounds} <= {args.warmup}")
    name = torch.cuda.get_device_name() if args.accelerator == "gpu" else "cpu"
    print(f"# {name}, torch {torch.__version__}, TF32 off, cudnn.benchmark on")
    print(f"{'clients':>7} {'eager ms/round':>15} {'graph ms/round':>15} {'eager/graph':>11}")
    for n in args.clients:
        eager = float("nan")
        if not args.graph_only:
            eager = run(n, args.rounds, args.warmup, False, args.accelerator)
        graph = run(n, args.rounds, args.warmup, True, args.accelerator)
        print(f"{n:>7} {eager:>15.2f} {graph:>15.2f} {eager / graph:>11.2f}")


if __name__ == "__main__":
    main()
