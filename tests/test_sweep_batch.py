"""Batched sweeps (``pl-privfed sweep --batch``): the points that differ only in the algorithm's
arguments train as one grid, and each point writes what its separate run writes (the same
``results.csv`` row and ``summary.json`` keys, the same certified ε)."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.sweeps import rows, write_sweep

from pl_privfed.sweep import run_sweep
from pl_privfed.sweep.batch import batch_parameter, groups

REPO = Path(__file__).resolve().parents[1]
CLIENT_LEVEL = str(REPO / "configs/algorithms/dp_fedavg_clip.yaml")  # digits, ε by calibration
FAST = [
    "--trainer.max_steps=3",
    "--trainer.val_check_interval=2",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
]
ALG = "model.algorithm.init_args."


def test_groups_are_the_points_that_differ_only_in_algorithm_arguments_and_seed():
    data = "data.init_args.batch_size"
    points = {
        0: {"seed": 0, ALG + "noise.epsilon": 2.0, data: 8},
        1: {"seed": 0, ALG + "noise.epsilon": 8.0, data: 8},
        2: {"seed": 1, ALG + "noise.epsilon": 2.0, data: 8},
        3: {"seed": 1, ALG + "noise.epsilon": 8.0, data: 16},
        5: {"seed": 2, ALG + "noise.epsilon": 8.0, data: 16},
        6: {"seed": 2, ALG + "noise.epsilon": 8.0, data: 32},  # alone: its data
    }
    found = groups(points)
    assert [g.indices for g in found] == [[0, 1, 2], [3, 5], [6]]
    assert found[0].varying == ["seed", ALG + "noise.epsilon"]
    assert found[0].grid == [
        {"--seed": 0, "noise.epsilon": 2.0},
        {"--seed": 0, "noise.epsilon": 8.0},
        {"--seed": 1, "noise.epsilon": 2.0},
    ]
    assert found[1].grid == [{"--seed": 1}, {"--seed": 2}]
    assert batch_parameter("seed", 3) == "--seed"
    assert batch_parameter("seed", True) is None and batch_parameter("seed", -1) is None
    # what is not an algorithm's plain argument runs alone: the data, an object, a deep field
    assert batch_parameter("data.init_args.batch_size", 8) is None
    assert batch_parameter(ALG + "operator", {"class_path": "x"}) is None
    assert batch_parameter(ALG + "operator.init_args.threshold", 1.0) == "operator.threshold"
    assert batch_parameter(ALG + "operator.init_args.inner.init_args.x", 1.0) is None
    assert batch_parameter(ALG + "noise", None) == "noise"
    assert batch_parameter(ALG + "noise.epsilon", None) is None
    mixed = {0: {ALG + "noise": None}, 1: {ALG + "noise": {"epsilon": 8.0}}}  # settings: the CLI's
    assert [(g.indices, g.varying) for g in groups(mixed)] == [([0], []), ([1], [])]


def _sweep(tmp_path, name, parameters, batch, where=((),)):
    """The sweep batched, or its points selected by each of ``where`` as separate processes."""
    path = write_sweep(
        tmp_path,
        parameters,
        name=name,
        command=["${env}", "pl-privfed", "fit", "--config", CLIENT_LEVEL, "${args}"],
    )
    out = tmp_path / ("batched" if batch else "separate") / name
    for chosen in [()] if batch else where:
        results = run_sweep(path, out, overrides=FAST, batch=batch, where=chosen)
    return results


def _f32(value):
    return np.float32(float(value))


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """A client-level private sweep over the seed and the target ε (each seed its own initial
    model, validation split, partition, minibatches, cohorts and noise) and its non-private
    twin over the step size (one step size diverges), each run batched and as separate
    processes (the private sweep's diagonal, (seed 0, ε 2) and (seed 1, ε 8): the seed and the
    target ε both differ between them, with half its processes)."""
    tmp = tmp_path_factory.mktemp("batch")
    private = {"seed": {"values": [0, 1]}, ALG + "noise.epsilon": {"values": [2.0, 8.0]}}
    diagonal = (("seed=0", "noise.epsilon=2.0"), ("seed=1", "noise.epsilon=8.0"))
    twin = {
        "seed": {"value": 0},
        ALG + "noise": {"value": None},
        ALG + "step_size": {"values": [0.5, 1.0e30]},
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("WANDB_MODE", "offline")
        out = {
            (name, batch): _sweep(tmp, name, params, batch, where)
            for name, params, where in (("private", private, diagonal), ("twin", twin, ((),)))
            for batch in (True, False)
        }
    return tmp, out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["private", "twin"])
def test_a_batched_point_writes_what_its_separate_run_writes(both, name):
    tmp, out = both
    batched, separate = rows(out[name, True]), rows(out[name, False])
    by_run = {r["run"]: r for r in batched}
    assert len(separate) == 2 and len(batched) == (4 if name == "private" else 2)
    pairs = [(by_run[s["run"]], s) for s in separate]  # the same run folders
    if name == "private":  # the diagonal: its first and last points
        assert [s["run"] for s in separate] == [batched[0]["run"], batched[3]["run"]]
    groups_made = list((tmp / "batched" / name / "groups").iterdir())
    assert len(groups_made) == 1  # one process trained every point
    for b, s in pairs:
        assert b["status"].startswith("failed") == s["status"].startswith("failed"), (b, s)
        assert b["rounds"] == s["rounds"]
        if s["status"] != "finished":  # the diverging step size: failed alone, at its round
            assert "non-finite training loss" in b["status"]
            continue
        for key in ("final_val_accuracy", "best_val_accuracy", "final_test_accuracy"):
            assert _f32(b[key]) == _f32(s[key]), key  # float32 metric vs its float64 copy
        for key in ("final_val_loss", "final_train_loss"):
            assert float(b[key]) == pytest.approx(float(s[key]), rel=1e-5), key
        assert b["best_val_round"] == s["best_val_round"]
        assert b["epsilon"] == s["epsilon"]  # its own ledger: the same certified ε
        one = json.loads((Path(b["run_dir"]) / "summary.json").read_text())
        two = json.loads((Path(s["run_dir"]) / "summary.json").read_text())
        assert set(one) - {"batched"} == set(two)
        assert one["private"] == two["private"] == (name == "private")
        if name == "private":
            assert one["privacy"]["noise_std"] == two["privacy"]["noise_std"]
            assert one["privacy"]["target_epsilon"] == two["privacy"]["target_epsilon"]
            assert one["epsilon_paper_convention"] == two["epsilon_paper_convention"]
        init_args = one["config"]["model"]["algorithm"]["init_args"]
        assert init_args == two["config"]["model"]["algorithm"]["init_args"]
        assert one["config"]["model"]["grid"] is None
        assert one["batched"]["points"] == (4 if name == "private" else 2)
        assert one["seeds"] == two["seeds"] and one["data"] == two["data"]  # its seed's split
        for key in ("seed", "seed_everything", "data"):  # the point's own seeds in its config
            assert one["config"][key] == two["config"][key], key
        assert one["config"]["run_name"] == two["config"]["run_name"]
        assert (Path(b["run_dir"]) / "curves.csv").is_file()
    if name == "private":  # each point calibrated to its own ε; the seeds did differ
        assert float(batched[0]["epsilon"]) == pytest.approx(2.0, rel=1e-2)
        assert float(batched[1]["epsilon"]) == pytest.approx(8.0, rel=1e-2)
        assert batched[1]["final_train_loss"] != batched[3]["final_train_loss"]
        sizes = [
            json.loads((Path(r["run_dir"]) / "summary.json").read_text())["data"]["client_sizes"]
            for r in batched
        ]
        assert sizes[0] == sizes[1] != sizes[2] == sizes[3]  # each seed's own partition


@pytest.mark.slow
def test_a_batched_sweep_resumes_and_runs_a_lone_point_alone(both, capsys):
    tmp, out = both
    path = out["private", True]
    stamps = [(Path(r["run_dir"]) / "summary.json").stat().st_mtime_ns for r in rows(path)]
    sweep = tmp / "private.yaml"
    run_sweep(sweep, path.parent, overrides=FAST, batch=True)  # everything finished
    assert capsys.readouterr().out.count("finished before, skipped") == 4
    assert [(Path(r["run_dir"]) / "summary.json").stat().st_mtime_ns for r in rows(path)] == stamps
    # one point left: a group of one runs as its separate run would (no grid)
    (Path(rows(path)[1]["run_dir"]) / "summary.json").unlink()
    run_sweep(sweep, path.parent, overrides=FAST, batch=True, dry_run=True)
    printed = capsys.readouterr().out.splitlines()
    assert sum("skipped" in line for line in printed) == 3 and len(printed) == 4
    assert "--model.grid" not in printed[-1] and f"--{ALG}noise.epsilon=8.0" in printed[-1]
    assert "--seed=0" in printed[-1]


@pytest.mark.slow
def test_a_bad_point_does_not_take_its_group_down(tmp_path, monkeypatch):
    """β = -1 is refused before training: the group's process fails, and its points run one by
    one, so that the bad point fails with its own error and the other finishes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    params = {ALG + "step_size": {"value": 0.2}, ALG + "beta": {"values": [-1.0, 0.1]}}
    path = run_sweep(write_sweep(tmp_path, params), tmp_path / "out", overrides=FAST, batch=True)
    table = rows(path)
    assert table[0]["status"].startswith("failed") and "beta" in table[0]["status"]
    assert table[1]["status"] == "finished" and table[1]["rounds"] == "3"
    (group,) = (tmp_path / "out" / "groups").iterdir()  # it was tried as one group first
    assert "--model.grid=" in (group / "command.txt").read_text()
    assert not (group / "summary.json").exists()
    assert "batched" not in json.loads((Path(table[1]["run_dir"]) / "summary.json").read_text())
