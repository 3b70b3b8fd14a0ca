"""The local sweep runner and the report: grid expansion, arguments, validation, real runs with
resume and failures, figures and tables; every shipped sweep file's values are accepted by the
CLI."""

import csv
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from pl_privfed.cli import PrivFedCLI, main
from pl_privfed.report import compare_methods, make_report
from pl_privfed.sweep import (
    column_names,
    failed_runs,
    grid,
    load_sweep,
    render_value,
    run_args,
    run_id,
    run_sweep,
)

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "configs/quickstart.yaml")
SWEEPS = sorted((REPO / "configs/sweeps").glob("*.yaml"))
FAST = ["--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false"]  # fmt: skip
BETA = "model.algorithm.init_args.beta"
STEP = "model.algorithm.init_args.step_size"


def write_sweep(directory, parameters, name="tiny", command=None):
    spec = {"name": name, "method": "grid", "metric": {"name": "test/acc", "goal": "maximize"},
            "parameters": parameters,
            "command": command or ["${env}", "pl-privfed", "fit", "--config", QUICKSTART,
                                   "${args}"]}  # fmt: skip
    path = Path(directory) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summary_of(row):
    return json.loads((Path(row["run_dir"]) / "summary.json").read_text())


# --------------------------------------------------------------------------- grid and arguments


def test_grid_order_and_size(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, {"a.x": {"values": [1, 2, 3]},
                                              "b.flag": {"values": [True, False]},
                                              "c.fixed": {"value": None}}))  # fmt: skip
    points = grid(sweep)
    assert len(points) == 6
    assert [(p["a.x"], p["b.flag"]) for p in points] == [
        (1, True), (1, False), (2, True), (2, False), (3, True), (3, False)]  # fmt: skip
    assert all(list(p) == ["a.x", "b.flag", "c.fixed"] and p["c.fixed"] is None for p in points)
    assert sweep.swept == ["a.x", "b.flag"] and sweep.method == "grid" and sweep.name == "tiny"
    assert sweep.metric == {"name": "test/acc", "goal": "maximize"}
    assert grid(sweep) == points  # deterministic
    ids = [run_id(i, p) for i, p in enumerate(points)]
    assert ids[0].startswith("0000-") and len(set(ids)) == 6
    assert ids == [run_id(i, p) for i, p in enumerate(grid(load_sweep(sweep.path)))]


def test_run_args_rendering(tmp_path):
    path = write_sweep(tmp_path, {"a.flag": {"values": [True, False]}, "b.none": {"value": None},
                                  "c.float": {"values": [0.1, 1e-05]}, "d.list": {"value": [32, 16]},
                                  "e.text": {"value": "adam"}},
                       command=["${env}", "${interpreter}", "${program}", "fit", "--config",
                                QUICKSTART, "${args}", "--seed_everything=1"])  # fmt: skip
    sweep = load_sweep(path)
    points = grid(sweep)
    assert run_args(sweep, points[1], "out/0003") == [
        "fit", "--config", QUICKSTART,
        "--a.flag=true", "--b.none=null", "--c.float=1e-05", "--d.list=[32, 16]", "--e.text=adam",
        "--seed_everything=1", "--output_dir=out/0003", "--trainer.default_root_dir=out/0003",
    ]  # fmt: skip
    assert run_args(sweep, points[2], Path("o"))[3:5] == ["--a.flag=false", "--b.none=null"]
    assert run_args(sweep, points[2], Path("o"))[5] == "--c.float=0.1"
    assert [render_value(v) for v in (True, False, None, 0.5, 3, "x")] == [
        "true", "false", "null", "0.5", "3", "x"]  # fmt: skip
    # the default command form: `${env} pl-privfed fit ...`
    sweep = load_sweep(write_sweep(tmp_path, {"a": {"value": 1}}, name="plain"))
    assert run_args(sweep, {"a": 1}, "d") == ["fit", "--config", QUICKSTART, "--a=1",
                                              "--output_dir=d", "--trainer.default_root_dir=d"]  # fmt: skip


