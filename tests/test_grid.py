"""A grid of configurations as one batched federation (``GridModule(grid=...)``): every
configuration's iterates equal its separate run; divergence, results, report, resume, errors."""

import csv
import json
from pathlib import Path

import pytest
import torch
import wandb
from helpers.resnet_grid import assert_grid_follows_single_runs
from helpers.training import Recorder, StopAt, trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from pl_privfed import FederatedModule, NonFiniteLossError
from pl_privfed.algorithms import (
    AlphaNormEC,
    Clip21,
    DistributedDPSGD,
    DPFedAvg,
    FedAvgPerUpdateClipping,
    LocalSGD,
)
from pl_privfed.callbacks import GradientNorm, RunSummary
from pl_privfed.cli import PrivFedCLI, main
from pl_privfed.datamodules import DigitsDataModule, DirichletPartitioner
from pl_privfed.grads import GradientOracle
from pl_privfed.grid import GridModule, grid_points, rebuild_algorithm
from pl_privfed.grid import module as grid_module
from pl_privfed.models import MLP
from pl_privfed.operators import AdaptiveClip
from pl_privfed.privacy import DPNoise, calibrate_noise_std, plan
from pl_privfed.report import make_report
from pl_privfed.sampling import PoissonSampler
from pl_privfed.sweep import grid as sweep_grid
from pl_privfed.sweep import load_sweep


class Digits64(DigitsDataModule):
    """The digits in float64, for comparisons to the last bit."""

    def preprocess(self, inputs, train, round_index):
        return inputs.double()


def _data(dtype=torch.float64, **kwargs):
    args = dict(
        num_clients=4, batch_size=8, partitioner=DirichletPartitioner(concentration=0.5, seed=1)
    )
    args.update(kwargs)
    return Digits64(**args) if dtype == torch.float64 else DigitsDataModule(**args)


def _model(batch_norm=True, dtype=torch.float64):
    torch.manual_seed(0)  # every run starts from the same x⁰, as the CLI's seed_everything does
    return MLP(64, [12], 10, batch_norm=batch_norm).to(dtype)


def _fit(module, tmp_path, rounds, data=None, ckpt_path=None, **kwargs):
    dtype = next(module.model.parameters()).dtype
    trainer(tmp_path, max_steps=rounds, **kwargs).fit(
        module, datamodule=data or _data(dtype), ckpt_path=ckpt_path
    )
    return module


def _assert_equals_separate_runs(grid_module, algorithm, backend, rounds, tmp_path, batch_norm):
    for k, point in enumerate(grid_module.grid_points):
        single = FederatedModule(
            _model(batch_norm), rebuild_algorithm(algorithm, point), grad_backend=backend
        )
        _fit(single, tmp_path / f"single{k}", rounds)
        x = single.layout.flatten(single.model)
        torch.testing.assert_close(grid_module.grid_params[k], x, rtol=1e-12, atol=1e-12)
        for name, buf in single.model.named_buffers():
            key = grid_module._grid_buffer_names[name]
            torch.testing.assert_close(getattr(grid_module, key)[k], buf, rtol=1e-12, atol=1e-12)
        config = grid_module.grid_algorithms[k]
        for name, buf in single.algorithm.named_buffers():  # a client table may be on disk
            other = config.state.table(name) if name in config.state.names else None
            other = dict(config.named_buffers())[name] if other is None else other
            torch.testing.assert_close(other, buf, rtol=1e-12, atol=1e-12)
        own = grid_module.grid_ledger(k)
        assert (own is None) == (single.privacy_ledger is None)
        if own is not None:  # its own ledger: its σ, its ε, as its separate run's
            assert own.noise_std == single.privacy_ledger.noise_std
            assert own.report()["epsilon"] == single.privacy_report()["epsilon"]
            assert own.epsilon_paper() == single.privacy_ledger.epsilon_paper()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_resnet20_grid_equals_separate_runs(backend, tmp_path):
    """Convolutions and BatchNorm with per-configuration buffers (what paper 002's ResNet-20
    grid runs): each configuration ends as its single run, in float64 (tests/test_gpu.py makes
    the same check on CUDA, with and without CUDA graphs)."""
    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01)
    grid = {"beta": [0.1, 1.0]}
    module = assert_grid_follows_single_runs(tmp_path, alg, grid, steps=3, grad_backend=backend)
    assert not torch.equal(module.grid_params[0], module.grid_params[1])


