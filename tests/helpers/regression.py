"""A plain LightningModule (no federation): linear regression on a small synthetic dataset."""

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class PlainRegression(pl.LightningModule):
    """A minimal non-federated module (as one privatized with Opacus would be)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 3, generator=g), torch.randn(64, 1, generator=g))
        return DataLoader(data, batch_size=8)
