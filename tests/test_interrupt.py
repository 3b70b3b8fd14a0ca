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
from helpers.interrupt import TINY, tiny_config

from pl_privfed.callbacks.interrupt import ABORT_LINE

REPO = Path(__file__).resolve().parents[1]


def start(folder: Path, *args: str) -> subprocess.Popen:
    """``pl-privfed <args>`` started in a subprocess, in ``folder``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "pl_privfed.cli", *args],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


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


@pytest.mark.slow
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
    assert summary["interrupted"] == {"signal": name, "round": stopped, "before_training": False}
    assert (tmp_path / where).resolve() == saved[0].resolve()
    assert f"resume with --ckpt_path {where}" in out

    if signum != signal.SIGTERM or processes:
        return  # the same checkpoint as SIGTERM's (and DDP resumes are checked in
        # test_distributed.py): one resume comparison keeps the suite fast
    total = str(stopped + 3)
    # the resumed run and the straight one at the same time (their start-ups, most of their
    # time, overlap), the straight one in a folder of its own
    (tmp_path / "straight").mkdir()
    runs = [
        start(
            tmp_path,
            "fit",
            "--config",
            str(config),
            "--trainer.max_steps",
            total,
            "--ckpt_path",
            str(saved[0]),
        ),
        start(tmp_path / "straight", "fit", "--config", str(config), "--trainer.max_steps", total),
    ]
    for run_proc in runs:
        _, run_err = run_proc.communicate(timeout=300)
        assert run_proc.returncode == 0, run_err[-3000:]
    a = final_state(wait_for("logs/tiny/version_1/checkpoints/round=*.ckpt", tmp_path))
    b = final_state(wait_for("logs/tiny/version_0/checkpoints/round=*.ckpt", tmp_path / "straight"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


#: the tiny federation validated every 2 rounds with a checkpoint every 5 rounds, saved at the
#: end of round 5 before round 5's validation (the checkpoint remembers round 4's)
SAVED_BEFORE_VALIDATION = TINY.replace("val_check_interval: 1000", "val_check_interval: 2").replace(
    "  enable_progress_bar: false\n",
    "  enable_progress_bar: false\n  callbacks:\n"
    "    - class_path: pl_privfed.callbacks.RoundCheckpoint\n"
    "      init_args: {every_n_train_steps: 5}\n",
)


def test_fit_from_a_finished_checkpoint_says_so_and_reports_its_final_round(
    tmp_path, monkeypatch, capsys
):
    """``fit --ckpt_path`` from a checkpoint at the run's last round trains nothing: a warning
    says so, and summary.json reports that model's last-round validation and test accuracy,
    as the finished run did (before: no test accuracy, and round 4's validation accuracy as
    the final one, since the checkpoint was saved before round 5's validation)."""
    from pl_privfed.cli import main

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "saved_early.yaml"
    config.write_text(SAVED_BEFORE_VALIDATION)
    main(["fit", "--config", str(config), "--trainer.max_steps", "5"])
    first = json.loads((tmp_path / "logs/tiny/version_0/summary.json").read_text())
    assert first["final_val_round"] == 5
    (ckpt,) = (tmp_path / "logs/tiny/version_0/checkpoints").glob("*.ckpt")
    assert torch.load(ckpt, weights_only=False)["validated_round"] == 4  # saved before it
    with pytest.warns(UserWarning, match="no rounds left to train"):
        main(["fit", "--config", str(config), "--trainer.max_steps", "5", "--ckpt_path", str(ckpt)])
    again = json.loads((tmp_path / "logs/tiny/version_1/summary.json").read_text())
    assert again["status"] == "finished" and again["rounds"] == 5
    assert "no rounds left" in again["no_rounds_left"]
    for split in ("val", "test"):
        assert again[f"final_{split}_round"] == 5
        assert again[f"final_{split}_accuracy"] == pytest.approx(first[f"final_{split}_accuracy"])
        assert again[f"final_{split}_loss"] == pytest.approx(first[f"final_{split}_loss"])
    assert again["best_val_accuracy"] >= again["final_val_accuracy"]
    last = capsys.readouterr().out.splitlines()[-1]
    assert "(round 5)" in last and "test accuracy=" in last


#: a digits datamodule that waits at one point of a fit's life (``$WAIT_AT``: ``setup``, the
#: datamodule's set-up; ``train_dataloader``, after the privacy statement, the checkpoint's
#: restore and Lightning's own signal handlers; ``round``, inside round 1), after writing the
#: file ``waiting``, so that a test sends its signal there
WAITING = """\
import os, time
from pathlib import Path
from pl_privfed.datamodules import DigitsDataModule

class WaitingDigits(DigitsDataModule):
    def _wait(self, where):
        if os.environ.get("WAIT_AT") == where and not Path("waiting").exists():
            Path("waiting").write_text(where)
            time.sleep(60)

    def setup(self, stage=None):
        self._wait("setup")
        super().setup(stage)

    def train_dataloader(self):
        self._wait("train_dataloader")
        return super().train_dataloader()

    def preprocess_clients(self, inputs, round_index, clients):
        self._wait("round")
        return super().preprocess_clients(inputs, round_index, clients)
"""


def start_waiting(folder: Path, wait_at: str, *args: str) -> subprocess.Popen:
    """``fit`` of the tiny federation over ``WaitingDigits``, waiting at ``wait_at``."""
    (folder / "waiting_digits.py").write_text(WAITING)
    config = tiny_config(folder)
    config.write_text(
        TINY.replace("DigitsDataModule", "WaitingDigits").replace(
            "pl_privfed.datamodules.WaitingDigits", "waiting_digits.WaitingDigits"
        )
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{folder}", "WAIT_AT": wait_at}
    return subprocess.Popen(
        [sys.executable, "-m", "pl_privfed.cli", "fit", "--config", str(config), *args],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


#: where the waiting runs below wait and which signal their test sends (``round``: two Ctrl-C)
WAITING_RUNS = [
    ("setup", signal.SIGTERM),
    ("train_dataloader", signal.SIGTERM),
    ("train_dataloader", signal.SIGINT),
    ("round", signal.SIGINT),
]


@pytest.fixture(scope="module")
def waiting_runs(tmp_path_factory):
    """The waiting runs of the tests below, started together, each in its own folder: each
    waits a minute at its point for its test's signal, so their start-ups (importing the
    package, setting up: most of each test's time) overlap instead of adding up."""
    runs = {}
    for wait_at, signum in WAITING_RUNS:
        folder = tmp_path_factory.mktemp(f"waiting_{wait_at}_{signal.Signals(signum).name}")
        runs[wait_at, signum] = (folder, start_waiting(folder, wait_at))
    yield runs
    for _, proc in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize(("wait_at", "signum"), WAITING_RUNS[:3])
def test_a_signal_before_training_ends_the_run_with_a_summary(waiting_runs, wait_at, signum):
    """Before round 1 (set-up, the privacy calibration, after the privacy statement) a
    SIGTERM or Ctrl-C stops the run at once: exit 143/130, one line, no traceback, no
    checkpoint and a summary.json saying ``interrupted ... before training`` (before: SIGTERM
    killed the process without a word and left the run folder without a summary)."""
    tmp_path, proc = waiting_runs[wait_at, signum]
    assert wait_for("waiting", tmp_path).read_text() == wait_at
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + int(signum), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"{name} before training: stopping now" in err
    run = tmp_path / "logs/tiny/version_0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == f"interrupted: {name} before training"
    assert summary["rounds"] == 0
    assert summary["interrupted"] == {
        "signal": name,
        "round": 0,
        "checkpoint": None,
        "before_training": True,
    }
    assert not list(run.glob("checkpoints/*.ckpt"))


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_at_once_in_one_line(waiting_runs):
    """A first Ctrl-C during a round asks for a stop after it; a second one, while the round
    still runs, ends the process at once: exit 130 and one line, not a traceback (before:
    108 lines)."""
    tmp_path, proc = waiting_runs["round", signal.SIGINT]
    assert wait_for("waiting", tmp_path).read_text() == "round"  # round 1 holds for a minute
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1] == ABORT_LINE


@pytest.fixture
def python_sigint():
    """SIGINT as an interactive Python session has it (``default_int_handler``): a job started
    in the background (``nohup make test &``) inherits it ignored, and the test below checks
    that a retired handler acts as the one found."""
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, found)


def test_the_handlers_by_phase_and_their_restoration(python_sigint):
    """In-process, without a fit: before training a signal stops at once (``SIGTERMException``,
    exit status 143); during training it is recorded and the stop comes at the end of the
    round; a second Ctrl-C in a Python session is a ``KeyboardInterrupt`` (the command's own
    process ends instead: ``test_a_second_ctrl_c_aborts_at_once_in_one_line``); afterwards the
    handlers found are back, and a handler Lightning puts back late acts as they would."""
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from pl_privfed.callbacks import interrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    class Trainer:  # what the handlers read of a trainer (weakly referenced)
        strategy, global_step = None, 0

    trainer = Trainer()
    interrupt.watch_setup_signals(trainer)
    setup_handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SIGTERMException) as info:
        setup_handler(signal.SIGTERM, None)
    assert info.value.code == 143 and interrupt.stopped_before_training(trainer)
    assert interrupt.stop_signal(trainer, info.value) == "SIGTERM"

    interrupt.watch_signals(trainer)  # training: recorded, the round goes on
    handler = signal.getsignal(signal.SIGINT)
    handler(signal.SIGINT, None)
    assert not interrupt.stopped_before_training(trainer)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)
    with pytest.raises(SIGTERMException) as info:
        interrupt.stop_if_signalled(trainer)
    assert info.value.code == 130

    interrupt.restore_signals(trainer)
    assert {s: signal.getsignal(s) for s in before} == before
    with pytest.raises(KeyboardInterrupt):  # retired: as the handler found (Python's default)
        handler(signal.SIGINT, None)
