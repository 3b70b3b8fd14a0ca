"""The local sweep runner and the report: grid expansion, arguments, validation, real runs with
resume and failures, figures and tables; every shipped sweep file's values are accepted by the
CLI."""

import csv
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers.processes import refused
from helpers.report import heat
from helpers.sweeps import QUICKSTART, REPO, rows, wandb_agent_command, write_sweep

from pl_privfed import report
from pl_privfed.cli import PrivFedCLI, agent_arguments, main
from pl_privfed.report import compare_methods, make_report, mean_interval
from pl_privfed.results import column_names, render_value, run_id
from pl_privfed.sweep import (
    SweepLockedError,
    failed_runs,
    grid,
    load_sweep,
    run_args,
    run_sweep,
    selected,
    sweep_lock,
)

SWEEPS = sorted((REPO / "configs/sweeps").glob("*.yaml"))
FAST = [
    "--trainer.max_steps=4",
    "--trainer.val_check_interval=2",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
]
BETA = "model.algorithm.init_args.beta"
STEP = "model.algorithm.init_args.step_size"


def summary_of(row):
    return json.loads((Path(row["run_dir"]) / "summary.json").read_text())


# --------------------------------------------------------------------------- grid and arguments


def test_grid_order_and_size(tmp_path):
    sweep = load_sweep(
        write_sweep(
            tmp_path,
            {
                "a.x": {"values": [1, 2, 3]},
                "b.flag": {"values": [True, False]},
                "c.fixed": {"value": None},
            },
        )
    )
    points = grid(sweep)
    assert len(points) == 6
    assert [(p["a.x"], p["b.flag"]) for p in points] == [
        (1, True),
        (1, False),
        (2, True),
        (2, False),
        (3, True),
        (3, False),
    ]
    assert all(list(p) == ["a.x", "b.flag", "c.fixed"] and p["c.fixed"] is None for p in points)
    assert sweep.swept == ["a.x", "b.flag"] and sweep.method == "grid" and sweep.name == "tiny"
    assert sweep.metric == {"name": "val/acc", "goal": "maximize"}
    assert grid(sweep) == points  # deterministic
    ids = [run_id(i, p) for i, p in enumerate(points)]
    assert ids[0].startswith("0000-") and len(set(ids)) == 6
    assert ids == [run_id(i, p) for i, p in enumerate(grid(load_sweep(sweep.path)))]


def test_run_args_rendering(tmp_path):
    path = write_sweep(
        tmp_path,
        {
            "a.flag": {"values": [True, False]},
            "b.none": {"value": None},
            "c.float": {"values": [0.1, 1e-05]},
            "d.list": {"value": [32, 16]},
            "e.text": {"value": "adam"},
        },
        command=[
            "${env}",
            "${interpreter}",
            "${program}",
            "fit",
            "--config",
            QUICKSTART,
            "${args}",
            "--seed_everything=1",
        ],
    )
    sweep = load_sweep(path)
    points = grid(sweep)
    assert run_args(sweep, points[1], "out/0003") == [
        "fit",
        "--config",
        QUICKSTART,
        "--a.flag=true",
        "--b.none=null",
        "--c.float=1e-05",
        "--d.list=[32, 16]",
        "--e.text=adam",
        "--seed_everything=1",
        "--output_dir=out/0003",
        "--trainer.default_root_dir=out/0003",
    ]
    assert run_args(sweep, points[2], Path("o"))[3:5] == ["--a.flag=false", "--b.none=null"]
    assert run_args(sweep, points[2], Path("o"))[5] == "--c.float=0.1"
    assert [render_value(v) for v in (True, False, None, 0.5, 3, "x")] == [
        "true",
        "false",
        "null",
        "0.5",
        "3",
        "x",
    ]
    # the default command form: `${env} pl-privfed fit ...`
    sweep = load_sweep(write_sweep(tmp_path, {"a": {"value": 1}}, name="plain"))
    assert run_args(sweep, {"a": 1}, "d") == [
        "fit",
        "--config",
        QUICKSTART,
        "--a=1",
        "--output_dir=d",
        "--trainer.default_root_dir=d",
    ]


def test_rendered_values_parse_in_the_cli(tmp_path):
    """Booleans, null and floats as rendered are what LightningCLI parses."""
    sweep = load_sweep(
        write_sweep(
            tmp_path,
            {
                STEP: {"value": 1e-05},
                BETA: {"value": 0.25},
                "model.algorithm.init_args.server_normalization": {"value": False},
                "model.algorithm.init_args.noise": {"value": None},
            },
        )
    )
    args = run_args(sweep, grid(sweep)[0], tmp_path / "run")
    cli = PrivFedCLI(args=[*args[1:], "--trainer.logger=false"], run=False)
    algorithm = cli.model.algorithm
    assert algorithm.step_size == 1e-05 and algorithm.beta == 0.25
    assert algorithm.server_normalization is False and algorithm.noise is None
    assert Path(cli.trainer.default_root_dir) == tmp_path / "run"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"method": "random"}, "method must be 'grid'.*'random'"),
        ({"method": "bayes"}, "method must be 'grid'.*'bayes'"),
        ({"parameters": {"a": {"min": 0, "max": 1}}}, "parameters.a needs 'value' or 'values'"),
        ({"parameters": {"a": 3}}, "parameters.a needs 'value' or 'values'.*3"),
        ({"parameters": {"a": {"values": []}}}, r"parameters.a.values must be a non-empty list"),
        ({"parameters": {}}, "parameters must be a non-empty mapping"),
        ({"command": ["pl-privfed", "fit"]}, r"command must be a list containing '\$\{args\}'"),
        ({"command": "pl-privfed fit ${args}"}, "command must be a list"),
        ({"metric": {"name": "test/acc", "goal": "maximize"}}, "metric.name='test/acc' selects on"),
        ({"project": 3}, "project must be a W&B project name, got 3"),
    ],
)
def test_validation(tmp_path, change, message):
    path = write_sweep(tmp_path, {"a": {"values": [1]}})
    spec = yaml.safe_load(path.read_text())
    spec.update(change)
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=message):
        load_sweep(path)


