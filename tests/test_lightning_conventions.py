"""What a Lightning user relies on: ``load_from_checkpoint`` of a command's checkpoint, abstract
bases refused and not offered, one seed knob, every file in the run's folder, evaluation
subcommands without a checkpoint callback, a ``--help`` of the package's own classes."""

import json
from pathlib import Path

import pytest
import pytorch_lightning as pl

from pl_privfed import FederatedModule
from pl_privfed.cli import main
from pl_privfed.datamodules import (
    ClassesPerClientPartitioner,
    DigitsDataModule,
    DirichletPartitioner,
)

REPO = Path(__file__).resolve().parents[1]
EF21 = str(REPO / "configs/algorithms/ef21.yaml")
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]


def test_load_from_checkpoint_rebuilds_a_cli_run(tmp_path, monkeypatch):
    """Today: "missing 2 required positional arguments: 'model' and 'algorithm'" (the
    checkpoint held no hyperparameters)."""
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", EF21, *QUIET, "--trainer.max_steps", "20", "--output_dir", "run"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (ckpt,) = (tmp_path / "run" / "checkpoints").glob("*.ckpt")

    module = FederatedModule.load_from_checkpoint(ckpt)
    assert type(module.algorithm).__name__ == "EF21" and module.algorithm.beta == 1.0
    assert type(module.algorithm.compressor).__name__ == "TopK"
    assert module.hparams["model"]["init_args"]["hidden_sizes"] == [32]
    data = DigitsDataModule(
        num_clients=10, batch_size=32, partitioner=DirichletPartitioner(0.5, seed=0)
    )
    trainer = pl.Trainer(
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path / "eval",
    )
    (metrics,) = trainer.test(module, datamodule=data, verbose=False)
    assert metrics["test/acc"] == pytest.approx(summary["final_test_accuracy"], abs=1e-6)
    assert metrics["test/acc"] > 0.5  # the trained model, not a fresh one


