"""Nothing lost on a signal: SIGTERM and Ctrl-C (SIGINT) during ``fit`` finish the round, save
it, write ``summary.json`` saying so and exit ``128 + signal``; resuming from that checkpoint
ends bit-identical to a run that was never stopped."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

#: a small federation that runs many rounds per second on a CPU
TINY = """\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 100000
  val_check_interval: 1000
  check_val_every_n_epoch: null
  num_sanity_val_steps: 0
  log_every_n_steps: 1000
  enable_progress_bar: false
  logger:
    class_path: pytorch_lightning.loggers.CSVLogger
    init_args: {save_dir: logs, name: tiny}
model:
  model:
    class_path: pl_privfed.models.MLP
    init_args: {in_features: 64, hidden_sizes: [8], num_classes: 10}
  algorithm:
    class_path: pl_privfed.algorithms.AlphaNormEC
    init_args: {step_size: 0.1, beta: 0.1, alpha: 0.01}
data:
  class_path: pl_privfed.datamodules.DigitsDataModule
  init_args:
    num_clients: 5
    batch_size: 8
    seed: 0
    partitioner:
      class_path: pl_privfed.datamodules.IIDPartitioner
      init_args: {seed: 1}
"""


def tiny_config(folder: Path) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(TINY)
    return path


def cli(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``pl-privfed <args>`` in a subprocess, in ``folder``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pl_privfed.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def start(folder: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "pl_privfed.cli", *args], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def wait_for(path_glob: str, folder: Path, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(folder.glob(path_glob))
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"{path_glob} never appeared under {folder}")


def final_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


def rounds_of(checkpoint: Path) -> int:
    return int(re.search(r"round=(\d+)", checkpoint.name).group(1))


DDP = ("--trainer.strategy", "ddp", "--trainer.devices", "2")


@pytest.mark.parametrize(
    ("signum", "processes"),
    [(signal.SIGTERM, ()), (signal.SIGINT, ()), (signal.SIGTERM, DDP)],
    ids=["sigterm", "sigint", "sigterm-ddp"],
)
def test_a_signal_saves_the_current_round_and_the_run_resumes_exactly(tmp_path, signum, processes):
    """Under DDP the signal reaches rank 0 (the launcher forwards it); every process stops
    after the same round (they hung in Lightning's handler before). Measured on a 2-core CPU:
    the DDP run resumed from its SIGTERM checkpoint ended bit-identical too."""
    config = tiny_config(tmp_path)
    proc = start(tmp_path, "fit", "--config", str(config), *processes)
    wait_for("logs/tiny/version_0/config.yaml", tmp_path)  # written at setup
    time.sleep(2.0)  # some rounds run (there is no checkpoint before round 1000)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + int(signum), err[-3000:]
    run = tmp_path / "logs/tiny/version_0"
    summary = json.loads((run / "summary.json").read_text())
    name = signal.Signals(signum).name
    assert summary["status"] == f"interrupted: {name} after round {summary['rounds']}"
    stopped = summary["rounds"]
    assert stopped > 0
    saved = sorted((run / "checkpoints").glob("round=*.ckpt"))
    assert [rounds_of(p) for p in saved] == [stopped]  # the current round, not an older one
    where = summary["interrupted"].pop("checkpoint")
    assert summary["interrupted"] == {"signal": name, "round": stopped}
    assert (tmp_path / where).resolve() == saved[0].resolve()
    assert f"resume with --ckpt_path {where}" in out

    if signum != signal.SIGTERM or processes:
        return  # the same checkpoint as SIGTERM's (and DDP resumes are checked in
        # test_distributed.py): one resume comparison keeps the suite fast
    total = str(stopped + 3)
    resumed = cli(tmp_path, "fit", "--config", str(config), "--trainer.max_steps", total,
                  "--ckpt_path", str(saved[0]), *processes)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = cli(tmp_path, "fit", "--config", str(config), "--trainer.max_steps", total,
                   *processes)  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    a = final_state(wait_for("logs/tiny/version_1/checkpoints/round=*.ckpt", tmp_path))
    b = final_state(wait_for("logs/tiny/version_2/checkpoints/round=*.ckpt", tmp_path))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_fit_from_a_finished_checkpoint_says_so_and_tests_its_model(tmp_path, monkeypatch, capsys):
    """``fit --ckpt_path`` from a checkpoint at the run's last round trains nothing: a warning
    says so, and summary.json reports that model's test accuracy (before: none, and the old
    validation accuracy as the final result without a word)."""
    from pl_privfed.cli import main

    monkeypatch.chdir(tmp_path)
    config = str(tiny_config(tmp_path))
    main(["fit", "--config", config, "--trainer.max_steps", "3"])
    first = json.loads((tmp_path / "logs/tiny/version_0/summary.json").read_text())
    (ckpt,) = (tmp_path / "logs/tiny/version_0/checkpoints").glob("*.ckpt")
    with pytest.warns(UserWarning, match="no rounds left to train"):
        main(["fit", "--config", config, "--trainer.max_steps", "3", "--ckpt_path", str(ckpt)])
    again = json.loads((tmp_path / "logs/tiny/version_1/summary.json").read_text())
    assert again["status"] == "finished" and again["rounds"] == 3
    assert "no rounds left" in again["no_rounds_left"]
    assert again["final_test_round"] == 3
    assert again["final_test_accuracy"] == first["final_test_accuracy"]
    assert again["final_val_round"] == first["final_val_round"] == 3
    assert "test accuracy=" in capsys.readouterr().out.splitlines()[-1]
