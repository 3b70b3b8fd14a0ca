"""What the noise and the audit cost: no noise, local, central and distributed noise, and the
same runs with a PrivacyAudit, timed in one run.

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
step per adversary) and, for distributed noise, the sender count's check. The issue's targets:
central or distributed noise at most 5 % over the noiseless round at 1,000 clients; a
``PrivacyAudit`` (100 canary clients) at most 10 % over the same run without it — both the
median round and the whole ``fit`` (the audit's statistics are computed at its end) are shown.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time

import pytorch_lightning as pl
import torch
from bench_artefact import Artefact, add_json_argument  # benchmarks/, the script's own folder

from pl_privfed import FederatedModule
from pl_privfed.algorithms import AlphaNormEC, DistributedDPSGD
from pl_privfed.callbacks import PrivacyAudit
from pl_privfed.datamodules import DirichletPartitioner, MNISTDataModule
from pl_privfed.models import LogisticRegression
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise

ALGORITHMS = {
    "DP-SGD (clip)": lambda noise: DistributedDPSGD(1.0, Clip(1.0), noise=noise),
    "DP-α-NormEC": lambda noise: AlphaNormEC(0.1, beta=0.01, alpha=0.01, noise=noise),
}


def noise_settings(clients: int) -> dict[str, tuple[DPNoise | None, bool]]:
    """Setting name → (noise, with a PrivacyAudit)."""
    base = {"epsilon": 8.0, "delta": 1e-5, "calibration": "target"}
    central = DPNoise(**base, placement="central")
    distributed = DPNoise(**base, placement="distributed", min_contributors=clients // 2)
    return {
        "none": (None, False),
        "local": (DPNoise(**base), False),
        "central": (central, False),
        "distributed": (distributed, False),
        "central+audit": (central, True),
        "distributed+audit": (distributed, True),
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


def run(make, noise, audit: bool, data, rounds: int, warmup: int) -> tuple[float, float]:
    """Median milliseconds per round after ``warmup`` rounds, and the whole fit's seconds."""
    pl.seed_everything(0, verbose=False)
    module = FederatedModule(LogisticRegression(784, 10), make(noise))
    timer = RoundTimer()
    callbacks = [timer, *([PrivacyAudit()] if audit else [])]
    trainer = pl.Trainer(
        max_steps=rounds, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        accelerator="cpu", devices=1, callbacks=callbacks,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    return 1e3 * statistics.median(timer.times[warmup:]), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    add_json_argument(parser)
    ns = parser.parse_args()
    record = Artefact("noise_placement")
    table = record.table(
        "rounds",
        [
            "algorithm",
            "noise",
            "ms/round",
            "vs none",
            "fit s",
            "audit: round vs without",
            "audit: fit vs without",
        ],
    )
    torch.set_num_threads(ns.threads)
    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    data = MNISTDataModule(
        num_clients=ns.clients, batch_size=ns.batch, seed=0,
        partitioner=DirichletPartitioner(concentration=0.5, seed=0),
    )  # fmt: skip
    print(f"# {platform.machine()} {platform.processor() or ''} torch {torch.__version__}, "
          f"{ns.threads} thread(s); {ns.clients} clients x {ns.batch} MNIST images, logistic "
          f"regression, median of {ns.rounds - ns.warmup} rounds, median of {ns.repeats} "
          "alternating repeats")  # fmt: skip
    print(f"{'algorithm':<16} {'noise':<18} {'ms/round':>9} {'vs none':>8} {'fit s':>7} "
          f"{'audit: round, fit vs without':>29}")  # fmt: skip
    for name, make in ALGORITHMS.items():
        settings = noise_settings(ns.clients)
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in settings}
        for _ in range(ns.repeats):
            for key, (noise, audit) in settings.items():
                times[key].append(run(make, noise, audit, data, ns.rounds, ns.warmup))
        med = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
               for k, v in times.items()}  # fmt: skip
        base = med["none"][0]
        for key, (round_ms, fit_s) in med.items():
            extra, audit = "", [None, None]
            if key.endswith("+audit"):
                plain = med[key.removesuffix("+audit")]
                extra = f"{round_ms / plain[0]:.3f}, {fit_s / plain[1]:.3f}"
                audit = [round_ms / plain[0], fit_s / plain[1]]
            table.append([name, key, round_ms, round_ms / base, fit_s, *audit])
            print(f"{name:<16} {key:<18} {round_ms:9.2f} {round_ms / base:8.3f} {fit_s:7.2f} "
                  f"{extra:>29}")  # fmt: skip
    noised = [r[3] for r in table if r[1] in ("central", "distributed")]
    audited = [x for r in table for x in r[5:] if x is not None]
    if noised:
        record.note(
            "rounds", "central or distributed noise, the most over none (target 1.05)", max(noised)
        )
    if audited:
        record.note("rounds", "the audit, the most over the same run (target 1.10)", max(audited))
    record.write(ns.json)


if __name__ == "__main__":
    main()
