"""A sweep stopped by a signal behaves as ``fit`` does (issue 49, item 2): ``kill <sweep pid>``
during a batched group used to end the sweep without a word while its group's training process
kept running (and a sweep restarted at once trained the same group into the same folder). Now
one line, the group's fit saves its round and stops, no process is left, the lock is released,
exit status 143, and the sweep run again continues the group from its checkpoint. A subprocess
test: the processes and the exit status are the point."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.sweeps import REPO, write_sweep

from pl_privfed.sweep.signals import SignalGuard, SweepInterrupted

CONFIG = str(REPO / "configs/algorithms/alpha_normec.yaml")
STEP = "model.algorithm.init_args.step_size"
#: long enough to be stopped while training; a checkpoint every 20 rounds shows it trains
OVERRIDES = [
    "--trainer.max_steps=20000",
    "--trainer.val_check_interval=20",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
]


def _processes_naming(text: str) -> list[int]:
    """The processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the processes from /proc")
def test_sigterm_stops_a_batched_sweep_like_fit_and_a_rerun_resumes(tmp_path):
    sweep = write_sweep(
        tmp_path,
        {STEP: {"values": [0.1, 0.2]}},
        name="stopped",
        command=["${env}", "pl-privfed", "fit", "--config", CONFIG, "${args}"],
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pl_privfed.cli", "sweep", str(sweep), "--out", str(out)]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    sweep_process = subprocess.Popen([*cmd, "--", *OVERRIDES], cwd=REPO, env=env, **pipes)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("groups/*/checkpoints/round=*.ckpt")):  # the group trains
            assert sweep_process.poll() is None, sweep_process.communicate()
            assert time.monotonic() < deadline, "the group never saved a round"
            time.sleep(0.5)
        sweep_process.send_signal(signal.SIGTERM)
        stdout, stderr = sweep_process.communicate(timeout=120)
    finally:
        if sweep_process.poll() is None:
            sweep_process.kill()
    assert sweep_process.returncode == 143, stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith("[pl-privfed sweep] SIGTERM: stopping the sweep; its running fit")
    assert _processes_naming(str(out)) == []  # the group's fit stopped with the sweep
    assert not (out / ".sweep.lock").exists()
    assert stdout.count("interrupted: SIGTERM after round") == 2  # both points say so
    (group,) = out.glob("groups/*")
    # run again: the group continues from the round it saved
    dry_run = [*cmd, "--dry-run", "--", *OVERRIDES]
    again = subprocess.run(dry_run, cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    (command,) = [ln for ln in again.stdout.splitlines() if "--model.grid=" in ln]
    assert f"--ckpt_path={group}/checkpoints/round=" in command


def test_ctrl_c_is_forwarded_once_and_ends_the_sweep_with_130(tmp_path, capsys):
    """The guard forwards the sweep's Ctrl-C to its running process once (the child, in its own
    session, gets no second one from the terminal), prints one line, and the next start raises
    SweepInterrupted with exit status 130."""
    import threading

    ready = tmp_path / "ready"
    child = (
        "import pathlib, signal, sys, time\n"
        "got = []\n"
        "signal.signal(signal.SIGINT, lambda *a: got.append(1))\n"
        f"pathlib.Path({str(ready)!r}).write_text('')\n"
        "deadline = time.time() + 60\n"
        "while not got and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "time.sleep(0.3)\n"
        "sys.exit(100 + len(got))\n"
    )

    def ctrl_c_once_ready():
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    found = signal.getsignal(signal.SIGINT)
    with SignalGuard() as guard:
        thread = threading.Thread(target=ctrl_c_once_ready)
        thread.start()
        code = guard.call([sys.executable, "-c", child])
        thread.join()
        assert code == 101  # one SIGINT reached it
        with pytest.raises(SweepInterrupted) as stopped:
            guard.call([sys.executable, "-c", "raise SystemExit(0)"])
    assert stopped.value.code == 130 and guard.child is None
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("[pl-privfed sweep] SIGINT: stopping the sweep; its running fit (pid")
    assert signal.getsignal(signal.SIGINT) == found  # the handler found, restored
