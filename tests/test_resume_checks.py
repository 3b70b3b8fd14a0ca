"""A resumed run is the run it claims to continue: ``fit --ckpt_path`` with another client count,
partition, algorithm, noise, seed or model is refused before training, in one line naming what
differs (the checkpoint's value and this run's), unless the change is allowed on purpose
(``--resume_allow_changes``, recorded in ``summary.json``). A non-private checkpoint cannot be
continued by a private run."""

import json
import re

import pytest
from helpers.interrupt import tiny_config
from helpers.processes import refused
from helpers.resume import ROUNDS, noise, run

from pl_privfed import resume
from pl_privfed.algorithms import AlphaNormEC, Clip21
from pl_privfed.cli import main
from pl_privfed.datamodules import DirichletPartitioner, IIDPartitioner
from pl_privfed.models import MLP


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("first")
    run(root)
    (path,) = (root / "checkpoints").glob("round=*.ckpt")
    return str(path)


CHANGES = {
    "fewer clients": (dict(clients=4), "data.num_clients: checkpoint 5, this run 4"),
    "more clients": (dict(clients=6), "data.num_clients: checkpoint 5, this run 6"),
    "partition": (
        dict(partitioner=DirichletPartitioner(0.5, seed=1)),
        "data.partitioner: checkpoint 'IIDPartitioner', this run 'DirichletPartitioner'",
    ),
    "partition seed": (
        dict(partitioner=IIDPartitioner(seed=2)),
        "data.partitioner.seed: checkpoint 1, this run 2",
    ),
    "algorithm class": (
        dict(algorithm=Clip21(0.1, clip_threshold=1.0, noise=noise())),
        "algorithm: checkpoint 'AlphaNormEC', this run 'Clip21'",
    ),
    "noise seed": (
        dict(algorithm=AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=noise(4))),
        "algorithm.noise.seed: checkpoint 3, this run 4",
    ),
    "noise removed": (
        dict(algorithm=AlphaNormEC(0.1, beta=0.1, alpha=0.01)),
        "algorithm.noise: checkpoint 'DPNoise', this run None",
    ),
    "step size": (
        dict(algorithm=AlphaNormEC(0.2, beta=0.1, alpha=0.01, noise=noise())),
        "algorithm.step_size: checkpoint 0.1, this run 0.2",
    ),
    "model": (
        dict(model=MLP(64, [16], 10)),
        "model.parameters.net.1.weight: checkpoint [8, 64], this run [16, 64]",
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_resume_into_a_different_run_is_refused_naming_the_difference(
    change, checkpoint, tmp_path
):
    kwargs, named = CHANGES[change]
    with pytest.raises(ValueError, match="written by a different run") as info:
        run(tmp_path, ckpt_path=checkpoint, rounds=ROUNDS + 2, **kwargs)
    message = str(info.value)
    assert named in message, message
    assert "\n" not in message and "--resume_allow_changes" in message


def test_the_same_run_resumes_and_an_allowed_change_is_recorded(checkpoint, tmp_path):
    module, t = run(tmp_path / "same", ckpt_path=checkpoint, rounds=ROUNDS + 2)
    assert (
        t.global_step == ROUNDS + 2 and module.summary_entries().get("resumed_with_changes") is None
    )
    changed = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=noise(4))
    module, t = run(
        tmp_path / "allowed",
        ckpt_path=checkpoint,
        rounds=ROUNDS + 2,
        algorithm=changed,
        allow=["algorithm.noise.seed"],
    )
    assert t.global_step == ROUNDS + 2
    entries = module.summary_entries()
    assert entries["resume_allow_changes"] == ["algorithm.noise.seed"]
    assert entries["resumed_with_changes"] == {
        "algorithm.noise.seed": {"checkpoint": 3, "this_run": 4}
    }


def test_a_private_run_cannot_continue_non_private_rounds(tmp_path):
    plain = AlphaNormEC(0.1, beta=0.1, alpha=0.01)
    run(tmp_path / "plain", algorithm=plain)
    (path,) = (tmp_path / "plain/checkpoints").glob("round=*.ckpt")
    private = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=noise())
    with pytest.raises(
        ValueError, match=re.escape("algorithm.noise: checkpoint None, this run 'DPNoise'")
    ):
        run(tmp_path / "private", algorithm=private, ckpt_path=str(path), rounds=ROUNDS + 2)
    # not even when the change is allowed: no epsilon covers the noiseless rounds
    with pytest.raises(ValueError, match=f"holds {ROUNDS} rounds trained without noise"):
        run(
            tmp_path / "private2",
            algorithm=private,
            ckpt_path=str(path),
            rounds=ROUNDS + 2,
            allow=["algorithm.noise"],
        )


def test_the_command_refuses_in_one_line_and_records_an_allowed_change(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = str(tiny_config(tmp_path))
    quiet = ["--trainer.max_steps", "3"]
    main(["fit", "--config", config, *quiet])
    (ckpt,) = (tmp_path / "logs/tiny/version_0/checkpoints").glob("*.ckpt")
    args = [
        "fit",
        "--config",
        config,
        "--trainer.max_steps",
        "5",
        "--ckpt_path",
        str(ckpt),
        "--data.init_args.num_clients",
        "6",
    ]
    line = refused(args, tmp_path)  # a real process: exit 2, this line alone on stderr
    assert "data.num_clients: checkpoint 5, this run 6" in line, line
    assert "--resume_allow_changes" in line
    main(
        [
            *args,
            "--data.init_args.num_clients",
            "5",
            "--data.init_args.seed",
            "7",
            "--resume_allow_changes",
            "data.seed",
        ]
    )
    summary = json.loads((tmp_path / "logs/tiny/version_2/summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds"] == 5
    assert summary["resumed_with_changes"] == {"data.seed": {"checkpoint": 0, "this_run": 7}}


def test_the_check_reads_only_the_two_records():
    """``pl_privfed.resume.check_resume`` compares plain-data records, whatever built them: a
    prefix allows everything under it, the accepted differences come back, the refused ones
    are named in one line."""
    data = {"class": "DigitsDataModule", "num_clients": 5}
    saved = {"algorithm": {"class": "AlphaNormEC", "noise": {"class": "DPNoise", "seed": 3}}}
    record = {"algorithm": {"class": "AlphaNormEC", "noise": {"class": "DPNoise", "seed": 4}}}
    saved["data"] = record["data"] = data
    checkpoint = {resume.RECORD_KEY: saved, "global_step": 2}
    assert resume.check_resume(checkpoint, saved) is None
    changes = resume.check_resume(checkpoint, record, allow_changes=["algorithm.noise"])
    assert changes == {"algorithm.noise.seed": {"checkpoint": 3, "this_run": 4}}
    with pytest.raises(ValueError, match=r"--resume_allow_changes algorithm\.noise\.seed$"):
        resume.check_resume(checkpoint, record, allow_changes=["data"])
    # a name that is no setting of the run (issue 49: it was accepted and allowed nothing)
    with pytest.raises(ValueError, match=r"^--resume_allow_changes algorithm\.nois: not a setting"):
        resume.check_resume(checkpoint, record, allow_changes=["algorithm.nois"])
    with pytest.raises(ValueError, match="holds 2 rounds trained without noise"):
        resume.check_resume(checkpoint, saved, private=True)
    assert resume.finished_rounds(checkpoint, 2) == (2, 2)
    assert resume.finished_rounds(checkpoint, 3) is None
    assert resume.finished_rounds(checkpoint, 0) is None  # a run without a bound
