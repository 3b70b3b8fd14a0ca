"""Memory-mapped client state (``client_state: disk``) that nothing loses and nothing fools: its
snapshots live and die with their checkpoint (beside it, named relatively), are verified on load
(a missing, truncated or modified snapshot is refused in one line naming the file), and a full or
unwritable disk is an error naming the folder when the state is allocated, not a SIGBUS."""

import errno
import os
import shutil

import pytest
import torch
from helpers.interrupt import tiny_config
from helpers.training import trainer

from pl_privfed import FederatedModule
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.callbacks import RoundCheckpoint
from pl_privfed.cli import main
from pl_privfed.datamodules import DigitsDataModule, IIDPartitioner
from pl_privfed.engine import ClientShard, ClientStateError, ClientStates
from pl_privfed.models import MLP
from pl_privfed.privacy import DPNoise


def run(root, rounds, ckpt_path=None, every=1, state_dir=None):
    torch.manual_seed(0)
    dm = DigitsDataModule(num_clients=5, batch_size=8, partitioner=IIDPartitioner(seed=1))
    algorithm = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=DPNoise(noise_multiplier=1.0, seed=3))
    module = FederatedModule(
        MLP(64, [8], 10), algorithm, client_state="disk", state_dir=str(state_dir or root / "state")
    )
    callback = RoundCheckpoint(dirpath=root / "checkpoints", every_n_train_steps=every)
    t = trainer(root, max_steps=rounds, enable_checkpointing=True, callbacks=[callback])
    t.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module


def test_snapshots_live_beside_their_checkpoint_and_die_with_it(tmp_path):
    module = run(tmp_path, 4)
    assert module.algorithm.state.placement == "disk"
    folder = tmp_path / "checkpoints"
    # one checkpoint kept (save_top_k=1) and one snapshot folder: the superseded ones are gone
    assert sorted(p.name for p in folder.iterdir()) == [
        "round=000004.ckpt",
        "round=000004.client_state",
    ]
    assert not list((tmp_path / "state").rglob("snapshots"))  # none left in the state folder
    saved = torch.load(folder / "round=000004.ckpt", weights_only=False)
    entry = saved["client_state"]["algorithm.client_memory"]
    assert entry["files"] == ["round=000004.client_state/client_memory.rank0.npy"]  # relative
    snapshot = folder / entry["files"][0]
    assert entry["sizes"] == [snapshot.stat().st_size] and len(entry["sha256"][0]) == 64


def test_a_checkpoint_moved_with_its_snapshots_resumes_exactly(tmp_path):
    full = run(tmp_path / "full", 6)
    run(tmp_path / "first", 3)
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "first/checkpoints", moved)
    shutil.rmtree(tmp_path / "first")  # the original run and its state folder are gone
    resumed = run(tmp_path / "resumed", 6, ckpt_path=str(moved / "round=000003.ckpt"))
    for (key, a), (_, b) in zip(
        full.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), key
    assert torch.equal(
        full.algorithm.state.table("client_memory"), resumed.algorithm.state.table("client_memory")
    )


def _damage(snapshot, how):
    if how == "deleted":
        snapshot.unlink()
    elif how == "truncated":
        with snapshot.open("r+b") as f:
            f.truncate(snapshot.stat().st_size - 100)
    else:  # modified: same size, one value changed
        with snapshot.open("r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"\x00\x00\x80\x7f")


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("deleted", "is missing"),
        ("truncated", "bytes, the checkpoint recorded"),
        ("modified", "was modified since the checkpoint was written"),
    ],
)
def test_a_damaged_snapshot_is_refused_naming_the_file(tmp_path, how, says):
    run(tmp_path / "first", 3)
    snapshot = tmp_path / "first/checkpoints/round=000003.client_state/client_memory.rank0.npy"
    _damage(snapshot, how)
    with pytest.raises(ClientStateError, match=says) as info:
        run(
            tmp_path / "resumed", 5, ckpt_path=str(tmp_path / "first/checkpoints/round=000003.ckpt")
        )
    assert str(snapshot) in str(info.value) and "\n" not in str(info.value)


def test_the_command_refuses_a_modified_snapshot_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = str(tiny_config(tmp_path))
    disk = ["--model.client_state", "disk"]
    main(["fit", "--config", config, "--trainer.max_steps", "3", *disk])
    (ckpt,) = (tmp_path / "logs/tiny/version_0/checkpoints").glob("*.ckpt")
    (snapshot,) = (tmp_path / "logs/tiny/version_0/checkpoints").glob("*.client_state/*.npy")
    _damage(snapshot, "modified")
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(
            ["fit", "--config", config, "--trainer.max_steps", "5", *disk, "--ckpt_path", str(ckpt)]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1, err
    assert "was modified" in err[0] and snapshot.name in err[0]


def _states(tmp_path, rows=4, dim=1000):
    states = ClientStates(torch.nn.Module(), ClientShard(rows))
    states.declare("memory", (dim,), torch.float32)
    return states


def test_disk_state_is_allocated_up_front(tmp_path):
    states = _states(tmp_path, rows=64, dim=4096)  # 1 MiB
    states.allocate(torch.device("cpu"), "disk", str(tmp_path))
    path = states.files["memory"]
    if hasattr(os, "posix_fallocate"):
        assert path.stat().st_blocks * 512 >= 64 * 4096 * 4  # not a sparse file


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate")
def test_a_full_disk_is_an_error_naming_the_folder(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    states = _states(tmp_path)
    with pytest.raises(ClientStateError, match="No space left on device") as info:
        states.allocate(torch.device("cpu"), "disk", str(tmp_path / "state"))
    assert str(tmp_path / "state") in str(info.value) and "state_dir" in str(info.value)


def test_a_state_folder_under_a_file_is_an_error_naming_it(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    states = _states(tmp_path)
    with pytest.raises(ClientStateError, match="client-state folder") as info:
        states.allocate(torch.device("cpu"), "disk", str(blocker / "state"))
    assert str(blocker / "state") in str(info.value)
