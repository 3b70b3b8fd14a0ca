"""Every algorithm family of the engine tests, and the digits data module they train on."""

from pl_privfed.algorithms import (
    BEER,
    PORTER,
    AlphaNormEC,
    DPFedAvg,
    FedAlphaNormEC,
    FedAvgPerSampleClipping,
    FedAvgPerUpdateClipping,
    LocalSGD,
    SoteriaFL,
)
from pl_privfed.datamodules import DigitsDataModule
from pl_privfed.graphs import Topology
from pl_privfed.operators import Clip, RandKBiased
from pl_privfed.privacy import DPNoise
from pl_privfed.sampling import FixedSizeSampler, PoissonSampler


class Digits64(DigitsDataModule):
    def preprocess(self, inputs, train, round_index):
        return inputs.double()


FAMILIES = {
    "dp_alpha_normec": (
        lambda: AlphaNormEC(
            0.1,
            beta=0.3,
            alpha=0.01,
            memory_init="gradient",
            noise=DPNoise(noise_multiplier=0.5, seed=1, draws="per_client"),
        ),
        {},
    ),
    "dp_fed_alpha_normec": (
        lambda: FedAlphaNormEC(
            0.1,
            0.2,
            beta=0.3,
            alpha=0.01,
            local_solver=LocalSGD(2),
            participation_prob=0.5,
            noise=DPNoise(noise_multiplier=0.5),
        ),
        {"local_batches": 2},
    ),
    "dp_fedavg_cohort": (
        lambda: DPFedAvg(
            0.5,
            0.3,
            operator=Clip(1.0),
            sampler=FixedSizeSampler(4),
            noise=DPNoise(noise_multiplier=0.3, seed=2),
        ),
        {},
    ),
    "per_sample_clipping": (
        lambda: FedAvgPerSampleClipping(
            0.1,
            clip_threshold=1.0,
            local_solver=LocalSGD(2),
            clip_level="example",
            sampler=PoissonSampler(0.7),
            noise=DPNoise(noise_multiplier=1.0, seed=3),
        ),
        {"local_batches": 2},
    ),
    "per_update_clipping": (
        lambda: FedAvgPerUpdateClipping(
            1.0,
            0.1,
            clip_threshold=0.5,
            local_solver=LocalSGD(2),
            noise=DPNoise(noise_multiplier=0.5, seed=4),
        ),
        {"local_batches": 2},
    ),
    "porter_dp": (
        lambda: PORTER(
            0.1,
            0.4,
            option="dp",
            clip_threshold=1.0,
            compressor=RandKBiased(ratio=0.3),
            noise=DPNoise(noise_multiplier=1.0, seed=5),
            batch_size=8,
            topology=Topology(graph="ring", weights="metropolis"),
        ),
        {},
    ),
    "beer": (lambda: BEER(0.1, 0.4, compressor=RandKBiased(ratio=0.3)), {}),
    "soteriafl": (
        lambda: SoteriaFL(
            0.2,
            0.5,
            compressor=RandKBiased(ratio=0.3),
            batch_size=8,
            noise=DPNoise(noise_multiplier=1.0, seed=6),
        ),
        {},
    ),
}