def test_column_names():
    assert column_names([STEP, BETA, "trainer.max_steps"]) == {
        STEP: "step_size",
        BETA: "beta",
        "trainer.max_steps": "max_steps",
    }
    # a shared last component, or one equal to a result column, keeps the full key
    keys = ["model.a.beta", "data.b.beta", "model.algorithm.init_args.noise.init_args.epsilon"]
    assert column_names(keys) == {k: k for k in keys}


FAKE_PYTHON = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(next(a.split("=", 1)[1] for a in args if a.startswith("--output_dir=")))
with open({log!r}, "a") as f:
    f.write(json.dumps({{"args": args, "cwd": os.getcwd(), "group": os.environ.get(
        "WANDB_RUN_GROUP"), "mode": os.environ.get("WANDB_MODE")}}) + "\\n")
out.mkdir(parents=True, exist_ok=True)
failed = any(a.endswith("beta=-1") for a in args)
(out / "summary.json").write_text(json.dumps({{"status": "failed: ValueError" if failed
    else "finished", "final_val_accuracy": 0.5, "best_val_accuracy": 0.6, "best_val_round": 2,
    "final_test_accuracy": 0.55, "rounds": 4}}))
sys.exit(1 if failed else 0)
"""


def fake_python(tmp_path):
    log = tmp_path / "calls.jsonl"
    path = tmp_path / "fake_python"
    path.write_text(FAKE_PYTHON.format(python=sys.executable, log=str(log)))
    path.chmod(0o755)
    return str(path), log


def calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_runner_contract_with_a_stand_in_interpreter(tmp_path, monkeypatch, capsys):
    """Subprocess arguments and environment, resume, retry of failures, results.csv."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    python, log = fake_python(tmp_path)
    sweep = write_sweep(
        tmp_path, {"a.beta": {"values": [0.5, -1]}, "b.c": {"value": True}}, name="contract"
    )
    path = run_sweep(sweep, "out", overrides=["--trainer.max_steps=4"], python=python)
    assert path == Path("out/results.csv")
    first = calls(log)
    assert [c["args"][:2] for c in first] == [["-m", "pl_privfed.cli"]] * 2
    identity = ["fit", "--config", QUICKSTART, "--trainer.max_steps=4"]
    run0 = Path("out/runs") / run_id(0, {"a.beta": 0.5, "b.c": True}, identity)
    assert first[0]["args"][2:] == [
        "fit",
        "--config",
        QUICKSTART,
        "--a.beta=0.5",
        "--b.c=true",
        f"--output_dir={run0}",
        f"--trainer.default_root_dir={run0}",
        "--run_name=beta=0.5",
        "--run_group=contract",
        "--trainer.max_steps=4",
    ]
    assert {(c["cwd"], c["group"], c["mode"]) for c in first} == {
        (str(tmp_path), "contract", "offline")
    }
    table = rows(path)
    assert [(r["run"][:4], r["status"], r["beta"], r["c"]) for r in table] == [
        ("0000", "finished", "0.5", "true"),
        ("0001", "failed: ValueError", "-1", "true"),
    ]
    assert list(table[0]) == [
        "run",
        "status",
        "beta",
        "c",
        "final_val_accuracy",
        "best_val_accuracy",
        "best_val_round",
        "final_test_accuracy",
        "final_val_loss",
        "final_train_loss",
        "epsilon",
        "rounds",
        "wall_time_s",
        "rounds_to_target",
        "final_full_grad_norm",
        "client_transmissions",
        "run_dir",
    ]
    assert table[0]["epsilon"] == "" and failed_runs(path) == [table[1]["run"]]
    assert (table[0]["final_val_accuracy"], table[0]["final_test_accuracy"]) == ("0.5", "0.55")
    out = capsys.readouterr().out
    assert "[1/2]" in out and "[2/2]" in out and "finished" in out and "failed" in out
    # resume: the finished point is skipped, the failed one retried; WANDB_MODE is respected
    monkeypatch.setenv("WANDB_MODE", "online")
    run_sweep(sweep, "out", overrides=["--trainer.max_steps=4"], python=python)
    again = calls(log)[2:]
    assert [c["args"][5:7] for c in again] == [["--a.beta=-1", "--b.c=true"]]
    assert again[0]["mode"] == "online"
    # dry run: prints the commands of the points that would run, runs nothing
    run_sweep(sweep, "out", overrides=["--trainer.max_steps=4"], python=python, dry_run=True)
    assert len(calls(log)) == 3
    printed = capsys.readouterr().out.splitlines()
    assert any("skipped" in line for line in printed)
    assert any(
        line.startswith(f"{python} -m pl_privfed.cli fit") and "--a.beta=-1" in line
        for line in printed
    )


def test_dry_run_writes_nothing(tmp_path, capsys):
    """Batched by default: the two points (differing in β) are one grid's command; with
    --separate one command each."""
    sweep = write_sweep(tmp_path, {BETA: {"values": [0.1, 0.2]}})
    out = str(tmp_path / "out")
    for flags, commands in (([], 1), (["--separate"], 2)):
        with pytest.raises(SystemExit) as exit_info:
            main(["sweep", str(sweep), "--out", out, "--dry-run", *flags, "--", *FAST])
        assert exit_info.value.code == 0
        lines = [ln for ln in capsys.readouterr().out.splitlines() if "pl_privfed.cli" in ln]
        assert len(lines) == commands and lines[-1].endswith(FAST[-1])
    assert f"--{BETA}=0.2" in lines[1] and not (tmp_path / "out").exists()


