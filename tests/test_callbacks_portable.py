"""Every callback of ``pl_privfed.callbacks`` on a plain LightningModule that is not a federation:
no exception, and one warning naming what it lacks where it lacks something (issue 22)."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pl_privfed.callbacks as callbacks_package
from pl_privfed.callbacks import (
    CommunicationCost,
    GradientNorm,
    OperatorStatistics,
    PrivacyAudit,
    PrivacyBudget,
    RoundCheckpoint,
    RoundProgressBar,
    RunSummary,
    TrainingCurves,
)

CALLBACK_NAMES = (
    "TrainingCurves",
    "RoundProgressBar",
    "GradientNorm",
    "CommunicationCost",
    "OperatorStatistics",
    "PrivacyBudget",
    "PrivacyAudit",
    "RunSummary",
    "RoundCheckpoint",
)


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))


class Plain(pl.LightningModule):
    """A tiny classifier as any Lightning project writes it: its own metric names, one of them on
    the progress bar, a ``forward`` and no federation."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("my_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("my_acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=8)

    def val_dataloader(self):
        return DataLoader(dataset(), batch_size=8)


class NoForward(Plain):
    """A module whose steps call its layer directly (no ``forward``)."""

    forward = pl.LightningModule.forward

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.layer(x), y)
        self.log("my_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        pass


class ShardsOnly(pl.LightningDataModule):
    """A datamodule with ``shards`` but no ``train_dataset``: GradientNorm ended in an
    ``AttributeError`` traceback."""

    shards = ((0, 1, 2, 3), (4, 5, 6, 7))

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=8)


def fit(tmp_path, callback, module=None, datamodule=None):
    """4 steps (2 epochs of 2 batches: two validations) with ``callback``; the warnings the
    callback gave (those starting with its class name)."""
    trainer = pl.Trainer(
        max_steps=4,
        default_root_dir=tmp_path,
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=isinstance(callback, RoundProgressBar),
        enable_checkpointing=isinstance(callback, RoundCheckpoint),
        num_sanity_val_steps=0,
        callbacks=[callback],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module or Plain(), datamodule=datamodule)
    name = type(callback).__name__
    mine = [str(w.message) for w in caught if str(w.message).startswith(f"{name}:")]
    return trainer, mine


def one_warning(messages: list[str], pattern: str) -> None:
    assert len(messages) == 1, messages
    assert re.search(pattern, messages[0]), messages[0]


def test_every_exported_callback_is_covered():
    exported = {
        name
        for name in callbacks_package.__all__
        if isinstance(getattr(callbacks_package, name), type)
        and issubclass(getattr(callbacks_package, name), pl.Callback)
    }
    assert exported == set(CALLBACK_NAMES)


def test_training_curves_with_default_keys_plot_what_is_logged(tmp_path):
    """Today: nothing written and no word, because none of ``train/loss``, ``val/acc``... is
    logged."""
    curves = TrainingCurves()
    _, messages = fit(tmp_path, curves)
    one_warning(
        messages,
        r"none of its default keys \(train/loss, val/loss, val/acc, "
        r"privacy/epsilon\) was logged.*that were: my_acc, my_loss",
    )
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    rows = (tmp_path / "curves.csv").read_text().splitlines()
    assert {r.split(",")[0] for r in rows[1:]} == {"my_loss", "my_acc"}
    assert [s for s, _ in curves.history["my_loss"]] == [1, 2, 3, 4]
    assert [s for s, _ in curves.history["my_acc"]] == [2, 4]  # after each validation


def test_training_curves_name_the_keys_never_logged(tmp_path):
    curves = TrainingCurves(keys=["my_loss", "val_accuracy"])
    _, messages = fit(tmp_path, curves)
    one_warning(messages, r"no metric 'val_accuracy' was logged.*\(logged: my_acc, my_loss\)")
    assert [s for s, _ in curves.history["my_loss"]] == [1, 2, 3, 4]
    assert "val_accuracy" not in (tmp_path / "curves.csv").read_text()


def test_progress_bar_shows_the_modules_prog_bar_metrics(tmp_path, capsys):
    """Today: the bar showed only its own keys (``train/loss``, ...), hiding ``my_loss``."""
    bar = RoundProgressBar()
    trainer, messages = fit(tmp_path, bar)
    assert messages == []
    shown = bar.get_metrics(trainer, trainer.lightning_module)
    assert set(shown) == {"my_loss"} and shown["my_loss"] == trainer.progress_bar_metrics["my_loss"]
    assert "my_loss=" in capsys.readouterr().out.replace("\r", "\n").splitlines()[-1]
    hidden = RoundProgressBar(prog_bar_metrics=False)
    trainer, _ = fit(tmp_path / "hidden", hidden)
    assert hidden.get_metrics(trainer, trainer.lightning_module) == {}


