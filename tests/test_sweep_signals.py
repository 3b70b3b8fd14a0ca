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