def test_a_misspelt_key_is_refused_once_before_anything_runs(tmp_path):
    """A misspelt init_args key used to cost one process per point (5 processes and 130 s,
    batched) before the same error was printed 5 times: the points are parsed first, as few as
    take every value (here 3 of 6), and the first bad one is refused in one line, exit 2."""
    sweep = write_sweep(
        tmp_path,
        {STEP: {"values": [0.1, 0.2, 0.3]}, BETA + "x": {"values": [0.1, 0.2]}},
    )
    checked = []
    run_sweep(sweep, tmp_path / "dry", dry_run=True, check=checked.extend)
    assert len(checked) == 3 and all(args[0] == "fit" for _, args in checked)
    assert {a for _, args in checked for a in args if a.startswith(f"--{BETA}x=")} == {
        f"--{BETA}x=0.1",
        f"--{BETA}x=0.2",
    }
    # a real sweep process: exit 2 and this one line, no point's process started
    line = refused(["sweep", sweep, "--out", tmp_path / "out", "--", *FAST], tmp_path)
    assert line.startswith("sweep point [1/6]") and "'betax'" in line
    assert not (tmp_path / "out").exists()


def test_where_runs_a_subset_in_the_folders_the_whole_sweep_gives_it(tmp_path, monkeypatch, capsys):
    """`--where` selects points by value (a parameter's full name or its end); they keep their
    run folders, so the whole sweep afterwards runs only the others; bad conditions are
    ValueErrors naming them, shown by the CLI as one line."""
    monkeypatch.chdir(tmp_path)
    python, log = fake_python(tmp_path)
    sweep = write_sweep(
        tmp_path,
        {"seed": {"values": [0, 1]}, "a.noise.epsilon": {"values": [0.5, 1.0, 8.0]}},
        name="where",
    )
    spec = load_sweep(sweep)
    assert selected(spec, ["noise.epsilon=1,8", "seed=1"]) == [4, 5]
    assert selected(spec, ["epsilon=0.5", "a.noise.epsilon=0.5,1"]) == [0, 3]
    assert selected(spec, []) == list(range(6))
    for bad, message in [
        ("eps=1", "names no parameter"),
        ("seed=2", "not a value of seed"),
        ("seed", "expected KEY=V1,V2"),
        ("=1", "expected KEY=V1,V2"),
    ]:
        with pytest.raises(ValueError, match=message):
            selected(spec, [bad])
    subset = run_sweep(sweep, "out", python=python, where=["epsilon=8.0"])
    assert [c["args"][5:7] for c in calls(log)] == [
        ["--seed=0", "--a.noise.epsilon=8.0"],
        ["--seed=1", "--a.noise.epsilon=8.0"],
    ]
    assert "2 of the 6 points" in capsys.readouterr().out
    assert [r["a.noise.epsilon"] for r in rows(subset)] == ["8.0", "8.0"]
    whole = run_sweep(sweep, "out", python=python)
    assert len(calls(log)) == 6 and len(rows(whole)) == 6  # the two finished runs were reused
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(sweep), "--out", "out", "--where", "seed=3"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--where 'seed=3'" in err[0], err


def test_a_sweep_that_gains_a_value_reuses_its_finished_runs(tmp_path, monkeypatch, capsys):
    """A point is found by its hash under any index: a sweep file that gains a value renumbers
    its points but runs only the new ones, and results.csv lists every point once."""
    monkeypatch.chdir(tmp_path)
    python, log = fake_python(tmp_path)
    sweep = write_sweep(
        tmp_path, {"seed": {"values": [0, 1]}, "a.step_size": {"values": [1.0, 3.0]}}, name="grow"
    )
    run_sweep(sweep, "out", python=python)
    before = sorted(p.name for p in Path("out/runs").iterdir())
    assert len(calls(log)) == 4 and [name[:4] for name in before] == [f"{i:04d}" for i in range(4)]
    grown = write_sweep(
        tmp_path,
        {"seed": {"values": [0, 1]}, "a.step_size": {"values": [0.3, 1.0, 3.0]}},
        name="grow",
    )
    table = rows(run_sweep(grown, "out", python=python))
    assert [c["args"][5:7] for c in calls(log)[4:]] == [
        ["--seed=0", "--a.step_size=0.3"],
        ["--seed=1", "--a.step_size=0.3"],
    ]
    assert [(r["seed"], r["step_size"]) for r in table] == [
        (s, g) for s in ("0", "1") for g in ("0.3", "1.0", "3.0")
    ]
    assert {r["run"] for r in table} >= set(before) and len({r["run"] for r in table}) == 6
    assert "finished before, skipped" in capsys.readouterr().out


def test_a_shortened_run_is_never_taken_for_a_full_one(tmp_path, monkeypatch, capsys):
    """The README's smoke run (`-- --trainer.max_steps=20`) and the full sweep afterwards use
    different run directories; `--rerun` runs finished points again."""
    monkeypatch.chdir(tmp_path)
    python, log = fake_python(tmp_path)
    sweep = write_sweep(tmp_path, {"a.beta": {"values": [0.5, 0.25]}}, name="ident")
    smoke = run_sweep(sweep, "out", overrides=["--trainer.max_steps=20"], python=python)
    smoke_runs = {r["run_dir"] for r in rows(smoke)}
    full = run_sweep(sweep, "out", python=python)  # nothing skipped: the full runs are new
    assert len(calls(log)) == 4 and "skipped" not in capsys.readouterr().out
    assert not smoke_runs & {r["run_dir"] for r in rows(full)}
    run_sweep(sweep, "out", python=python)  # now everything is skipped
    assert len(calls(log)) == 4
    run_sweep(sweep, "out", python=python, rerun=True)
    assert len(calls(log)) == 6


def test_concurrent_sweeps_on_one_folder_are_refused(tmp_path, monkeypatch, capsys):
    import os
    import subprocess

    monkeypatch.chdir(tmp_path)
    python, log = fake_python(tmp_path)
    sweep = write_sweep(tmp_path, {"a.beta": {"value": 0.5}}, name="locked")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / ".sweep.lock").write_text(
            json.dumps(
                {"pid": holder.pid, "host": __import__("socket").gethostname(), "started": 0}
            )
        )
        with pytest.raises(SweepLockedError, match=f"another sweep \\(pid {holder.pid} on"):
            run_sweep(sweep, "out", python=python)
        with pytest.raises(SystemExit) as exit_:
            main(["sweep", str(sweep), "--out", "out"])
        assert exit_.value.code == 2 and calls(log) == []
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale, taken over, and removed when the sweep ends
    run_sweep(sweep, "out", python=python)
    assert len(calls(log)) == 1 and "stale lock" in capsys.readouterr().out
    assert not (tmp_path / "out" / ".sweep.lock").exists()
    with sweep_lock(tmp_path / "out") as path:  # held: a second holder is refused
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with pytest.raises(SweepLockedError), sweep_lock(tmp_path / "out"):
            pass
    assert not path.exists()