def test_gradient_norm_without_shards_measures_the_training_set(tmp_path):
    """Without a datamodule: one shard of the training dataloader's dataset. Today a
    ``ValueError`` ended the run."""
    module = Plain()
    module.criterion = nn.CrossEntropyLoss()
    norm = GradientNorm()
    _, messages = fit(tmp_path, norm, module)
    one_warning(
        messages,
        r"no datamodule.shards.*training dataloader's dataset as one shard "
        r"\(all 16 examples",
    )
    assert [r for r, _ in norm.history] == [0, 1, 2, 3, 4]
    x, y = dataset().tensors
    module.zero_grad()
    nn.functional.cross_entropy(module(x), y).backward()
    exact = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in module.parameters()]))
    assert norm.history[-1][1] == pytest.approx(float(exact), rel=1e-5)


def test_gradient_norm_with_shards_but_no_dataset_measures_nothing(tmp_path):
    """Shards without ``train_dataset``: today an ``AttributeError`` traceback."""
    norm = GradientNorm()
    _, messages = fit(tmp_path, norm, Plain(), ShardsOnly())
    one_warning(messages, r"datamodule ShardsOnly has shards but no train_dataset.*not measured")
    assert norm.history == [] and norm.summary_entries()["final_full_grad_norm"] is None


def test_gradient_norm_without_a_criterion_uses_cross_entropy(tmp_path):
    norm = GradientNorm(weighting="examples")
    _, messages = fit(tmp_path, norm, Plain())
    assert len(messages) == 2, messages  # each once, over 5 evaluations
    assert "no datamodule.shards" in messages[0]
    assert "Plain has no criterion attribute" in messages[1] and "cross-entropy" in messages[1]
    assert [r for r, _ in norm.history] == [0, 1, 2, 3, 4]


def test_gradient_norm_on_a_module_without_forward(tmp_path):
    """Today: ``NotImplementedError`` from Lightning's ``forward``."""
    norm = GradientNorm()
    _, messages = fit(tmp_path, norm, NoForward())
    one_warning(messages, r"NoForward has no forward\(\).*not measured")
    assert norm.history == []


def test_privacy_budget_without_mechanisms_warns_and_claims_nothing(tmp_path):
    """Today: a ``ValueError`` at the start of fit."""
    budget = PrivacyBudget(epsilon=1.0)
    summary = RunSummary(accuracy_key="my_acc", loss_key="my_loss", verbose=False)
    trainer = pl.Trainer(
        max_steps=4,
        default_root_dir=tmp_path,
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[budget, summary],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Plain())
    messages = [str(w.message) for w in caught if str(w.message).startswith("PrivacyBudget:")]
    one_warning(
        messages,
        r"Plain has no privacy_mechanisms\(\) method and no noise_multiplier "
        r"and sample_rate were given.*enforces NO budget",
    )
    assert trainer.global_step == 4 and budget.summary_entries() == {}
    assert "privacy/epsilon" not in trainer.callback_metrics
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["private"] is False and data["epsilon"] is None and "privacy_budget" not in data


def test_privacy_audit_on_a_plain_module_audits_nothing(tmp_path):
    """Today: a ``ValueError`` at the start of fit."""
    audit = PrivacyAudit()
    trainer, messages = fit(tmp_path, audit)
    one_warning(
        messages,
        r"audits a FederatedModule's run: Plain has no algorithm and no "
        r"layout attribute.*nothing is audited",
    )
    assert trainer.global_step == 4 and audit.summary_entries() == {}


def test_run_summary_names_each_missing_key_once(tmp_path):
    _, messages = fit(tmp_path, RunSummary(verbose=False))
    assert len(messages) == 2, messages  # the accuracy and the validation loss, once each
    logged = r".*\(logged: my_acc, my_loss\)"
    assert re.search(r"no metric 'val/acc' was logged" + logged, messages[0]), messages[0]
    assert re.search(r"no metric 'val/loss' was logged" + logged, messages[1]), messages[1]
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["rounds"] == 4 and data["final_train_loss"] > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: CommunicationCost(),
        lambda: OperatorStatistics(clip_threshold=1.0),
        lambda: RunSummary(
            accuracy_key="my_acc", loss_key="my_loss", val_loss_key="my_loss", verbose=False
        ),
        lambda: RoundCheckpoint(),
    ],
    ids=["CommunicationCost", "OperatorStatistics", "RunSummary", "RoundCheckpoint"],
)
def test_callbacks_that_need_nothing_of_the_module_work_silently(tmp_path, make):
    callback = make()
    trainer, messages = fit(tmp_path, callback)
    assert messages == [] and trainer.global_step == 4
    if isinstance(callback, CommunicationCost):
        d = sum(p.numel() for p in trainer.lightning_module.parameters())
        assert callback.totals == {"client_to_server": 4 * 32 * d, "server_to_client": 4 * 32 * d}
    elif isinstance(callback, OperatorStatistics):
        assert callback.counts == {"grad_norm": 4, "clip_fraction": 4, "norm_after": 4}
    elif isinstance(callback, RunSummary):
        data = json.loads((tmp_path / "summary.json").read_text())
        assert data["final_val_round"] == 4 and data["final_val_accuracy"] is not None
    else:
        assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["round=000004.ckpt"]
