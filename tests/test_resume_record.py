"""Issue 30: the record a checkpoint keeps of its run is derived from the objects' constructor
arguments (through ``**kwargs`` to their base classes' and into nested objects) and what the run
realized (client count, partition fingerprint, model layers and shapes), for every datamodule of
the package and a user's, without a list to update. Before, ``MNISTDataModule``'s record lacked
``num_clients``, the partitioner, the batch size and the seed (they are its base's arguments,
passed on through ``**kwargs``), so a resumed MNIST run trained on with another federation."""

import inspect
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.resume import run

from pl_privfed import algorithms, datamodules, operators, privacy, resume, sampling
from pl_privfed.algorithms import DPFedAvg
from pl_privfed.checks import NOT_THE_RUN, arguments_of, constructor_parameters
from pl_privfed.cli import main
from pl_privfed.datamodules import (
    A9ADataModule,
    CIFAR10DataModule,
    DirichletPartitioner,
    FashionMNISTDataModule,
    FederatedDataModule,
    MNISTDataModule,
)
from pl_privfed.datamodules.vision import CIFAR10_CLASSES
from pl_privfed.models import LogisticRegression
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise
from pl_privfed.sampling import PoissonSampler

REPO = Path(__file__).resolve().parents[1]
PRIVATE_MNIST = str(REPO / "configs/private/mnist_dp_fedavg_clip.yaml")


def tiny_cifar(folder: Path) -> str:
    """A miniature CIFAR-10 in torchvision's format (40 training and 10 test images)."""
    rng = np.random.default_rng(0)
    batches = folder / "cifar-10-batches-py"
    batches.mkdir(parents=True, exist_ok=True)
    for name, n in [*((f"data_batch_{i}", 8) for i in range(1, 6)), ("test_batch", 10)]:
        batch = {
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "labels": (np.arange(n) % 10).tolist(),
        }
        (batches / name).write_bytes(pickle.dumps(batch))
    (batches / "batches.meta").write_bytes(pickle.dumps({"label_names": list(CIFAR10_CLASSES)}))
    return str(folder)


def federation(kind: type, folder: Path, **changes):
    """A set-up datamodule of ``kind`` (a few hundred examples, 4 clients, Dirichlet(0.5))."""
    kwargs = dict(
        num_clients=4,
        batch_size=2,
        seed=0,
        max_train_examples=400,
        partitioner=DirichletPartitioner(0.5, seed=0),
    )
    if kind is CIFAR10DataModule:
        kwargs.update(data_dir=tiny_cifar(folder), verify_md5=False, max_train_examples=None)
    kwargs.update(changes)
    datamodule = kind(**kwargs)
    datamodule.setup("fit")
    return datamodule


def record_of(datamodule) -> dict:
    """The run record of a private DP-FedAvg run (the private MNIST config's) on ``datamodule``."""
    noise = DPNoise(noise_multiplier=1.0, placement="central", seed=0)
    algorithm = DPFedAvg(
        0.5, local_step_size=1.0, operator=Clip(1.0), sampler=PoissonSampler(0.5), noise=noise
    )
    model = LogisticRegression(datamodule.train_dataset[0][0].numel(), 10)
    return resume.run_record([("algorithm.", algorithm)], datamodule, model, torch.nn.Module())


DATAMODULES = [MNISTDataModule, FashionMNISTDataModule, CIFAR10DataModule, A9ADataModule]
CHANGES = {
    "num_clients": (dict(num_clients=5), "data.num_clients: checkpoint 4, this run 5"),
    "concentration": (
        dict(partitioner=DirichletPartitioner(0.3, seed=0)),
        "data.partitioner.concentration: checkpoint 0.5, this run 0.3",
    ),
    "batch size": (dict(batch_size=3), "data.batch_size: checkpoint 2, this run 3"),
    "seed": (dict(seed=1), "data.seed: checkpoint 0, this run 1"),
}


@pytest.fixture
def loaded_once(monkeypatch):
    """Each dataset's files are read once per test (what is tested is the record, not reading):
    ``load_datasets`` is remembered per datamodule class and data folder."""
    cache = {}
    for kind in DATAMODULES:
        load = kind.load_datasets

        def remembered(self, load=load):
            key = (type(self), self.data_dir)
            if key not in cache:
                cache[key] = load(self)
            return cache[key]

        monkeypatch.setattr(kind, "load_datasets", remembered)


@pytest.mark.parametrize("kind", DATAMODULES, ids=lambda k: k.__name__)
def test_every_datamodule_of_the_package_refuses_another_federation(kind, tmp_path, loaded_once):
    saved = record_of(federation(kind, tmp_path))
    checkpoint = {resume.RECORD_KEY: saved, "global_step": 2}
    assert resume.check_resume(checkpoint, record_of(federation(kind, tmp_path))) is None
    for change, (kwargs, named) in CHANGES.items():
        with pytest.raises(ValueError, match="written by a different run") as info:
            resume.check_resume(checkpoint, record_of(federation(kind, tmp_path, **kwargs)))
        message = str(info.value)
        assert named in message and "\n" not in message, (change, message)
        # the partition's fingerprint follows from the arguments: not named beside them
        assert resume.PARTITION_KEY not in message, message
    allowed = resume.check_resume(
        checkpoint,
        record_of(federation(kind, tmp_path, num_clients=3)),
        allow_changes=["data.num_clients"],
    )
    assert allowed == {"data.num_clients": {"checkpoint": 4, "this_run": 3}}