@pytest.mark.parametrize("backend, batch_norm", [("vmap", True), ("loop", True), ("layers", False)])
def test_alpha_normec_grid_equals_separate_runs(backend, batch_norm, tmp_path, monkeypatch):
    """Paper 002's grid axes (γ, β, server normalization): each configuration's parameters,
    BatchNorm running statistics and memories equal its own run's, in float64; its gradients
    in chunks of configurations, or one configuration at a time, give the same iterates."""
    alg = AlphaNormEC(0.05, beta=0.1, alpha=0.01, memory_init="gradient")
    grid = {"step_size": [0.05, 0.5], "beta": [0.1, 1.0], "server_normalization": [True, False]}
    module = GridModule(_model(batch_norm), alg, grad_backend=backend, grid=grid)
    _fit(module, tmp_path / "grid", 5)
    assert len(module.grid_points) == 8
    # gradients for 3 configurations per oracle call: the same iterates
    chunked = GridModule(_model(batch_norm), alg, grad_backend=backend, grid=grid, grid_chunk=3)
    _fit(chunked, tmp_path / "chunked", 5)
    monkeypatch.setattr(grid_module, "STACKED_PARAMETER_BYTES", 0)  # one call per configuration
    alone = GridModule(_model(batch_norm), alg, grad_backend=backend, grid=grid)
    _fit(alone, tmp_path / "alone", 5)
    for other in (chunked, alone):
        for a, b in zip(module.state_dict().values(), other.state_dict().values(), strict=True):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert module.grid_points[1] == {"step_size": 0.05, "beta": 0.1, "server_normalization": False}
    assert [c.status for c in module.configurations] == ["finished"] * 8
    _assert_equals_separate_runs(module, alg, backend, 5, tmp_path, batch_norm)
    # the configurations did move apart
    assert not torch.equal(module.grid_params[0], module.grid_params[7])


def test_private_clip21_grid_equals_separate_runs(tmp_path):
    """DP-Clip21 over τ and γ: the noise multiplier does not depend on τ (σ ∝ τ), so one
    accountant serves every configuration, and each draws its noise as its own run does."""
    alg = Clip21(0.1, clip_threshold=1.0, noise=DPNoise(epsilon=8.0, seed=5))
    grid = {"clip_threshold": [0.1, 1.0], "step_size": [0.01, 0.1]}
    module = GridModule(_model(), alg, grad_backend="vmap", grid=grid)
    _fit(module, tmp_path / "grid", 4)
    assert module.privacy_ledger.accountant.steps == 4
    _assert_equals_separate_runs(module, alg, "vmap", 4, tmp_path, True)


def test_adaptive_clip_grid_equals_separate_runs(tmp_path):
    """DP-FedAvg with adaptive clipping over its target quantile and the step size: each
    configuration keeps its own clipping norm (a buffer), its noise split and its count's noise,
    as its separate run does."""
    clip = AdaptiveClip(0.5, count_stddev=5.0)
    noise = DPNoise(epsilon=8.0, calibration="target", placement="central", seed=5)
    alg = DPFedAvg(0.5, 0.5, operator=clip, sampler=PoissonSampler(0.5), noise=noise)
    grid = {"operator.target_quantile": [0.3, 0.7], "step_size": [0.2, 0.5]}
    module = GridModule(_model(), alg, grad_backend="vmap", grid=grid)
    _fit(module, tmp_path / "grid", 4)
    norms = [float(c.clip_norm) for c in module.grid_algorithms]
    assert norms[0] != norms[2] and 0.5 not in norms  # each adapted its own norm
    _assert_equals_separate_runs(module, alg, "vmap", 4, tmp_path, True)


ALG = "model.algorithm.init_args."


def test_a_grid_over_an_operator_argument_rebuilds_the_operator(tmp_path):
    """DP-FedAvg over its clipping threshold Φ (``operator.threshold``, an argument of the
    ``Clip`` the config builds) and the target ε: each configuration's operator is a new
    ``Clip`` with its Φ, its σ is calibrated to its own sensitivity and ε, and it ends as its
    separate run; the grid's results name Φ as the sweep file does."""
    from pl_privfed.operators import Clip
    from pl_privfed.sampling import PoissonSampler

    noise = DPNoise(epsilon=8.0, calibration="target", placement="central", seed=2)
    alg = DPFedAvg(
        0.5,
        local_step_size=1.0,
        operator=Clip(1.0),
        sampler=PoissonSampler(0.5),
        sampling_seed=1,
        noise=noise,
    )
    grid = {"operator.threshold": [0.3, 3.0], "noise.epsilon": [2.0, 8.0]}
    module = GridModule(_model(), alg, grad_backend="vmap", grid=grid, grid_dir=str(tmp_path / "g"))
    with pytest.raises(ValueError, match="Clip has no argument 'nope'"):
        GridModule(_model(), alg, grid={"operator.nope": [1.0]})
    _fit(module, tmp_path / "grid", 3)
    thresholds = [a.operator.threshold for a in module.grid_algorithms]
    assert thresholds == [0.3, 0.3, 3.0, 3.0] and alg.operator.threshold == 1.0
    assert module.grid_algorithms[0].operator is not module.grid_algorithms[1].operator
    stds = [module.grid_ledger(k).noise_std for k in range(4)]
    assert stds[2] == pytest.approx(10 * stds[0], rel=1e-2) and stds[0] > stds[1]  # σ ∝ Φ
    _assert_equals_separate_runs(module, alg, "vmap", 3, tmp_path, True)
    header = (tmp_path / "g" / "results.csv").read_text().splitlines()[0]
    assert header.split(",")[2] == "threshold"
    from pl_privfed.grid.points import sweep_name

    assert sweep_name("operator.threshold", alg) == f"{ALG}operator.init_args.threshold"
    assert sweep_name("noise.epsilon", alg) == f"{ALG}noise.epsilon"  # settings: no init_args


