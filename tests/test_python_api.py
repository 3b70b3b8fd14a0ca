"""docs/python_api.md: a federation from one's own ``nn.Module`` and tensors, in about 20 lines
(the page's example runs here as written), through ``FederatedDataModule.from_tensors`` /
``from_datasets`` and ``pl_privfed.default_callbacks()``."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from pl_privfed import FederatedDataModule
from pl_privfed.datamodules import DatasetDataModule, DirichletPartitioner

DOC = Path(__file__).resolve().parents[1] / "docs" / "python_api.md"


def test_the_documented_example_runs(tmp_path, monkeypatch, capsys):
    (code, *_) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(code.strip().splitlines()) <= 25
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    folder = tmp_path / "logs" / "python_api"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds"] == 100
    assert summary["epsilon"] == pytest.approx(8.0, abs=0.01) and summary["delta"] == 1e-5
    assert summary["privacy"]["neighbouring_relation"] == "replace_one"
    assert summary["privacy"]["sample_rate"] == 1.0  # full-batch rounds: no amplification
    assert summary["final_test_accuracy"] > 0.85
    assert (folder / "curves.png").is_file()
    assert [p.name for p in (folder / "checkpoints").iterdir()] == ["round=000100.ckpt"]
    assert "round 100/100" in capsys.readouterr().out.replace("\r", "\n")
    # the page quotes this run's numbers: they are the ones it reports
    page = " ".join(DOC.read_text().split())
    (quoted,) = re.findall(
        r"It ends at ([\d.]+) % validation and ([\d.]+) % test accuracy and ε = ([\d.]+) \(δ = 1e-5\)"
        r" after (\d+) rounds",
        page,
    )
    assert quoted == (
        f"{100 * summary['final_val_accuracy']:.1f}",
        f"{100 * summary['final_test_accuracy']:.1f}",
        f"{summary['epsilon']:.2f}",
        str(summary["rounds"]),
    )


def test_from_tensors_converts_arrays_and_infers_the_classes():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 2, 3))  # float64 arrays, any input shape
    y = rng.integers(0, 4, size=60)
    dm = FederatedDataModule.from_tensors(
        x[:50],
        y[:50],
        x[50:],
        y[50:],
        num_clients=5,
        batch_size=4,
        partitioner=DirichletPartitioner(1.0),
    )
    assert isinstance(dm, DatasetDataModule) and dm.num_classes == int(y.max()) + 1
    dm.setup("fit")
    inputs, targets = dm.round_batch(0)
    assert inputs.shape == (5, 4, 2, 3) and inputs.dtype == torch.float32
    assert targets.dtype == torch.int64 and len(dm.test_dataset) == 10
    regression = FederatedDataModule.from_tensors(
        x[:50], x[:50, 0, :1], x[50:], x[50:, 0, :1], num_clients=2, batch_size=4
    )
    assert regression.num_classes is None
    assert FederatedDataModule.from_tensors(x, y, x, y, num_classes=7).num_classes == 7


@pytest.mark.parametrize(
    "args, message",
    [
        (
            (torch.zeros(5, 2), torch.zeros(4), torch.zeros(2, 2), torch.zeros(2)),
            r"x_train and y_train must hold the same positive number of examples",
        ),
        (
            (torch.zeros(0, 2), torch.zeros(0), torch.zeros(2, 2), torch.zeros(2)),
            r"x_train and y_train",
        ),
        (
            (torch.zeros(5, 2), torch.zeros(5), torch.zeros(2, 2), torch.zeros(3)),
            r"x_test and y_test",
        ),
    ],
)
def test_from_tensors_refuses_mismatched_tensors(args, message):
    with pytest.raises(ValueError, match=message):
        FederatedDataModule.from_tensors(*args)


class Labelled(Dataset):
    """A map-style dataset that is not a TensorDataset: labels come from its items."""

    def __init__(self, n):
        self.x = torch.arange(n, dtype=torch.float32).view(n, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(i % 3)


def test_from_datasets_reads_any_map_style_dataset():
    dm = FederatedDataModule.from_datasets(Labelled(30), Labelled(9), num_clients=3, batch_size=5)
    assert dm.num_classes == 3
    dm.setup("fit")
    inputs, targets = dm.round_batch(2)
    assert inputs.shape == (3, 5, 1) and targets.shape == (3, 5)
    with pytest.raises(ValueError, match="train must hold at least one example"):
        FederatedDataModule.from_datasets(TensorDataset(torch.zeros(0, 1)), Labelled(3))
    with pytest.raises(ValueError, match="num_classes must be a positive integer"):
        FederatedDataModule.from_datasets(Labelled(3), Labelled(3), num_classes=0)
