"""Rounds everywhere (progress bar, checkpoint names, a checkpoint at the end of every fit) and
nothing lost (checkpoints written atomically, one log directory per run)."""

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.regression import PlainRegression
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities.warnings import PossibleUserWarning

from pl_privfed.callbacks import RoundCheckpoint, RoundProgressBar, check_checkpoint_file
from pl_privfed.cli import main
from pl_privfed.logdir import reserve_log_dir

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")


def test_progress_bar_counts_rounds_across_epochs(tmp_path, monkeypatch, capsys):
    """Today: "Epoch 1: 100%| 5/5" bars, one per 5-round Lightning epoch."""
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            QUICKSTART,
            "--trainer.logger",
            "false",
            "--trainer.max_steps",
            "12",
            "--trainer.val_check_interval",
            "5",
        ]
    )
    out = capsys.readouterr().out.replace("\r", "\n")
    assert "round 12/12" in out and "Epoch" not in out and "v_num" not in out
    final = [line for line in out.splitlines() if line.startswith("round 12/12")][-1]
    assert "loss=" in final and "ε(server)=" in final and "acc=" in final  # ε names its adversary
    assert "Validation" not in out  # no second bar for the evaluations between rounds


def test_progress_bar_total_and_resume(tmp_path):
    bar = RoundProgressBar()
    trainer = pl.Trainer(
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[bar],
    )
    trainer.fit(PlainRegression())  # 8 batches per epoch
    assert bar.train_progress_bar.total == 24 and bar.train_progress_bar.n == 24
    assert RoundProgressBar.total_rounds(pl.Trainer(max_steps=300, logger=False)) == 300


def test_checkpoints_are_named_in_rounds_and_written_at_the_end_of_every_fit(tmp_path, monkeypatch):
    """Today: ``epoch=3-step=20.ckpt``, and no checkpoint at all when no evaluation ran."""
    monkeypatch.chdir(tmp_path)
    base = ["fit", "--config", QUICKSTART, "--trainer.enable_progress_bar", "false"]
    main(
        [
            *base,
            "--trainer.max_steps",
            "7",
            "--trainer.val_check_interval",
            "5",
            "--trainer.logger",
            "false",
            "--trainer.default_root_dir",
            "a",
        ]
    )
    assert [p.name for p in (tmp_path / "a/checkpoints").iterdir()] == ["round=000007.ckpt"]
    main(
        [
            *base,
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "50",
            "--trainer.logger",
            "false",
            "--trainer.default_root_dir",
            "b",
        ]
    )
    (ckpt,) = (tmp_path / "b/checkpoints").iterdir()
    assert ckpt.name == "round=000004.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 4
    check_checkpoint_file(ckpt)
    # the run resumes from it (which is kept), and its own last round is saved beside it;
    # round 4 is inside the quickstart's second 5-round epoch, which Lightning warned about
    # ("your dataloader is not resumable"): the round loader is, and says so
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PossibleUserWarning)
        main(
            [
                *base,
                "--trainer.max_steps",
                "6",
                "--trainer.val_check_interval",
                "50",
                "--trainer.logger",
                "false",
                "--trainer.default_root_dir",
                "b",
                "--ckpt_path",
                str(ckpt),
            ]
        )
    assert not [w for w in caught if "resuming from a checkpoint" in str(w.message)]
    names = sorted(p.name for p in (tmp_path / "b/checkpoints").iterdir())
    assert names == ["round=000004.ckpt", "round=000006.ckpt"]


class DiskFullOnSecondSave(TorchCheckpointIO):
    """Writes a few bytes of the second checkpoint, then fails (a full disk, a killed job)."""

    def __init__(self):
        self.saves = 0

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.saves += 1
        if self.saves == 2:
            Path(path).write_bytes(b"PK\x03\x04 only the start")
            # as Lightning's fsspec transaction reports it: its staging file in the system's
            # temporary folder
            raise OSError(28, "No space left on device", "/tmp/tmpk2x9q1")
        super().save_checkpoint(checkpoint, path, storage_options)


@pytest.mark.parametrize("callback", [RoundCheckpoint, ModelCheckpoint])
def test_checkpoints_are_written_atomically(callback, tmp_path):
    """A save that fails part-way leaves no truncated file under a checkpoint's name (today's
    ModelCheckpoint does), and the previous checkpoint stays whole."""
    checkpoint = callback(
        dirpath=str(tmp_path),
        every_n_train_steps=2,
        save_top_k=-1,
        filename="round={step:06d}",
        auto_insert_metric_name=False,
    )
    trainer = pl.Trainer(
        max_steps=6,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint],
        plugins=[DiskFullOnSecondSave()],
    )
    with pytest.raises(OSError, match="No space left") as info:
        trainer.fit(PlainRegression())
    names = sorted(p.name for p in tmp_path.iterdir())
    if callback is ModelCheckpoint:  # the behaviour RoundCheckpoint fixes
        assert names == ["round=000002.ckpt", "round=000004.ckpt"]
        with pytest.raises(ValueError, match="not a complete PyTorch checkpoint"):
            check_checkpoint_file(tmp_path / "round=000004.ckpt")
        return
    assert names == ["round=000002.ckpt"]  # no partial file left behind either
    check_checkpoint_file(tmp_path / "round=000002.ckpt")
    # the error names the checkpoint folder and the file, not the staging file in /tmp
    # (issue 30), and so does the command's one line
    from pl_privfed.cli import error_line

    assert info.value.filename == str(tmp_path)
    assert error_line(info.value) == (
        f"cannot write {str(tmp_path)!r}: No space left on device (saving round=000004.ckpt)",
        1,
    )