def test_a_grid_whose_client_state_does_not_fit_in_memory_puts_the_rest_on_disk(
    tmp_path, monkeypatch
):
    """``client_state: auto`` counts the configurations set up before against the machine's
    memory quarter: with room for about two configurations' α-NormEC memories, the first ones
    are held in memory and the later ones memory-mapped on disk (with one configuration's
    worth each, every one would have fit alone), and every configuration still ends as its
    separate run."""
    from pl_privfed.engine import state

    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01)
    grid = {"beta": [0.1, 0.3, 1.0]}
    probe = GridModule(_model(), alg, grad_backend="vmap", grid=grid)
    _fit(probe, tmp_path / "probe", 1)
    each = probe.grid_algorithms[0].state.nbytes()
    assert each > 0 and all(a.state.placement == "device" for a in probe.grid_algorithms)
    # the base algorithm and the first configuration fit in the quarter, the rest do not
    monkeypatch.setattr(state, "_machine_memory", lambda: 4 * (2 * each + each // 2))
    module = GridModule(_model(), alg, grad_backend="vmap", grid=grid)
    _fit(module, tmp_path / "grid", 3)
    placements = [module.algorithm.state.placement] + [
        a.state.placement for a in module.grid_algorithms
    ]
    assert placements == ["device", "device", "disk", "disk"]
    _assert_equals_separate_runs(module, alg, "vmap", 3, tmp_path, True)


def test_a_grid_told_to_refuse_names_how_many_configurations_fit(tmp_path, monkeypatch):
    """``grid_memory: refuse`` (what a batched sweep asks): where a configuration's client
    state would go to disk only because of the earlier ones', the run is refused before
    training, naming how many configurations fit, which the sweep reads to split its group."""
    from pl_privfed.engine import state
    from pl_privfed.sweep.batch import Group, split

    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01)
    grid = {"beta": [0.1, 0.3, 1.0, 3.0]}
    probe = GridModule(_model(), alg, grad_backend="vmap", grid=grid)
    _fit(probe, tmp_path / "probe", 1)
    each = probe.grid_algorithms[0].state.nbytes()
    assert each == probe.algorithm.num_clients * probe.layout.dim * 8  # the g_i, float64
    monkeypatch.setattr(state, "_machine_memory", lambda: 4 * (3 * each + each // 2))
    module = GridModule(_model(), alg, grad_backend="vmap", grid=grid, grid_memory="refuse")
    summary = RunSummary(dirpath=str(tmp_path / "grid"), verbose=False)
    with pytest.raises(
        state.GridMemoryRefused, match="at most 2 configurations at once"
    ) as refused:
        _fit(module, tmp_path / "grid", 3, callbacks=[summary])
    assert refused.value.fit == 2
    assert int(module.algorithm.rounds_done) == 0  # refused before training
    # the typed failure reaches the sweep through summary.json, not through the message's text
    written = json.loads((tmp_path / "grid" / "summary.json").read_text())
    assert written["error"] == {"type": "grid_memory_refused", "fit": 2}
    group = Group([0, 1, 2, 3], [{"b": v} for v in grid["beta"]], ["b"])
    assert [g.indices for g in split(group, written)] == [[0, 1], [2, 3]]
    other = {"status": "failed: ValueError: beta must be positive", "error": {"type": "ValueError"}}
    assert split(group, other) is None and split(group, None) is None
    with pytest.raises(ValueError, match="grid_memory"):
        GridModule(_model(), alg, grid=grid, grid_memory="swap")


def test_grid_with_local_steps_serves_other_requests_from_the_oracle(tmp_path):
    """FedAvg with per-update clipping asks for gradients at per-client local iterates (not the
    batched request): those go to the oracle as in a single run, with the same results."""
    alg = FedAvgPerUpdateClipping(
        1.0, local_step_size=0.1, clip_threshold=1.0, local_solver=LocalSGD(steps=2)
    )
    grid = {"clip_threshold": [0.1, 10.0]}
    data = dict(local_batches=2)
    module = GridModule(_model(batch_norm=False), alg, grad_backend="vmap", grid=grid)
    _fit(module, tmp_path / "grid", 3, data=_data(**data))
    for k, point in enumerate(module.grid_points):
        single = FederatedModule(
            _model(batch_norm=False), rebuild_algorithm(alg, point), grad_backend="vmap"
        )
        _fit(single, tmp_path / f"s{k}", 3, data=_data(**data))
        torch.testing.assert_close(module.grid_params[k], single.layout.flatten(single.model))


def test_diverging_configuration_is_frozen_and_the_others_go_on(tmp_path):
    alg = Clip21(0.1, clip_threshold=1.0)
    module = GridModule(
        _model(batch_norm=False, dtype=torch.float32), alg, grid={"step_size": [0.1, 3e38]}
    )
    _fit(module, tmp_path / "grid", 6)
    ok, failed = [c.status for c in module.configurations]
    assert ok == "finished"
    assert failed.startswith("failed: non-finite training loss at round ")
    # it completed the rounds before that one, as its separate run reports
    assert module.grid_entries(1)["rounds"] == int(failed.rsplit(" ", 1)[1])
    single = FederatedModule(_model(batch_norm=False, dtype=torch.float32), Clip21(0.1, 1.0))
    _fit(single, tmp_path / "single", 6)
    torch.testing.assert_close(module.grid_params[0], single.layout.flatten(single.model))
    # when every configuration diverges the run stops, naming the round
    module = GridModule(
        _model(batch_norm=False, dtype=torch.float32), alg, grid={"step_size": [3e38]}
    )
    with pytest.raises(NonFiniteLossError, match="round"):
        _fit(module, tmp_path / "all", 6)


def test_a_grid_in_which_every_configuration_diverges_still_writes_its_results(tmp_path):
    """Today the run stopped with summary.json pointing to a results.csv never written."""
    out = tmp_path / "out"
    module = GridModule(
        _model(batch_norm=False, dtype=torch.float32),
        Clip21(0.1, clip_threshold=1.0),
        grid={"step_size": [3e38, 1e38]},
        grid_dir=str(out),
    )
    summary = RunSummary(dirpath=str(tmp_path))
    with pytest.raises(NonFiniteLossError, match="every configuration"):
        _fit(module, tmp_path / "all", 6, callbacks=[summary])
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["status"].startswith("failed: NonFiniteLossError")
    assert data["grid"] == {
        "configurations": 2,
        "finished": 0,
        "failed": 2,
        "results": str(out / "results.csv"),
    }
    with open(data["grid"]["results"]) as f:
        rows = list(csv.DictReader(f))
    assert [r["step_size"] for r in rows] == ["3e+38", "1e+38"]
    assert all(r["status"].startswith("failed: non-finite training loss at round") for r in rows)


def test_grid_results_are_a_sweep_that_report_draws(tmp_path):
    alg = AlphaNormEC(0.05, beta=0.1, alpha=0.01)
    grid = {"beta": [0.1, 1.0], "step_size": [0.01, 0.1, 0.5]}
    module = GridModule(_model(dtype=torch.float32), alg, grid=grid, grid_dir=str(tmp_path / "out"))
    _fit(
        module,
        tmp_path / "grid",
        6,
        limit_val_batches=None,
        val_check_interval=3,
        log_every_n_steps=2,
    )
    with (tmp_path / "out" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["beta"], r["step_size"]) for r in rows] == [
        (b, g) for b in ("0.1", "1.0") for g in ("0.01", "0.1", "0.5")
    ]
    assert {r["status"] for r in rows} == {"finished"}
    for k, row in enumerate(rows):
        summary = json.loads((tmp_path / "out" / "runs" / row["run"] / "summary.json").read_text())
        assert summary["config"]["model"]["algorithm"]["class_path"].endswith("AlphaNormEC")
        assert summary["config"]["model"]["algorithm"]["init_args"]["beta"] == float(row["beta"])
        accuracy = module.configurations[k].curves["val/acc"]
        assert [r for r, _ in accuracy] == [3, 6]
        assert float(row["final_val_accuracy"]) == accuracy[-1][1]
        best = max(accuracy, key=lambda p: p[1])
        assert (float(row["best_val_accuracy"]), int(row["best_val_round"])) == (best[1], best[0])
        # the test set is evaluated once, at the end, for every configuration's final model
        (test,) = module.configurations[k].curves["test/acc"]
        assert test[0] == 6 and float(row["final_test_accuracy"]) == test[1]
        # the accuracy is that of the configuration's own model
        module.load_grid_configuration(k)
        module.model.eval()
        dm = _data(torch.float32)
        dm.setup("fit")
        correct = total = 0
        for inputs, targets in dm.val_dataloader():
            correct += int((module.model(inputs).argmax(-1) == targets).sum())
            total += len(targets)
        assert correct / total == pytest.approx(accuracy[-1][1])
        correct = sum(int((module.model(x).argmax(-1) == y).sum()) for x, y in dm.test_dataloader())
        assert correct / len(dm.test_dataset) == pytest.approx(test[1])
        assert [r for r, _ in module.configurations[k].curves["train/loss"]] == [1, 3, 5, 6]
    paths = {p.name for p in make_report(tmp_path / "out" / "results.csv", tmp_path / "report")}
    assert {"heatmap.png", "curves.png", "table.md"} <= paths


def test_a_grid_summary_reports_its_best_configuration_without_a_warning(tmp_path, recwarn):
    """A grid's own summary.json reported no validation accuracy nor training loss and warned
    "no metric 'val/acc' was logged" (RunSummary read the metrics before the grid logged them,
    and read ``val/acc`` and ``train/loss``, which a grid does not log): it now reports the best
    configuration's, named."""
    module = GridModule(
        _model(dtype=torch.float32),
        Clip21(0.1, clip_threshold=1.0),
        grid={"step_size": [0.01, 0.5]},
        grid_dir=str(tmp_path / "out"),
    )
    _fit(
        module,
        tmp_path / "grid",
        4,
        callbacks=[RunSummary(dirpath=str(tmp_path))],
        limit_val_batches=None,
        val_check_interval=2,
    )
    assert not [str(w.message) for w in recwarn if "no metric" in str(w.message)]
    data = json.loads((tmp_path / "summary.json").read_text())
    accuracies = [module.configurations[k].curves["val/acc"] for k in range(2)]
    assert data["val_accuracy_metric"] == "grid/best_val_acc"
    assert data["train_loss_metric"] == "grid/min_train_loss"
    assert data["final_train_loss"] == pytest.approx(
        min(module.configurations[k].curves["train/loss"][-1][1] for k in range(2))
    )
    assert data["final_val_accuracy"] == pytest.approx(max(a[-1][1] for a in accuracies))
    assert data["best_val_accuracy"] == pytest.approx(max(v for a in accuracies for _, v in a))


def test_grid_resume_is_bit_identical(tmp_path):
    def run(name, ckpt_path=None, callbacks=()):
        alg = AlphaNormEC(0.05, beta=0.1, alpha=0.01, noise=DPNoise(epsilon=8.0, seed=3))
        module = GridModule(
            _model(dtype=torch.float32), alg, grid={"beta": [0.1, 1.0], "noise.epsilon": [2.0, 8.0]}
        )
        _fit(
            module,
            tmp_path / name,
            8,
            callbacks=list(callbacks),
            enable_checkpointing=True,
            ckpt_path=ckpt_path,
        )
        return module

    full = run("full")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    run("first", callbacks=[ckpt, StopAt(4)])
    (path,) = (tmp_path / "ckpt").glob("*.ckpt")
    resumed = run("resumed", ckpt_path=str(path))
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), k
    for a, b in zip(full.grid_algorithms, resumed.grid_algorithms):  # the streams' key
        assert int(a.rounds_done) == int(b.rounds_done) == 8
    assert [c.curves for c in full.configurations] == [c.curves for c in resumed.configurations]
    assert full.privacy_ledger.accountant.steps == resumed.privacy_ledger.accountant.steps == 8
    for k in range(4):  # every configuration's own ledger went on from the checkpoint's
        a, b = full.grid_ledger(k), resumed.grid_ledger(k)
        assert a.rounds_accounted == b.rounds_accounted == 8 and a.epsilon() == b.epsilon()
    assert full.grid_ledger(0).epsilon() < full.grid_ledger(1).epsilon()  # ε = 2 vs 8


def test_a_grid_from_a_finished_checkpoint_only_warns(tmp_path):
    """No rounds left: a single run tests the checkpoint's model, a grid only says so (it tests
    its configurations in its training loop), told by its class attribute."""
    assert FederatedModule.tests_finished_checkpoint and not GridModule.tests_finished_checkpoint

    def module():
        return GridModule(
            _model(dtype=torch.float32),
            AlphaNormEC(0.05, beta=0.1, alpha=0.01),
            grid={"beta": [0.1, 1.0]},
        )

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    _fit(module(), tmp_path / "first", 2, callbacks=[ckpt], enable_checkpointing=True)
    (path,) = (tmp_path / "ckpt").glob("*.ckpt")
    again = module()
    with pytest.warns(UserWarning, match="no rounds left to train") as warned:
        _fit(again, tmp_path / "again", 2, ckpt_path=str(path))
    note = again.summary_entries()["no_rounds_left"]
    assert "evaluated on the test set" not in note and any(note in str(w.message) for w in warned)
    assert "final_test_loss" not in again.summary_entries()


def test_a_killed_and_resumed_grid_reports_what_the_uninterrupted_grid_does(tmp_path):
    """Checkpoint at round 4, evaluations every 3 rounds: the resumed grid does not evaluate
    round 4 (a single run does, for its curves; a grid would record nothing of it, at the cost
    of a pass per configuration), so its history and best accuracy are the uninterrupted
    grid's (an extra evaluation in them could make another configuration the best)."""
    evaluate = dict(limit_val_batches=None, val_check_interval=3, check_val_every_n_epoch=None)
    validated = Recorder()  # the rounds at which Lightning's validation loop ran

    def run(name, ckpt_path=None, callbacks=()):
        alg = AlphaNormEC(0.05, beta=0.1, alpha=0.01)
        module = GridModule(
            _model(dtype=torch.float32), alg, grid={"beta": [0.1, 1.0], "alpha": [0.01, 1.0]}
        )
        _fit(
            module,
            tmp_path / name,
            8,
            enable_checkpointing=True,
            ckpt_path=ckpt_path,
            callbacks=[validated, *callbacks],
            **evaluate,
        )
        return module

    full = run("full")
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt",
        every_n_train_steps=4,
        save_top_k=-1,
        save_on_train_epoch_end=False,
    )
    run("first", callbacks=[ckpt, StopAt(4)])
    path = next(p for p in (tmp_path / "ckpt").glob("*.ckpt") if p.name == "round=000004.ckpt")
    validated.rounds = []
    resumed = run("resumed", ckpt_path=str(path))
    assert validated.rounds == [6, 8]
    rounds = sorted({r for c in full.configurations for r, _ in c.curves.get("val/acc", [])})
    assert rounds == [3, 6, 8]
    assert [c.curves for c in full.configurations] == [
        c.curves for c in resumed.configurations
    ]  # results.csv is written from it