class Blobs(FederatedDataModule):
    """A user's datamodule, not registered anywhere: Gaussian blobs, ``spread`` apart;
    ``examples`` is kept under another name (``self.size``), so only the partition shows it."""

    num_classes = 2

    def __init__(self, spread: float = 1.0, examples: int = 80, **kwargs) -> None:
        super().__init__(**kwargs)
        self.spread = spread
        self.size = examples

    def load_datasets(self):
        g = torch.Generator().manual_seed(0)
        y = torch.arange(self.size) % 2
        x = torch.randn(self.size, 3, generator=g) + self.spread * y[:, None]
        data = torch.utils.data.TensorDataset(x, y)
        return data, data


def test_a_user_datamodule_is_recorded_without_registering_it():
    def record(**changes):
        datamodule = Blobs(**{"num_clients": 4, "batch_size": 2, **changes})
        datamodule.setup("fit")
        return resume.data_record(datamodule)

    saved = record()
    assert {"spread", "num_clients", "batch_size", "partitioner", "seed"} <= set(saved)
    assert constructor_parameters(Blobs)[:2] == ["spread", "examples"]
    checkpoint = {resume.RECORD_KEY: {"data": saved}}
    cases = {
        "data.spread: checkpoint 1.0, this run 2.0": dict(spread=2.0),
        "data.num_clients: checkpoint 4, this run 5": dict(num_clients=5),
        # an argument the record cannot read still changes the realized partition
        f"data.{resume.PARTITION_KEY}: checkpoint '{saved[resume.PARTITION_KEY]}'": dict(
            examples=60
        ),
    }
    for named, kwargs in cases.items():
        with pytest.raises(ValueError, match=re.escape(named)):
            resume.check_resume(checkpoint, {"data": record(**kwargs)})


def _record_classes() -> list[type]:
    """What a run record holds objects of, as the package exports them: algorithms, samplers,
    operators, partitioners, datamodules, the noise and its placements."""
    modules = (algorithms, sampling, operators, datamodules)
    found = [getattr(m, n) for m in modules for n in m.__all__]
    kinds = [k for k in found if inspect.isclass(k) and not inspect.isabstract(k)]
    kinds = [
        k
        for k in kinds
        if k.__module__.split(".")[1] != "datamodules"
        or issubclass(k, FederatedDataModule | datamodules.Partitioner)
    ]
    return [
        *kinds,
        privacy.DPNoise,
        privacy.CentralNoise,
        privacy.DistributedNoise,
        privacy.LocalNoise,
        privacy.SecureAggregation,
    ]


#: what a class needs beyond its required arguments to be built at all
EXTRA = {
    "DPNoise": {"noise_multiplier": 1.0},
    "DistributedNoise": {"min_contributors": 2},
    "TopK": {"k": 2},
    "RandKBiased": {"k": 2},
    "RandKUnbiased": {"k": 2},
}
#: arguments that are the data itself, not settings: the partition's fingerprint stands for them
DATA = {"DatasetDataModule": ["train", "test"]}