def test_a_private_checkpoint_evaluates_under_a_plain_trainer(tmp_path, monkeypatch):
    """Issue 31: a checkpoint of a noise calibrated to ε (``calibration: target``) raised "the
    paper noise calibration needs the number of rounds K" under ``pl.Trainer(logger=False)
    .test``. Evaluation needs no K: the run's calibration (its K, its σ) and its ledger come back
    from the checkpoint, and the test accuracy is the run's."""
    monkeypatch.chdir(tmp_path)
    config = str(REPO / "configs/demo/fedavg_private.yaml")
    main(["fit", "--config", config, *QUIET, "--trainer.max_steps", "10", "--output_dir", "run"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (ckpt,) = (tmp_path / "run" / "checkpoints").glob("*.ckpt")

    module = FederatedModule.load_from_checkpoint(ckpt)
    data = DigitsDataModule(
        num_clients=5,
        batch_size=250,
        seed=0,
        partitioner=ClassesPerClientPartitioner(
            classes_per_client=2, samples_per_client=250, seed=0
        ),
    )
    trainer = pl.Trainer(
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path / "eval",
    )
    (metrics,) = trainer.test(module, datamodule=data, verbose=False)
    assert metrics["test/acc"] == pytest.approx(summary["final_test_accuracy"], abs=1e-6)
    privacy = summary["privacy"]
    assert module.algorithm.noise_std == pytest.approx(privacy["noise_std"], rel=1e-12)
    report = module.privacy_ledger.report()
    assert report["calibration_rounds"] == privacy["calibration_rounds"] == 10
    assert report["rounds_accounted"] == 10
    assert report["epsilon"] == pytest.approx(privacy["epsilon"], rel=1e-9)


def test_python_api_hyperparameters_leave_the_modules_out():
    """Built in Python, the module saves its other arguments (load_from_checkpoint then takes
    model= and algorithm=), with no Lightning warning about nn.Module hyperparameters."""
    import warnings

    from pl_privfed.algorithms import EF21
    from pl_privfed.models import MLP

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = FederatedModule(MLP(64, [8], 10), EF21(step_size=0.5), client_chunk=4)
    assert "model" not in module.hparams and "algorithm" not in module.hparams
    assert module.hparams["client_chunk"] == 4


def fit_help(capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    return capsys.readouterr().out


def test_abstract_algorithms_are_not_offered(capsys, monkeypatch):
    """``fit --help`` lists concrete algorithms only (today it offered FederatedAlgorithm,
    which ended in NotImplementedError at round 1)."""
    text = fit_help(capsys, monkeypatch)
    start = text.index("\n  --model.algorithm ALGORITHM")
    choices = " ".join(text[start : text.index("\n  --model.grid ", start)].split())
    assert "pl_privfed.algorithms.AlphaNormEC" in choices
    for base in ("FederatedAlgorithm,", "LocalUpdateAlgorithm", "DecentralizedAlgorithm"):
        assert f"pl_privfed.algorithms.{base}" not in choices


def test_evaluation_attaches_no_checkpoint_callback_and_says_what_it_scores(
    tmp_path, monkeypatch, capsys, recwarn
):
    """Today ``validate``/``test`` attached the round checkpoint (Lightning warned "dirpath has
    changed" when it read the checkpoint's callback state) and ``test`` without ``--ckpt_path``
    silently scored the untrained model."""
    from pytorch_lightning.callbacks import Checkpoint

    from pl_privfed.cli import PrivFedCLI

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", EF21, *QUIET, "--trainer.max_steps", "5", "--output_dir", "run"])
    (ckpt,) = (tmp_path / "run" / "checkpoints").glob("*.ckpt")
    capsys.readouterr()
    for command in ("validate", "test"):
        cli = PrivFedCLI(
            args=[
                command,
                "--config",
                EF21,
                *QUIET,
                "--output_dir",
                command,
                "--ckpt_path",
                str(ckpt),
            ]
        )
        assert not [c for c in cli.trainer.callbacks if isinstance(c, Checkpoint)]
        assert "scores the model as initialized" not in capsys.readouterr().err
    assert not [w for w in recwarn if "dirpath" in str(w.message)]
    assert not (tmp_path / "validate" / "checkpoints").exists()
    main(["test", "--config", EF21, *QUIET, "--output_dir", "untrained"])
    err = capsys.readouterr().err
    assert "[pl-privfed] test: no --ckpt_path, so this scores the model as initialized" in err


DP_DIGITS = str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")


def test_seed_everything_is_the_one_seed_knob(tmp_path, monkeypatch, capsys):
    """Today ``--seed_everything 1`` changed the model's initialization only: the partition, the
    data order and the noise stayed at seed 0. Now it is ``--seed`` (documented in --help) and
    summary.json lists every seed used."""
    from pl_privfed.cli import PrivFedCLI

    monkeypatch.chdir(tmp_path)
    cli = PrivFedCLI(
        args=["--config", DP_DIGITS, "--trainer.logger=false", "--seed_everything", "3"], run=False
    )
    assert cli.datamodule.seed == 3 and cli.datamodule.partitioner.seed == 3
    assert cli.model.algorithm.noise.seed == 3
    # a config file's seed_everything seeds the model only: a seed set on its own stays
    cli = PrivFedCLI(
        args=["--config", DP_DIGITS, "--trainer.logger=false", "--data.init_args.seed", "9"],
        run=False,
    )
    assert cli.datamodule.seed == 9
    main(
        [
            "fit",
            "--config",
            DP_DIGITS,
            *QUIET,
            "--trainer.max_steps",
            "2",
            "--seed_everything",
            "5",
            "--output_dir",
            "run",
        ]
    )
    seeds = json.loads((tmp_path / "run" / "summary.json").read_text())["seeds"]
    assert seeds["set_by"] == "seed_everything" and seeds["seed_everything"] == 5
    assert seeds["data.init_args.seed"] == 5 and seeds["model.algorithm.init_args.noise.seed"] == 5
    assert seeds["data.init_args.partitioner.init_args.seed"] == 5
    assert set(seeds) == {
        "set_by",
        "seed_everything",
        "data.init_args.seed",
        "data.init_args.partitioner.init_args.seed",
        "model.algorithm.init_args.noise.seed",
    }
    main(
        [
            "fit",
            "--config",
            DP_DIGITS,
            *QUIET,
            "--trainer.max_steps",
            "1",
            "--seed_everything",
            "5",
            "--seed",
            "6",
            "--output_dir",
            "both",
        ]
    )
    seeds = json.loads((tmp_path / "both" / "summary.json").read_text())["seeds"]
    assert seeds["set_by"] == "--seed" and seeds["seed_everything"] == 6
    assert (
        "An integer --seed_everything on the command line without --seed does the same"
        in " ".join(fit_help(capsys, monkeypatch).split())
    )


def test_fit_help_lists_the_package_classes_not_every_torch_module(tmp_path, capsys, monkeypatch):
    """Today ``fit --help`` was 1,995 lines, 1,400 of them every nn.Module subclass of torch
    and Opacus; any nn.Module is still
    accepted by its class_path."""
    from pl_privfed.cli import PrivFedCLI

    text = fit_help(capsys, monkeypatch)
    assert len(text.splitlines()) < 800
    assert "torch.nn.Identity" not in text and "opacus" not in text
    for own in (
        "pl_privfed.models.MLP",
        "pl_privfed.algorithms.EF21",
        "pl_privfed.datamodules.DigitsDataModule",
        "pl_privfed.callbacks.RunSummary",
    ):
        assert own in text
    assert "or any torch.nn.Module by its class_path" in " ".join(text.split())
    monkeypatch.chdir(tmp_path)
    cli = PrivFedCLI(
        args=[
            "--config",
            EF21,
            "--trainer.logger=false",
            "--model.model",
            "torch.nn.Linear",
            "--model.model.init_args.in_features=64",
            "--model.model.init_args.out_features=10",
        ],
        run=False,
    )
    assert type(cli.model.model).__name__ == "Linear"


@pytest.mark.slow
def test_nothing_is_written_outside_the_run_folders(tmp_path, monkeypatch):
    """Today, with ``--trainer.logger false``, summary.json, the curves, config.yaml and
    checkpoints/ landed in the working directory, and ``--output_dir`` left the checkpoints
    there. Each command, from a clean working directory, writes only its intended folder."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def only(*names):
        assert sorted(p.name for p in cwd.iterdir()) == sorted(names)

    def command(*args):
        with pytest.raises(SystemExit) as info:
            main(list(args))
        assert info.value.code == 0

    fit = ["fit", "--config", EF21, *QUIET, "--trainer.max_steps", "2"]
    main(fit)  # no logger, no --output_dir: the run's own lightning_logs/version_0
    only("lightning_logs")
    run = cwd / "lightning_logs" / "version_0"
    assert {"summary.json", "curves.csv", "config.yaml", "checkpoints"} <= {
        p.name for p in run.iterdir()
    }
    main([*fit, "--output_dir", "out"])  # --output_dir holds everything, checkpoints included
    only("lightning_logs", "out")
    (ckpt,) = (cwd / "out" / "checkpoints").glob("*.ckpt")
    for evaluation in ("validate", "test"):
        main([evaluation, "--config", EF21, *QUIET, "--ckpt_path", str(ckpt)])
    only("lightning_logs", "out")
    csv_logger = (
        '{"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": "logs"}}'
    )
    main([*fit, "--trainer.logger", csv_logger])
    only("lightning_logs", "out", "logs")

    sweep = tmp_path / "inputs" / "tiny.yaml"
    sweep.parent.mkdir()
    sweep.write_text(
        "name: tiny\nmethod: grid\nmetric: {name: val/acc, goal: maximize}\n"
        "parameters:\n  model.algorithm.init_args.step_size: {values: [0.3, 0.5]}\n"
        "  model.algorithm.init_args.beta: {values: [1.0]}\n"
        f"command: [pl-privfed, fit, --config, {EF21}, --trainer.max_steps=2, "
        "--trainer.logger=false, --trainer.enable_progress_bar=false, '${args}']\n"
    )
    command("sweep", str(sweep))
    only("lightning_logs", "out", "logs", "sweeps")
    command("report", "sweeps/tiny/results.csv")  # into sweeps/tiny/report/
    only("lightning_logs", "out", "logs", "sweeps")
    command("compare", "sweeps/tiny/results.csv", "--out", "compared")
    only("lightning_logs", "out", "logs", "sweeps", "compared")


def test_load_from_checkpoint_of_a_python_run_takes_the_modules(tmp_path):
    """A module built in Python: its checkpoint holds the other arguments; the model and the
    algorithm are given back to ``load_from_checkpoint``."""
    import pl_privfed
    from pl_privfed.algorithms import EF21
    from pl_privfed.models import MLP

    data = DigitsDataModule(num_clients=5, batch_size=32)
    pl.seed_everything(0)
    module = FederatedModule(MLP(64, [8], 10), EF21(step_size=0.5), client_chunk=2)
    trainer = pl.Trainer(
        max_steps=3,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        callbacks=pl_privfed.default_callbacks(progress_bar=False),
    )
    trainer.fit(module, data)
    (ckpt,) = (tmp_path / "checkpoints").glob("*.ckpt")
    loaded = FederatedModule.load_from_checkpoint(
        ckpt, model=MLP(64, [8], 10), algorithm=EF21(step_size=0.5)
    )
    assert loaded.client_chunk == 2
    for a, b in zip(module.model.parameters(), loaded.model.parameters(), strict=True):
        assert a.detach().equal(b.detach())