@pytest.mark.parametrize(
    "grid, message",
    [
        ({}, "grid"),
        ({"nope": [1.0]}, "'nope'"),
        ({"beta": []}, "beta"),
        ({"beta": 0.1}, "beta"),
        ({"beta": [0.1, -1.0]}, "beta"),
    ],
)
def test_bad_grid_fails_at_construction(grid, message):
    with pytest.raises(ValueError, match=message):
        GridModule(_model(), AlphaNormEC(0.1, beta=0.1, alpha=0.01), grid=grid)


@pytest.mark.parametrize("chunk", [0, 2.5, True])
def test_bad_grid_chunk(chunk):
    with pytest.raises(ValueError, match="grid_chunk"):
        GridModule(
            _model(), AlphaNormEC(0.1, beta=0.1, alpha=0.01), grid={"beta": [1.0]}, grid_chunk=chunk
        )


def test_private_configurations_with_their_own_epsilon_keep_their_own_ledgers(
    tmp_path, monkeypatch
):
    """A grid over the target ε (``noise.epsilon``) and the step size: each configuration's σ
    is calibrated to its own ε and its ledger accounts it as its separate run's does; iterates,
    σ and certified ε equal the separate runs' (a checkpoint keeps every ledger: the resume
    test)."""
    noise = DPNoise(epsilon=8.0, calibration="target", seed=3)
    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=noise)
    grid = {"noise.epsilon": [2.0, 8.0], "step_size": [0.1, 0.05]}
    module = GridModule(_model(), alg, grad_backend="vmap", grid=grid, grid_dir=str(tmp_path / "g"))
    solved = []  # σ is solved once per target ε: the step size does not enter the calibration
    plan._solve_once.cache_clear()
    monkeypatch.setattr(
        plan, "calibrate_noise_std", lambda **kw: solved.append(kw) or calibrate_noise_std(**kw)
    )
    _fit(module, tmp_path / "grid", 3)
    assert sorted(kw["target_epsilon"] for kw in solved) == [2.0, 8.0]
    stds = [module.grid_ledger(k).noise_std for k in range(4)]
    assert stds[0] == stds[1] > stds[2] == stds[3]  # ε = 2 needs more noise than ε = 8
    assert [module.grid_ledger(k).rounds_accounted for k in range(4)] == [3] * 4
    for k, target in enumerate([2.0, 2.0, 8.0, 8.0]):
        assert module.grid_ledger(k).epsilon() == pytest.approx(target, rel=1e-2)
        summary = json.loads(
            next((tmp_path / "g" / "runs").glob(f"{k:04d}-*/summary.json")).read_text()
        )
        assert summary["epsilon"] == module.grid_ledger(k).epsilon()
        assert summary["privacy"]["target_epsilon"] == target and summary["private"] is True
    _assert_equals_separate_runs(module, alg, "vmap", 3, tmp_path, True)


