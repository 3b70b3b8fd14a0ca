"""A small digits federation that saves a round checkpoint, for the resume checks."""

import torch

from helpers.training import trainer
from pl_privfed import FederatedModule
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.callbacks import RoundCheckpoint
from pl_privfed.datamodules import DigitsDataModule, IIDPartitioner
from pl_privfed.models import MLP
from pl_privfed.privacy import DPNoise

ROUNDS = 3


def noise(seed=3):
    return DPNoise(noise_multiplier=1.0, seed=seed)


def run(
    root,
    *,
    clients=5,
    partitioner=None,
    algorithm=None,
    model=None,
    ckpt_path=None,
    allow=(),
    rounds=ROUNDS,
):
    torch.manual_seed(0)
    dm = DigitsDataModule(
        num_clients=clients, batch_size=8, partitioner=partitioner or IIDPartitioner(seed=1)
    )
    algorithm = (
        algorithm
        if algorithm is not None
        else AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=noise())
    )
    module = FederatedModule(model or MLP(64, [8], 10), algorithm)
    module.resume_allow_changes = tuple(allow)
    t = trainer(
        root,
        max_steps=rounds,
        enable_checkpointing=True,
        callbacks=[RoundCheckpoint(dirpath=root / "checkpoints")],
    )
    t.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, t