GRID_PYTHON = """#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(next(a.split("=", 1)[1] for a in args if a.startswith("--output_dir=")))
seed = int(next(a.split("=", 1)[1] for a in args if a.startswith("--seed=")))
(out / "grid").mkdir(parents=True, exist_ok=True)
lines = ["run,status,beta,final_val_accuracy,final_test_accuracy,rounds,run_dir"]
for i, beta in enumerate((0.1, 1.0)):
    lines.append(f"{{i:04d}}-g,finished,{{beta}},{{0.5 + 0.1 * i + 0.01 * seed}},0.4,4,x")
(out / "grid" / "results.csv").write_text("\\n".join(lines) + "\\n")
(out / "summary.json").write_text(json.dumps({{"status": "finished", "grid": {{
    "configurations": 2, "results": str(out / "grid" / "results.csv")}}}}))
"""


def test_a_grid_takes_a_seed_axis_through_a_sweep(tmp_path, monkeypatch):
    """A sweep over `seed` of a config that trains a grid: results.csv holds one row per seed
    and grid configuration, which the report aggregates over the seeds."""
    monkeypatch.chdir(tmp_path)
    python = tmp_path / "grid_python"
    python.write_text(GRID_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    sweep = write_sweep(tmp_path, {"seed": {"values": [0, 1, 2]}}, name="gridseeds")
    path = run_sweep(sweep, "out", python=str(python))
    table = rows(path)
    assert [(r["seed"], r["beta"]) for r in table] == [
        (s, b) for s in ("0", "1", "2") for b in ("0.1", "1.0")
    ]
    assert table[1]["final_val_accuracy"] == "0.6"
    configs = report.aggregate(report.load_results(path), ["beta", "seed"])
    assert list(zip(configs["beta"], configs["seeds"])) == [("0.1", 3), ("1.0", 3)]
    assert configs["final_val_accuracy:mean"][1] == pytest.approx(0.61)


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory):
    """A real 2-point grid (β ∈ {0.01, 0.1}), 4 rounds each, run batched (one process; as
    the command does by default)."""
    tmp = tmp_path_factory.mktemp("grid")
    sweep = write_sweep(tmp, {STEP: {"value": 0.2}, BETA: {"values": [0.01, 0.1]}}, name="grid")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("WANDB_MODE", "offline")
        path = run_sweep(sweep, tmp / "out", overrides=FAST, batch=True)
    return sweep, path


@pytest.mark.slow
def test_real_grid_results(finished_grid):
    _, path = finished_grid
    table = rows(path)
    assert [(r["status"], r["beta"], r["step_size"], r["rounds"]) for r in table] == [
        ("finished", "0.01", "0.2", "4"),
        ("finished", "0.1", "0.2", "4"),
    ]
    for r in table:
        assert 0 <= float(r["final_val_accuracy"]) <= float(r["best_val_accuracy"]) <= 1
        assert r["best_val_round"] in ("2", "4") and 0 <= float(r["final_test_accuracy"]) <= 1
        assert float(r["final_train_loss"]) > 0 and float(r["epsilon"]) > 0
        summary = summary_of(r)
        assert summary["config"]["model"]["algorithm"]["init_args"]["beta"] == float(r["beta"])
        assert (Path(r["run_dir"]) / "curves.csv").is_file()
        assert Path(r["run_dir"]).name == r["run"]
    assert failed_runs(path) == []


@pytest.mark.slow
def test_real_grid_resume(finished_grid, tmp_path, monkeypatch, capsys):
    sweep, original = finished_grid
    shutil.copytree(original.parent, tmp_path / "out")  # keeps the mtimes; the original stays
    path = run_sweep(sweep, tmp_path / "out", overrides=FAST)  # everything finished: nothing runs
    monkeypatch.chdir(tmp_path)
    summaries = [Path(r["run_dir"]) / "summary.json" for r in rows(path)]
    assert all(p.is_relative_to(tmp_path / "out") for p in summaries)
    stamps = [p.stat().st_mtime_ns for p in summaries]
    assert stamps == [
        (Path(r["run_dir"]) / "summary.json").stat().st_mtime_ns for r in rows(original)
    ]
    run_sweep(sweep, path.parent, overrides=FAST)
    assert [p.stat().st_mtime_ns for p in summaries] == stamps
    assert capsys.readouterr().out.count("skipped") == 4
    # only the run whose summary.json is gone is redone (by a stand-in interpreter that records
    # its calls: a third real run would only cost time)
    summaries[1].unlink()
    python, log = fake_python(tmp_path)
    run_sweep(sweep, path.parent, overrides=FAST, python=python)
    assert summaries[0].stat().st_mtime_ns == stamps[0]
    assert [c["args"][-len(FAST) - 5 :] for c in calls(log)] == [
        [
            f"--{BETA}=0.1",
            f"--output_dir={summaries[1].parent}",
            f"--trainer.default_root_dir={summaries[1].parent}",
            "--run_name=beta=0.1",
            "--run_group=grid",
            *FAST,
        ]
    ]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "skipped" in out[0] and "finished in" in out[1]
    assert [r["status"] for r in rows(path)] == ["finished", "finished"]


