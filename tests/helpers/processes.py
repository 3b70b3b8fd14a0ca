"""``pl-privfed`` as a user runs it: a real process, where its exit status or its printed line
is what a test checks (the process's own start-up, log filters and exit path included)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFIX = "pl-privfed: error: "


def cli(args, cwd, timeout=300):
    """``python -m pl_privfed.cli <args>`` in ``cwd``, this checkout first on the path: the
    finished process (``returncode``, ``stdout``, ``stderr``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "pl_privfed.cli", *map(str, args)]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def refused(args, cwd):
    """The line of a command that must exit 2 with that one line on stderr and nothing else
    (no traceback, no Lightning or W&B line), without its ``pl-privfed: error:`` prefix."""
    done = cli(args, cwd)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), lines
    return lines[0].removeprefix(PREFIX)