@pytest.mark.parametrize(
    "grid, message",
    [
        ([{"beta": 0.1}, {"alpha": 0.1}], "same parameters"),
        ([], "non-empty list"),
        ({"noise.epsilon": [1.0]}, "noise"),  # the algorithm adds no noise
        ([{"nope.x": 1}], "'nope.x'"),
        ([{"beta.x": 1.0}], "not settings or an object"),
    ],
)
def test_bad_points_and_nested_parameters_fail_at_construction(grid, message):
    with pytest.raises(ValueError, match=message):
        GridModule(_model(), AlphaNormEC(0.1, beta=0.1, alpha=0.01), grid=grid)


def test_a_grid_given_as_points_trains_exactly_those():
    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=DPNoise(epsilon=8.0))
    points = [{"step_size": 0.2, "noise.epsilon": 1.0}, {"step_size": 0.1, "noise.epsilon": 4.0}]
    module = GridModule(_model(), alg, grid=points)
    assert module.grid_points == points
    assert [a.step_size for a in module.grid_algorithms] == [0.2, 0.1]
    assert [a.noise.epsilon for a in module.grid_algorithms] == [1.0, 4.0]
    assert alg.noise.epsilon == 8.0  # the algorithm's own settings are not touched


def test_grid_points_order_is_the_sweep_order():
    points = grid_points(AlphaNormEC(0.1, 0.1, 0.1), {"beta": [1, 2], "alpha": [3, 4]})
    assert points == [
        {"beta": 1, "alpha": 3},
        {"beta": 1, "alpha": 4},
        {"beta": 2, "alpha": 3},
        {"beta": 2, "alpha": 4},
    ]