def test_log_versions_are_reserved_atomically(tmp_path):
    """Two runs that start together each get a version: today both chose ``version_0``
    (Lightning lists the directories; the first write comes much later)."""
    first = CSVLogger(tmp_path, name="run")
    second = CSVLogger(tmp_path, name="run")
    assert first.version == second.version == 0  # Lightning's own choice, before any write
    first, second = CSVLogger(tmp_path, name="run"), CSVLogger(tmp_path, name="run")
    reserve_log_dir(first)
    reserve_log_dir(second)
    assert (first.version, second.version) == (0, 1)
    assert (tmp_path / "run/version_0").is_dir() and (tmp_path / "run/version_1").is_dir()
    explicit = CSVLogger(tmp_path, name="run", version="mine")
    reserve_log_dir(explicit)
    assert explicit.version == "mine" and not (tmp_path / "run/mine").exists()


@pytest.mark.slow
def test_two_runs_started_together_get_their_own_directories(tmp_path):
    config = tmp_path / "csv_only.yaml"
    config.write_text(
        "trainer:\n  logger:\n    class_path: pytorch_lightning.loggers.CSVLogger\n"
        "    init_args: {save_dir: logs, name: quickstart}\n"
    )
    args = [
        sys.executable,
        "-m",
        "pl_privfed.cli",
        "fit",
        "--config",
        QUICKSTART,
        "--config",
        str(config),
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "3",
        "--trainer.enable_progress_bar",
        "false",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 400
    for proc in procs:
        _, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        assert proc.returncode == 0, err
    versions = sorted(p.name for p in (tmp_path / "logs/quickstart").iterdir())
    assert versions == ["version_0", "version_1"]
    for version in versions:
        folder = tmp_path / "logs/quickstart" / version
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["rounds"] == 3
        rows = (folder / "metrics.csv").read_text().splitlines()
        assert len([r for r in rows if r.split(",")[0] != "epoch"]) >= 1
        assert (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir()


def test_a_config_replaces_a_default_callback_of_its_kind(tmp_path, monkeypatch):
    """The CLI's defaults are not configurable from YAML; a callback of the same kind listed in
    the config takes the default's place (one RunSummary, one checkpoint callback)."""
    from pl_privfed.callbacks import RunSummary
    from pl_privfed.cli import PrivFedCLI

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "callbacks.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n"
        "    - class_path: pl_privfed.callbacks.RoundCheckpoint\n"
        "      init_args: {every_n_train_steps: 2, save_top_k: -1}\n"
        "    - class_path: pl_privfed.callbacks.RunSummary\n"
        "      init_args: {accuracy_key: test/acc, verbose: false}\n"
    )
    args = ["--config", QUICKSTART, "--config", str(config), "--trainer.logger", "false"]
    cli = PrivFedCLI(args=args, run=False)
    kinds = [type(c) for c in cli.trainer.callbacks]
    assert kinds.count(RunSummary) == 1 and kinds.count(RoundCheckpoint) == 1
    assert kinds.count(RoundProgressBar) == 1
    assert not next(c for c in cli.trainer.callbacks if isinstance(c, RunSummary)).verbose
    main(
        [
            "fit",
            *args,
            "--trainer.max_steps",
            "5",
            "--trainer.val_check_interval",
            "50",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            "r",
        ]
    )
    names = sorted(p.name for p in (tmp_path / "r/checkpoints").iterdir())
    assert names == ["round=000002.ckpt", "round=000004.ckpt", "round=000005.ckpt"]
    quiet = PrivFedCLI(
        args=[
            *args[:2],
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_checkpointing",
            "false",
        ],
        run=False,
    )
    kinds = [type(c) for c in quiet.trainer.callbacks]
    assert RoundProgressBar not in kinds and RoundCheckpoint not in kinds


@pytest.mark.slow
def test_progress_without_a_terminal_is_a_few_plain_lines(tmp_path):
    """Issue 31: piped to a file, a 100-round fit wrote 214 carriage returns (every round drawn
    twice). Without a terminal the bar prints one plain line every tenth of the run, each after
    that round's evaluation, and nothing is redrawn."""
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pl_privfed.cli",
                "fit",
                "--config",
                str(REPO / "configs/demo/fedavg_private.yaml"),
                "--trainer.logger",
                "false",
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.count("\r") <= 5
    lines = [line for line in text.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in lines] == [f"{k}/100" for k in range(10, 101, 10)]
    assert "acc=0.875" in lines[-1] and "ε(server)=7.997" in lines[-1]  # round 100's validation


def test_the_terminal_bar_draws_each_round_once(capsys):
    """Every round was drawn twice when a Lightning epoch ended with it (here: every 8th)."""
    bar = RoundProgressBar(plain=False)
    trainer = pl.Trainer(
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[bar],
    )
    trainer.fit(PlainRegression())  # 8 batches per epoch, 24 rounds
    drawn = capsys.readouterr().out.replace("\r", "\n")
    for k in range(1, 24):
        assert drawn.count(f"round {k}/24 ") == 1, k
    with pytest.raises(ValueError, match="plain must be true, false or null"):
        RoundProgressBar(plain="yes")
