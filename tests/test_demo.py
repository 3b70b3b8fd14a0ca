"""``make demo`` / ``pl-privfed demo``: a useful private run (certified ε ≤ 8 at δ = 1e-5 under
record-level local DP with replace-one neighbours and no sampling, test accuracy ≥ 85 %), its
non-private twin and a second algorithm at the same certified ε; a table and a figure."""

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from pl_privfed.cli import main
from pl_privfed.demo import DEMO_RUNS, find_configs

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def readme_demo_table() -> list[str]:
    """The lines of the README's demo table (its fenced block under "What `make demo` shows")."""
    blocks = re.findall(r"^```\w*\n(.*?)^```$", README, re.S | re.M)
    (block,) = [b for b in blocks if "ε (δ=1e-5)" in b]
    return block.strip().splitlines()


def progress_lines() -> list[str]:
    """The plain progress line of ``configs/demo/fedavg_private.yaml`` that the README and
    docs/callbacks.md show, each from its loss on."""
    callbacks = (REPO / "docs" / "callbacks.md").read_text(encoding="utf-8")
    (readme,) = re.findall(r"`(round 60/100 \[[^`]*)`", README)
    (doc,) = re.findall(r"^(round 60/100 \[.*)$", callbacks, re.M)
    return [line[line.index("loss=") :] for line in (readme, doc)]


def test_demo_configs_are_defensible_as_written():
    """What the accounting rests on is in the configs, explicitly."""
    for name in ("fedavg_private.yaml", "porter_private.yaml"):
        config = yaml.safe_load((REPO / "configs/demo" / name).read_text())
        noise = config["model"]["algorithm"]["init_args"]["noise"]
        assert noise["neighbouring"] == "replace_one" and noise["calibration"] == "target"
        assert noise["epsilon"] <= 8 and noise["delta"] == 1e-5
        data = config["data"]["init_args"]
        shard = data["partitioner"]["init_args"]["samples_per_client"]
        assert data["batch_size"] == shard  # full-batch rounds: no record sampling
        assert "sampler" not in config["model"]["algorithm"]["init_args"]  # every client, always


def test_the_demo_shows_a_useful_private_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["demo", "--out", "out", "--configs", str(REPO / "configs/demo")])
    assert info.value.code == 0
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing beside its folder
    out = capsys.readouterr().out
    assert "Privacy unit: one training image of a client" in out and "replace_one" in out
    assert "no amplification is claimed" in out
    for run in DEMO_RUNS:
        assert run.label in out
    # the README (and docs/callbacks.md) show this output: no quoted line drifts from it
    printed = out.splitlines()
    assert [line for line in readme_demo_table() if line not in printed] == []
    assert [line for line in progress_lines() if line not in out] == []
    summaries = {
        r.name: json.loads((tmp_path / "out" / r.name / "summary.json").read_text())
        for r in DEMO_RUNS
    }
    private = summaries["private"]
    assert private["epsilon"] <= 8.0 + 1e-6 and private["delta"] == 1e-5
    assert private["final_test_accuracy"] >= 0.85
    assert (
        private["privacy"]["sample_rate"] == 1.0 and private["privacy"]["rounds_accounted"] == 100
    )
    assert private["privacy"]["neighbouring_relation"] == "replace_one"
    assert private["privacy"]["privacy_unit"].startswith("example-level local DP")
    # the accuracy curve converges: its last evaluations sit within a few points of each other
    with (tmp_path / "out" / "private" / "curves.csv").open() as f:
        acc = [float(r["value"]) for r in csv.DictReader(f) if r["metric"] == "val/acc"]
    assert len(acc) == 10 and acc[-1] > acc[0] + 0.1 and max(acc[-3:]) - min(acc[-3:]) < 0.05
    assert not summaries["no_noise"]["private"]
    assert summaries["no_noise"]["final_test_accuracy"] >= private["final_test_accuracy"] - 0.02
    porter = summaries["porter_private"]
    assert porter["epsilon"] <= 8.0 + 1e-6 and porter["privacy"]["sample_rate"] == 1.0
    assert porter["privacy"]["neighbouring_relation"] == "replace_one"
    assert "record-level local DP per agent" in porter["privacy"]["privacy_unit"]
    assert (tmp_path / "out" / "demo.png").stat().st_size > 10_000
    with (tmp_path / "out" / "demo.csv").open() as f:
        assert [r["run"] for r in csv.DictReader(f)] == [r.name for r in DEMO_RUNS]


def test_find_configs_names_where_it_looked(tmp_path):
    assert find_configs(REPO / "configs/demo") == REPO / "configs/demo"
    with pytest.raises(FileNotFoundError, match=r"fedavg_private\.yaml, porter_private\.yaml"):
        find_configs(tmp_path)


def test_the_readmes_epsilon_4_run_prints_what_the_readme_says(tmp_path, monkeypatch, capsys):
    """README's "Changing a value": the demo config at ε = 4, its result line as printed."""
    (quoted,) = re.findall(r"`(\[pl-privfed\] rounds=100,[^`]*?epsilon=[0-9.]+)", README)
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs/demo/fedavg_private.yaml"),
            "--model.algorithm.init_args.noise.epsilon",
            "4",
            "--output_dir",
            "run",
            "--trainer.logger",
            "false",
        ]
    )
    assert " ".join(quoted.split()) in capsys.readouterr().out
