"""`make frontier-mnist` as one sitting: the whole target's wall time, each sweep file's, and the
load average while it ran.

Run mode (the default) runs ``make frontier-mnist`` in a checkout (``--checkout``, default this
one) under ``/usr/bin/time -v``, samples the load average once a minute, and then reads the
sitting back; ``--logs DIR`` reads a sitting run by hand from ``DIR``: ``make.log`` (the target's
output: each sweep file's ``HH:MM:SS <sweep>: started`` and ``... finished`` lines), ``time.log``
(``/usr/bin/time -v make frontier-mnist``'s report) and ``load.log`` (``HH:MM:SS`` and
``/proc/loadavg`` a line, once a minute). Each sweep's points are counted from its
``sweeps/frontier/<sweep>/results.csv`` (``--results``: another folder of them, e.g. the kept
record docs/frontier_runs/, which holds the same points). With ``--json`` it writes the artefact
docs/performance.md renders (``<!-- bench:frontier_mnist/... -->``).

Usage::

    python benchmarks/frontier_time.py --json docs/results/benchmarks/frontier_mnist.json
    python benchmarks/frontier_time.py --logs /tmp/fm --checkout /tmp/fm/main --json ...
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_artefact import Artefact, add_json_argument  # benchmarks/, the script's own folder

REPO = Path(__file__).resolve().parents[1]
EVENT = re.compile(r"^(\d\d:\d\d:\d\d) (\S+): (started|finished|some runs failed)")
ELAPSED = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)")


def seconds_of_day(stamp: str) -> int:
    h, m, s = (int(x) for x in stamp.split(":"))
    return 3600 * h + 60 * m + s


def clock(stamps: list[str]) -> list[int]:
    """``HH:MM:SS`` stamps in the order written, as seconds from the first one's midnight (a
    sitting may pass midnight: a stamp earlier than the one before is on the next day)."""
    out, day, last = [], 0, -1
    for stamp in stamps:
        t = seconds_of_day(stamp)
        if t < last:
            day += 86400
        last = t
        out.append(t + day)
    return out


def elapsed(text: str) -> float:
    """``/usr/bin/time -v``'s wall clock (``h:mm:ss`` or ``m:ss.ss``) in seconds."""
    match = ELAPSED.search(text)
    if match is None:
        raise SystemExit("time.log: no 'Elapsed (wall clock) time' line (/usr/bin/time -v)")
    parts = [float(p) for p in match[1].split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def read_rows(results: Path) -> list[dict]:
    if not results.is_file():
        return []
    with results.open(newline="") as f:
        return list(csv.DictReader(f))


def points(rows: list[dict]) -> tuple[int, int]:
    """Rows and finished rows of a sweep's ``results.csv`` rows (:func:`read_rows`)."""
    return len(rows), sum(r.get("status") == "finished" for r in rows)


def parameters(row: dict) -> tuple:
    """A results.csv row's point: its swept parameters (the columns between ``status`` and
    the first result column, ``final_val_accuracy``), by name. A run folder's name also hashes
    the sweep file's other settings, which the record's older runs were made with."""
    names = list(row)
    swept = names[names.index("status") + 1 : names.index("final_val_accuracy")]
    return tuple((k, row[k]) for k in swept)


def against(rows: list[dict], kept: Path) -> tuple[int, int, float]:
    """How a sweep's finished points in the sitting (``rows``) compare with the kept record's
    runs of the same points (the same swept parameters, :func:`parameters`): how many were
    compared, how many have the same final test accuracy and certified ε to the last written
    digit, and the largest difference in final test accuracy (percentage points)."""
    record = {parameters(r): r for r in read_rows(kept)}
    compared = same = 0
    largest = 0.0
    for row in rows:
        old = record.get(parameters(row))
        if row.get("status") != "finished" or old is None or old.get("status") != "finished":
            continue
        compared += 1
        same += all(row.get(k) == old.get(k) for k in ("final_test_accuracy", "epsilon"))
        diff = abs(float(row["final_test_accuracy"]) - float(old["final_test_accuracy"]))
        largest = max(largest, 100 * diff)
    return compared, same, largest


def sweeps(make_log: str, results: Path, kept: Path | None = None) -> list[list]:
    """One row a sweep file: name, points, finished, started and ended (seconds from the first
    start), wall seconds, seconds a point, how it ended; with ``kept`` (the kept record's
    folder) also :func:`against` it."""
    events = [m.groups() for m in map(EVENT.match, make_log.splitlines()) if m]
    times = clock([e[0] for e in events])
    begin: dict[str, int] = {}
    rows = []
    for (_, name, what), t in zip(events, times, strict=True):
        if what == "started":
            begin[name] = t
            continue
        start = begin.pop(name)
        found = read_rows(results / name / "results.csv")
        total, done = points(found)
        wall = t - start
        end = "finished" if what == "finished" else "failed runs"
        row = [name, total, done, start - times[0], t - times[0], wall, wall / max(done, 1), end]
        if kept is not None:
            row += against(found, kept / name / "results.csv")
        rows.append(row)
    rows.sort(key=lambda row: row[3])  # in the order they started
    if begin:
        raise SystemExit(f"make.log: sweeps that started and did not end: {sorted(begin)}")
    return rows


def loads(load_log: str) -> list[float]:
    """The 1-minute load averages sampled while the sitting ran."""
    return [float(line.split()[1]) for line in load_log.splitlines() if len(line.split()) > 1]


def run(checkout: Path, logs: Path) -> None:
    """``make frontier-mnist`` in ``checkout`` under ``/usr/bin/time -v``, the load sampled once
    a minute into ``logs/load.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    done = threading.Event()

    def sample() -> None:
        with (logs / "load.log").open("w") as out:
            while not done.is_set():
                loadavg = Path("/proc/loadavg").read_text().strip()
                out.write(f"{time.strftime('%H:%M:%S')} {loadavg}\n")
                out.flush()
                done.wait(60)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    with (logs / "make.log").open("w") as out, (logs / "time.log").open("w") as err:
        cmd = ["/usr/bin/time", "-v", "make", "frontier-mnist"]
        code = subprocess.call(cmd, cwd=checkout, stdout=out, stderr=err)
    done.set()
    thread.join()
    if code != 0:
        raise SystemExit(f"make frontier-mnist exited with {code}: see {logs}/time.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--logs", type=Path, default=None, help="read a sitting's logs")
    parser.add_argument(
        "--kept",
        type=Path,
        default=None,
        help="compare each point with the kept record's run (e.g. docs/frontier_runs)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="the folder of the sweeps' <sweep>/results.csv (default: <checkout>/sweeps/frontier)",
    )
    add_json_argument(parser)
    args = parser.parse_args()
    record = Artefact("frontier_time")
    logs = args.logs
    if logs is None:
        logs = args.checkout / "sweeps" / "frontier_time"
        run(args.checkout, logs)
    make_log = (logs / "make.log").read_text()
    time_log = (logs / "time.log").read_text()
    load = loads((logs / "load.log").read_text())
    columns = [
        "sweep file",
        "points",
        "finished",
        "started s",
        "ended s",
        "wall s",
        "s/point",
        "end",
    ]
    if args.kept is not None:
        columns += ["compared with the record", "same accuracy and ε", "largest gap (points)"]
    rows = record.table("sweeps", columns, "Each sweep file of `make frontier-mnist`, one sitting")
    found = sweeps(make_log, args.results or args.checkout / "sweeps" / "frontier", args.kept)
    rows += found
    for row in found:
        print(" | ".join(str(v) for v in row), flush=True)
    whole = elapsed(time_log)
    total = sum(r[1] for r in found)
    finished = sum(r[2] for r in found)
    record.table(
        "whole",
        ["points", "finished", "wall s", "wall h", "s/point", "load min", "load max"],
        "The whole target (install, every sweep file, the two reports)",
    ).append([total, finished, whole, whole / 3600, whole / max(finished, 1), min(load), max(load)])
    print(
        f"whole: {finished} of {total} points in {whole:.0f} s ({whole / 3600:.2f} h), "
        f"load {min(load):.2f}-{max(load):.2f}",
        flush=True,
    )
    jobs = re.search(r"started \((\d+) torch thread", make_log)
    record.data["load_start"] = [load[0]] * 3
    record.data["load_end"] = [load[-1]] * 3
    mtime = datetime.datetime.fromtimestamp(
        os.path.getmtime(logs / "time.log"), datetime.timezone.utc
    )
    record.data["date_utc"] = mtime.isoformat(timespec="seconds")
    record.write(args.json, torch_threads=int(jobs[1]) if jobs else None)


if __name__ == "__main__":
    main()