REPO = Path(__file__).resolve().parents[1]
GRIDS = [
    ("alpha_normec", "alpha_normec", 96),
    ("dpsgd_smoothed_normalization", "dpsgd", 16),
    ("clip21", "clip21", 16),
]


@pytest.mark.parametrize("base, overlay, size", GRIDS, ids=[g[1] for g in GRIDS])
def test_paper_002_grid_overlays_match_their_sweeps(base, overlay, size, tmp_path, monkeypatch):
    """Each grid overlay builds the configurations of the sweep file it replaces."""
    monkeypatch.chdir(tmp_path)
    cli = PrivFedCLI(
        args=[
            "--config",
            str(REPO / f"configs/paper/alpha_normec/{base}.yaml"),
            "--config",
            str(REPO / f"configs/paper/grid_paper002_{overlay}.yaml"),
            "--trainer.logger",
            "false",
        ],
        run=False,
    )
    sweep = load_sweep(REPO / f"configs/sweeps/paper002_{overlay}.yaml")
    # the sweep's seed axis is not a grid parameter: a grid takes it through a sweep over --seed
    expected = {
        repr({k.rsplit(".", 1)[-1]: v for k, v in p.items() if k != "seed"})
        for p in sweep_grid(sweep)
    }
    assert len(cli.model.grid_points) == size
    assert sorted(map(repr, cli.model.grid_points)) == sorted(expected)


