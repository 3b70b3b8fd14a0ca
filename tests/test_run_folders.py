"""One folder per run, whatever the loggers (issue 49): a run's summary, config, curves and
checkpoints share a folder no other run writes into, with W&B alone, CSV alone, both or no
logger; a reused ``--output_dir`` is refused in one line unless the run continues there
(``--ckpt_path last``)."""

import json
from pathlib import Path

import pytest

import pl_privfed.callbacks.summary as summary_module
import pl_privfed.cli.app as app
from pl_privfed.cli import main

REPO = Path(__file__).resolve().parents[1]
DIGITS = str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")
WANDB = "pytorch_lightning.loggers.WandbLogger"
CSV = "pytorch_lightning.loggers.CSVLogger"


def _fit(tmp_path, loggers, *extra, rounds=2):
    """A 2-round quiet fit of the digits config with ``loggers`` (class paths; none: no logger)."""
    config = tmp_path / f"loggers_{len(loggers)}_{'_'.join(p[-9:] for p in loggers)}.yaml"
    lines = ["trainer:", "  logger:" if loggers else "  logger: false"]
    for path in loggers:
        project = "project: pl-privfed" if path == WANDB else "name: csv"
        lines += [f"    - class_path: {path}", f"      init_args: {{save_dir: logs, {project}}}"]
    config.write_text("\n".join(lines) + "\n")
    args = ["fit", "--config", DIGITS, "--config", str(config), "--trainer.max_steps"]
    args += [str(rounds), "--trainer.val_check_interval", str(rounds)]
    main([*args, "--trainer.enable_progress_bar", "false", *extra])


def _runs(pattern, tmp_path):
    """``{folder: summary}`` of the summaries matching ``pattern`` under ``tmp_path``."""
    found = sorted(tmp_path.glob(pattern))
    return {p.parent: json.loads(p.read_text()) for p in found}


def test_every_run_keeps_its_own_folder_whatever_the_loggers(tmp_path, monkeypatch):
    """Before: with ``WandbLogger`` alone ``summary.json``, ``config.yaml`` and the curves went
    straight into ``logs/`` (the logger's ``save_dir``) and the next run overwrote them."""
    monkeypatch.chdir(tmp_path)
    sent = []  # what the runs' W&B summaries receive: the record's fields, status included
    record = summary_module.wandb_summary
    monkeypatch.setattr(
        summary_module, "wandb_summary", lambda d: sent.append(record(d)) or sent[-1]
    )
    _fit(tmp_path, [WANDB])
    _fit(tmp_path, [WANDB])
    assert [s["status"] for s in sent] == ["finished", "finished"] and "rounds" in sent[0]
    wandb_runs = _runs("logs/pl-privfed/*/summary.json", tmp_path)
    assert len(wandb_runs) == 2 and not (tmp_path / "logs/summary.json").exists()
    _fit(tmp_path, [WANDB, CSV])  # W&B first: its run's folder; the CSV logger its version
    _fit(tmp_path, [CSV])
    _fit(tmp_path, [])
    assert len(_runs("logs/pl-privfed/*/summary.json", tmp_path)) == 3
    assert len(_runs("logs/csv/version_*/summary.json", tmp_path)) == 1
    assert len(_runs("lightning_logs/version_*/summary.json", tmp_path)) == 1
    assert sorted(p.name for p in (tmp_path / "logs/csv").iterdir()) == ["version_0", "version_1"]
    everything = _runs("**/summary.json", tmp_path)
    assert len(everything) == 5
    for folder, summary in everything.items():
        assert summary["status"] == "finished" and summary["rounds"] == 2, folder
        assert (folder / "config.yaml").is_file() and (folder / "curves.csv").is_file()
        assert [p.name for p in (folder / "checkpoints").iterdir()] == ["round=000002.ckpt"]
    assert not list(tmp_path.glob("logs/lightning_logs"))  # W&B's checkpoints are in its run


def test_a_reused_output_dir_is_refused_unless_the_run_continues(tmp_path, monkeypatch, capsys):
    """Before: a second run into one ``--output_dir`` overwrote its ``summary.json`` and left
    the first run's metrics and checkpoints beside it. Now it is refused in one line;
    ``--ckpt_path last`` continues the run from its newest round checkpoint."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    _fit(tmp_path, [], "--output_dir", str(out))
    first = (out / "summary.json").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        _fit(tmp_path, [], "--output_dir", str(out))
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--output_dir" in err and "summary.json" in err, err
    assert (out / "summary.json").read_bytes() == first
    checked = []
    monkeypatch.setattr(app, "check_checkpoint_file", lambda p: checked.append(p) or Path(p))
    _fit(tmp_path, [], "--output_dir", str(out), "--ckpt_path", "last", rounds=4)
    assert checked == [str(out / "checkpoints/round=000002.ckpt")]  # what Lightning resumed
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["status"] == "finished" and resumed["rounds"] == 4
    assert json.loads(first)["rounds"] == 2
    with pytest.raises(SystemExit) as nothing:
        _fit(tmp_path, [], "--output_dir", str(tmp_path / "new"), "--ckpt_path", "last")
    assert nothing.value.code == 2 and "no round checkpoint" in capsys.readouterr().err