def test_rendered_values_parse_in_the_cli(tmp_path):
    """Booleans, null and floats as rendered are what LightningCLI parses."""
    sweep = load_sweep(write_sweep(tmp_path, {
        STEP: {"value": 1e-05}, BETA: {"value": 0.25},
        "model.algorithm.init_args.server_normalization": {"value": False},
        "model.algorithm.init_args.noise": {"value": None}}))  # fmt: skip
    args = run_args(sweep, grid(sweep)[0], tmp_path / "run")
    cli = PrivFedCLI(args=[*args[1:], "--trainer.logger=false"], run=False)
    algorithm = cli.model.algorithm
    assert algorithm.step_size == 1e-05 and algorithm.beta == 0.25
    assert algorithm.server_normalization is False and algorithm.noise is None
    assert Path(cli.trainer.default_root_dir) == tmp_path / "run"


@pytest.mark.parametrize(
    "change, message",
    [({"method": "random"}, "method must be 'grid'.*'random'"),
     ({"method": "bayes"}, "method must be 'grid'.*'bayes'"),
     ({"parameters": {"a": {"min": 0, "max": 1}}}, "parameters.a needs 'value' or 'values'"),
     ({"parameters": {"a": 3}}, "parameters.a needs 'value' or 'values'.*3"),
     ({"parameters": {"a": {"values": []}}}, r"parameters.a.values must be a non-empty list"),
     ({"parameters": {}}, "parameters must be a non-empty mapping"),
     ({"command": ["pl-privfed", "fit"]}, r"command must be a list containing '\$\{args\}'"),
     ({"command": "pl-privfed fit ${args}"}, "command must be a list")],
)  # fmt: skip
def test_validation(tmp_path, change, message):
    path = write_sweep(tmp_path, {"a": {"values": [1]}})
    spec = yaml.safe_load(path.read_text())
    spec.update(change)
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=message):
        load_sweep(path)


def test_column_names():
    assert column_names([STEP, BETA, "trainer.max_steps"]) == {
        STEP: "step_size", BETA: "beta", "trainer.max_steps": "max_steps"}  # fmt: skip
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
    else "finished", "final_test_accuracy": 0.5, "best_test_accuracy": 0.6, "rounds": 4}}))
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
    sweep = write_sweep(tmp_path, {"a.beta": {"values": [0.5, -1]}, "b.c": {"value": True}},
                        name="contract")  # fmt: skip
    path = run_sweep(sweep, "out", overrides=["--trainer.max_steps=4"], python=python)
    assert path == Path("out/results.csv")
    first = calls(log)
    assert [c["args"][:2] for c in first] == [["-m", "pl_privfed.cli"]] * 2
    assert first[0]["args"][2:] == ["fit", "--config", QUICKSTART, "--a.beta=0.5", "--b.c=true",
        f"--output_dir={Path('out/runs') / run_id(0, {'a.beta': 0.5, 'b.c': True})}",
        f"--trainer.default_root_dir={Path('out/runs') / run_id(0, {'a.beta': 0.5, 'b.c': True})}",
        "--trainer.max_steps=4"]  # fmt: skip
    assert {(c["cwd"], c["group"], c["mode"]) for c in first} == {
        (str(tmp_path), "contract", "offline")}  # fmt: skip
    table = rows(path)
    assert [(r["run"][:4], r["status"], r["beta"], r["c"]) for r in table] == [
        ("0000", "finished", "0.5", "true"), ("0001", "failed: ValueError", "-1", "true")]  # fmt: skip
    assert list(table[0]) == ["run", "status", "beta", "c", "final_test_accuracy",
        "best_test_accuracy", "final_train_loss", "epsilon", "rounds", "wall_time_s",
        "rounds_to_target", "final_full_grad_norm", "client_transmissions", "run_dir"]  # fmt: skip
    assert table[0]["epsilon"] == "" and failed_runs(path) == [table[1]["run"]]
    out = capsys.readouterr().out
    assert "[1/2]" in out and "[2/2]" in out and "finished" in out and "failed" in out
    # resume: the finished point is skipped, the failed one retried; WANDB_MODE is respected
    monkeypatch.setenv("WANDB_MODE", "online")
    run_sweep(sweep, "out", python=python)
    again = calls(log)[2:]
    assert [c["args"][5:7] for c in again] == [["--a.beta=-1", "--b.c=true"]]
    assert again[0]["mode"] == "online"
    # dry run: prints the commands of the points that would run, runs nothing
    run_sweep(sweep, "out", python=python, dry_run=True)
    assert len(calls(log)) == 3
    printed = capsys.readouterr().out.splitlines()
    assert any("skipped" in line for line in printed)
    assert any(line.startswith(f"{python} -m pl_privfed.cli fit") and "--a.beta=-1" in line
               for line in printed)  # fmt: skip


