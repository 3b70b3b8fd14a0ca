"""The local sweep runner and the report: grid expansion, arguments, resume, failures, figures;
every shipped sweep file's values are accepted by the CLI."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from pl_privfed.cli import PrivFedCLI, main
from pl_privfed.report import make_report
from pl_privfed.sweep import grid, load_sweep, run_args, run_sweep

REPO = Path(__file__).resolve().parents[1]
SWEEPS = sorted((REPO / "configs/sweeps").glob("*.yaml"))
FAST = ["--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false"]  # fmt: skip


def write_sweep(tmp_path, parameters, name="tiny"):
    spec = {"name": name, "method": "grid", "metric": {"name": "test/acc", "goal": "maximize"},
            "parameters": parameters,
            "command": ["${env}", "pl-privfed", "fit", "--config",
                        str(REPO / "configs/quickstart.yaml"), "${args}"]}  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_grid_order_and_arguments(tmp_path):
    path = write_sweep(tmp_path, {"a.x": {"values": [1, 2]}, "b.flag": {"values": [True, False]},
                                  "c.fixed": {"value": None}, "d.x": {"value": 0.5}})  # fmt: skip
    sweep = load_sweep(path)
    points = grid(sweep)
    assert [(p["a.x"], p["b.flag"]) for p in points] == [
        (1, True),
        (1, False),
        (2, True),
        (2, False),
    ]
    assert sweep.swept == ["a.x", "b.flag"]
    args = run_args(sweep, points[1], "out/0001")
    assert args == ["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--a.x=1",
                    "--b.flag=false", "--c.fixed=null", "--d.x=0.5", "--output_dir=out/0001",
                    "--trainer.default_root_dir=out/0001"]  # fmt: skip


@pytest.mark.parametrize(
    "change, message",
    [({"method": "random"}, "method must be 'grid'"),
     ({"parameters": {"a": {"min": 0}}}, "parameters.a needs 'value' or 'values'"),
     ({"parameters": {"a": {"values": []}}}, "parameters.a.values"),
     ({"command": ["pl-privfed", "fit"]}, "command must be a list containing")],
)  # fmt: skip
def test_validation(tmp_path, change, message):
    path = write_sweep(tmp_path, {"a": {"values": [1]}})
    spec = yaml.safe_load(path.read_text())
    spec.update(change)
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=message):
        load_sweep(path)


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_run_resume_failure_and_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = write_sweep(tmp_path, {"model.algorithm.init_args.beta": {"values": [0.1, -1.0]},
                                   "model.algorithm.init_args.step_size": {"value": 0.2}})  # fmt: skip
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:  # beta = -1 is rejected: exit status 1
        main(["sweep", str(sweep), "--out", str(out), "--", *FAST])
    assert exit_info.value.code == 1
    results = rows(out / "results.csv")
    assert [r["beta"] for r in results] == ["0.1", "-1.0"]
    assert results[0]["status"] == "finished" and results[0]["rounds"] == "4"
    assert results[1]["status"].startswith("failed") and "beta" in results[1]["status"]
    finished = Path(results[0]["run_dir"]) / "summary.json"
    stamp = finished.stat().st_mtime_ns
    assert (
        json.loads(finished.read_text())["config"]["model"]["algorithm"]["init_args"]["beta"] == 0.1
    )
    # resume: the finished run is not redone, the failed one is retried (and fails again)
    path, failures = run_sweep(sweep, out, overrides=FAST)
    assert failures == 1 and finished.stat().st_mtime_ns == stamp
    # report from the CSV: heatmap, curves and the paper-style table
    written = make_report(path, tmp_path / "report")
    names = {p.name for p in written}
    assert {"heatmap.png", "curves.png", "table.md", "table.csv"} <= names
    assert all(p.stat().st_size > 0 for p in written)
    table = (tmp_path / "report" / "table.md").read_text().splitlines()
    assert table[0] == "| method | beta | step_size | final accuracy | best accuracy | epsilon |"
    assert len(table) == 3 and table[2].startswith("| AlphaNormEC + server norm | 0.1 | 0.2 |")
    with pytest.raises(ValueError, match="x='gamma'"):
        make_report(path, tmp_path / "r2", x="gamma")


def test_dry_run_prints_commands(tmp_path, capsys):
    sweep = write_sweep(tmp_path, {"model.algorithm.init_args.beta": {"values": [0.1, 0.2]}})
    path, failures = run_sweep(sweep, tmp_path / "out", dry_run=True)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "pl_privfed.cli" in ln]
    assert failures == 0 and len(lines) == 2 and "--model.algorithm.init_args.beta=0.2" in lines[1]
    assert rows(path) == []


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
            obj = {"model": cli.model, "trainer": cli.trainer}[key.split(".")[0]]
            attr = key.split(".")[-1]
            if key.startswith("model.algorithm"):
                obj = cli.model.algorithm
                if ".noise." in key:
                    obj = obj.noise
            actual = getattr(obj, attr, None)
            if attr == "clip_threshold":
                actual = obj.operator.threshold
            elif attr == "scale":
                actual = obj.scale
            if actual is not None:
                assert actual == value, (key, actual, value)
    assert len(grid(sweep)) == int(
        __import__("math").prod(len(v) for v in sweep.parameters.values())
    )


def test_quickstart_grid_has_eight_points():
    assert len(grid(load_sweep(REPO / "configs/sweeps/quickstart_grid.yaml"))) == 8
