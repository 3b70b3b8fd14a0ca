"""A batched sweep gives every point its own W&B run (pl_privfed/sweep/wandb_runs.py): named,
grouped and configured as the point's separate run, holding its curves against ``round`` and
its results; the group's own process logs nothing to W&B."""

import json
import struct
from pathlib import Path

import pytest
from helpers.sweeps import rows, write_sweep

from pl_privfed.record import wandb_summary
from pl_privfed.sweep import run_sweep
from pl_privfed.sweep.wandb_runs import wandb_logger_args

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs/algorithms/dp_fedavg_clip.yaml")  # CSV and W&B loggers, digits
FAST = [
    "--trainer.max_steps=3",
    "--trainer.val_check_interval=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
]
ALG = "model.algorithm.init_args."


def records(path: Path) -> list:
    """The records of a W&B run log (``run-*.wandb``): a LevelDB log (32 KiB blocks, each
    record ``crc32 | length | type`` then its bytes, split across blocks as FIRST, MIDDLE, LAST)
    after W&B's 7-byte header, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    raw, block, pos, parts, out = path.read_bytes(), 32768, 7, b"", []
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        parts = data if kind in (1, 2) else parts + data
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


@pytest.mark.slow
def test_every_batched_point_gets_its_own_wandb_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = {"seed": {"value": 0}, ALG + "noise.epsilon": {"values": [2.0, 8.0]}}
    sweep = write_sweep(
        tmp_path,
        params,
        name="wb",
        command=["${env}", "pl-privfed", "fit", "--config", CONFIG, "${args}"],
    )
    table = rows(run_sweep(sweep, tmp_path / "out", overrides=FAST, batch=True))
    (group,) = (tmp_path / "out" / "groups").iterdir()
    assert "--model.grid=" in (group / "command.txt").read_text()
    assert not list(group.rglob("*.wandb"))  # the group's process logged nothing to W&B
    import wandb

    wandb.teardown()  # the service closes (flushes) every run log before it exits
    for row, epsilon in zip(table, (2.0, 8.0), strict=True):
        run_dir = Path(row["run_dir"])
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "finished" and "batched" in summary
        (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
        found = records(log)
        (run,) = [r.run for r in found if r.WhichOneof("record_type") == "run"]
        assert run.display_name == summary["config"]["run_name"]
        assert run.display_name.endswith(f"noise.epsilon={epsilon}")
        assert run.run_group == "wb"
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        assert config["model"]["algorithm"]["init_args"]["noise"]["epsilon"] == epsilon
        assert config["model"]["grid"] is None
        history = {}
        for record in found:
            if record.WhichOneof("record_type") == "history":
                items = {_key(i): json.loads(i.value_json) for i in record.history.item}
                history[items["round"]] = {
                    k: v for k, v in items.items() if k[0] != "_" and k != "round"
                }
        curves = {}
        for line in (run_dir / "curves.csv").read_text().splitlines()[1:]:
            metric, round_, value = line.split(",")
            curves.setdefault(int(round_), {})[metric] = float(value)
        assert history == curves and {"val/acc", "val/loss"} <= set(curves[2])
        assert "train/loss" in curves[1] and "test/acc" in curves[3]
        finals = {}
        for record in found:
            if record.WhichOneof("record_type") == "summary":
                finals.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        for key in ("final_val_accuracy", "final_test_accuracy", "epsilon", "rounds"):
            assert finals[key] == pytest.approx(summary[key]), key
        assert set(wandb_summary(summary)) <= set(finals)  # the record's W&B fields
        raw = log.read_bytes()
        assert b"run-summary" in raw and b"training-curves" in raw  # the two artifacts


def test_the_wandb_logger_is_found_in_a_resolved_config():
    wandb_entry = {
        "class_path": "pytorch_lightning.loggers.WandbLogger",
        "init_args": {"project": "p"},
    }
    csv_entry = {"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {}}
    assert wandb_logger_args({"trainer": {"logger": [csv_entry, wandb_entry]}}) == {"project": "p"}
    assert wandb_logger_args({"trainer": {"logger": wandb_entry}}) == {"project": "p"}
    assert wandb_logger_args({"trainer": {"logger": [csv_entry]}}) is None
    assert wandb_logger_args({"trainer": {"logger": False}}) is None
    assert wandb_logger_args(None) is None