def test_dry_run_writes_nothing(tmp_path, capsys):
    sweep = write_sweep(tmp_path, {BETA: {"values": [0.1, 0.2]}})
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--dry-run", "--", *FAST])
    assert exit_info.value.code == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "pl_privfed.cli" in ln]
    assert len(lines) == 2 and f"--{BETA}=0.2" in lines[1] and lines[1].endswith(FAST[-1])
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory):
    """A real 2-point grid (β ∈ {0.01, 0.1}), 4 rounds each."""
    tmp = tmp_path_factory.mktemp("grid")
    sweep = write_sweep(tmp, {STEP: {"value": 0.2}, BETA: {"values": [0.01, 0.1]}}, name="grid")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("WANDB_MODE", "offline")
        path = run_sweep(sweep, tmp / "out", overrides=FAST)
    return sweep, path


def test_real_grid_results(finished_grid):
    _, path = finished_grid
    table = rows(path)
    assert [(r["status"], r["beta"], r["step_size"], r["rounds"]) for r in table] == [
        ("finished", "0.01", "0.2", "4"), ("finished", "0.1", "0.2", "4")]  # fmt: skip
    for r in table:
        assert 0 <= float(r["final_test_accuracy"]) <= float(r["best_test_accuracy"]) <= 1
        assert float(r["final_train_loss"]) > 0 and float(r["epsilon"]) > 0
        summary = summary_of(r)
        assert summary["config"]["model"]["algorithm"]["init_args"]["beta"] == float(r["beta"])
        assert (Path(r["run_dir"]) / "curves.csv").is_file()
        assert Path(r["run_dir"]).name == r["run"]
    assert failed_runs(path) == []


def test_real_grid_resume(finished_grid, tmp_path, monkeypatch, capsys):
    sweep, original = finished_grid
    shutil.copytree(original.parent, tmp_path / "out")  # keeps the mtimes; the original stays
    path = run_sweep(sweep, tmp_path / "out", overrides=FAST)  # everything finished: nothing runs
    monkeypatch.chdir(tmp_path)
    summaries = [Path(r["run_dir"]) / "summary.json" for r in rows(path)]
    assert all(p.is_relative_to(tmp_path / "out") for p in summaries)
    stamps = [p.stat().st_mtime_ns for p in summaries]
    assert stamps == [(Path(r["run_dir"]) / "summary.json").stat().st_mtime_ns
                      for r in rows(original)]  # fmt: skip
    run_sweep(sweep, path.parent, overrides=FAST)
    assert [p.stat().st_mtime_ns for p in summaries] == stamps
    assert capsys.readouterr().out.count("skipped") == 4
    # only the run whose summary.json is gone is redone (by a stand-in interpreter that records
    # its calls: a third real run would only cost time)
    summaries[1].unlink()
    python, log = fake_python(tmp_path)
    run_sweep(sweep, path.parent, overrides=FAST, python=python)
    assert summaries[0].stat().st_mtime_ns == stamps[0]
    assert [c["args"][-len(FAST) - 3 :] for c in calls(log)] == [
        [f"--{BETA}=0.1", f"--output_dir={summaries[1].parent}",
         f"--trainer.default_root_dir={summaries[1].parent}", *FAST]]  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "skipped" in out[0] and "finished in" in out[1]
    assert [r["status"] for r in rows(path)] == ["finished", "finished"]


