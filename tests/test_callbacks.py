"""CommunicationCost and OperatorStatistics, in plain modules and in the FederatedModule."""

import json
import math
import re
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.regression import PlainRegression
from torch import nn

from pl_privfed import FederatedModule
from pl_privfed.algorithms import EF21, AlphaNormEC
from pl_privfed.callbacks import CommunicationCost, OperatorStatistics, RunSummary, TrainingCurves
from pl_privfed.communication import count_nonzeros, message_bits
from pl_privfed.datamodules import QuadraticDataModule
from pl_privfed.models import HalfSquaredError, QuadraticModel
from pl_privfed.operators import TopK
from pl_privfed.privacy import DPNoise


def bits(vectors, value_bits=32):
    """Bits of each row of ``vectors`` (its non-zeros counted as the engine does)."""
    return message_bits(count_nonzeros(vectors), vectors.shape[-1], value_bits)


def fit(module, callbacks, datamodule=None, **kwargs):
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
        **kwargs,
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer


def test_message_bits_known_sizes():
    d = 1000  # index: ceil(log2 1000) = 10 bits
    dense = torch.randn(2, d) + 10
    sparse = torch.zeros(3, d)
    sparse[:, :5] = 1.0
    assert bits(dense).tolist() == [32_000.0, 32_000.0]
    assert bits(sparse).tolist() == [5 * 42.0] * 3
    assert bits(sparse, value_bits=16).tolist() == [5 * 26.0] * 3
    half = torch.ones(1, d)
    half[:, :300] = 0  # 700 non-zeros: sparse (29,400) < dense (32,000)
    assert bits(half).item() == 700 * 42


def quadratic_module(algorithm, n=4, d=64):
    centers = torch.randn(n, d, generator=torch.Generator().manual_seed(0)).tolist()
    dm = QuadraticDataModule(centers=centers)
    return FederatedModule(QuadraticModel(d, 1.0), algorithm, HalfSquaredError()), dm


def test_communication_of_ef21_topk_and_private_normec():
    n, d, rounds = 4, 64, 5
    comm = CommunicationCost()
    module, dm = quadratic_module(EF21(0.1, compressor=TopK(k=3), memory_init="zeros"), n, d)
    fit(module, [comm], dm, max_steps=rounds)
    up = n * 3 * (32 + 6) * rounds  # k values + 6-bit indices (d = 64) per client
    down = n * 32 * d * rounds  # the dense model to every client
    assert comm.totals == {"client_to_server": up, "server_to_client": down}
    assert comm.summary_entries()["communication_total_bits"]["client_to_server"] == up

    comm = CommunicationCost()
    module, dm = quadratic_module(
        AlphaNormEC(0.1, 0.1, 0.01, noise=DPNoise(noise_multiplier=1.0)), n, d
    )
    fit(module, [comm], dm, max_steps=rounds)
    assert comm.totals["client_to_server"] == n * 32 * d * rounds  # noisy messages are dense


def test_communication_in_a_plain_module():
    comm = CommunicationCost(workers=4)
    trainer = fit(PlainRegression(), [comm], max_steps=3)
    d = 4  # Linear(3, 1)
    assert comm.last == {"client_to_server": 4 * 32 * d, "server_to_client": 4 * 32 * d}
    assert comm.totals["client_to_server"] == 3 * 4 * 32 * d
    assert trainer.callback_metrics["comm/client_to_server_total_bits"] == 3 * 4 * 32 * d
    with pytest.raises(ValueError, match="workers"):
        CommunicationCost(workers=0)


class RecordGradNorm(pl.Callback):
    def __init__(self):
        self.norms = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        g = torch.cat([p.grad.reshape(-1) for p in pl_module.parameters()])
        self.norms.append(g.norm().item())


def test_operator_statistics_in_a_plain_module():
    stats = OperatorStatistics(clip_threshold=0.5)
    record = RecordGradNorm()
    trainer = fit(PlainRegression(), [record, stats], max_steps=6)
    assert trainer.callback_metrics["operators/grad_norm"].item() == pytest.approx(
        record.norms[-1], rel=1e-6
    )
    clipped = sum(n > 0.5 for n in record.norms) / len(record.norms)
    assert stats.summary_entries()["operator_means"]["clip_fraction"] == pytest.approx(clipped)
    mean_after = sum(min(n, 0.5) for n in record.norms) / len(record.norms)
    assert stats.summary_entries()["operator_means"]["norm_after"] == pytest.approx(
        mean_after, rel=1e-6
    )


