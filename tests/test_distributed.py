"""Clients sharded over two CPU processes (gloo) give the single process's iterates.

Every algorithm family of tests/test_engine.py runs under ``torchrun --nproc_per_node 2``
(tests/helpers/ddp_families.py, ``Trainer(strategy="ddp", devices=2)``) and on one process here, in
float64: parameters and the whole federation's state agree to 1e-12 (the processes' partial sums
are added in another order). A run interrupted at round 3 on two processes resumes bit for bit on
two, and its checkpoint finishes on one process with the single run's iterates. The command
line runs under ``--trainer.strategy ddp --trainer.devices 2``, and model-sharding strategies
are refused before training.
"""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.ddp_families import FAMILIES, fit, state

from pl_privfed.engine import ClientShard
from pl_privfed.engine.distributed import adopt_strategy

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }


def _close(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for key in a:
        if a[key].is_floating_point():
            torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=1e-12, msg=key)
        else:
            assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "tests" / "helpers" / "ddp_families.py"),
        str(out),
        *FAMILIES,
        "resume",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_two_processes_give_the_single_process_iterates(name, two_processes, tmp_path):
    saved = torch.load(two_processes / f"{name}.pt", weights_only=False)
    assert saved["shard"] == (0, 4)  # rank 0 holds clients 0-3 of 7
    _close(saved["state"], state(fit(name, tmp_path, devices=1)))


@pytest.mark.slow
def test_resume_on_two_processes_and_on_one(two_processes, tmp_path):
    name = next(iter(FAMILIES))
    resumed = torch.load(two_processes / "resumed.pt", weights_only=False)
    uninterrupted = torch.load(two_processes / f"{name}.pt", weights_only=False)["state"]
    for key, value in uninterrupted.items():  # bit for bit on the same two processes
        assert torch.equal(resumed["state"][key], value), key
    # the two-process checkpoint holds the whole federation: it finishes on one process
    finished = fit(name, tmp_path / "one", ckpt_path=resumed["checkpoint"], devices=1)
    _close(state(finished), state(fit(name, tmp_path / "single", devices=1)))


@pytest.mark.slow
def test_command_line_on_two_processes(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "pl_privfed.cli",
        "fit",
        "--config",
        str(ROOT / "configs/algorithms/dp_alpha_normec_digits.yaml"),
        "--trainer.strategy=ddp",
        "--trainer.devices=2",
        "--trainer.max_steps=6",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        f"--output_dir={tmp_path / 'out'}",
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (tmp_path / "out" / "summary.json").is_file()
    assert proc.stdout.count("[pl-privfed] rounds=6") == 1  # one summary line: rank 0's


def test_shard_blocks_and_strategies():
    shards = [ClientShard(7, rank, 3) for rank in range(3)]
    assert [(s.start, s.stop) for s in shards] == [(0, 3), (3, 6), (6, 7)]
    assert shards[1].owned(torch.tensor([0, 2, 3, 5, 6])).tolist() == [3, 5]
    assert [shards[0].owner(c) for c in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy

    ddp = SimpleNamespace(strategy=DDPStrategy())
    adopt_strategy(ddp)  # kept, without the DistributedDataParallel wrapper
    assert isinstance(ddp.strategy, DDPStrategy) and ddp.strategy.configure_ddp() is None
    adopt_strategy(SimpleNamespace(strategy=SingleDeviceStrategy("cpu")))
    with pytest.raises(ValueError, match="FSDPStrategy is not supported"):
        adopt_strategy(SimpleNamespace(strategy=FSDPStrategy()))
