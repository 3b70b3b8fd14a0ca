"""Result files are written all or nothing: a full disk while ``summary.json`` is rewritten
leaves the previous file, never a truncated or 0-byte one (the disk is "full" through a file
size limit, ``RLIMIT_FSIZE``, in a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, resource, signal, sys
from pathlib import Path
from types import SimpleNamespace
from pl_privfed.callbacks import RunSummary

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
folder = Path(sys.argv[1])
summary = RunSummary(dirpath=str(folder), verbose=False)
summary.summary = lambda trainer, module, status: {"status": status, "pad": "x" * 20000}
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
trainer = SimpleNamespace(loggers=[], callbacks=[], fast_dev_run=False)
try:
    summary._write(trainer, None, status="finished")
except OSError as exc:
    print("refused:", exc.errno)
    print("named:", exc.filename)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="Linux rlimit")
def test_a_full_disk_keeps_the_previous_summary(tmp_path):
    previous = {"status": "interrupted: SIGTERM after round 7", "rounds": 7}
    (tmp_path / "summary.json").write_text(json.dumps(previous))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "refused: 27" in done.stdout, done.stderr[-2000:]  # EFBIG
    assert json.loads((tmp_path / "summary.json").read_text()) == previous
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left
    assert f"named: {tmp_path / 'summary.json'}" in done.stdout  # not the temporary file


@pytest.mark.parametrize("command", ["report", "compare"])
@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ("", "an empty results file (no runs)"),
        (
            "r0,failed: ValueError: bad,,\nr1,interrupted: SIGTERM after round 3,,\n",
            "no finished run among its 2 run(s)",
        ),
        # issue 30: exited 0 with empty tables, blaming "no evaluation ran?"
        (
            "r0,finished,nan,\nr1,finished,abc,\n",
            "none of its 2 finished runs has a numeric result (a final_val_accuracy that is not a "
            "finite number: r0 ('nan'), r1 ('abc'))",
        ),
    ],
)
def test_report_and_compare_refuse_an_empty_or_all_failed_results_file(
    tmp_path, capsys, command, rows, says
):
    from pl_privfed.cli import main

    results = tmp_path / "results.csv"
    results.write_text("run,status,final_val_accuracy,run_dir\n" + rows)
    args = [command, str(results)] + (
        ["--out", str(tmp_path / "out")] if command == "compare" else []
    )
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"pl-privfed: error: {results}: {says}")
    assert "nothing to report" in err[0]


def test_a_report_names_the_runs_and_columns_whose_values_are_not_numbers(tmp_path):
    """Issue 30: a results file's NaN or non-numeric values were left out without a word (and
    the runs were blamed: "no evaluation ran?"); now one warning names each run and column,
    apart from the runs that have no value at all."""
    from pl_privfed.report import load_results
    from pl_privfed.report.configs import warn_missing

    results = tmp_path / "results.csv"
    results.write_text(
        "run,status,final_val_accuracy,final_test_accuracy,run_dir\n"
        "r0,finished,0.5,0.4,\nr1,finished,nan,0.3,\nr2,finished,,abc,\nr3,failed,nan,,\n"
    )
    runs = load_results(results)
    assert runs["run"].tolist() == ["r0", "r1", "r2"]
    with pytest.warns(UserWarning) as caught:
        warn_missing(runs, "final_val_accuracy", str(results))
    (message,) = [str(w.message) for w in caught]
    assert "2 of 3 finished runs" in message
    assert "a final_val_accuracy that is not a finite number: r1 ('nan')" in message
    assert "no final_val_accuracy (no evaluation ran?): r2" in message
    assert "not finite numbers are left out: final_test_accuracy of r2 ('abc')" in message
    # a run whose selection metric is NaN but whose test accuracy is a number: still reported
    only = runs[runs["run"] == "r1"]
    with pytest.warns(UserWarning, match=r"1 of 1 finished runs .* r1 \('nan'\)"):
        warn_missing(only, "final_val_accuracy", str(results))