@pytest.mark.slow
def test_real_failure_does_not_stop_the_grid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = write_sweep(tmp_path, {STEP: {"value": 0.2}, BETA: {"values": [-1.0, 0.1]}})
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:  # β = -1 is rejected: exit status 1
        # one process a point: the failure of a point alone (a batched group's failure and
        # its points' retry: tests/test_sweep_batch.py)
        main(["sweep", str(sweep), "--out", str(out), "--separate", "--", *FAST])
    assert exit_info.value.code == 1
    table = rows(out / "results.csv")
    assert [r["beta"] for r in table] == ["-1.0", "0.1"]
    assert table[0]["status"].startswith("failed") and "beta" in table[0]["status"]
    assert table[1]["status"] == "finished" and table[1]["rounds"] == "4"
    assert failed_runs(out / "results.csv") == [table[0]["run"]]
    assert (Path(table[0]["run_dir"]) / "output.log").is_file()
    assert not (tmp_path / "checkpoints").exists()  # runs keep their files in their run dir


@pytest.mark.slow
def test_report_on_the_real_grid(finished_grid, tmp_path):
    _, path = finished_grid
    written = make_report(path, tmp_path / "report")
    assert [p.name for p in written] == ["heatmap.png", "curves.png", "table.md", "table.csv"]
    assert all(p.stat().st_size > 1000 or p.suffix != ".png" for p in written)
    table = table_rows(tmp_path / "report" / "table.csv")
    assert all(r["method"] == "DP-AlphaNormEC + server norm" for r in table)  # private: DP-
    results = {r["beta"]: r for r in rows(path)}
    best = max(results.values(), key=lambda r: float(r["final_val_accuracy"]))
    (selected,) = [r for r in table if r["selected"] == "yes"]
    assert selected["β"] == best["beta"]  # chosen on validation ...
    assert selected["test accuracy (%)"] == f"{100 * float(best['final_test_accuracy']):.2f}"
    with pytest.raises(ValueError, match="x='gamma'"):
        make_report(path, tmp_path / "r2", x="gamma")


# --------------------------------------------------------------------------- report, synthetic

HEADER = [
    "run",
    "status",
    "step_size",
    "beta",
    "server_normalization",
    "seed",
    "final_val_accuracy",
    "best_val_accuracy",
    "final_test_accuracy",
    "final_train_loss",
    "epsilon",
    "rounds",
    "wall_time_s",
    "run_dir",
]


def table_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fake_results(tmp_path, seeds=(0,), with_nan=True, private=False, val=None, test=None):
    """A 2 × 2 × 2 grid (β, γ, server normalization) × seeds with curves; without seeds'
    spread one run has no accuracy and one failed. ``val``/``test`` map the configuration index
    and seed to accuracies."""
    lines = []
    index = 0
    for step in ("0.1", "1.0"):
        for beta in ("0.01", "0.1"):
            for norm in ("true", "false"):
                for seed in seeds:
                    run = f"{len(lines):04d}-abc"
                    run_dir = tmp_path / "runs" / run
                    run_dir.mkdir(parents=True)
                    acc = val(index, seed) if val else 0.1 * index + 0.05
                    status = "failed: boom" if index == 7 and with_nan else "finished"
                    best = "" if (with_nan and index == 5) else str(acc + 0.01)
                    final = "" if (with_nan and index == 5) else str(acc)
                    algo = {
                        "class_path": "pl_privfed.algorithms.AlphaNormEC",
                        "init_args": {
                            "server_normalization": norm == "true",
                            "noise": {"epsilon": 8.0} if private else None,
                        },
                    }
                    (run_dir / "summary.json").write_text(
                        json.dumps(
                            {
                                "status": status,
                                "private": private,
                                "config": {"model": {"algorithm": algo}},
                            }
                        )
                    )
                    (run_dir / "curves.csv").write_text(
                        "metric,round,value\n"
                        + "".join(
                            f"train/loss,{k},{2.0 / k + seed}\nval/acc,{k},{acc * k / 4}\n"
                            for k in (1, 2, 3, 4)
                        )
                    )
                    t = test(index, seed) if test else acc - 0.02
                    lines.append(
                        [
                            run,
                            status,
                            step,
                            beta,
                            norm,
                            str(seed),
                            final,
                            best,
                            str(t),
                            "nan" if index == 2 else "0.5",
                            "8.0" if private else "",
                            "4",
                            "1.0",
                            str(run_dir),
                        ]
                    )
                index += 1
    return write_rows(tmp_path / "results.csv", HEADER, lines)


def test_report_facets_difference_and_table(tmp_path):
    path = fake_results(tmp_path)
    with pytest.warns(UserWarning, match=r"1 of 7 finished runs .* have no final_val_accuracy"):
        written = make_report(path)
    assert [p.name for p in written] == [
        "heatmap.png",
        "heatmap_server_normalization_difference.png",
        "curves.png",
        "table.md",
        "table.csv",
    ]
    assert all(p.parent == tmp_path / "report" and p.stat().st_size > 0 for p in written)
    table = table_rows(tmp_path / "report" / "table.csv")
    assert list(table[0])[:9] == [
        "method",
        "β",
        "γ",
        "seeds",
        "val accuracy (%)",
        "val 95 % CI",
        "test accuracy (%)",
        "test 95 % CI",
        "best val accuracy (%)",
    ]
    assert "ε" not in table[0]  # no run is private; server normalization is in the method's name
    assert len(table) == 7  # the failed run is left out
    assert [r["method"] for r in table] == ["AlphaNormEC"] * 3 + ["AlphaNormEC + server norm"] * 4
    first = table[0]
    assert (first["β"], first["γ"], first["val accuracy (%)"], first["test accuracy (%)"]) == (
        "0.1",
        "0.1",
        "35.00",
        "33.00",
    )
    assert first["selected"] == "yes" and first["seeds"] == "1" and first["val 95 % CI"] == ""
    assert table[2]["val accuracy (%)"] == ""  # no validation accuracy: blank, never selected
    assert [r["val accuracy (%)"] for r in table[3:]] == ["65.00", "45.00", "25.00", "5.00"]
    md = (tmp_path / "report" / "table.md").read_text()
    assert md.startswith("## Selected on validation (final_val_accuracy)")
    assert "from 1 and 1 seed(s): no interval" in md  # one seed: no claim of a difference
    # explicit facet and other axes
    written = make_report(
        path, tmp_path / "r2", x="step_size", y="beta", facet="server_normalization"
    )
    assert "heatmap_server_normalization_difference.png" in [p.name for p in written]
    with pytest.raises(ValueError, match="facet='alpha'"):
        make_report(path, tmp_path / "r3", facet="alpha")


