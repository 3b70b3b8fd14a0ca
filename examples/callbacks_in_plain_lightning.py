"""pl-privfed's callbacks in an ordinary (non-federated) Lightning project.

A small classifier on scikit-learn's digits, trained with a hand-rolled DP-SGD step
(clip the minibatch gradient to norm C, add N(0, (σC)²) noise) so that there is something for
the privacy and operator callbacks to report. Run it with

    python examples/callbacks_in_plain_lightning.py [output_dir]

and look at ``<output_dir>/summary.json`` and ``<output_dir>/curves.png``.
"""

from __future__ import annotations

import sys

import pytorch_lightning as pl
import torch
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

CLIP, NOISE_MULTIPLIER, BATCH = 1.0, 1.0, 64


class DigitsClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.noise = torch.Generator().manual_seed(0)  # explicit generator for the DP noise
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x / 16.0, dtype=torch.float32)
        y = torch.tensor(y)
        self.train_set = TensorDataset(x[:1400], y[:1400])
        self.val_set = TensorDataset(x[1400:], y[1400:])

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        # Runs after OperatorStatistics recorded the raw gradient norm (callbacks run first).
        grads = [p.grad for p in self.parameters()]
        torch.nn.utils.clip_grad_norm_(self.parameters(), CLIP)
        for g in grads:
            g.add_(torch.randn(g.shape, generator=self.noise) * NOISE_MULTIPLIER * CLIP / BATCH)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=BATCH, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=500)


def main(output_dir: str = "logs/plain_callbacks") -> pl.Trainer:
    pl.seed_everything(0)
    callbacks = [
        # ε of the noisy steps (sampling rate = batch / dataset size; Opacus RDP accountant);
        # training stops before the step that would spend more than ε = 3.
        PrivacyBudget(epsilon=3.0, delta=1e-5, noise_multiplier=NOISE_MULTIPLIER,
                      sample_rate=BATCH / 1400),
        # one dense gradient up and one model down per step, as in a 1-worker parameter server
        CommunicationCost(workers=1),
        # raw gradient norm and how often clipping at C shortened it
        OperatorStatistics(clip_threshold=CLIP),
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
