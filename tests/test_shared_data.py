"""Reading the shared dataset copies writes nothing next to them (issue 22): torchvision
extracted the MNIST and Fashion-MNIST archives into ``../shared/data``."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest
from helpers.files import snapshot, snapshot_changes

from pl_privfed.datamodules import FashionMNISTDataModule, MNISTDataModule
from pl_privfed.datamodules.files import DataFileError
from pl_privfed.datamodules.vision import read_idx

MODULES = {"MNIST": MNISTDataModule, "FashionMNIST": FashionMNISTDataModule}


@pytest.fixture(scope="module")
def archives(shared_data, tmp_path_factory):
    """A writable copy of the MNIST and Fashion-MNIST archives (as ../shared/data is in a
    checkout): torchvision extracted the four files of each beside them."""
    root = tmp_path_factory.mktemp("archives")
    for name in MODULES:
        (root / name / "raw").mkdir(parents=True)
        for archive in (shared_data / name / "raw").glob("*.gz"):
            shutil.copyfile(archive, root / name / "raw" / archive.name)
    return root


def test_mnist_and_fashion_mnist_write_nothing_beside_their_archives(archives, tmp_path):
    before = snapshot(archives)
    assert sorted(before) == sorted(
        [f"{n}/raw" for n in MODULES]
        + [f"{n}" for n in MODULES]
        + [
            f"{n}/raw/{p}-{k}-idx{d}-ubyte.gz"
            for n in MODULES
            for p in ("train", "t10k")
            for k, d in (("images", 3), ("labels", 1))
        ]
    )
    for module in MODULES.values():
        dm = module(data_dir=str(archives), num_clients=4, batch_size=8, cache=str(tmp_path))
        dm.setup("fit")
        assert len(dm.train_dataset) == 60_000 and len(dm.test_dataset) == 10_000
        x, y = dm.train_dataset[0]
        assert tuple(x.shape) == (1, 28, 28) and 0 <= float(x.min()) <= float(x.max()) <= 1
        assert y.dtype.is_floating_point is False
    assert snapshot_changes(before, snapshot(archives)) == []
    assert list(tmp_path.iterdir()) == []  # nor into a cache: the archives are read in memory


def test_the_shared_copies_are_read_in_place_and_left_unchanged(shared_data):
    before = snapshot(shared_data)
    for module in MODULES.values():
        train, test = module(num_clients=2).load_datasets()  # PL_PRIVFED_DATA: the shared copy
        assert len(train) == 60_000 and len(test) == 10_000
    assert snapshot_changes(before, snapshot(shared_data)) == []


def test_read_idx_reads_archives_and_extracted_files_alike(archives, tmp_path):
    labels = read_idx(archives / "MNIST" / "raw" / "t10k-labels-idx1-ubyte")
    assert labels.shape == (10_000,) and labels.dtype == np.uint8 and labels.flags.writeable
    assert np.bincount(labels).tolist()[:3] == [980, 1135, 1032]  # MNIST's test set
    extracted = tmp_path / "t10k-labels-idx1-ubyte"
    with gzip.open(archives / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz") as file:
        extracted.write_bytes(file.read())
    assert np.array_equal(read_idx(extracted), labels)
    extracted.write_bytes(extracted.read_bytes()[:5000])
    with pytest.raises(ValueError, match=r"4992 values, its header says \(10000,\)"):
        read_idx(extracted)
    extracted.write_bytes(b"PK\x03\x04")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(extracted)


def test_a_truncated_extracted_file_is_named(archives, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(archives / "MNIST", root / "MNIST")
    (root / "MNIST" / "raw" / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00")
    with pytest.raises(DataFileError, match=r"MNIST files in .* cannot be read.*header"):
        MNISTDataModule(data_dir=str(root)).load_datasets()