def test_report_selects_on_validation_and_reports_test_over_seeds(tmp_path, monkeypatch):
    """Three seeds per configuration: mean ± std and scipy's t-interval; the configuration with
    the best mean validation accuracy is selected, and its test accuracy is what is reported,
    even where another configuration has a higher test accuracy."""
    from scipy import stats

    def val(index, seed):
        return 0.5 + 0.01 * index + 0.02 * seed

    def test(index, seed):
        return 0.9 if index == 0 else 0.4 + 0.01 * seed  # the test set favours index 0

    path = fake_results(tmp_path, seeds=(0, 1, 2), with_nan=False, private=True, val=val, test=test)
    make_report(path, tmp_path / "report")
    table = table_rows(tmp_path / "report" / "table.csv")
    assert {r["seeds"] for r in table} == {"3"} and len(table) == 8
    selected = {r["method"]: r for r in table if r["selected"] == "yes"}
    assert set(selected) == {"DP-AlphaNormEC", "DP-AlphaNormEC + server norm"}
    best = selected["DP-AlphaNormEC"]  # index 7 (γ = 1, β = 0.1, no server norm) on validation
    assert (best["γ"], best["β"]) == ("1.0", "0.1")
    values = [100 * (0.4 + 0.01 * s) for s in range(3)]
    low, high = stats.t.interval(0.95, 2, loc=np.mean(values), scale=stats.sem(values))
    assert best["test accuracy (%)"] == f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f}"
    assert best["test 95 % CI"] == f"[{low:.2f}, {high:.2f}]"
    assert best["ε"] == "8"
    # one colour range, the data's (issue 49); the curves of both server-normalization
    # variants, with bands
    figures, _, _ = report.report_figures(path)
    ((low, high),) = {heat(ax).get_clim() for ax in figures["heatmap.png"].axes if heat(ax)}
    assert 0.0 < low < high < 100.0
    _, acc_ax = figures["curves.png"].axes
    labels = [line.get_label() for line in acc_ax.lines]
    assert {label.split(":")[0] for label in labels} == {
        "DP-AlphaNormEC",
        "DP-AlphaNormEC + server norm",
    }
    assert len(acc_ax.collections) == len(labels) == 4  # a band for each curve (3 seeds)
    figures, _, _ = report.report_figures(path, vmin=40, vmax=60)
    assert heat(figures["heatmap.png"].axes[0]).get_clim() == (40, 60)
    # the difference map's range is symmetric
    low, high = heat(figures["heatmap_server_normalization_difference.png"].axes[0]).get_clim()
    assert low == -high
    with pytest.raises(ValueError, match="metric='final_test_accuracy' would select on the test"):
        make_report(path, tmp_path / "r3", metric="final_test_accuracy")


def test_report_without_accuracy_warns_and_draws_no_grey_heatmap(tmp_path):
    path = fake_results(tmp_path, with_nan=False)
    text = path.read_text().splitlines()
    header = text[0].split(",")
    blank = [
        ",".join(
            "" if header[i] in ("final_val_accuracy", "best_val_accuracy") else v
            for i, v in enumerate(line.split(","))
        )
        for line in text[1:]
    ]
    path.write_text("\n".join([text[0], *blank]) + "\n")
    with pytest.warns(UserWarning) as record:
        written = make_report(path, tmp_path / "report")
    messages = [str(w.message) for w in record]
    assert any("8 of 8 finished runs" in m for m in messages)
    assert any("no heatmap drawn" in m for m in messages)
    assert "heatmap.png" not in [p.name for p in written]


def test_report_without_beta_and_without_finished_runs(tmp_path, capsys):
    path = tmp_path / "results.csv"
    header = (
        "run,status,step_size,scale,final_val_accuracy,best_val_accuracy,"
        "final_train_loss,epsilon,rounds,wall_time_s,run_dir\n"
    )
    path.write_text(header + "0000-x,finished,0.1,1.0,0.5,0.5,,,,,missing\n")
    written = make_report(path, tmp_path / "out")  # x falls back to `scale`
    assert [p.name for p in written] == ["heatmap.png", "table.md", "table.csv"]  # no curves
    assert len(table_rows(tmp_path / "out" / "table.csv")) == 1
    with open(tmp_path / "out" / "table.csv") as f:
        assert f.readline().startswith("method,scale,γ,seeds,")
    # an all-failed or empty results file is an error naming the file, not empty tables
    path.write_text(header + "0000-x,failed: boom,0.1,1.0,,,,,,,missing\n")
    with pytest.raises(ValueError, match=r"results\.csv: no finished run among its 1 run"):
        make_report(path, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
    empty = tmp_path / "empty.csv"
    empty.write_text(header)
    for command, args in (
        ("report", [str(path)]),
        ("report", [str(empty)]),
        ("compare", [str(path), "--out", str(tmp_path / "c")]),
        ("compare", [str(empty), "--out", str(tmp_path / "c")]),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([command, *args])
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and "\n" not in err, (command, args, err)
        assert err.startswith("pl-privfed: error: ") and Path(args[0]).name in err


def test_report_pools_several_results_files(tmp_path):
    """A grid run once per seed writes one results.csv each: read together, they aggregate."""
    a = fake_results(tmp_path / "a", seeds=(0,), with_nan=False)
    b = fake_results(tmp_path / "b", seeds=(1,), with_nan=False)
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(a), str(b), "--out", str(tmp_path / "report"), "--vmax", "90"])
    assert exit_.value.code == 0
    table = table_rows(tmp_path / "report" / "table.csv")
    assert len(table) == 8 and {r["seeds"] for r in table} == {"2"}


# --------------------------------------------------------------------------- shipped sweeps


