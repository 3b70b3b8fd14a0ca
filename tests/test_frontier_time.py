"""benchmarks/frontier_time.py reads a `make frontier-mnist` sitting back from its logs: each sweep
file's wall time from the make log's start and end lines (past midnight too), the whole target's
from ``/usr/bin/time -v``, each point against the kept record. File-only."""

import csv
import json
from pathlib import Path

from helpers.benchmarks import benchmark_module


def _results(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    with (folder / "results.csv").open("w", newline="") as f:
        columns = ["run", "status", "seed", "final_val_accuracy", "final_test_accuracy", "epsilon"]
        writer = csv.DictWriter(f, columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def test_a_sitting_is_read_back_from_its_logs(tmp_path, monkeypatch):
    timing = benchmark_module("frontier_time")
    logs, sitting, kept = tmp_path / "logs", tmp_path / "sitting", tmp_path / "kept"
    logs.mkdir()
    (logs / "make.log").write_text(
        "python3 -m venv .venv\n"
        "23:59:50 frontier_a: started (1 torch thread(s); log: x.log)\n"
        "23:59:51 frontier_b: started (1 torch thread(s); log: y.log)\n"
        "00:05:01 frontier_b: finished\n"
        "00:20:00 frontier_a: some runs failed or it stopped (see x.log, results.csv)\n"
    )
    (logs / "time.log").write_text("\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03\n")
    (logs / "load.log").write_text("23:59:00 2.01 1.5 1.2 3/200 1\n00:00:00 2.50 1.5 1.2 3/2 1\n")
    a = [{"run": "0000-x", "status": "finished", "seed": 0, "final_test_accuracy": "0.9"}]
    a += [{"run": "0001-y", "status": "failed: nan", "seed": 1}]
    b = [{"run": "0000-z", "status": "finished", "seed": 0, "final_test_accuracy": "0.5"}]
    _results(sitting / "frontier_a", a)
    _results(sitting / "frontier_b", b)
    _results(kept / "frontier_a", [{**a[0], "run": "0000-older-hash"}])  # matched by its seed
    _results(kept / "frontier_b", [{**b[0], "final_test_accuracy": "0.4975"}])
    out = tmp_path / "t.json"
    argv = ["x", "--logs", str(logs), "--results", str(sitting), "--kept", str(kept)]
    monkeypatch.setattr("sys.argv", [*argv, "--json", str(out)])
    timing.main()
    data = json.loads(out.read_text())
    rows = data["tables"]["sweeps"]["rows"]
    # name, points, finished, start, end, wall, s/point, end, compared, same, largest gap
    assert rows[0][:8] == ["frontier_a", 2, 1, 0, 1210, 1210, 1210.0, "failed runs"]
    assert rows[0][8:] == [1, 1, 0.0]
    assert rows[1][:8] == ["frontier_b", 1, 1, 1, 311, 310, 310.0, "finished"]
    assert rows[1][8:10] == [1, 0] and abs(rows[1][10] - 0.25) < 1e-9
    whole = data["tables"]["whole"]["rows"][0]
    assert whole[:3] == [3, 2, 3723.0] and whole[5:] == [2.01, 2.5]
    assert data["load_start"][0] == 2.01 and data["load_end"][0] == 2.5
    assert data["machine"]["torch_threads"] == 1
