"""The FederatedModule inside a real Trainer: iterates, resume exactness, failures."""

import csv
import json

import pytest
import torch
from helpers.algorithms import ref_error_feedback, smoothed
from helpers.training import Recorder, StopAt, trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from pl_privfed import FederatedModule, NonFiniteLossError
from pl_privfed.algorithms import EF21, AlphaNormEC, DistributedDPSGD
from pl_privfed.callbacks import RunSummary
from pl_privfed.datamodules import DigitsDataModule, DirichletPartitioner, QuadraticDataModule
from pl_privfed.models import MLP, HalfSquaredError, QuadraticModel
from pl_privfed.operators import RandKBiased, TopK
from pl_privfed.privacy import DPNoise


def test_module_iterates_match_reference():
    """Through Lightning (data module, oracle, flattening) the iterates are Algorithm 1's."""
    torch.manual_seed(0)
    centers = [[3.0, -1.0, 0.5], [-2.0, 0.0, 1.0], [0.5, 2.0, -3.0], [1.0, 1.0, 1.0]]
    x0 = [2.0, -1.0, 0.5]
    dm = QuadraticDataModule(centers=centers)
    alg = AlphaNormEC(
        0.05,
        beta=0.3,
        alpha=0.5,
        server_normalization=False,
        noise=DPNoise(noise_multiplier=0.2, seed=4),
    )
    module = FederatedModule(QuadraticModel(3, x0), alg, criterion=HalfSquaredError())
    trainer(max_steps=20).fit(module, datamodule=dm)
    ref = ref_error_feedback(
        torch.tensor(centers, dtype=torch.float64),
        torch.tensor(x0, dtype=torch.float64),
        lambda v: smoothed(v, 0.5),
        0.3,
        0.05,
        False,
        20,
        std=0.2 * 2,
        seed=4,
    )  # (std = multiplier × the replace-one sensitivity 2 of Norm_α)
    # float32 model vs float64 reference; the noise stream is drawn in float32 by the module
    torch.testing.assert_close(module.model.x.detach().double(), ref[-1], atol=1e-4, rtol=1e-4)
    assert module.privacy_ledger.accountant.steps == 20


def _digits_run(tmp_path, max_steps, ckpt_path=None, callbacks=()):
    torch.manual_seed(0)
    dm = DigitsDataModule(
        num_clients=5, batch_size=16, partitioner=DirichletPartitioner(concentration=0.5, seed=1)
    )
    alg = AlphaNormEC(
        0.05, beta=0.1, alpha=0.01, memory_init="gradient", noise=DPNoise(epsilon=8.0, seed=3)
    )
    module = FederatedModule(MLP(64, [16], 10, batch_norm=True), alg)
    t = trainer(tmp_path, max_steps=max_steps, callbacks=list(callbacks), enable_checkpointing=True)
    t.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module


def test_resume_is_bit_identical(tmp_path):
    full = _digits_run(tmp_path / "full", 14)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=6, save_top_k=-1)
    interrupted = _digits_run(tmp_path / "first", 14, callbacks=[ckpt, StopAt(6)])
    assert interrupted.global_step == 6
    (path,) = list((tmp_path / "ckpt").glob("*.ckpt"))
    resumed = _digits_run(tmp_path / "resumed", 14, ckpt_path=str(path))
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), k
    # the noise streams are keyed by the round: rounds_done (a buffer) is their whole state
    assert int(full.algorithm.rounds_done) == int(resumed.algorithm.rounds_done) == 14
    assert full.privacy_ledger.accountant.steps == resumed.privacy_ledger.accountant.steps == 14
    assert full.privacy_ledger.epsilon(1e-5) == resumed.privacy_ledger.epsilon(1e-5)


def test_resume_restores_operator_generator(tmp_path):
    def run(max_steps, ckpt_path=None, callbacks=()):
        torch.manual_seed(0)  # same initial model (the CLI's seed_everything does this)
        dm = DigitsDataModule(num_clients=3, batch_size=8)
        module = FederatedModule(MLP(64, [], 10), EF21(0.5, compressor=RandKBiased(ratio=0.2)))
        trainer(
            tmp_path, max_steps=max_steps, callbacks=list(callbacks), enable_checkpointing=True
        ).fit(module, datamodule=dm, ckpt_path=ckpt_path)
        return module

    full = run(9)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=4, save_top_k=-1)
    run(9, callbacks=[ckpt, StopAt(4)])
    resumed = run(9, ckpt_path=str(next((tmp_path / "c").glob("*.ckpt"))))
    assert torch.equal(full.model.net[1].weight, resumed.model.net[1].weight)


def test_non_finite_loss_stops_with_round_number():
    dm = QuadraticDataModule(centers=[[1.0], [-3.0]])
    module = FederatedModule(
        QuadraticModel(1, [2.0]), DistributedDPSGD(1000.0), criterion=HalfSquaredError()
    )
    with pytest.raises(NonFiniteLossError, match=r"round \d+"):
        trainer(max_steps=100).fit(module, datamodule=dm)
    assert 0 < module.global_step < 100