def test_quickstart_grid_has_eight_points():
    sweep = load_sweep(REPO / "configs/sweeps/quickstart_grid.yaml")
    points = grid(sweep)
    assert len(points) == 8 and sweep.method == "grid"
    assert {p["model.algorithm.init_args.server_normalization"] for p in points} == {True, False}
    assert sweep.command[sweep.command.index("pl-privfed") + 1 :][:3] == [
        "fit",
        "--config",
        "configs/algorithms/alpha_normec.yaml",
    ]


def test_paper_sweeps_have_three_seeds_and_every_sweep_a_project():
    for path in SWEEPS:
        sweep = load_sweep(path)
        assert sweep.project == "pl-privfed", path.name
        assert not sweep.metric.get("name", "").startswith("test/"), path.name
        if path.stem.startswith("paper"):
            assert len(sweep.parameters.get("seed", [])) >= 3, path.name


def covering_points(sweep):
    """Grid points that together use every value of every parameter (nulls and booleans
    included)."""
    widest = max(len(v) for v in sweep.parameters.values())
    return [{k: v[i % len(v)] for k, v in sweep.parameters.items()} for i in range(widest)]


def test_wandb_agent_command_lines_of_every_point_are_built(tmp_path):
    """Every point of every shipped sweep gets a command line from W&B's construction, whose
    null and boolean values (`--…=None`, `--…=True`) the CLI's argument preparation turns into
    what its parser reads."""
    for path in SWEEPS:
        sweep = load_sweep(path)
        for params in grid(sweep):
            cmd = wandb_agent_command(path, params)
            assert cmd[:3] == ["/usr/bin/env", "pl-privfed", "fit"], cmd
            args = agent_arguments(cmd[2:])
            assert not any(a.endswith("=None") for a in args)
            if None in params.values():
                assert any(a.endswith("=null") for a in args)


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_shipped_sweeps_run_under_the_wandb_agent(path, tmp_path, monkeypatch):
    """Every value of every parameter (in at most max(len(values)) points), in the command line
    ``wandb agent`` builds, is parsed and instantiated by the CLI from a working directory outside
    the repository (the sweep's config paths resolve)."""
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(path)
    for params in covering_points(sweep):
        cmd = wandb_agent_command(path, params)
        cli = PrivFedCLI(args=[*agent_arguments(cmd[3:]), "--trainer.logger=false"], run=False)
        for key, value in params.items():
            if key == "seed":
                assert cli.config["seed_everything"] == value
                assert cli.datamodule.seed == value
                continue
            obj = {"model": cli.model, "trainer": cli.trainer, "data": cli.datamodule}[
                key.split(".")[0]
            ]
            attr = key.split(".")[-1]
            if key.startswith("model.algorithm"):
                obj = cli.model.algorithm
                if ".noise." in key:
                    obj = obj.noise
                elif ".local_solver." in key:
                    obj = obj.local_solver
                elif ".operator." in key:
                    obj = obj.operator
                elif ".server_optimizer." in key:
                    obj = obj.server_optimizer
            elif ".partitioner." in key:
                obj = obj.partitioner
            actual = getattr(obj, attr, None)
            if attr == "clip_threshold":
                actual = getattr(obj.operator, "threshold", None)
                assert actual == value, (key, actual, value)  # None: no clipping
            elif attr == "scale":
                actual = obj.scale
            if actual is not None:
                assert actual == value, (key, actual, value)
    assert len(grid(sweep)) == math.prod(len(v) for v in sweep.parameters.values())


# --------------------------------------------------------------------------- federated report figures


def write_rows(path, header, rows_):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows_)
    return path


def test_report_rounds_to_target(tmp_path):
    """Paper 003 Figs. 1-2: rounds to the gradient-norm target against c, per τ and per classes."""
    header = [
        "run",
        "status",
        "classes_per_client",
        "clip_threshold",
        "steps",
        "step_size",
        "final_val_accuracy",
        "best_val_accuracy",
        "final_train_loss",
        "epsilon",
        "rounds",
        "wall_time_s",
        "rounds_to_target",
        "final_full_grad_norm",
        "client_transmissions",
        "run_dir",
    ]
    body, i = [], 0
    for classes in ("1", "10"):
        for c in ("0.5", "null"):
            for steps in ("1", "5"):
                for step in ("0.1", "0.2"):
                    reached = "" if (classes == "1" and c == "0.5") else str(10 + i)
                    body.append(
                        [
                            f"{i:04d}-x",
                            "finished",
                            classes,
                            c,
                            steps,
                            step,
                            "0.5",
                            "0.5",
                            "0.3",
                            "",
                            "100",
                            "1.0",
                            reached,
                            "0.2",
                            "1000",
                            "missing",
                        ]
                    )
                    i += 1
    path = write_rows(tmp_path / "results.csv", header, body)
    written = make_report(path, tmp_path / "report", x="clip_threshold", y="step_size")
    assert [p.name for p in written][-1] == "rounds_to_target.png"
    assert written[-1].stat().st_size > 1000


def test_report_accuracy_vs_transmissions(tmp_path):
    """Paper 004 Fig. 2: accuracy of the best run per p against k · p · M transmissions."""
    header = [
        "run",
        "status",
        "step_size",
        "beta",
        "participation_prob",
        "final_val_accuracy",
        "best_val_accuracy",
        "final_train_loss",
        "epsilon",
        "rounds",
        "wall_time_s",
        "client_transmissions",
        "run_dir",
    ]
    body = []
    for i, p in enumerate(("0.25", "0.5", "1.0")):
        run_dir = tmp_path / "runs" / f"{i:04d}-x"
        run_dir.mkdir(parents=True)
        (run_dir / "curves.csv").write_text(
            "metric,round,value\n" + "".join(f"val/acc,{k},{0.1 * k}\n" for k in (1, 2, 3))
        )
        body.append(
            [
                run_dir.name,
                "finished",
                "0.01",
                "0.01",
                p,
                "0.3",
                "0.3",
                "1.0",
                "8.0",
                "4",
                "1.0",
                str(int(4 * 20 * float(p))),
                str(run_dir),
            ]
        )
    path = write_rows(tmp_path / "results.csv", header, body)
    written = make_report(path, tmp_path / "report")
    assert written[-1].name == "accuracy_vs_transmissions.png" and written[-1].stat().st_size > 1000


