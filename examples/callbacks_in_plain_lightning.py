"""pl-privfed's callbacks in an ordinary (non-federated) Lightning project.

A small classifier on scikit-learn's digits, trained with DP-SGD as Opacus runs it (Abadi et al.
2016): every example's gradient is clipped to norm C (``GradSampleModule`` computes per-example
gradients), the clipped gradients are summed and N(0, (σC)²) noise is added (``DPOptimizer``),
and every batch is a Poisson sample — each example joins independently with probability
q = 64/1400 (``DPDataLoader``). That is exactly the mechanism ``PrivacyBudget`` is told about
(noise multiplier σ, sampling rate q; one example moves the clipped sum by at most C), so the
ε it reports is certified for what runs. Run it with

    python examples/callbacks_in_plain_lightning.py [output_dir]

and look at ``<output_dir>/summary.json`` and ``<output_dir>/curves.png``.
"""

from __future__ import annotations

import sys

import pytorch_lightning as pl
import torch
from opacus import GradSampleModule
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pl_privfed.callbacks import (
    CommunicationCost,
    OperatorStatistics,
    PrivacyBudget,
    RunSummary,
    TrainingCurves,
)

CLIP, NOISE_MULTIPLIER, BATCH, TRAIN_SIZE = 4.0, 1.0, 64, 1400
SAMPLE_RATE = BATCH / TRAIN_SIZE  # q: each example joins a batch with this probability


class DigitsClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        # per-example gradients (grad_sample) for per-example clipping
        self.net = GradSampleModule(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)))
        self.noise = torch.Generator().manual_seed(0)  # explicit generator for the DP noise
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x / 16.0, dtype=torch.float32)
        y = torch.tensor(y)
        self.train_set = TensorDataset(x[:TRAIN_SIZE], y[:TRAIN_SIZE])
        self.val_set = TensorDataset(x[TRAIN_SIZE:], y[TRAIN_SIZE:])
        self._stats: dict[str, torch.Tensor] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        # Before DPOptimizer clips: how long the examples' gradients were, and how many it clips.
        norms = torch.stack(
            [p.grad_sample.flatten(1).norm(dim=1) for p in self.net.parameters()], dim=1
        ).norm(dim=1)
        self._stats = {
            "grad_norm": norms.mean(),
            "clip_fraction": (norms > CLIP).float().mean(),
            "norm_after": norms.clamp(max=CLIP).mean(),
        }

    def operator_statistics(self) -> dict[str, torch.Tensor]:
        """Per-example clipping statistics of the last step (read by OperatorStatistics)."""
        return self._stats

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        # clip every example's gradient to CLIP, sum, add N(0, (NOISE_MULTIPLIER · CLIP)²), and
        # divide by the expected batch size
        return DPOptimizer(
            torch.optim.SGD(self.net.parameters(), lr=0.5),
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=CLIP,
            expected_batch_size=BATCH,
            generator=self.noise,
        )

    def train_dataloader(self):
        # Poisson sampling: every example joins each batch independently with probability q
        return DPDataLoader(
            self.train_set, sample_rate=SAMPLE_RATE, generator=torch.Generator().manual_seed(1)
        )

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=500)


def main(output_dir: str = "logs/plain_callbacks") -> pl.Trainer:
    pl.seed_everything(0)
    callbacks = [
        # ε of the DP-SGD steps (Poisson rate q, noise multiplier σ; dp-accounting's PLD, the default);
        # training stops before the step that would spend more than ε = 3.
        PrivacyBudget(epsilon=3.0, delta=1e-5, noise_multiplier=NOISE_MULTIPLIER,
                      sample_rate=SAMPLE_RATE),
        # one dense gradient up and one model down per step, as in a 1-worker parameter server
        CommunicationCost(workers=1),
        # per-example gradient norms and how often clipping at C shortened them
        OperatorStatistics(),
        TrainingCurves(keys=["train_loss", "val_acc", "privacy/epsilon"],
                       dirpath=output_dir, filename="curves.png"),
        RunSummary(dirpath=output_dir, accuracy_key="val_acc", loss_key="train_loss"),
    ]  # fmt: skip
    trainer = pl.Trainer(max_epochs=30, logger=False, enable_checkpointing=False,
                         callbacks=callbacks, default_root_dir=output_dir)  # fmt: skip
    trainer.fit(DigitsClassifier())
    return trainer


if __name__ == "__main__":
    main(*sys.argv[1:])
