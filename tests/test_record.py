"""The run record (``pl_privfed.record``): declared once, produced by one function for a single
run, a grid configuration and a batched sweep point, and read by ``results.csv`` and the W&B
summary. A field added to the declaration appears in all of them."""

import csv
import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from pl_privfed import FederatedModule, record
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.callbacks import RunSummary
from pl_privfed.datamodules import DigitsDataModule
from pl_privfed.grid import GridModule
from pl_privfed.models import LogisticRegression
from pl_privfed.results import result_columns, result_row, save_results
from pl_privfed.sweep import wandb_runs
from pl_privfed.sweep.batch import Group, write_point_records

#: the field the test declares: the smallest validation loss, read from the curve
ADDED = record.Field(
    "min_val_loss", "the smallest validation loss", curve="val/loss", pick="min", column=True
)


def test_a_record_reads_curves_then_entries_in_the_declared_order():
    curves = {"val/acc": [(2, 0.5), (4, 0.7), (6, 0.6)], "val/loss": [(6, 0.9), (2, 1.5)]}
    made = record.make_record(
        status="finished",
        rounds=6,
        curves=curves,
        entries={"final_val_accuracy": 0.1, "epsilon": 2.0, "extra": 1},
    )
    assert list(made)[: len(record.FIELDS)] == record.field_names()
    assert list(made)[-1] == "extra"  # the run's other entries follow the record
    assert made["final_val_accuracy"] == 0.6  # the curve wins over an entry of the same name
    assert (made["best_val_accuracy"], made["best_val_round"]) == (0.7, 4)
    assert (made["final_val_loss"], made["final_val_round"]) == (0.9, 6)
    assert made["epsilon"] == 2.0 and made["final_test_accuracy"] is None
    assert record.result_columns() == tuple(f.name for f in record.FIELDS if f.column)
    assert "privacy" not in record.wandb_summary({"privacy": {"epsilon": 1.0}, "status": "x"})


def test_a_batched_point_takes_each_field_from_where_its_scope_says():
    group = {
        "status": "finished",
        "final_val_accuracy": 0.9,
        "data": {"clients": 4},
        "grid": {"configurations": 2},
        "operator_means": {"norm": 1.0},
        "epochs": 0,
    }
    own = {"final_val_accuracy": 0.5, "data": None, "client_transmissions": 12}
    entries, undeclared = record.point_entries(group, own)
    assert entries["final_val_accuracy"] == 0.5  # run: the configuration's, never the group's
    assert entries["rounds_to_target"] is None
    assert entries["data"] == {"clients": 4} and entries["epochs"] == 0  # group: the group's
    assert "grid" not in entries  # grid: the group's own description
    assert undeclared == ["operator_means"] and entries["operator_means"] is None


def _data():
    return DigitsDataModule(num_clients=4, batch_size=8, seed=0)


def _trainer(root, callbacks=()):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=4,
        val_check_interval=2,
        num_sanity_val_steps=0,
        default_root_dir=root,
        callbacks=list(callbacks),
    )


def _model():
    torch.manual_seed(0)
    return LogisticRegression(64, 10)


def test_a_field_added_to_the_declaration_reaches_every_output(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "FIELDS", (*record.FIELDS, ADDED))
    assert "min_val_loss" in result_columns()

    # a single run
    alone = RunSummary(dirpath=str(tmp_path / "alone"), verbose=False)
    _trainer(tmp_path / "alone", [alone]).fit(
        FederatedModule(_model(), AlphaNormEC(0.1, beta=0.1, alpha=0.01)), datamodule=_data()
    )
    single = json.loads((tmp_path / "alone" / "summary.json").read_text())
    assert single["min_val_loss"] == min(v for _, v in alone.curves["val/loss"])

    # a grid's configurations (what a batched group's process writes), and the group's summary
    group_dir = tmp_path / "group"
    grid = GridModule(
        _model(),
        AlphaNormEC(0.1, beta=0.1, alpha=0.01),
        grid={"step_size": [0.1, 0.3]},
        grid_dir=str(group_dir / "grid"),
    )
    _trainer(group_dir, [RunSummary(dirpath=str(group_dir), verbose=False)]).fit(
        grid, datamodule=_data()
    )
    with (group_dir / "grid" / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for configuration, row in zip(grid.configurations, rows, strict=True):
        expected = min(v for _, v in configuration.curves["val/loss"])
        assert float(row["min_val_loss"]) == expected  # results.csv's column
        own = json.loads((group_dir / "grid" / "runs" / row["run"] / "summary.json").read_text())
        assert own["min_val_loss"] == expected
    assert rows[0]["min_val_loss"] != rows[1]["min_val_loss"]

    # the batched points, each its configuration's value, in results.csv and the W&B summary
    points = [{"model.algorithm.init_args.step_size": v} for v in (0.1, 0.3)]
    group = Group([0, 1], points, ["model.algorithm.init_args.step_size"])
    run_dirs = [tmp_path / "points" / f"run{k}" for k in range(2)]
    written = write_point_records(group, group_dir, run_dirs, ["a", "b"], 0, 1.0)
    assert [p["min_val_loss"] for p in written] == [float(r["min_val_loss"]) for r in rows]
    names = {"model.algorithm.init_args.step_size": "step_size"}
    table = save_results(
        tmp_path / "points",
        names,
        [result_row(d, p, q, names) for d, p, q in zip(run_dirs, written, points)],
    )
    with table.open() as handle:
        assert [r["min_val_loss"] for r in csv.DictReader(handle)] == [
            r["min_val_loss"] for r in rows
        ]

    summaries = []

    class FakeRun:  # what wandb.init returns, recording the run summary it is given
        id, dir = "fake", str(tmp_path / "wandb" / "files")
        summary = type("Summary", (), {"update": lambda self, values: summaries.append(values)})()

        def define_metric(self, *args, **kwargs): ...
        def log(self, *args, **kwargs): ...
        def log_artifact(self, *args, **kwargs): ...
        def finish(self, *args, **kwargs): ...

    import wandb

    monkeypatch.setattr(wandb, "init", lambda **kwargs: FakeRun())
    monkeypatch.setattr(wandb, "Artifact", lambda **kwargs: type("A", (), {"add_file": print})())
    logger = {"class_path": "pytorch_lightning.loggers.WandbLogger", "init_args": {}}
    with_wandb = [{**p, "config": {"trainer": {"logger": [logger]}}} for p in written]
    wandb_runs.log_point_runs(with_wandb, run_dirs, ["a", "b"], "sweep", env={})
    assert [s["min_val_loss"] for s in summaries] == [p["min_val_loss"] for p in written]
    assert all(s["status"] == "finished" for s in summaries)


def test_results_columns_follow_the_declaration(monkeypatch):
    before = result_columns()
    monkeypatch.setattr(record, "FIELDS", (*record.FIELDS, ADDED))
    assert result_columns() == (*before, "min_val_loss")
    with pytest.raises(StopIteration):  # an undeclared name is no field
        next(f for f in record.FIELDS if f.name == "no_such_field")


def test_the_docs_table_is_the_declaration():
    text = (Path(__file__).resolve().parents[1] / "docs" / "run_record.md").read_text()
    start = text.index("<!-- record table: generated -->\n") + len(
        "<!-- record table: generated -->\n"
    )
    assert text[start : text.index("<!-- end of record table -->")] == record.markdown_table()