def _built(kind: type):
    """``kind`` built with its required arguments filled in (2, else 0.5, or what it needs)."""
    examples = torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.arange(4) % 2)
    needs = {"operator": Clip(1.0), "train": examples, "test": examples}
    required = [
        n
        for n, p in inspect.signature(kind).parameters.items()
        if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    extra = EXTRA.get(kind.__name__, {})
    for filler in (2, 0.5):
        try:
            return kind(**{n: needs.get(n, filler) for n in required}, **extra)
        except (ValueError, TypeError):
            continue
    raise AssertionError(f"{kind.__name__} could not be built for the test")


@pytest.mark.parametrize("kind", _record_classes(), ids=lambda k: k.__name__)
def test_every_argument_of_every_recorded_class_is_in_the_record(kind):
    """Found from the package's exports, not listed: a datamodule, algorithm, sampler or
    operator added later is checked too. An argument the record cannot read (kept under
    another name) fails here, naming it."""
    record = arguments_of(_built(kind))
    skipped = {*NOT_THE_RUN, *DATA.get(kind.__name__, ())}
    unread = [n for n in constructor_parameters(kind) if n not in record and n not in skipped]
    assert not unread, f"{kind.__name__} keeps {unread} under other names: not in its record"


def test_a_checkpoint_of_an_older_version_is_refused_in_one_line():
    """Keys the checkpoint's record lacks (an older version recorded less: MNIST without its
    client count) are refused, naming the file, the keys and the way on; allowed on purpose,
    the keys the record has are still compared. A checkpoint without a record is refused."""
    current = {"data": {"class": "MNISTDataModule", "split": "standard", "num_clients": 1000}}
    older = {"data": {"class": "MNISTDataModule", "split": "standard"}}
    with pytest.raises(ValueError) as info:
        resume.check_resume({resume.RECORD_KEY: older}, current, ckpt_path="old.ckpt")
    assert str(info.value) == (
        "ckpt_path 'old.ckpt' was written by an older pl-privfed that did not record "
        "data.num_clients; resume with --resume_allow_changes data.num_clients if this run's "
        "values of them are the checkpoint's, or start the run again"
    )
    allow = ["data.num_clients"]
    assert resume.check_resume({resume.RECORD_KEY: older}, current, allow_changes=allow) is None
    older["data"]["split"] = "paper"
    with pytest.raises(
        ValueError, match=re.escape("data.split: checkpoint 'paper', this run 'standard'")
    ):
        resume.check_resume({resume.RECORD_KEY: older}, current, allow_changes=allow)
    refused = "'old.ckpt' was written by an older pl-privfed that kept no record of its run"
    with pytest.raises(ValueError, match=re.escape(refused + "; this version cannot check")):
        resume.check_resume({"global_step": 3}, current, ckpt_path="old.ckpt")


def test_the_record_names_nested_and_inherited_arguments_and_the_model_layers():
    data = arguments_of(MNISTDataModule(num_clients=7, data_dir="/x", cache="/y"))
    assert data["num_clients"] == 7 and data["partitioner"]["class"] == "IIDPartitioner"
    assert not {"data_dir", "cache", "download", "eval_batch_size"} & set(data)
    record = record_of(federation(A9ADataModule, Path("unused")))
    noise = record["algorithm"]["noise"]
    assert noise["placement"] == "central" and noise["noise_multiplier"] == 1.0
    assert record["algorithm"]["sampler"] == {"class": "PoissonSampler", "probability": 0.5}
    assert record["model"]["layers"] and record["model"]["parameters"]


def test_more_clients_than_the_client_state_holds_is_one_line(tmp_path):
    """An allowed ``data.num_clients`` change: fewer clients resume with the first clients'
    rows; more clients, which have no state (error-feedback memories) to resume from, are
    refused before anything loads, not a ``load_state_dict`` size-mismatch traceback."""
    first = tmp_path / "first"
    run(first)
    (path,) = (first / "checkpoints").glob("round=*.ckpt")
    allow = ["data.num_clients", "data.partitioner"]
    module, t = run(tmp_path / "fewer", clients=4, ckpt_path=str(path), rounds=5, allow=allow)
    assert t.global_step == 5
    changes = module.summary_entries()["resumed_with_changes"]
    assert changes == {"data.num_clients": {"checkpoint": 5, "this_run": 4}}
    with pytest.raises(ValueError) as info:
        run(tmp_path / "more", clients=6, ckpt_path=str(path), rounds=5, allow=allow)
    message = str(info.value)
    assert "data.num_clients: checkpoint 5, this run 6" in message and "\n" not in message
    assert "holds rows for 5 clients only" in message


def fails(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.slow
def test_the_private_mnist_config_refuses_another_federation_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """The issue's case, end to end: a checkpoint of configs/private/mnist_dp_fedavg_clip.yaml
    resumed with another ``num_clients`` or Dirichlet concentration (exit 2, one line naming
    the setting and both values); an allowed change is recorded in ``summary.json``."""
    monkeypatch.chdir(tmp_path)
    data = "--data.init_args."

    def fit(folder: str, *args: str) -> list[str]:
        return [
            "fit",
            "--config",
            PRIVATE_MNIST,
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.max_steps",
            "2",
            "--trainer.val_check_interval",
            "2",
            "--output_dir",
            str(tmp_path / folder),
            f"{data}num_clients",
            "20",
            f"{data}max_train_examples",
            "2000",
            f"{data}max_test_examples",
            "500",
            *args,
        ]

    main(fit("first"))
    (ckpt,) = tmp_path.glob("first/**/*.ckpt")
    capsys.readouterr()
    line = fails(fit("more", "--ckpt_path", str(ckpt), f"{data}num_clients", "30"), capsys)
    assert "data.num_clients: checkpoint 20, this run 30" in line
    assert "--resume_allow_changes data.num_clients" in line
    concentration = f"{data}partitioner.init_args.concentration"
    line = fails(fit("skew", "--ckpt_path", str(ckpt), concentration, "0.3"), capsys)
    assert "data.partitioner.concentration: checkpoint 0.5, this run 0.3" in line
    main(fit("same", "--ckpt_path", str(ckpt), "--trainer.max_steps", "3"))  # no spurious change
    summary = json.loads((tmp_path / "same/summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds"] == 3
    assert "resumed_with_changes" not in summary
    main(
        fit(
            "fewer",
            "--ckpt_path",
            str(ckpt),
            f"{data}num_clients",
            "10",
            "--resume_allow_changes",
            "data.num_clients",
        )
    )
    summary = json.loads((tmp_path / "fewer/summary.json").read_text())
    assert summary["resumed_with_changes"] == {
        "data.num_clients": {"checkpoint": 20, "this_run": 10}
    }