def test_real_failure_does_not_stop_the_grid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = write_sweep(tmp_path, {STEP: {"value": 0.2}, BETA: {"values": [-1.0, 0.1]}})
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:  # β = -1 is rejected: exit status 1
        main(["sweep", str(sweep), "--out", str(out), "--", *FAST])
    assert exit_info.value.code == 1
    table = rows(out / "results.csv")
    assert [r["beta"] for r in table] == ["-1.0", "0.1"]
    assert table[0]["status"].startswith("failed") and "beta" in table[0]["status"]
    assert table[1]["status"] == "finished" and table[1]["rounds"] == "4"
    assert failed_runs(out / "results.csv") == [table[0]["run"]]
    assert (Path(table[0]["run_dir"]) / "output.log").is_file()
    assert not (tmp_path / "checkpoints").exists()  # runs keep their files in their run dir


def test_report_on_the_real_grid(finished_grid, tmp_path):
    _, path = finished_grid
    written = make_report(path, tmp_path / "report")
    assert [p.name for p in written] == ["heatmap.png", "curves.png", "table.md", "table.csv"]
    assert all(p.stat().st_size > 1000 or p.suffix != ".png" for p in written)
    table = (tmp_path / "report" / "table.md").read_text().splitlines()
    assert table[0] == "| method | β | γ | final accuracy (%) | best accuracy (%) | ε |"
    assert len(table) == 4 and all(
        line.startswith("| AlphaNormEC + server norm | 0.") for line in table[2:]
    )
    results = {r["beta"]: r for r in rows(path)}
    best = [float(line.split("|")[5]) for line in table[2:]]
    assert best == sorted(best, reverse=True)
    expected = max(results.values(), key=lambda r: float(r["best_test_accuracy"]))
    assert table[2].split("|")[2].strip() == expected["beta"]
    with pytest.raises(ValueError, match="x='gamma'"):
        make_report(path, tmp_path / "r2", x="gamma")


# --------------------------------------------------------------------------- report, synthetic


def fake_results(tmp_path, with_nan=True):
    """A 2 × 2 × 2 grid (β, γ, server normalization) with curves; one run without accuracy, one
    failed."""
    header = ["run", "status", "step_size", "beta", "server_normalization",
              "final_test_accuracy", "best_test_accuracy", "final_train_loss", "epsilon",
              "rounds", "wall_time_s", "run_dir"]  # fmt: skip
    lines = []
    index = 0
    for step in ("0.1", "1.0"):
        for beta in ("0.01", "0.1"):
            for norm in ("true", "false"):
                run = f"{index:04d}-abc"
                run_dir = tmp_path / "runs" / run
                run_dir.mkdir(parents=True)
                acc = 0.1 * index + 0.05
                status = "failed: boom" if index == 7 else "finished"
                best = "" if (with_nan and index == 5) else str(acc + 0.01)
                algo = {"class_path": "pl_privfed.algorithms.AlphaNormEC",
                        "init_args": {"server_normalization": norm == "true"}}  # fmt: skip
                (run_dir / "summary.json").write_text(json.dumps(
                    {"status": status, "config": {"model": {"algorithm": algo}}}))  # fmt: skip
                (run_dir / "curves.csv").write_text("metric,round,value\n" + "".join(
                    f"train/loss,{k},{2.0 / k}\ntest/acc,{k},{acc * k / 4}\n" for k in (1, 2, 3, 4)
                ))  # fmt: skip
                lines.append([run, status, step, beta, norm, str(acc), best,
                              "nan" if index == 2 else "0.5", "", "4", "1.0", str(run_dir)])  # fmt: skip
                index += 1
    return write_rows(tmp_path / "results.csv", header, lines)