def test_topk_k_out_of_range_fails_before_training():
    dm = DigitsDataModule(num_clients=2, batch_size=4)
    module = FederatedModule(MLP(64, [], 10), EF21(0.1, compressor=TopK(k=10**7)))
    with pytest.raises(ValueError, match="k must be in"):
        trainer(max_steps=2).fit(module, datamodule=dm)
    assert module.global_step == 0


def test_summary_json_and_privacy_report(tmp_path):
    dm = DigitsDataModule(num_clients=4, batch_size=16)
    alg = AlphaNormEC(0.05, 0.1, 0.01, noise=DPNoise(epsilon=8.0))
    module = FederatedModule(MLP(64, [8], 10), alg)
    summary = RunSummary(dirpath=str(tmp_path))
    t = trainer(
        tmp_path,
        max_steps=10,
        callbacks=[summary],
        limit_val_batches=None,
        val_check_interval=5,
        check_val_every_n_epoch=None,
    )
    t.fit(module, datamodule=dm)
    import json

    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["status"] == "finished" and data["rounds"] == 10
    assert 0 <= data["final_val_accuracy"] <= data["best_val_accuracy"] <= 1
    assert data["final_val_round"] == 10 and data["best_val_round"] in (5, 10)
    assert 0 <= data["final_test_accuracy"] <= 1 and data["final_test_round"] == 10
    assert data["private"] and data["delta"] == 1e-5
    assert data["epsilon"] == pytest.approx(module.privacy_ledger.accountant.get_epsilon(1e-5))
    assert data["privacy"]["calibration_rounds"] == 10
    assert data["final_train_loss"] > 0


# --------------------------------------------------------------------------- honest evaluation


def _accuracy(module, dataset):
    x, y = dataset.tensors
    with torch.no_grad():
        return (module.model.eval()(x).argmax(-1) == y).float().mean().item()


def _small_run(
    tmp_path,
    max_steps,
    val_every,
    ckpt_path=None,
    callbacks=(),
    recorder=None,
    eval_batch_size=1024,
    **kwargs,
):
    torch.manual_seed(0)
    dm = DigitsDataModule(num_clients=4, batch_size=16, eval_batch_size=eval_batch_size)
    module = FederatedModule(MLP(64, [8], 10), AlphaNormEC(0.1, 0.1, 0.01))
    recorder = recorder or Recorder()
    summary = RunSummary(dirpath=str(tmp_path), verbose=False)
    t = trainer(
        tmp_path,
        max_steps=max_steps,
        limit_val_batches=None,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        callbacks=[summary, recorder, *callbacks],
        **kwargs,
    )
    t.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, dm, recorder.rounds, json.loads((tmp_path / "summary.json").read_text())


def test_the_last_round_is_evaluated_on_validation_data_and_test_once_at_the_end(tmp_path):
    """max_steps 7 with an evaluation every 5 rounds: rounds 5 and 7 are validated (7 once),
    the final metrics are round 7's, val/* is the held-out split and test/* the test set."""
    module, dm, rounds, data = _small_run(tmp_path, 7, 5)
    assert rounds == [5, 7]
    assert data["final_val_round"] == 7 and data["final_test_round"] == 7
    assert data["final_val_accuracy"] == pytest.approx(_accuracy(module, dm.val_dataset))
    assert data["final_test_accuracy"] == pytest.approx(_accuracy(module, dm.test_dataset))
    assert (
        data["best_val_round"] in (5, 7) and data["best_val_accuracy"] >= data["final_val_accuracy"]
    )
    assert "best_test_accuracy" not in data  # a best-of over the test set is never reported


