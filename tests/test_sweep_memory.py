"""A batched group whose configurations' client state would not fit in memory together is
split: its process is refused before training naming how many fit (``grid_memory: refuse``),
and the sweep runs the points in groups of that size (``PL_PRIVFED_MEMORY_BYTES`` stands in
for a small machine)."""

from pathlib import Path

import pytest
from helpers.sweeps import rows, write_sweep

from pl_privfed.cli.app import PrivFedCLI
from pl_privfed.engine.state import MEMORY_ENV
from pl_privfed.sweep import run_sweep

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs/algorithms/alpha_normec.yaml")  # α-NormEC, digits, 10 clients
FAST = [
    "--trainer.max_steps=2",
    "--trainer.val_check_interval=2",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
]


@pytest.mark.slow
def test_a_group_too_large_for_memory_runs_in_groups_that_fit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cli = PrivFedCLI(args=["--config", CONFIG, "--trainer.logger=false"], run=False)
    each = cli.datamodule.num_clients * cli.model.layout.dim * 4  # α-NormEC's g_i, float32
    # a quarter of this "machine" holds the run's own algorithm and two configurations
    monkeypatch.setenv(MEMORY_ENV, str(4 * (3 * each + each // 2)))
    params = {"model.algorithm.init_args.step_size": {"values": [0.05, 0.1, 0.2]}}
    sweep = write_sweep(
        tmp_path,
        params,
        name="mem",
        command=["${env}", "pl-privfed", "fit", "--config", CONFIG, "${args}"],
    )
    table = rows(run_sweep(sweep, tmp_path / "out", overrides=FAST, batch=True))
    assert [r["status"] for r in table] == ["finished"] * 3
    printed = capsys.readouterr().out
    assert "too many configurations for memory: 2 groups of at most 2" in printed
    folders = sorted((tmp_path / "out" / "groups").iterdir())
    assert len(folders) == 2  # the refused group of 3, then the group of the first two
    (refused,) = [
        f for f in folders if "at most 2 configurations at once" in (f / "output.log").read_text()
    ]
    (grid,) = [f for f in folders if f != refused]
    assert (grid / "command.txt").read_text().count('"step_size"') == 2  # the first two
    assert "--model.grid_memory=refuse" in (grid / "command.txt").read_text()
    assert [("batched" in (Path(r["run_dir"]) / "summary.json").read_text()) for r in table] == [
        True,
        True,
        False,
    ]
