"""Lightning's edges (issue 49): another namespace's objects named in one line, fast_dev_run
records nothing, a plain datamodule pointed at ``from_datasets``, 16-bit precision refused,
``RunSummary`` names every metric it cannot find, no carriage returns in piped output (the run's
``status`` in its W&B summary: tests/test_run_folders.py)."""

import json

import pytest
import pytorch_lightning as pl
from jsonargparse import Namespace
from torch import nn

import pl_privfed
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.callbacks import RoundProgressBar, RunSummary
from pl_privfed.cli.folders import check_run_config
from pl_privfed.privacy import DPNoise

L = pytest.importorskip("lightning.pytorch")
pll = pytest.importorskip("pl_privfed.lightning")


def module(package=pl_privfed, private=True):
    noise = DPNoise(epsilon=8.0, delta=1e-5, calibration="target") if private else None
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    return package.FederatedModule(
        model, AlphaNormEC(alpha=0.01, step_size=0.5, beta=1.0, noise=noise)
    )


def trainer(lightning=pl, **kwargs):
    options = dict(
        max_steps=2,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    return lightning.Trainer(**{**options, **kwargs})


def data(package=pl_privfed.datamodules):
    return package.DigitsDataModule(num_clients=4, batch_size=16, seed=0)


@pytest.mark.parametrize("case", ["model", "reverse", "callback"])
def test_the_other_namespace_is_named_in_one_line(case, tmp_path, monkeypatch):
    """Before: Lightning's "`model` must be a `LightningModule` ... got `FederatedModule`", and
    another namespace's callbacks taken silently as plain ones (two progress bars)."""
    monkeypatch.chdir(tmp_path)  # a failed fit's summary of the foreign RunSummary goes here
    if case == "model":  # pytorch_lightning's Trainer, the lightning.pytorch module
        fit, model, dm = trainer(), module(pll), data(pll)
        named, use = "pl_privfed.lightning.module.FederatedModule", "from pl_privfed import"
    elif case == "reverse":
        fit, model, dm = trainer(L), module(), data()
        named, use = "pl_privfed.module.FederatedModule", "from pl_privfed.lightning import"
    else:  # the module matches the trainer, a callback does not
        fit, model, dm = trainer(callbacks=[pll.RunSummary()]), module(), data()
        named, use = "callback pl_privfed.lightning.callbacks.summary.RunSummary", "pl_privfed"
    with pytest.raises(TypeError) as info:
        fit.fit(model, datamodule=dm)
    message = str(info.value)
    assert "\n" not in message and named in message and use in message, message
    assert fit.global_step == 0


def test_fast_dev_run_writes_no_summary_and_claims_no_epsilon(tmp_path, capsys):
    fit = trainer(fast_dev_run=True, callbacks=[RunSummary(dirpath=str(tmp_path))])
    fit.fit(module(), datamodule=data())
    assert fit.global_step == 1 and not list(tmp_path.iterdir())
    out = capsys.readouterr().out
    assert "fast_dev_run" in out and "no privacy claim" in out
    assert "ε" not in out and "epsilon" not in out.replace("no privacy claim", "")


def test_a_plain_lightning_datamodule_is_pointed_at_from_datasets():
    class Plain(pl.LightningDataModule):
        def train_dataloader(self):
            return data().train_dataloader()

    with pytest.raises(ValueError, match=r"got Plain: .*FederatedDataModule\.from_datasets"):
        trainer().fit(module(private=False), datamodule=Plain())


def test_a_16_bit_precision_is_refused_in_one_line():
    """Before: ``bf16-mixed`` ran, its clipping and noise in 16-bit autocast, without a word.
    The command refuses it while checking the parsed config, before anything is built."""
    fit = trainer(precision="bf16-mixed")
    with pytest.raises(ValueError, match=r"^trainer.precision='bf16-mixed' is not supported"):
        fit.fit(module(), datamodule=data())
    assert fit.global_step == 0
    for precision in ("16-mixed", "bf16-true", 16):
        config = Namespace(trainer=Namespace(precision=precision, max_steps=2))
        with pytest.raises(ValueError, match=r"^trainer.precision=.* is not supported"):
            check_run_config(config, "fit")
    check_run_config(Namespace(trainer=Namespace(precision="64-true", max_steps=2)), "fit")


def test_run_summary_names_every_metric_it_cannot_find(tmp_path):
    """Before: ``val_loss_key="val_loss"`` wrote ``final_val_loss: null`` without a word."""
    summary = RunSummary(dirpath=str(tmp_path), val_loss_key="val_loss", verbose=False)
    with pytest.warns(UserWarning, match=r"no metric 'val_loss' was logged.*val_loss_key"):
        trainer(callbacks=[summary]).fit(module(private=False), datamodule=data())
    assert json.loads((tmp_path / "summary.json").read_text())["final_val_loss"] is None


def test_piped_output_has_no_carriage_returns(tmp_path, capsys):
    """The sanity check's bar was drawn with carriage returns into a piped log."""
    fit = trainer(
        num_sanity_val_steps=2,
        enable_progress_bar=True,
        default_root_dir=tmp_path,
        callbacks=[RoundProgressBar(), RunSummary(verbose=False)],
    )
    fit.fit(module(private=False), datamodule=data())
    fit.test(fit.lightning_module, datamodule=data())
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err and "round 2/2" in captured.out