def test_report_facets_difference_and_table(tmp_path):
    path = fake_results(tmp_path)
    written = make_report(path)
    assert [p.name for p in written] == ["heatmap.png", "heatmap_server_normalization_difference.png",
                                         "curves.png", "table.md", "table.csv"]  # fmt: skip
    assert all(p.parent == tmp_path / "report" and p.stat().st_size > 0 for p in written)
    table = (tmp_path / "report" / "table.md").read_text().splitlines()
    # no ε column (no run is private), server normalization goes into the method's name
    assert table[0] == "| method | β | γ | final accuracy (%) | best accuracy (%) |"
    body = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    assert len(body) == 7  # the failed run is left out
    assert [b[0] for b in body] == ["AlphaNormEC"] * 3 + ["AlphaNormEC + server norm"] * 4
    assert body[0] == ["AlphaNormEC", "0.1", "0.1", "35.00", "36.00"]
    assert body[1] == ["AlphaNormEC", "0.01", "0.1", "15.00", "16.00"]
    assert body[2] == ["AlphaNormEC", "0.01", "1.0", "55.00", ""]  # no best accuracy: blank
    assert [b[4] for b in body[3:]] == ["66.00", "46.00", "26.00", "6.00"]
    with (tmp_path / "report" / "table.csv").open(newline="") as f:
        assert list(csv.reader(f))[1] == body[0]
    # explicit facet and other axes
    written = make_report(
        path, tmp_path / "r2", x="step_size", y="beta", facet="server_normalization"
    )
    assert "heatmap_server_normalization_difference.png" in [p.name for p in written]
    with pytest.raises(ValueError, match="facet='alpha'"):
        make_report(path, tmp_path / "r3", facet="alpha")


def test_report_without_beta_and_without_finished_runs(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("run,status,step_size,scale,final_test_accuracy,best_test_accuracy,"
                    "final_train_loss,epsilon,rounds,wall_time_s,run_dir\n"
                    "0000-x,failed: boom,0.1,1.0,,,,,,,missing\n")  # fmt: skip
    written = make_report(path, tmp_path / "out")  # x falls back to `scale`
    assert [p.name for p in written] == ["table.md", "table.csv"]
    assert (
        (tmp_path / "out" / "table.md")
        .read_text()
        .splitlines()[0]
        .startswith("| method | scale | γ |")
    )


# --------------------------------------------------------------------------- shipped sweeps


def test_quickstart_grid_has_eight_points():
    sweep = load_sweep(REPO / "configs/sweeps/quickstart_grid.yaml")
    points = grid(sweep)
    assert len(points) == 8 and sweep.method == "grid"
    assert {p["model.algorithm.init_args.server_normalization"] for p in points} == {True, False}
    assert sweep.command[sweep.command.index("pl-privfed") + 1 :][:3] == [
        "fit", "--config", "configs/quickstart.yaml"]  # fmt: skip


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_shipped_sweeps_are_accepted_by_the_cli(path, tmp_path, monkeypatch):
    """Every value of every parameter, in at most max(len(values)) points, instantiates."""
    monkeypatch.chdir(REPO)  # the sweep commands name configs relative to the repository
    sweep = load_sweep(path)
    widest = max(len(v) for v in sweep.parameters.values())
    for i in range(widest):
        params = {k: v[i % len(v)] for k, v in sweep.parameters.items()}
        args = run_args(sweep, params, tmp_path / "run")
        assert args[0] == "fit"
        cli = PrivFedCLI(args=[*args[1:], "--trainer.logger=false"], run=False)
        for key, value in params.items():
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
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows_)
    return path


def test_report_rounds_to_target(tmp_path):
    """Paper 003 Figs. 1-2: rounds to the gradient-norm target against c, per τ and per classes."""
    header = ["run", "status", "classes_per_client", "clip_threshold", "steps", "step_size",
              "final_test_accuracy", "best_test_accuracy", "final_train_loss", "epsilon",
              "rounds", "wall_time_s", "rounds_to_target", "final_full_grad_norm",
              "client_transmissions", "run_dir"]  # fmt: skip
    body, i = [], 0
    for classes in ("1", "10"):
        for c in ("0.5", "null"):
            for steps in ("1", "5"):
                for step in ("0.1", "0.2"):
                    reached = "" if (classes == "1" and c == "0.5") else str(10 + i)
                    body.append([f"{i:04d}-x", "finished", classes, c, steps, step, "0.5", "0.5",
                                 "0.3", "", "100", "1.0", reached, "0.2", "1000", "missing"])  # fmt: skip
                    i += 1
    path = write_rows(tmp_path / "results.csv", header, body)
    written = make_report(path, tmp_path / "report", x="clip_threshold", y="step_size")
    assert [p.name for p in written][-1] == "rounds_to_target.png"
    assert written[-1].stat().st_size > 1000


