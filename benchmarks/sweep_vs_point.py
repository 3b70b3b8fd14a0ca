"""A sweep as ``pl-privfed sweep`` runs it (batched, no flag) against one of its points run
alone (the ``pl-privfed fit`` command the sweep gives that point with ``--separate``): wall
seconds of each, alternated ``--repeats`` times, with the load average around each, and their
ratio. Issue 49 asks for the README's quickstart sweep in at most three times one point's time.

Usage::

    python benchmarks/sweep_vs_point.py                                  # the quickstart grid
    python benchmarks/sweep_vs_point.py --sweep configs/sweeps/quickstart_grid.yaml --repeats 2
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_artefact import Artefact, add_json_argument  # benchmarks/, the script's own folder

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "pl_privfed.cli"]


def timed(cmd: list[str], log: Path) -> tuple[float, int]:
    """Wall seconds and exit status of ``cmd`` run in the checkout, its output to ``log``."""
    start = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    return time.perf_counter() - start, code


def first_point(sweep: str, out: Path) -> list[str]:
    """The ``pl-privfed fit`` command of the sweep's first point, as run one process per
    point (``--separate --dry-run``)."""
    dry = subprocess.run(
        [*CLI, "sweep", sweep, "--out", str(out), "--separate", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(ln for ln in dry.stdout.splitlines() if " pl_privfed.cli fit " in ln)
    return shlex.split(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default="configs/sweeps/quickstart_grid.yaml")
    parser.add_argument("--repeats", type=int, default=1)
    add_json_argument(parser)
    args = parser.parse_args()
    record = Artefact("sweep_vs_point")
    rows = record.table(
        "ratio",
        ["repeat", "sweep s", "one point alone s", "sweep / point", "load before sweep"],
        f"{args.sweep} batched (no flag) against its first point run alone, wall seconds",
    )
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            out = Path(tmp) / f"sweep{repeat}"
            before = sweep_load = os.getloadavg()[0]
            sweep_s, code = timed(
                [*CLI, "sweep", args.sweep, "--out", str(out)], out.with_suffix(".log")
            )
            print(f"sweep: {sweep_s:.1f} s (exit {code}), load {before} -> {os.getloadavg()}")
            point = first_point(args.sweep, Path(tmp) / f"point{repeat}")
            before = os.getloadavg()
            point_s, code = timed(point, Path(tmp) / f"point{repeat}.log")
            print(
                f"one point alone: {point_s:.1f} s (exit {code}), load {before} -> {os.getloadavg()}"
            )
            print(f"repeat {repeat + 1}: sweep / point = {sweep_s / point_s:.2f}", flush=True)
            rows.append([repeat + 1, sweep_s, point_s, sweep_s / point_s, sweep_load])
    record.write(args.json)


if __name__ == "__main__":
    main()
