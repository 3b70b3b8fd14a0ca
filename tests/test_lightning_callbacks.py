"""Lightning's own callbacks and loggers see a federation in rounds: ``LearningRateMonitor``
logs the step size, a stop by ``EarlyStopping`` (or any callback) is recorded and said,
``ModelCheckpoint`` names files by round, W&B plots every series against ``round``."""

import csv
import json

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger, WandbLogger

from pl_privfed import FederatedModule
from pl_privfed.algorithms import EF21
from pl_privfed.callbacks import RunSummary
from pl_privfed.datamodules import DigitsDataModule
from pl_privfed.grid import GridModule
from pl_privfed.models import MLP


def fit(tmp_path, callbacks, *, module=None, max_steps=4, **kwargs):
    """A tiny digits federation (4 clients, step size 0.1) evaluated every 2 rounds."""
    options = dict(
        max_steps=max_steps,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )
    options.update(kwargs)
    trainer = pl.Trainer(**options)
    module = module or FederatedModule(MLP(64, [8], 10), EF21(0.1))
    trainer.fit(module, datamodule=DigitsDataModule(num_clients=4, batch_size=16))
    return trainer


def test_learning_rate_monitor_logs_the_step_size_and_checkpoints_count_rounds(tmp_path):
    """Today: ``lr-RoundOptimizer`` 0.0 (a placeholder) and ``epoch=0-step=4.ckpt``."""
    logger = CSVLogger(tmp_path, name="csv")
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt")  # no filename: Lightning's default
    trainer = fit(tmp_path, [LearningRateMonitor(), checkpoints], logger=logger)
    rows = list(csv.DictReader(open(f"{logger.log_dir}/metrics.csv")))
    lrs = [
        float(r["lr-RoundOptimizer/step_size"]) for r in rows if r["lr-RoundOptimizer/step_size"]
    ]
    assert lrs and set(lrs) == {0.1}
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["round=000004.ckpt"]
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.1
    # a second trainer fitting the same (set up) module: its checkpoints count rounds too
    again = ModelCheckpoint(dirpath=tmp_path / "again")
    fit(tmp_path, [again], module=trainer.lightning_module, max_steps=2, logger=False)
    assert [p.name for p in (tmp_path / "again").iterdir()] == ["round=000002.ckpt"]


def test_the_optimizer_follows_a_changed_step_size_and_a_grid_has_one_per_configuration():
    module = FederatedModule(MLP(64, [], 10), EF21(0.1))
    optimizer = module.configure_optimizers()
    module.algorithm.step_size = 0.05  # e.g. a callback's schedule: the next round's lr follows
    optimizer.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.05]
    grid = GridModule(MLP(64, [], 10), EF21(0.1), grid={"step_size": [0.1, 0.3]})
    groups = grid.configure_optimizers().param_groups
    assert [(g["name"], g["lr"]) for g in groups] == [("config_0", 0.1), ("config_1", 0.3)]


class StopAtRoundThree(pl.Callback):
    """Stops the run and gives no reason."""

    def on_train_batch_end(self, trainer, *args):
        trainer.should_stop = trainer.should_stop or trainer.global_step == 3


@pytest.mark.parametrize("stopper", ["early_stopping", "silent"])
def test_a_stop_by_a_callback_is_recorded_and_said(tmp_path, capsys, stopper):
    """Today: ``stopped_reason: null`` and nothing on the console."""
    if stopper == "early_stopping":  # val/acc cannot improve by 0.5: stops at the second check
        callback = EarlyStopping("val/acc", mode="max", patience=1, min_delta=0.5)
        by, reason = "EarlyStopping", "early stopping at round 4: Monitored metric val/acc did not"
    else:
        callback = StopAtRoundThree()
        by, reason = "trainer.should_stop", "stopped at round 3 of 20: trainer.should_stop"
    summary = RunSummary(dirpath=str(tmp_path))
    trainer = fit(tmp_path, [callback, summary], max_steps=20, logger=False)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["rounds"] == trainer.global_step < 20
    assert data["stopped_by"] == by and data["stopped_reason"].startswith(reason)
    assert "Signaling Trainer" not in data["stopped_reason"]
    assert f"stopped by {by}: {reason}" in capsys.readouterr().out


def test_a_run_that_ends_at_its_last_round_names_no_stop(tmp_path, capsys):
    """Also when ``EarlyStopping`` fires at the last round (issue 49: it was recorded as an
    early stop of a run that ran every round)."""
    fires_at_four = EarlyStopping("val/acc", mode="max", patience=1, min_delta=0.5)
    trainer = fit(tmp_path, [fires_at_four, RunSummary(dirpath=str(tmp_path))], logger=False)
    assert trainer.global_step == 4 and fires_at_four.wait_count >= fires_at_four.patience  # fired
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["stopped_by"] is None and data["stopped_reason"] is None
    assert "stopped by" not in capsys.readouterr().out


def test_wandb_plots_every_series_against_the_round(tmp_path, monkeypatch):
    """Today: every series against ``trainer/global_step`` (9 for round 10) and an ``epoch``
    series. A real offline W&B run; its ``log`` and ``define_metric`` calls are recorded."""
    from wandb.sdk.wandb_run import Run

    calls = []
    log, define = Run.log, Run.define_metric

    def record_log(self, data, *args, **kwargs):
        calls.append(("log", dict(data)))
        return log(self, data, *args, **kwargs)

    def record_define(self, name, *args, **kwargs):
        calls.append(("define", name, kwargs.get("step_metric")))
        return define(self, name, *args, **kwargs)

    monkeypatch.setattr(Run, "log", record_log)
    monkeypatch.setattr(Run, "define_metric", record_define)
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="rounds")
    fit(tmp_path, [LearningRateMonitor()], logger=logger, enable_checkpointing=False)
    logger.experiment.finish()
    assert ("define", "round", None) in calls
    assert calls.index(("define", "*", "round")) > calls.index(
        ("define", "*", "trainer/global_step")
    )
    records = [data for kind, data, *_ in calls if kind == "log"]
    assert records and all("round" in r and "epoch" not in r for r in records)
    train = [r["round"] for r in records if "train/loss" in r]
    val = [r["round"] for r in records if "val/acc" in r]
    assert train == [1, 2, 3, 4] and val == [2, 4]  # the rounds done, as the summary counts
    assert {
        r["lr-RoundOptimizer/step_size"] for r in records if "lr-RoundOptimizer/step_size" in r
    } == {0.1}


def test_a_diverging_run_is_named_as_such(tmp_path):
    """Today: only ``train loss=101.4857`` in the result line. A quadratic federation at step
    size 2.5 multiplies the distance to the optimum by -1.5 every round."""
    from pl_privfed.datamodules import QuadraticDataModule
    from pl_privfed.models import HalfSquaredError, QuadraticModel
    from pl_privfed.operators import TopK

    centers = [[1.0, -2.0], [3.0, 0.5]]
    module = FederatedModule(
        QuadraticModel(2, 1.0), EF21(2.5, compressor=TopK(k=2)), HalfSquaredError()
    )
    trainer = pl.Trainer(
        max_steps=8,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[RunSummary(dirpath=str(tmp_path))],
    )
    with pytest.warns(
        UserWarning, match=r"training loss grew from .* \(round 1\) to .* \(round 8\)"
    ):
        trainer.fit(module, datamodule=QuadraticDataModule(centers=centers))