def test_grid_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"),
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "2",
            "--model.grid",
            '{"step_size": [0.1, 0.2], "beta": [0.1, 1.0]}',
            "--model.grid_dir",
            "grid",
        ]
    )
    with open("grid/results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"finished"}
    assert all(float(r["epsilon"]) > 0 for r in rows)  # the quickstart is private
    # the quickstart's W&B logger (offline) got the table as an artifact; teardown() waits for
    # W&B's service to close the run log (see tests/test_cli.py)
    wandb.teardown()
    (run_log,) = tmp_path.glob("logs/wandb/offline-run-*/run-*.wandb")
    assert b"grid-results" in run_log.read_bytes()


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_oracle_with_given_client_buffers(backend):
    """Given every client's own buffers, the oracle uses them (not the model's), leaves them
    untouched, and returns the clients' updated copies; shape and name mistakes are refused."""
    model = _model()
    oracle = GradientOracle(model, torch.nn.CrossEntropyLoss(), backend)
    x = oracle.layout.flatten(model)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(3, 8, 64, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 10, (3, 8), generator=g)
    plain = oracle(x, inputs, targets)
    averaged = oracle._pending_buffers
    own = {k: b.unsqueeze(0).repeat(3, *[1] * b.dim()) for k, b in model.named_buffers()}
    shifted = {k: v + 1 if v.is_floating_point() else v for k, v in own.items()}
    before = {k: v.clone() for k, v in shifted.items()}
    out = oracle(x.repeat(3, 1), inputs, targets, buffers=own)
    torch.testing.assert_close(out.grads, plain.grads)  # training mode: batch statistics
    for k, v in oracle.client_buffers.items():
        ref = v.mean(0) if v.is_floating_point() else v[0]
        torch.testing.assert_close(ref, averaged[k])
    assert oracle._pending_buffers is None  # nothing to commit into the model
    oracle(x.repeat(3, 1), inputs, targets, buffers=shifted)
    for k, v in shifted.items():
        assert torch.equal(v, before[k])
        if v.is_floating_point() and "running_mean" in k:  # r ← (1 − m) r + m·batch mean
            assert not torch.allclose(oracle.client_buffers[k], own[k])
    with pytest.raises(ValueError, match="shape"):
        oracle(x, inputs, targets, buffers={k: v[:2] for k, v in own.items()})
    with pytest.raises(ValueError, match="buffers"):
        oracle(x, inputs, targets, buffers={})


def test_gradient_norm_measures_and_stops_each_configuration(tmp_path):
    """Paper 003's metric in a grid: every configuration's ||∇f(x)|| curve and rounds to the
    target equal its separate run's; each stops at its own target round; the run stops when
    every configuration has."""
    data = dict(batch_size=64)

    def logistic():
        torch.manual_seed(0)
        return MLP(64, [], 10).double()

    def norm_callback():
        return GradientNorm(every_n_rounds=1, target=0.3, stop_at_target=True)

    alg = DistributedDPSGD(0.5)
    module = GridModule(logistic(), alg, grid={"step_size": [0.01, 0.5, 1.0]})
    _fit(module, tmp_path / "grid", 30, data=_data(**data), callbacks=[norm_callback()])
    assert module.global_step == 30  # γ = 0.01 never gets there
    for k, point in enumerate(module.grid_points):
        single, callback = (
            FederatedModule(logistic(), rebuild_algorithm(alg, point)),
            norm_callback(),
        )
        _fit(single, tmp_path / f"s{k}", 30, data=_data(**data), callbacks=[callback])
        curve = module.configurations[k].curves["train/full_grad_norm"]
        assert [r for r, _ in curve] == [r for r, _ in callback.history]
        torch.testing.assert_close(
            torch.tensor([v for _, v in curve]), torch.tensor([v for _, v in callback.history])
        )
        assert module.grid_entries(k)["rounds_to_target"] == callback.rounds_to_target
        assert module.configurations[k].status == "finished"  # what report.py keeps, as for a sweep
        if callback.rounds_to_target is None:
            assert "stopped_reason" not in module.grid_entries(k)
        else:
            reason = module.grid_entries(k)["stopped_reason"]
            assert reason.startswith("full gradient norm")
            assert single.global_step == callback.rounds_to_target
    reached = [module.grid_entries(k)["rounds_to_target"] for k in range(3)]
    assert reached[0] is None and reached[1] is not None and reached[2] is not None
    with (tmp_path / "grid" / "grid" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["rounds_to_target"] for r in rows] == ["", str(reached[1]), str(reached[2])]
    assert all(r["final_full_grad_norm"] for r in rows)
    assert [r["rounds"] for r in rows] == ["30", str(reached[1]), str(reached[2])]
    # the report keeps the configurations stopped at their target (paper 003's figures)
    written = {p.name for p in make_report(tmp_path / "grid" / "grid" / "results.csv")}
    # no validation ran: no curve can be selected, and the table says so (no empty figure)
    assert written == {"rounds_to_target.png", "table.md", "table.csv"}
    md = (tmp_path / "grid" / "grid" / "report" / "table.md").read_text()
    assert "curves.png: not drawn: no run has final_val_accuracy" in md
    table = (tmp_path / "grid" / "grid" / "report" / "table.csv").read_text().splitlines()
    assert len(table) == 1 + 3
    # when every configuration reaches the target the run stops there
    module = GridModule(logistic(), alg, grid={"step_size": [0.5, 1.0]})
    _fit(module, tmp_path / "both", 30, data=_data(**data), callbacks=[norm_callback()])
    assert module.global_step == max(reached[1:])


FAMILIES = [
    "dp_alpha_normec",
    "dp_clip21",
    "ef21",
    "dpsgd_clip",
    "dp_fed_alpha_normec",
    "dp_fedavg_clip",
    "dp_fedavg_per_sample_clipping",
    "dp_fedavg_per_update_clipping",
    "porter_dp",
    "porter_gc",
    "beer",
    "soteriafl",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_every_algorithm_family_in_a_grid_equals_its_separate_runs(name, tmp_path, monkeypatch):
    """Shipped algorithm configs (client sampling, local steps, per-example clipping, gossip,
    compression, noise): a 2-configuration grid over the step size, and for the private ones the
    noise (the target ε, or the noise multiplier), against the two runs: iterates, and each
    configuration's σ and certified ε from its own ledger."""
    monkeypatch.chdir(tmp_path)
    config = str(REPO / f"configs/algorithms/{name}.yaml")
    base = [
        "--config",
        config,
        "--trainer.logger",
        "false",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.callbacks",
        "[]",
    ]

    def fit(*extra, run=True):
        cli = PrivFedCLI(args=[*base, *extra], run=False)
        if run:
            trainer(tmp_path, max_steps=3).fit(cli.model, datamodule=cli.datamodule)
        return cli.model

    algorithm = fit(run=False).algorithm
    step, noise = algorithm.step_size, algorithm.noise
    points = [{"step_size": step}, {"step_size": step / 2}]
    if noise is not None:  # the second configuration at half the ε (or twice the noise)
        field = "epsilon" if noise.epsilon is not None else "noise_multiplier"
        value = getattr(noise, field)
        points[0][f"noise.{field}"], points[1][f"noise.{field}"] = value, 2 * value
        if field == "epsilon":
            points[1]["noise.epsilon"] = value / 2
    grid = fit("--model.grid", json.dumps(points))
    assert [c.status for c in grid.configurations] == ["finished", "finished"]
    assert not torch.equal(grid.grid_params[0], grid.grid_params[1])
    for k, point in enumerate(points):
        args = [
            a for key, v in point.items() for a in (f"--model.algorithm.init_args.{key}", str(v))
        ]
        single = fit(*args)
        x = single.layout.flatten(single.model)
        torch.testing.assert_close(grid.grid_params[k], x, rtol=1e-6, atol=1e-7)
        own = grid.grid_ledger(k)
        assert (own is None) == (single.privacy_ledger is None)
        if own is not None:
            assert own.accountant.steps == single.privacy_ledger.accountant.steps
            assert own.noise_std == single.privacy_ledger.noise_std
            assert own.report()["epsilon"] == single.privacy_report()["epsilon"]
    if noise is not None:  # the two configurations were calibrated apart
        assert grid.grid_ledger(0).noise_std != grid.grid_ledger(1).noise_std
