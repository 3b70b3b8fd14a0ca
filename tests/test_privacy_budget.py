"""PrivacyBudget in a plain (non-federated) LightningModule and in the FederatedModule."""

import json

import dp_accounting
import pytest
import pytorch_lightning as pl
import torch
from helpers.regression import PlainRegression
from helpers.training import StopAt
from pytorch_lightning.callbacks import ModelCheckpoint

from pl_privfed import FederatedModule
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.callbacks import PrivacyBudget, RunSummary
from pl_privfed.datamodules import DigitsDataModule
from pl_privfed.models import MLP
from pl_privfed.privacy import DPNoise


def plain_trainer(tmp_path, callbacks, **kwargs):
    return pl.Trainer(
        max_epochs=100,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        **kwargs,
    )


def first_step_over(epsilon, nm, q, delta=1e-5):
    """The first step at which dp-accounting's PLD accountant (the package's default) certifies
    more than ``epsilon``."""
    acc = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.GaussianDpEvent(nm)
    if q < 1:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    for step in range(1, 10_000):
        acc.compose(event)
        if acc.get_epsilon(delta) > epsilon:
            return step
    raise AssertionError


@pytest.mark.slow
def test_stops_before_the_step_that_exceeds_the_budget(tmp_path):
    budget = PrivacyBudget(epsilon=1.0, delta=1e-5, noise_multiplier=3.0, sample_rate=0.125)
    summary = RunSummary(dirpath=str(tmp_path))
    trainer = plain_trainer(tmp_path, [budget, summary])
    trainer.fit(PlainRegression())
    over = first_step_over(1.0, 3.0, 0.125)
    assert over > 10
    assert trainer.global_step == over - 1
    assert budget.spent <= 1.0 < budget._epsilon_after([(3.0, 0.125)])
    assert budget.stopped_step == over - 1
    # logged: the accountant's cheap upper bound (coarse PLD); the stop and summary: exact
    logged = float(trainer.callback_metrics["privacy/epsilon"])
    assert budget.spent * (1 - 1e-6) <= logged <= 1.02 * budget.spent  # (logged as float32)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert "privacy budget" in data["stopped_reason"]


def test_budget_too_small_for_a_single_step(tmp_path):
    budget = PrivacyBudget(epsilon=0.01, noise_multiplier=0.5, sample_rate=1.0)
    trainer = plain_trainer(tmp_path, [budget])
    trainer.fit(PlainRegression())
    assert trainer.global_step == 0 and budget.stopped_step == 0


def test_plain_module_without_mechanisms_needs_arguments(tmp_path):
    """Without mechanisms or arguments it warns (once) and claims no ε, instead of failing
    (tests/test_callbacks_portable.py checks the summary)."""
    budget = PrivacyBudget(epsilon=1.0)
    with pytest.warns(UserWarning, match="privacy_mechanisms.*noise_multiplier") as record:
        plain_trainer(tmp_path, [budget], max_steps=5).fit(PlainRegression())
    assert sum("PrivacyBudget" in str(w.message) for w in record) == 1
    assert budget.summary_entries() == {} and budget.stopped_step is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": 1.0, "delta": 2.0}, "delta"),
        ({"epsilon": 1.0, "noise_multiplier": 1.0}, "both"),
        ({"epsilon": 1.0, "noise_multiplier": 1.0, "sample_rate": 0.0}, "sample_rate"),
    ],
)
def test_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrivacyBudget(**kwargs)


def _federated(tmp_path, callbacks, max_steps=40, ckpt_path=None):
    torch.manual_seed(0)
    module = FederatedModule(
        MLP(64, [], 10),
        AlphaNormEC(0.1, 0.1, 0.01, noise=DPNoise(noise_multiplier=10.0, seed=1)),
    )
    trainer = pl.Trainer(
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )
    trainer.fit(
        module, datamodule=DigitsDataModule(num_clients=4, batch_size=8), ckpt_path=ckpt_path
    )
    return trainer, module


def test_federated_module_protocol_and_resume(tmp_path):
    over = first_step_over(2.0, 10.0, 1.0)
    assert 5 < over < 40
    budget = PrivacyBudget(epsilon=2.0)
    trainer, module = _federated(tmp_path / "a", [budget])
    assert trainer.global_step == over - 1 < 40
    assert budget.spent == pytest.approx(module.privacy_ledger.accountant.get_epsilon(1e-5))
    # one ε key: the module's privacy/epsilon (today the callback added privacy_budget/epsilon)
    # logged: the accountant's cheap upper bound (coarse PLD); the stop and summary: exact
    logged = float(trainer.callback_metrics["privacy/epsilon"])
    assert budget.spent * (1 - 1e-6) <= logged <= 1.02 * budget.spent  # (logged as float32)
    assert not [k for k in trainer.callback_metrics if k.startswith("privacy_budget/")]
    remaining = trainer.callback_metrics["privacy/budget_remaining"]
    assert remaining == pytest.approx(2.0 - budget.spent)
    # interrupted at round 5, resumed: the accounting continues and stops at the same round
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=5, save_top_k=-1)
    _federated(tmp_path / "b", [PrivacyBudget(epsilon=2.0), ckpt, StopAt(5)])
    resumed_budget = PrivacyBudget(epsilon=2.0)
    trainer, resumed = _federated(
        tmp_path / "c", [resumed_budget], ckpt_path=str(next((tmp_path / "ck").glob("*.ckpt")))
    )
    assert trainer.global_step == over - 1
    # the budget reads the run's ledger (one history, carried by the module's checkpoint)
    assert resumed.privacy_ledger.accountant.steps == over - 1
    assert resumed_budget.accountant.steps == 0
    assert resumed_budget.spent == pytest.approx(budget.spent)


def test_a_noiseless_run_is_reported_not_private_instead_of_epsilon_zero(tmp_path, capsys):
    """PrivacyBudget on a federation without noise: a warning, no ε logged, and summary.json
    says ``private: false`` (it printed ε = 0.000 before)."""

    torch.manual_seed(0)
    module = FederatedModule(MLP(64, [], 10), AlphaNormEC(0.1, 0.1, 0.01))
    budget = PrivacyBudget(epsilon=2.0)
    summary = RunSummary(dirpath=str(tmp_path))
    trainer = pl.Trainer(
        max_steps=3,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=[budget, summary],
    )
    with pytest.warns(UserWarning, match="adds no noise: the run is not private"):
        trainer.fit(module, datamodule=DigitsDataModule(num_clients=4, batch_size=8))
    assert trainer.global_step == 3
    assert "privacy/epsilon" not in trainer.callback_metrics
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["private"] is False and data["epsilon"] is None and data["delta"] is None
    assert data["privacy_budget"]["private"] is False
    assert data["privacy_budget"]["epsilon_spent"] is None
    line = capsys.readouterr().out
    assert "not private (no noise)" in line and "epsilon=0.000" not in line
