"""The noise placements as objects: a user's placement, registered with one decorator, runs end
to end (the message stage, the round's release, the plan, the ledger), and the ``class_path``
form of ``placement`` parses beside the registered names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import pytorch_lightning as pl
import torch
import yaml
from jsonargparse import ArgumentParser

from pl_privfed import FederatedModule
from pl_privfed.algorithms import DPFedAvg, FederatedAlgorithm
from pl_privfed.datamodules import QuadraticDataModule
from pl_privfed.engine import MessageStage, run_round
from pl_privfed.models import HalfSquaredError, QuadraticModel
from pl_privfed.operators import Clip
from pl_privfed.privacy import (
    PLACEMENTS,
    CentralNoise,
    DistributedNoise,
    DPNoise,
    LocalNoise,
    NoisePlacement,
    plan,
    register_placement,
)
from pl_privfed.rng import STREAM_SAMPLING, keyed_generator
from pl_privfed.sampling import PoissonSampler


@dataclass(frozen=True)
class QuorumLocalNoise(LocalNoise):
    """A user's placement: local noise, and a round with fewer than ``min_contributors``
    senders releases nothing."""

    name: ClassVar[str] = "local_quorum"
    min_contributors: int | None = 1

    @classmethod
    def from_settings(cls, min_contributors: int | None = None) -> NoisePlacement:
        return cls(1 if min_contributors is None else min_contributors)

    def aborts(self, senders: int) -> bool:
        return senders < self.min_contributors

    def phrase(self) -> str:
        return f"local noise, released only with {self.min_contributors} senders or more"


@pytest.fixture
def quorum():
    register_placement(QuorumLocalNoise)
    yield QuorumLocalNoise
    PLACEMENTS.pop(QuorumLocalNoise.name)


def _counts(n, q, seed, rounds):
    return [
        int(torch.rand(n, generator=keyed_generator(seed, STREAM_SAMPLING, k)).lt(q).sum())
        for k in range(rounds)
    ]


def test_builtin_placements_answer_the_engine_and_the_accounting():
    local, central, distributed = LocalNoise(), CentralNoise(), DistributedNoise(4)
    assert [p.sender_std(2.0) for p in (local, central, distributed)] == [2.0, 0.0, 1.0]
    assert [p.aggregator_draws for p in (local, central, distributed)] == [False, True, False]
    assert distributed.aborts(3) and not distributed.aborts(4) and not local.aborts(0)
    assert central.adversaries == ("models",) and local.adversaries == ("server", "models")
    assert DPNoise(noise_multiplier=1.0, placement="distributed", min_contributors=4).where == (
        distributed
    )


def test_a_registered_placement_runs_end_to_end(quorum, tmp_path):
    """The name resolves to the class, the message stage asks it whether a round aborts (the
    round's result says so and the model stays), the plan writes its sentence, and the ledger
    composes only the released rounds."""
    n, q, t, rounds, z = 6, 0.3, 2, 12, 0.8
    counts = _counts(n, q, 5, rounds)
    aborted = sum(c < t for c in counts)
    assert 0 < aborted < rounds
    noise = DPNoise(noise_multiplier=z, placement="local_quorum", min_contributors=t, seed=2)
    assert noise.where == QuorumLocalNoise(t)
    centers = [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5], [0.3, -0.2], [2.0, 2.0], [-0.5, -1.5]]

    def algorithm(noise):
        return DPFedAvg(
            0.3, 0.2, operator=Clip(0.5), sampler=PoissonSampler(q), noise=noise, sampling_seed=5
        )

    # the engine: the round's result is typed, the model does not move when nothing is released
    alg = algorithm(noise)
    alg.setup(num_clients=n, dim=2, num_rounds=rounds, dtype=torch.float64)
    x = torch.zeros(2, dtype=torch.float64)
    grads = torch.tensor(centers, dtype=torch.float64)
    for k in range(rounds):
        result = run_round(alg, x, lambda p, clients=None, **_: p - grads[clients])
        assert result.released == (counts[k] >= t)
        assert ("aborted" in result.metrics) == (not result.released)
        assert torch.equal(result.params, x) or result.released
        x = result.params
    stage = alg.message_stage()
    assert isinstance(stage, MessageStage) and stage.placement == QuorumLocalNoise(t)
    # the plan and the ledger, through a FederatedModule run
    module = FederatedModule(
        QuadraticModel(2, [0.0, 0.0]), algorithm(noise), criterion=HalfSquaredError()
    )
    pl.Trainer(
        max_steps=rounds,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    ).fit(module, datamodule=QuadraticDataModule(centers=centers))
    ledger = module.privacy_ledger
    assert ledger.rounds_aborted == aborted and ledger.rounds_accounted == rounds
    for accountant in ledger.accountants.values():
        assert accountant.steps == rounds - aborted
    report = module.privacy_report()
    assert report["placement"] == "local_quorum" and report["min_contributors"] == t
    assert report["privacy_unit"].endswith("released only with 2 senders or more")
    assert report["adversary"] == "server" and report["trusted"] is None
    assert plan.unit(module.algorithm.release(), noise) == report["privacy_unit"]


def _parse(noise: dict) -> DPNoise:
    parser = ArgumentParser()
    parser.add_argument("--algorithm", type=FederatedAlgorithm)
    config = {
        "algorithm": {
            "class_path": "pl_privfed.algorithms.DistributedDPSGD",
            "init_args": {"step_size": 0.1, "noise": noise},
        }
    }
    return parser.instantiate(parser.parse_string(yaml.safe_dump(config))).algorithm.noise


def test_class_path_placement_parses_beside_the_names(quorum):
    """``placement: distributed`` with ``min_contributors`` and the ``class_path`` form give the
    same placement; the noise settings may repeat ``t``, not contradict it; a user's class
    parses by its class path too."""
    by_name = _parse({"noise_multiplier": 1.0, "placement": "distributed", "min_contributors": 5})
    spec = {
        "class_path": "pl_privfed.privacy.DistributedNoise",
        "init_args": {"min_contributors": 5},
    }
    by_class = _parse({"noise_multiplier": 1.0, "placement": spec})
    assert by_name.where == by_class.where == DistributedNoise(5)
    assert by_name.placement == "distributed"  # the configuration's spelling is kept
    assert _parse({"noise_multiplier": 1.0, "placement": spec, "min_contributors": 5}).where == (
        DistributedNoise(5)
    )
    with pytest.raises(ValueError, match="min_contributors=6 contradicts"):
        DPNoise(noise_multiplier=1.0, placement=DistributedNoise(5), min_contributors=6)
    central = {"class_path": "pl_privfed.privacy.CentralNoise"}
    assert _parse({"noise_multiplier": 1.0, "placement": central}).where == CentralNoise()
    user = {"class_path": f"{__name__}.QuorumLocalNoise", "init_args": {"min_contributors": 3}}
    assert _parse({"noise_multiplier": 1.0, "placement": user}).where == QuorumLocalNoise(3)
    assert _parse({"noise_multiplier": 1.0, "placement": "local_quorum"}).where == (
        QuorumLocalNoise(1)
    )


def test_registering_needs_a_named_placement():
    class Nameless(NoisePlacement):
        pass

    with pytest.raises(ValueError, match="set name"):
        register_placement(Nameless)
    with pytest.raises(ValueError, match="placement must be"):
        DPNoise(noise_multiplier=1.0, placement="nowhere")


def test_class_path_placement_through_the_command_line(tmp_path, monkeypatch, capsys):
    """A shipped config with its ``placement`` given as a ``class_path`` on the command line
    (``min_contributors`` left as the config has it, the same ``t``): the CLI's config shows
    the class."""
    from pl_privfed.cli import main

    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[1] / "configs/private/mnist_dpsgd_distributed.yaml"
    spec = "{class_path: pl_privfed.privacy.DistributedNoise, init_args: {min_contributors: 5000}}"
    try:
        main(
            [
                "fit",
                "--config",
                str(config),
                "--model.algorithm.init_args.noise.placement",
                spec,
                "--print_config",
            ]
        )
    except SystemExit as done:
        assert not done.code
    noise = yaml.safe_load(capsys.readouterr().out)["model"]["algorithm"]["init_args"]["noise"]
    assert noise["placement"] == {
        "class_path": "pl_privfed.privacy.DistributedNoise",
        "init_args": {"min_contributors": 5000, "allow_aborts": False},
    }
    assert noise["min_contributors"] == 5000
