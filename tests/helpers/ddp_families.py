"""Every algorithm family on several CPU processes (gloo): run by tests/test_distributed.py as
``torchrun --nproc_per_node 2 tests/helpers/ddp_families.py OUT [family ...]``.

Each process trains the digits federation of tests/test_engine.py with
``Trainer(strategy="ddp", devices=2)``: it holds half the clients and the round's sums are added
over both processes. Rank 0 saves the final parameters and the whole federation's state (the
checkpoint hook gathers it) to ``OUT/<family>.pt``. With ``resume`` it also interrupts a run at
round 3, resumes it from its checkpoint on the same two processes, and saves the result and the
checkpoint path, for the test to continue on one process.
"""

import os
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import ModelCheckpoint

from helpers.engine import FAMILIES, Digits64
from helpers.training import StopAt
from pl_privfed import FederatedModule, resume
from pl_privfed.datamodules import DirichletPartitioner
from pl_privfed.engine.distributed import close_process_group
from pl_privfed.models import MLP

ROUNDS = 6


def fit(name, root, rounds=ROUNDS, callbacks=(), ckpt_path=None, devices=2):
    make, data_kwargs = FAMILIES[name]
    torch.manual_seed(0)
    dm = Digits64(
        num_clients=7,
        batch_size=8,
        seed=3,
        val_fraction=0.0,
        partitioner=DirichletPartitioner(concentration=0.5, seed=1),
        **data_kwargs,
    )
    module = FederatedModule(MLP(64, [16], 10).double(), make(), client_chunk=2)
    accelerator = os.environ.get("PL_PRIVFED_TEST_ACCELERATOR", "cpu")  # "gpu": NCCL
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=rounds,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        default_root_dir=root,
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module


def state(module) -> dict:
    """The final parameters and every algorithm tensor, the per-client tables gathered."""
    checkpoint = {"state_dict": {k: v.clone() for k, v in module.state_dict().items()}}
    step = int(module.global_step)  # gathers the tables of both processes:
    resume.save_client_state(checkpoint, module.algorithms(), step)
    return {k: v for k, v in checkpoint["state_dict"].items() if torch.is_tensor(v)}


def main(out: Path, names: list[str]) -> None:
    for name in names:
        module = fit(name, out / name)
        result = state(module)
        if dist.get_rank() == 0:
            torch.save(
                {
                    "state": result,
                    "chunk": module.chunk_size(),
                    "shard": (module.algorithm.shard.start, module.algorithm.shard.stop),
                },
                out / f"{name}.pt",
            )
    if "resume" in sys.argv:
        name = names[0]
        ckpt = ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=3, save_top_k=-1)
        fit(name, out / "first", callbacks=[ckpt, StopAt(3)])
        paths = sorted((out / "ckpt").glob("*.ckpt"))
        resumed = fit(name, out / "resumed", ckpt_path=str(paths[0]))
        result = state(resumed)
        if dist.get_rank() == 0:
            torch.save({"state": result, "checkpoint": str(paths[0])}, out / "resumed.pt")
    close_process_group()  # an open gloo group can abort the process at exit


if __name__ == "__main__":
    main(Path(sys.argv[1]), [a for a in sys.argv[2:] if a != "resume"])