def test_operator_statistics_of_the_federated_module():
    stats = OperatorStatistics()
    module, dm = quadratic_module(AlphaNormEC(0.1, 0.1, 0.01, noise=DPNoise(noise_multiplier=1.0)))
    trainer = fit(module, [stats], dm, max_steps=4)
    logged = {k for k in trainer.callback_metrics if k.startswith("operators/")}
    assert logged == {
        f"operators/{k}"
        for k in ("clip_fraction", "norm_before", "update_norm", "ef_gap", "noise_to_signal")
    }
    # Norm_α output has norm < 1; every client is scaled down at these sizes
    assert trainer.callback_metrics["operators/update_norm"] < 1
    assert trainer.callback_metrics["operators/clip_fraction"] == 1.0
    # noise std 1 per coordinate on 4 clients x 64 coordinates vs messages of norm < 1
    nsr = trainer.callback_metrics["operators/noise_to_signal"].item()
    assert nsr > math.sqrt(4 * 64) / 4 / 2


class PlainWithValidation(PlainRegression):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))

    def val_dataloader(self):
        return self.train_dataloader()

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss


def test_training_curves_in_a_plain_module(tmp_path):
    curves = TrainingCurves(keys=["train_loss", "val_loss", "never_logged"], dirpath=str(tmp_path))
    trainer = pl.Trainer(
        max_steps=12,
        val_check_interval=4,
        check_val_every_n_epoch=None,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[curves],
    )
    trainer.fit(PlainWithValidation())
    assert [s for s, _ in curves.history["train_loss"]] == list(range(1, 13))
    assert [s for s, _ in curves.history["val_loss"]] == [4, 8, 12]  # not re-recorded per step
    assert curves.history["never_logged"] == []
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    restored = TrainingCurves(keys=["train_loss", "val_loss"])
    restored.load_state_dict(curves.state_dict())
    assert restored.history["val_loss"] == curves.history["val_loss"]


def test_docs_example_with_all_callbacks_in_a_plain_lightning_project(tmp_path):
    """examples/callbacks_in_plain_lightning.py (shown in docs/callbacks.md) runs and reports."""
    import runpy

    path = Path(__file__).parents[1] / "examples" / "callbacks_in_plain_lightning.py"
    example = runpy.run_path(str(path))
    trainer = example["main"](str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / "curves.png").stat().st_size > 1000
    budget = summary["privacy_budget"]
    assert summary["private"] and summary["epsilon"] == budget["epsilon_spent"] <= 3.0
    assert summary["stopped_reason"].startswith("privacy budget: step")
    assert budget["stopped_step"] == trainer.global_step == summary["rounds"] < 30 * 22
    assert summary["communication_total_bits"]["client_to_server"] == 32 * 2410 * summary["rounds"]
    assert 0 < summary["operator_means"]["clip_fraction"] < 1
    assert summary["final_val_accuracy"] > 0.5 and summary["final_test_accuracy"] is None
    # docs/callbacks.md quotes this run: its numbers are the ones the run reports
    doc = " ".join((Path(__file__).parents[1] / "docs" / "callbacks.md").read_text().split())
    (quoted,) = re.findall(
        r"That example stops after (\d+) steps because the (\d+)\w* would spend ε = ([\d.]+) > 3 "
        r"\(ε = ([\d.]+) spent at δ = 1e-5\), with ([\d.]+) % validation accuracy; (\d+) % of",
        doc,
    )
    would_spend = re.search(r"would spend epsilon=([\d.]+) >", summary["stopped_reason"])[1]
    assert quoted == (
        str(summary["rounds"]),
        str(summary["rounds"] + 1),
        would_spend,
        f"{summary['epsilon']:.3f}",
        f"{100 * summary['final_val_accuracy']:.1f}",
        f"{100 * summary['operator_means']['clip_fraction']:.0f}",
    )


def test_log_artifact_without_wandb_logger_needs_no_wandb(tmp_path, monkeypatch):
    """A run with loggers off must finish on a machine where wandb is not installed."""
    import sys

    import pytorch_lightning as pl

    from pl_privfed.logdir import log_artifact

    monkeypatch.setitem(sys.modules, "wandb", None)  # ``import wandb`` now raises ImportError
    trainer = pl.Trainer(logger=False, default_root_dir=tmp_path)
    log_artifact(trainer, tmp_path / "summary.json", "run-summary")


