"""What the noise costs a round: no noise, local, central and distributed noise, same run.

The issue's target: a round with central or distributed noise costs at most 5 % more than the
same round without noise at 1,000 clients. This script trains the same federation (MNIST split
over ``--clients`` clients, ``--batch`` images each per round, multinomial logistic regression)
inside a real Trainer with evaluation and logging off, for each algorithm and each noise setting,
and reports the median time of the rounds after a warm-up. The settings are run in alternation,
``--repeats`` times, and the median over repeats is kept, so a slow spell of the machine falls
on every setting alike. The ratios printed are each setting's round time over the noiseless
round's, measured in the same run. Usage::

    PL_PRIVFED_DATA=../shared/data python benchmarks/noise_placement.py
    python benchmarks/noise_placement.py --clients 1000 --rounds 60 --repeats 3

What a noised round adds: the noise draw (one ``d``-vector per round for central noise and for
the clients' noise drawn as a sum, ``draws: aggregate``), the per-round accounting (one Opacus
step per adversary) and, for distributed noise, the sender count's check.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import pytorch_lightning as pl
import torch

from pl_privfed import FederatedModule
from pl_privfed.algorithms import AlphaNormEC, DistributedDPSGD
from pl_privfed.datamodules import DirichletPartitioner, MNISTDataModule
from pl_privfed.models import LogisticRegression
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise

ALGORITHMS = {
    "DP-SGD (clip)": lambda noise: DistributedDPSGD(1.0, Clip(1.0), noise=noise),
    "DP-α-NormEC": lambda noise: AlphaNormEC(0.1, beta=0.01, alpha=0.01, noise=noise),
}


def noise_settings(clients: int) -> dict[str, DPNoise | None]:
    base = {"epsilon": 8.0, "delta": 1e-5, "calibration": "target"}
    return {
        "none": None,
        "local": DPNoise(**base),
        "central": DPNoise(**base, placement="central"),
        "distributed": DPNoise(**base, placement="distributed", min_contributors=clients // 2),
    }


class RoundTimer(pl.Callback):
    """Wall time of every round (training step)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, *args) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter() - self._start)


def run(make, noise, data: MNISTDataModule, rounds: int, warmup: int) -> float:
    """Median milliseconds per round after ``warmup`` rounds."""
    pl.seed_everything(0, verbose=False)
    module = FederatedModule(LogisticRegression(784, 10), make(noise))
    timer = RoundTimer()
    trainer = pl.Trainer(
        max_steps=rounds, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        accelerator="cpu", devices=1, callbacks=[timer],
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    return 1e3 * statistics.median(timer.times[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    data = MNISTDataModule(
        num_clients=ns.clients, batch_size=ns.batch, seed=0,
        partitioner=DirichletPartitioner(concentration=0.5, seed=0),
    )  # fmt: skip
    print(f"# {platform.machine()} {platform.processor() or ''} torch {torch.__version__}, "
          f"{ns.threads} thread(s); {ns.clients} clients x {ns.batch} MNIST images, logistic "
          f"regression, median of {ns.rounds - ns.warmup} rounds, median of {ns.repeats} "
          "alternating repeats")  # fmt: skip
    print(f"{'algorithm':<16} {'noise':<12} {'ms/round':>9} {'vs none':>8}")
    for name, make in ALGORITHMS.items():
        settings = noise_settings(ns.clients)
        times: dict[str, list[float]] = {k: [] for k in settings}
        for _ in range(ns.repeats):
            for key, noise in settings.items():
                times[key].append(run(make, noise, data, ns.rounds, ns.warmup))
        base = statistics.median(times["none"])
        for key in settings:
            t = statistics.median(times[key])
            print(f"{name:<16} {key:<12} {t:9.2f} {t / base:8.3f}")


if __name__ == "__main__":
    main()