def test_test_metrics_reach_the_loggers_at_the_last_round(tmp_path):
    from pytorch_lightning.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="csv")
    _small_run(tmp_path, 4, 2, logger=logger)
    with open(f"{logger.log_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # Lightning logs round k's metrics at step k - 1; the test point shares the last round's
    val = [int(r["step"]) for r in rows if r.get("val/acc")]
    test = [int(r["step"]) for r in rows if r.get("test/acc")]
    assert val == [1, 3] and test == [3]


def test_early_stopping_on_validation_loss(tmp_path):
    from pytorch_lightning.callbacks import EarlyStopping

    stop = EarlyStopping(monitor="val/loss", patience=0, min_delta=10.0)  # stops at once
    module, _, rounds, data = _small_run(tmp_path, 40, 2, callbacks=[stop])
    assert module.global_step == 4 and rounds == [2, 4] and stop.stopped_epoch is not None
    assert data["final_val_round"] == 4 and data["final_test_round"] == 4


def test_the_resume_evaluation_does_not_change_the_best_accuracy():
    """The evaluation a resumed run makes at its first round is not one the uninterrupted run
    made: RunSummary's best (and final) values ignore it, the next evaluation counts."""
    from types import SimpleNamespace

    summary = RunSummary(verbose=False)
    summary.load_state_dict({"curves": {"val/acc": [[3, 0.5]], "val/loss": [[3, 1.0]]}})
    module = SimpleNamespace(resume_evaluation=True)
    fake = SimpleNamespace(
        sanity_checking=False, global_step=4, callback_metrics={"val/acc": 0.9, "val/loss": 0.1}
    )
    summary.on_validation_end(fake, module)
    assert (summary.best_accuracy, summary.best_round, summary.evaluated_round) == (0.5, 3, 3)
    module.resume_evaluation, fake.global_step = False, 6
    summary.on_validation_end(fake, module)
    assert (summary.best_accuracy, summary.best_round, summary.evaluated_round) == (0.9, 6, 6)


def test_resume_evaluates_the_checkpoint_round_once(tmp_path):
    """A checkpoint written between evaluations (round 4, evaluations every 3 rounds): the
    resumed run evaluates round 4 first. A checkpoint written right after an evaluation (round
    6): the resumed run does not evaluate round 6 again."""
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "c4", every_n_train_steps=4, save_top_k=-1, save_on_train_epoch_end=False
    )
    _small_run(tmp_path / "first", 9, 3, callbacks=[ckpt, StopAt(5)], enable_checkpointing=True)
    path = next(p for p in (tmp_path / "c4").glob("*.ckpt") if p.name == "round=000004.ckpt")
    _, _, rounds, data = _small_run(
        tmp_path / "resumed", 9, 3, ckpt_path=str(path), enable_checkpointing=True
    )
    assert rounds == [4, 6, 9] and data["final_val_round"] == 9
    after_eval = ModelCheckpoint(dirpath=tmp_path / "c6", save_top_k=-1)  # saved after validation
    _small_run(tmp_path / "second", 6, 3, callbacks=[after_eval], enable_checkpointing=True)
    path = next(p for p in (tmp_path / "c6").glob("*.ckpt") if p.name == "round=000006.ckpt")
    _, _, rounds, _ = _small_run(
        tmp_path / "again", 9, 3, ckpt_path=str(path), enable_checkpointing=True
    )
    assert rounds == [9]


@pytest.mark.parametrize("saved_at", [4, 6])
def test_the_resume_evaluation_covers_the_whole_validation_set(tmp_path, saved_at):
    """The validation set in five batches (144 examples, eval_batch_size 32) and a checkpoint
    written after the evaluation of round 3, at round 4 (between evaluations) or at round 6
    (before that round's evaluation): the resumed run's first val/acc is the accuracy of the
    checkpoint's model on the whole validation set, and every evaluation it shares with the
    uninterrupted run logs the same val/acc and val/loss. (Restored, Lightning's validation
    loop went on from the counters of the checkpoint's last evaluation and stopped after one
    batch: the first val/acc was 3/32.)"""
    from types import SimpleNamespace

    saving = ModelCheckpoint(
        dirpath=tmp_path / "c",
        every_n_train_steps=saved_at,
        save_top_k=-1,
        save_on_train_epoch_end=False,
    )
    full = Recorder()
    _small_run(
        tmp_path / "full",
        9,
        3,
        callbacks=[saving],
        recorder=full,
        eval_batch_size=32,
        enable_checkpointing=True,
    )
    path = tmp_path / "c" / f"round={saved_at:06d}.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["validated_round"] == 3
    saved = SimpleNamespace(model=MLP(64, [8], 10))  # the checkpoint's model, as _accuracy reads
    weights = checkpoint["state_dict"].items()
    saved.model.load_state_dict(
        {k.removeprefix("model."): v for k, v in weights if k.startswith("model.")}
    )
    resumed = Recorder()
    _, dm, rounds, _ = _small_run(
        tmp_path / "resumed", 9, 3, ckpt_path=str(path), recorder=resumed, eval_batch_size=32
    )
    assert len(dm.val_dataloader()) == 5 and rounds == sorted({saved_at, 6, 9})
    assert resumed.metrics[0]["val/acc"] == pytest.approx(_accuracy(saved, dm.val_dataset))
    by_round = dict(zip(rounds, resumed.metrics))
    assert [by_round[r] for r in (6, 9)] == full.metrics[1:]  # full: rounds 3, 6, 9


def test_a_run_summary_state_written_before_curves_keeps_its_best_and_last_values():
    """A checkpoint's RunSummary state from before the record kept curves (best and last values
    with their rounds) resumes with those values, not with nothing."""
    summary = RunSummary(verbose=False)
    summary.load_state_dict(
        {
            "best_accuracy": 0.7,
            "best_round": 2,
            "final_accuracy": 0.6,
            "final_val_loss": 1.0,
            "evaluated_round": 4,
        }
    )
    assert (summary.best_accuracy, summary.best_round, summary.evaluated_round) == (0.7, 2, 4)
    assert summary.curves["val/loss"] == [(4, 1.0)]
