"""A grid over the run's seed (``"--seed"`` points): each configuration is its separate run
with that seed — its initial model, validation split, partition, minibatch streams, noise,
cohorts and random graph — for a client-level, a record-level and a decentralized family."""

import pytest
import torch
from helpers.training import trainer

from pl_privfed import FederatedModule
from pl_privfed.algorithms import DPFedAvg, FedAvgPerSampleClipping, LocalGD, LocalSGD
from pl_privfed.algorithms.decentralized import PORTER
from pl_privfed.datamodules import DigitsDataModule, DirichletPartitioner, QuadraticDataModule
from pl_privfed.graphs import Topology
from pl_privfed.grid import GridModule
from pl_privfed.grid import module as grid_module
from pl_privfed.grid.seeds import RUN_SEED
from pl_privfed.models import MLP
from pl_privfed.operators import Clip, RandKBiased
from pl_privfed.privacy import DPNoise
from pl_privfed.sampling import FixedSizeSampler


class Digits64(DigitsDataModule):
    """The digits in float64, for comparisons to the last bit."""

    def preprocess(self, inputs, train, round_index):
        return inputs.double()


def _data(seed, **kwargs):
    """The datamodule as ``--seed seed`` sets it: its seed and its partitioner's."""
    partitioner = DirichletPartitioner(concentration=0.5, seed=seed)
    return Digits64(num_clients=5, batch_size=8, seed=seed, partitioner=partitioner, **kwargs)


def _model(seed):
    """The model as the CLI builds it right after seed_everything(seed), in float64."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return MLP(64, [12], 10)
    finally:
        torch.set_default_dtype(default)


def _client_level(seed, step):
    return DPFedAvg(
        step,
        local_step_size=0.5,
        operator=Clip(0.5),
        local_solver=LocalGD(steps=2),
        sampler=FixedSizeSampler(cohort_size=3),
        sampling_seed=seed,
        noise=DPNoise(epsilon=8.0, calibration="target", seed=seed),
    )


def _record_level(seed, step):
    noise = DPNoise(noise_multiplier=1.0, seed=seed)  # its ε: its own shards' sampling rate
    return FedAvgPerSampleClipping(
        step, clip_threshold=1.0, clip_level="example", local_solver=LocalSGD(steps=2), noise=noise
    )


def _decentralized(seed, step):
    return PORTER(
        step,
        consensus_step_size=0.05,
        option="dp",
        clip_threshold=1.0,
        topology=Topology("erdos_renyi", p=0.6, seed=seed),
        compressor=RandKBiased(ratio=0.5),
        batch_size=8,
        seed=seed,
        noise=DPNoise(noise_multiplier=1.0, seed=seed),
    )


FAMILIES = {
    "client-level DP-FedAvg, sampled cohorts": (_client_level, {}),
    "record-level per-example DP-SGD": (
        _record_level,
        {"local_batches": 2, "batch_sampling": "without_replacement"},
    ),
    "decentralized PORTER-DP": (_decentralized, {"batch_sampling": "without_replacement"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "per-configuration"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_seeds_in_a_grid_equal_their_separate_runs(family, stacked, tmp_path, monkeypatch):
    """Either way the grid computes its gradients (one stacked call, or one call per
    configuration on its seed's data: what it does at 10,000 clients)."""
    if not stacked:
        monkeypatch.setattr(grid_module, "STACKED_PARAMETER_BYTES", 0)
    make, data_args = FAMILIES[family]
    points = [{RUN_SEED: s, "step_size": g} for s, g in ((0, 0.1), (1, 0.1), (1, 0.3), (2, 0.3))]
    rounds, fit = 3, dict(limit_val_batches=1.0, val_check_interval=2, check_val_every_n_epoch=None)
    grid = GridModule(_model(0), make(0, 0.1), grid=points, grid_dir=str(tmp_path / "grid"))
    trainer(tmp_path / "grid", max_steps=rounds, **fit).fit(grid, datamodule=_data(0, **data_args))
    assert [c.status for c in grid.configurations] == ["finished"] * len(points)
    for k, point in enumerate(points):
        seed = point[RUN_SEED]
        single = FederatedModule(_model(seed), make(seed, point["step_size"]))
        trainer(tmp_path / f"single{k}", max_steps=rounds, **fit).fit(
            single, datamodule=_data(seed, **data_args)
        )
        x = single.layout.flatten(single.model)
        torch.testing.assert_close(grid.grid_params[k], x, rtol=1e-12, atol=1e-12)
        own = grid.grid_ledger(k)
        assert own.noise_std == single.privacy_ledger.noise_std  # its own shards' rates
        assert own.report()["epsilon"] == single.privacy_report()["epsilon"]
        history = grid.configurations[k].curves  # the grid sums its evaluations in float32
        assert history["test/acc"][-1][1] == pytest.approx(single._final_test["accuracy"])
        assert history["test/loss"][-1][1] == pytest.approx(single._final_test["loss"], rel=1e-6)
        assert history["val/loss"][-1][1] == pytest.approx(
            single.trainer.callback_metrics["val/loss"].item(), rel=1e-6
        )
    # the seeds did differ: initial models, data and noise
    assert not torch.equal(grid.grid_params[0], grid.grid_params[1])


def test_a_seed_grid_sets_every_seed_and_refuses_what_it_cannot_reproduce():
    """``"--seed"`` sets every seed argument of the algorithm and its objects, as ``--seed``
    does; a model that is not its seed's initialization is refused before training (a batched
    sweep then runs those points one by one)."""
    grid = GridModule(_model(3), _decentralized(0, 0.1), grid={RUN_SEED: [3, 4]})
    alg = grid.grid_algorithms[1]
    assert (alg.seed, alg.noise.seed, alg.topology.seed) == (4, 4, 4)
    assert grid.grid_algorithms[0].topology.seed == 3
    assert torch.equal(grid.grid_params[0], grid.layout.flatten(_model(3)))
    assert torch.equal(grid.grid_params[1], grid.layout.flatten(_model(4)))
    with pytest.raises(ValueError, match=r"--seed.*not its initialization at the first point's"):
        GridModule(_model(0), _client_level(0, 0.1), grid={RUN_SEED: [1, 2]})
    with pytest.raises(ValueError, match="--seed must be a seed >= 0"):
        GridModule(_model(0), _client_level(0, 0.1), grid={RUN_SEED: [0, -1]})


def test_a_reseeded_datamodule_is_its_seeds_run_and_shares_what_it_can():
    """A seed's view: the split, partition and streams of the datamodule built with that seed;
    the loaded digits shared, generated data (the quadratic's centers) drawn again."""
    base = _data(0)
    base.setup("fit")
    view = base.reseeded(1, DirichletPartitioner(concentration=0.5, seed=1))
    fresh = _data(1)
    fresh.setup("fit")
    assert view._loaded is base._loaded  # the digits are not copied
    assert view.val_indices.tolist() == fresh.val_indices.tolist() != base.val_indices.tolist()
    assert [s.tolist() for s in view.shards] == [s.tolist() for s in fresh.shards]
    assert torch.equal(view.round_indices(3), fresh.round_indices(3))
    assert not torch.equal(view.round_indices(3), base.round_indices(3))
    quadratic = QuadraticDataModule(num_clients=3, dim=2, seed=0)
    quadratic.setup("fit")
    other = QuadraticDataModule(num_clients=3, dim=2, seed=1)
    other.setup("fit")
    assert torch.equal(quadratic.reseeded(1).train_targets, other.train_targets)
    assert not torch.equal(quadratic.train_targets, other.train_targets)