class PlainEveryThird(PlainRegression):
    """Logs ``every3`` at steps 0, 3, 6, ... only (like ε with ``epsilon_every: 3``)."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        if self.global_step % 3 == 0:
            self.log("every3", float(self.global_step))
        return loss


def test_training_curves_record_a_metric_only_where_it_was_logged(tmp_path):
    """Today a metric logged every N steps was re-recorded at every step: a staircase."""
    curves = TrainingCurves(keys=["train_loss", "every3"], dirpath=str(tmp_path))
    fit(PlainEveryThird(), [curves], max_steps=10)
    # logged at global steps 0, 3, 6, 9; recorded after the step, at rounds done 1, 4, 7, 10
    assert curves.history["every3"] == [(1, 0.0), (4, 3.0), (7, 6.0), (10, 9.0)]
    assert [s for s, _ in curves.history["train_loss"]] == list(range(1, 11))
    rows = (tmp_path / "curves.csv").read_text().splitlines()
    assert sum(r.startswith("every3,") for r in rows) == 4


def test_training_curves_of_epsilon_logged_every_few_rounds(tmp_path):
    module, dm = quadratic_module(
        AlphaNormEC(0.1, 0.1, 0.01, noise=DPNoise(noise_multiplier=1.0)), 4, 16
    )
    module.epsilon_every = 4
    curves = TrainingCurves(dirpath=str(tmp_path))
    fit(module, [curves], dm, max_steps=10)
    assert [r for r, _ in curves.history["privacy/epsilon"]] == [4, 8, 10]  # and the last round


class PlainValAcc(PlainWithValidation):
    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("accuracy", 0.5)


def test_run_summary_reports_the_metrics_it_is_given_and_warns_about_missing_ones(tmp_path):
    """A module logging its accuracy under another name than ``accuracy_key`` got a null
    accuracy silently; now RunSummary warns naming what was logged, and reads the name it is
    given."""
    import json

    def fit_with_validation(callback):
        pl.Trainer(
            max_steps=4,
            val_check_interval=2,
            check_val_every_n_epoch=None,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[callback],
        ).fit(PlainValAcc())

    summary = RunSummary(dirpath=str(tmp_path))
    with pytest.warns(UserWarning, match=r"no metric 'val/acc' was logged.*accuracy.*accuracy_key"):
        fit_with_validation(summary)
    assert json.loads((tmp_path / "summary.json").read_text())["final_val_accuracy"] is None
    named = RunSummary(
        dirpath=str(tmp_path / "named"),
        accuracy_key="accuracy",
        loss_key="train_loss",
        val_loss_key="val_loss",  # not named: a warning too (issue 49)
    )
    import warnings

    with warnings.catch_warnings():  # (PlainValAcc is unseeded: whether its loss grows over
        # 4 rounds, which RunSummary warns about as a divergence, depends on the test order)
        warnings.filterwarnings("error", message="RunSummary: (?!the training loss grew)")
        fit_with_validation(named)
    data = json.loads((tmp_path / "named" / "summary.json").read_text())
    assert data["final_val_accuracy"] == 0.5 and data["final_val_round"] == 4
    assert data["final_train_loss"] > 0 and data["final_val_loss"] is not None


def test_default_callbacks_follow_the_trainer_settings():
    from pl_privfed import default_callbacks
    from pl_privfed.callbacks import (
        CommunicationCost,
        OperatorStatistics,
        RoundCheckpoint,
        RoundProgressBar,
        RunSummary,
    )

    kinds = [type(c) for c in default_callbacks()]
    assert kinds == [
        RunSummary,
        OperatorStatistics,
        CommunicationCost,
        TrainingCurves,
        RoundProgressBar,
        RoundCheckpoint,
    ]
    kinds = [type(c) for c in default_callbacks(progress_bar=False, checkpoint=False)]
    assert RoundProgressBar not in kinds and RoundCheckpoint not in kinds
    assert default_callbacks(accuracy_key="val/acc")[0].accuracy_key == "val/acc"


def test_docs_budget_example_on_the_digits(tmp_path, capsys):
    """docs/callbacks.md's ``PrivacyBudget`` on the command line (the digits DP-α-NormEC with
    ``epsilon=4``): it stops where the page says, with the ε the page quotes."""
    from pl_privfed.cli import main

    config = Path(__file__).parents[1] / "configs" / "algorithms" / "dp_alpha_normec_digits.yaml"
    main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.callbacks+=pl_privfed.callbacks.PrivacyBudget",
            "--trainer.callbacks.epsilon=4",
            "--output_dir",
            str(tmp_path),
            "--trainer.logger",
            "false",
        ]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    doc = " ".join((Path(__file__).parents[1] / "docs" / "callbacks.md").read_text().split())
    (quoted,) = re.findall(
        r"stops after (\d+) of its 300 rounds \(round (\d+) would spend ε = ([\d.]+); ε = ([\d.]+) "
        r"spent, ([\d.]+) under the papers' convention",
        doc,
    )
    would_spend = re.search(r"would spend epsilon=([\d.]+) >", summary["stopped_reason"])[1]
    assert quoted == (
        str(summary["rounds"]),
        str(summary["rounds"] + 1),
        would_spend,
        f"{summary['epsilon']:.3f}",
        f"{summary['epsilon_paper_convention']:.3f}",
    )