def test_report_accuracy_vs_transmissions(tmp_path):
    """Paper 004 Fig. 2: accuracy of the best run per p against k · p · M transmissions."""
    header = ["run", "status", "step_size", "beta", "participation_prob",
              "final_test_accuracy", "best_test_accuracy", "final_train_loss", "epsilon",
              "rounds", "wall_time_s", "client_transmissions", "run_dir"]  # fmt: skip
    body = []
    for i, p in enumerate(("0.25", "0.5", "1.0")):
        run_dir = tmp_path / "runs" / f"{i:04d}-x"
        run_dir.mkdir(parents=True)
        (run_dir / "curves.csv").write_text(
            "metric,round,value\n" + "".join(f"test/acc,{k},{0.1 * k}\n" for k in (1, 2, 3))
        )
        body.append([run_dir.name, "finished", "0.01", "0.01", p, "0.3", "0.3", "1.0", "8.0",
                     "4", "1.0", str(int(4 * 20 * float(p))), str(run_dir)])  # fmt: skip
    path = write_rows(tmp_path / "results.csv", header, body)
    written = make_report(path, tmp_path / "report")
    assert written[-1].name == "accuracy_vs_transmissions.png" and written[-1].stat().st_size > 1000


def fake_method_sweep(root, name, algorithm, accuracies, bits_per_round, channel):
    """A results.csv of runs whose summary.json holds a gradient-norm history and bit totals."""
    header = ["run", "status", "step_size", "final_test_accuracy", "best_test_accuracy",
              "final_train_loss", "epsilon", "rounds", "wall_time_s", "run_dir"]  # fmt: skip
    body = []
    for i, acc in enumerate(accuracies):
        run_dir = root / name / "runs" / f"{i:04d}"
        run_dir.mkdir(parents=True)
        summary = {
            "config": {"model": {"algorithm": {"class_path": f"pl_privfed.algorithms.{algorithm}"}}},
            "rounds": 100,
            "communication_total_bits_per_agent": {channel: 100 * bits_per_round,
                                                   "server_to_client": 1e9},
            "full_grad_norm": {"history": [[0, 2.0], [50, 1.0], [100, 0.5 + i]]},
        }  # fmt: skip
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "curves.csv").write_text(
            "metric,round,value\ntest/acc,50,0.4\ntest/acc,100,0.6\n"
        )
        body.append([f"{i:04d}", "finished", str(0.1 * (i + 1)), str(acc), str(acc), "0.3", "0.01",
                     "100", "1.0", str(run_dir)])  # fmt: skip
    return write_rows(root / name / "results.csv", header, body)


def test_compare_methods_draws_the_best_run_of_each_sweep(tmp_path):
    """Paper 001 Figs. 2-3: utility and accuracy of the best-tuned runs against rounds and bits."""
    porter = fake_method_sweep(tmp_path, "porter", "PORTER", [0.7, 0.8], 64.0, "agent_to_agent")
    soteria = fake_method_sweep(tmp_path, "soteria", "SoteriaFL", [0.6], 32.0, "client_to_server")
    main_args = ["compare", str(porter), str(soteria), "--out", str(tmp_path / "cmp")]
    with pytest.raises(SystemExit) as exit_:
        main(main_args)
    assert exit_.value.code == 0
    assert (tmp_path / "cmp" / "comparison.png").stat().st_size > 1000
    with (tmp_path / "cmp" / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["PORTER (step_size=0.2)", "SoteriaFL"]
    # the best PORTER run (accuracy 0.8, the second) ends at ||∇f|| = 1.5: utility 2.25
    assert [float(r["final utility"]) for r in rows] == [2.25, 0.25]
    # bits sent per agent: every channel but the server's broadcast
    assert [float(r["bits sent per agent"]) for r in rows] == [6400.0, 3200.0]
    assert [r["final accuracy (%)"] for r in rows] == ["80.00", "60.00"]


def test_compare_methods_needs_a_finished_run(tmp_path):
    header = ["run", "status", "step_size", "best_test_accuracy", "run_dir"]
    path = write_rows(tmp_path / "results.csv", header, [["0000", "failed", "0.1", "", ""]])
    with pytest.raises(ValueError, match="no finished run"):
        compare_methods([path], tmp_path / "out")
    with pytest.raises(ValueError, match="at least one"):
        compare_methods([], tmp_path / "out")
