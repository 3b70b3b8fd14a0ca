"""``GradientNorm``: exact full-gradient norm, rounds to target, early stop, summary, state; and
paper 003's qualitative result (per-sample vs per-update clipping) on real MNIST."""

import json

import numpy as np
import pytest
import torch
from helpers.training import trainer
from torch import nn

from pl_privfed import FederatedModule
from pl_privfed.algorithms import FedAvgPerSampleClipping, FedAvgPerUpdateClipping, LocalGD
from pl_privfed.callbacks import GradientNorm, RunSummary
from pl_privfed.datamodules import (
    ClassesPerClientPartitioner,
    DigitsDataModule,
    DirichletPartitioner,
    MNISTDataModule,
)
from pl_privfed.models import MLP, LogisticRegression


def reference_norm(model, dm, weighting):
    """Plain loop over clients: f = (1/M) Σ_i mean_{shard i} ℓ (or the mean over the union)."""
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    sizes = [len(s) for s in dm.shards]
    for shard in dm.shards:
        x, y = dm.train_inputs[shard], dm.train_targets[shard]
        loss = nn.functional.cross_entropy(model(x), y)
        weight = 1 / len(sizes) if weighting == "clients" else len(shard) / sum(sizes)
        for t, g in zip(total, torch.autograd.grad(loss, params)):
            t += weight * g
    return float(torch.sqrt(sum((t**2).sum() for t in total)))


@pytest.mark.parametrize("weighting", ["clients", "examples"])
def test_full_gradient_norm_is_exact(tmp_path, weighting):
    dm = DigitsDataModule(
        num_clients=5, batch_size=16, partitioner=DirichletPartitioner(0.3, seed=1)
    )
    model = MLP(64, [16], 10)
    module = FederatedModule(model, FedAvgPerUpdateClipping(1.0, 0.1, clip_threshold=1.0))
    callback = GradientNorm(every_n_rounds=2, weighting=weighting, chunk_size=100)
    trainer(tmp_path, callbacks=[callback], max_steps=4).fit(module, dm)
    assert len({len(s) for s in dm.shards}) > 1  # unequal shards: the weighting matters
    assert [r for r, _ in callback.history] == [0, 2, 4]
    expected = reference_norm(model, dm, weighting)
    assert callback.history[-1][1] == pytest.approx(expected, rel=1e-5)
    assert model.training  # the callback restores the mode


def mnist_one_class(samples=32):
    return MNISTDataModule(
        num_clients=10,
        batch_size=samples,  # the whole shard: full-batch local gradients (paper 003 App. G)
        max_train_examples=3000,
        max_test_examples=200,
        partitioner=ClassesPerClientPartitioner(1, samples_per_client=samples),
    )


def run_mnist(tmp_path, algorithm, rounds, stop=True):
    model = LogisticRegression(784, 10)
    for p in model.parameters():
        nn.init.zeros_(p)  # x⁰ = 0
    callback = GradientNorm(target=0.18, stop_at_target=stop)
    summary = RunSummary(dirpath=str(tmp_path), verbose=False)
    trainer(tmp_path, callbacks=[callback, summary], max_steps=rounds).fit(
        FederatedModule(model, algorithm), mnist_one_class()
    )
    return callback, json.loads((tmp_path / "summary.json").read_text())


def test_paper003_per_sample_stalls_per_update_reaches_target(tmp_path):
    """One class per worker (paper 003 Figs. 1-2): per-sample clipping at c = 0.1 stalls above
    ||∇f|| = 0.18 (its bias min(ζ, ζ²/c) does not vanish), while per-update clipping with the same
    c and a local step small enough that c >= η_l τ ζ reaches it (Theorem II, eq. 5)."""
    sample_cb, sample = run_mnist(
        tmp_path / "sample",
        FedAvgPerSampleClipping(0.8, clip_threshold=0.1, local_solver=LocalGD(5)),
        rounds=60,
    )
    assert sample["rounds"] == 60 and sample["rounds_to_target"] is None
    tail = [v for r, v in sample_cb.history if r >= 40]
    assert min(tail) > 0.4 and max(tail) - min(tail) < 0.05  # stalled well above 0.18
    update_cb, update = run_mnist(
        tmp_path / "update",
        FedAvgPerUpdateClipping(25.0, 0.004, clip_threshold=0.1, local_solver=LocalGD(5)),
        rounds=60,
    )
    reached = update["rounds_to_target"]
    assert reached is not None and reached <= 40
    assert update["rounds"] == reached  # stopped there
    assert update["full_grad_norm"]["final"] <= 0.18 < update_cb.history[reached - 1][1]
    assert update["stopped_reason"].startswith("full gradient norm")
    assert update["client_transmissions"] == 10 * reached


def test_validation():
    with pytest.raises(ValueError, match="every_n_rounds"):
        GradientNorm(every_n_rounds=0)
    with pytest.raises(ValueError, match="target"):
        GradientNorm(target=-1.0)
    with pytest.raises(ValueError, match="stop_at_target"):
        GradientNorm(stop_at_target=True)
    with pytest.raises(ValueError, match="weighting"):
        GradientNorm(weighting="mean")


def test_state_round_trip():
    cb = GradientNorm(target=0.5)
    cb.history = [(0, 1.0), (3, 0.4)]
    cb.rounds_to_target = 3
    other = GradientNorm(target=0.5)
    other.load_state_dict(cb.state_dict())
    assert other.history == cb.history and other.rounds_to_target == 3
    entries = other.summary_entries()
    assert entries["rounds_to_target"] == 3 and entries["full_grad_norm"]["min"] == 0.4
    assert np.isclose(entries["final_full_grad_norm"], 0.4)