def fake_method_sweep(
    root, name, algorithm, accuracies, bits_per_round, channel, seeds=(0,), spread=0.0
):
    """A results.csv of runs whose summary.json holds a gradient-norm history and bit totals."""
    header = [
        "run",
        "status",
        "step_size",
        "seed",
        "final_val_accuracy",
        "best_val_accuracy",
        "final_test_accuracy",
        "final_train_loss",
        "epsilon",
        "rounds",
        "wall_time_s",
        "run_dir",
    ]
    body = []
    for i, acc in enumerate(accuracies):
        for seed in seeds:
            run_dir = root / name / "runs" / f"{i:04d}-{seed}"
            run_dir.mkdir(parents=True)
            summary = {
                "config": {
                    "model": {"algorithm": {"class_path": f"pl_privfed.algorithms.{algorithm}"}}
                },
                "rounds": 100,
                "private": True,
                "communication_total_bits_per_agent": {
                    channel: 100 * bits_per_round,
                    "server_to_client": 1e9,
                },
                "full_grad_norm": {"history": [[0, 2.0], [50, 1.0], [100, 0.5 + i]]},
            }
            (run_dir / "summary.json").write_text(json.dumps(summary))
            (run_dir / "curves.csv").write_text(
                f"metric,round,value\nval/acc,50,0.4\nval/acc,100,{0.6 + 0.01 * seed}\n"
            )
            test = acc - 0.05 + spread * seed
            body.append(
                [
                    run_dir.name,
                    "finished",
                    str(0.1 * (i + 1)),
                    str(seed),
                    str(acc),
                    str(acc),
                    str(test),
                    "0.3",
                    "0.01",
                    "100",
                    "1.0",
                    str(run_dir),
                ]
            )
    return write_rows(root / name / "results.csv", header, body)


def test_compare_methods_draws_the_best_configuration_of_each_sweep(tmp_path, capsys):
    """Paper 001 Figs. 2-3: utility and accuracy of the best-tuned runs against rounds and bits."""
    porter = fake_method_sweep(tmp_path, "porter", "PORTER", [0.7, 0.8], 64.0, "agent_to_agent")
    soteria = fake_method_sweep(tmp_path, "soteria", "SoteriaFL", [0.6], 32.0, "client_to_server")
    main_args = ["compare", str(porter), str(soteria), "--out", str(tmp_path / "cmp")]
    with pytest.raises(SystemExit) as exit_:
        main(main_args)
    assert exit_.value.code == 0
    assert (tmp_path / "cmp" / "comparison.png").stat().st_size > 1000
    table = table_rows(tmp_path / "cmp" / "comparison.csv")
    assert [r["method"] for r in table] == ["DP-PORTER (step_size=0.2)", "DP-SoteriaFL"]
    # the best PORTER run (accuracy 0.8, the second) ends at ||∇f|| = 1.5: utility 2.25
    assert [float(r["final utility"]) for r in table] == [2.25, 0.25]
    # bits sent per agent: every channel but the server's broadcast
    assert [float(r["bits sent per agent"]) for r in table] == [6400.0, 3200.0]
    assert [r["val accuracy (%)"] for r in table] == ["80.00", "60.00"]
    assert [r["test accuracy (%)"] for r in table] == ["75.00", "55.00"]
    assert "1 and 1 seed(s): no interval" in capsys.readouterr().out


def test_compare_methods_aggregates_seeds_and_notes_overlaps(tmp_path):
    porter = fake_method_sweep(
        tmp_path, "porter", "PORTER", [0.7], 64.0, "agent_to_agent", seeds=(0, 1, 2), spread=0.05
    )
    soteria = fake_method_sweep(
        tmp_path,
        "soteria",
        "SoteriaFL",
        [0.69],
        32.0,
        "client_to_server",
        seeds=(0, 1, 2),
        spread=0.05,
    )
    far = fake_method_sweep(
        tmp_path, "far", "BEER", [0.2], 32.0, "agent_to_agent", seeds=(0, 1, 2), spread=0.001
    )
    compare_methods([porter, soteria, far], tmp_path / "cmp")
    table = table_rows(tmp_path / "cmp" / "comparison.csv")
    assert [r["seeds"] for r in table] == ["3", "3", "3"]
    assert table[0]["test accuracy (%)"] == "70.00 ± 5.00"
    notes = (tmp_path / "cmp" / "comparison.md").read_text().split("Notes:")[1]
    assert "DP-PORTER and DP-SoteriaFL: the 95 % intervals of test accuracy overlap" in notes
    assert "DP-BEER" not in notes  # far apart: no note
    with pytest.raises(ValueError, match="would select on the test set"):
        compare_methods([porter], tmp_path / "x", metric="final_test_accuracy")


def test_compare_methods_needs_a_finished_run(tmp_path):
    header = ["run", "status", "step_size", "final_val_accuracy", "run_dir"]
    path = write_rows(tmp_path / "results.csv", header, [["0000", "failed", "0.1", "", ""]])
    with pytest.raises(ValueError, match="no finished run"):
        compare_methods([path], tmp_path / "out")
    with pytest.raises(ValueError, match="at least one"):
        compare_methods([], tmp_path / "out")


def test_mean_interval_matches_scipy():
    from scipy import stats

    values = [0.61, 0.7, 0.64, 0.69]
    r = mean_interval(values)
    low, high = stats.t.interval(0.95, 3, loc=np.mean(values), scale=stats.sem(values))
    assert (r.n, r.mean, r.std) == (
        4,
        pytest.approx(np.mean(values)),
        pytest.approx(np.std(values, ddof=1)),
    )
    assert (r.low, r.high) == (pytest.approx(low), pytest.approx(high))
    assert math.isnan(mean_interval([0.5]).low) and mean_interval([]).n == 0
    assert mean_interval([0.5, 0.5, 0.5]).low == 0.5  # equal values: the interval is the mean
    assert math.isnan(mean_interval([0.5, 0.6]).low)  # two seeds: no interval (issue 49)
