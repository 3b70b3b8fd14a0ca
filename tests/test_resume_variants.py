"""Resume through Lightning checkpoints for the federated variants and the decentralized methods.

A run interrupted at round 6 and resumed from its checkpoint ends bit-identical to the
uninterrupted run: client sampling, local steps over several minibatches, per-example clipping,
gossip state, the compression and output generators, a server optimizer's moments, the
accountant and the transmission count all travel in the checkpoint.
"""

import pytest
import torch
from helpers.training import StopAt, trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from pl_privfed import FederatedModule
from pl_privfed.algorithms import (
    PORTER,
    DPFedAvg,
    FedAdam,
    FedAlphaNormEC,
    FedAvgPerSampleClipping,
    FedAvgPerUpdateClipping,
    FedYogi,
    LocalGD,
    LocalSGD,
    SoteriaFL,
)
from pl_privfed.callbacks import GradientNorm
from pl_privfed.datamodules import DigitsDataModule, IIDPartitioner
from pl_privfed.graphs import Topology
from pl_privfed.models import MLP
from pl_privfed.operators import AdaptiveClip, Clip, RandKBiased
from pl_privfed.privacy import BandedMFNoise, DPNoise, TreeNoise
from pl_privfed.sampling import CyclicSampler, PoissonSampler

ROUNDS, STOP = 12, 6

CASES = {
    "fed_alpha_normec": (
        lambda: FedAlphaNormEC(
            0.05,
            local_step_size=0.1,
            beta=0.1,
            alpha=0.01,
            local_solver=LocalSGD(3),
            participation_prob=0.5,
            server_normalization=False,
            noise=DPNoise(noise_multiplier=0.5, seed=3),
            sampling_seed=4,
        ),
        dict(local_batches=3),
    ),
    "per_sample": (
        lambda: FedAvgPerSampleClipping(
            0.3,
            clip_threshold=1.0,
            local_solver=LocalSGD(2),
            clip_level="example",
            noise=DPNoise(noise_multiplier=1.0, seed=5),
        ),
        dict(local_batches=2),
    ),
    "per_update": (
        lambda: FedAvgPerUpdateClipping(
            1.0,
            local_step_size=0.2,
            clip_threshold=0.5,
            local_solver=LocalGD(2),
            sampler=PoissonSampler(0.6),
            noise=DPNoise(noise_multiplier=0.5, seed=6),
        ),
        dict(),
    ),
    "per_update_adaptive_clip": (  # the clipping norm C_t (buffer clip_norm) in the checkpoint
        lambda: FedAvgPerUpdateClipping(
            1.0,
            local_step_size=0.2,
            local_solver=LocalGD(2),
            sampler=PoissonSampler(0.6),
            noise=DPNoise(noise_multiplier=0.5, seed=6),
            adaptive_clip=AdaptiveClip(0.3, count_stddev=1.0),
        ),
        dict(),
    ),
    "per_update_fedadam": (
        lambda: FedAvgPerUpdateClipping(
            0.05,
            local_step_size=0.2,
            clip_threshold=0.5,
            sampler=PoissonSampler(0.6),
            noise=DPNoise(noise_multiplier=0.5, seed=6),
            server_optimizer=FedAdam(tau=0.01),
        ),
        dict(),
    ),
    "fed_alpha_normec_fedyogi": (
        lambda: FedAlphaNormEC(
            0.01,
            local_step_size=0.1,
            beta=0.1,
            alpha=0.01,
            participation_prob=0.5,
            noise=DPNoise(noise_multiplier=0.5, seed=3),
            server_optimizer=FedYogi(beta1=0.5, tau=0.01),
        ),
        dict(),
    ),
    # correlated noise: the recursion's recent noise rows travel in the algorithm's state_dict
    "dp_fedavg_banded_mf": (
        lambda: DPFedAvg(
            0.3,
            local_step_size=0.2,
            operator=Clip(1.0),
            sampler=CyclicSampler(5),
            noise=DPNoise(noise_multiplier=0.5, seed=6, placement=BandedMFNoise(3)),
        ),
        dict(),
    ),
    "dp_fedavg_tree": (
        lambda: DPFedAvg(
            0.3,
            local_step_size=0.2,
            operator=Clip(1.0),
            sampler=CyclicSampler(5),
            noise=DPNoise(noise_multiplier=0.5, seed=6, placement=TreeNoise(5)),
        ),
        dict(),
    ),
    "porter_dp": (
        lambda: PORTER(
            0.2,
            0.3,
            option="dp",
            clip_threshold=1.0,
            compressor=RandKBiased(ratio=0.2),
            topology=Topology(graph="erdos_renyi", p=0.8, weights="metropolis"),
            noise=DPNoise(noise_multiplier=1.0, seed=7),
            batch_size=8,
            seed=8,
        ),
        dict(),
    ),
    "soteriafl": (
        lambda: SoteriaFL(
            0.2,
            0.5,
            clip_threshold=1.0,
            compressor=RandKBiased(ratio=0.2),
            noise=DPNoise(noise_multiplier=1.0, seed=9),
            batch_size=8,
            seed=10,
        ),
        dict(),
    ),
}


def _run(name, root, ckpt_path=None, callbacks=()):
    torch.manual_seed(0)
    make_algorithm, data_kwargs = CASES[name]
    dm = DigitsDataModule(
        num_clients=5, batch_size=8, partitioner=IIDPartitioner(seed=1), **data_kwargs
    )
    module = FederatedModule(MLP(64, [16], 10), make_algorithm())
    gradient_norm = GradientNorm(every_n_rounds=3)
    t = trainer(
        root, max_steps=ROUNDS, enable_checkpointing=True, callbacks=[gradient_norm, *callbacks]
    )
    t.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, gradient_norm


@pytest.mark.parametrize("name", list(CASES))
def test_resumed_run_is_bit_identical(name, tmp_path):
    full, full_norm = _run(name, tmp_path / "full")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=STOP, save_top_k=-1)
    _run(name, tmp_path / "first", callbacks=[ckpt, StopAt(STOP)])
    (path,) = list((tmp_path / "ckpt").glob("*.ckpt"))
    resumed, resumed_norm = _run(name, tmp_path / "resumed", ckpt_path=str(path))
    assert resumed.global_step == full.global_step == ROUNDS
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items(), strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), k
    assert int(full.algorithm.rounds_done) == int(resumed.algorithm.rounds_done) == ROUNDS
    if name.endswith("adaptive_clip"):  # the norm moved and was restored with the rest
        assert "algorithm.clip_norm" in full.state_dict()
        assert float(resumed.algorithm.clip_norm) == float(full.algorithm.clip_norm) != 0.3
    assert full.privacy_ledger.accountant.steps == resumed.privacy_ledger.accountant.steps
    assert full.privacy_ledger.epsilon(1e-5) == resumed.privacy_ledger.epsilon(1e-5)
    assert full.client_transmissions == resumed.client_transmissions
    assert full_norm.history == resumed_norm.history  # rounds 0, 3, …, 12 in both
    torch.manual_seed(0)
    initial = full.layout.flatten(MLP(64, [16], 10))  # what _run starts from
    assert not torch.equal(full.layout.flatten(full.model), initial)  # training moved the model
