"""Loaders of the papers' datasets: the real copies in ../shared/data and generated miniatures
in the canonical formats; CIFAR-10 preprocessing inside the engine."""

import hashlib
import io
import pickle
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import dump_svmlight_file

from pl_privfed.datamodules import (
    A9ADataModule,
    CIFAR10DataModule,
    ClassesPerClientPartitioner,
    FashionMNISTDataModule,
    IIDPartitioner,
    MNISTDataModule,
    random_crop_flip,
    vision,
)
from pl_privfed.datamodules.vision import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD

MD5 = {  # ../shared/data/README.md
    "MNIST/raw/train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "FashionMNIST/raw/train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "a9a/a9a": "fb3596510d780aaf76a06dc721d49662",
    "a9a/a9a.t": "f0bb16cf1ee3e80ff560e9d132ee647e",
    "cifar10-jpeg/cifar10-jpeg.tar.gz": "163cd5da1dd51a584b3b25feb328d988",
}


@pytest.mark.parametrize("name", sorted(MD5))
def test_real_files_match_their_md5(shared_data, name):
    assert hashlib.md5((shared_data / name).read_bytes()).hexdigest() == MD5[name]


@pytest.mark.parametrize("cls", [MNISTDataModule, FashionMNISTDataModule])
def test_real_mnist_like(cls):
    dm = cls(num_clients=10)  # data_dir from $PL_PRIVFED_DATA = ../shared/data (read-only)
    dm.setup("fit")
    train_x, train_y = dm.train_dataset.tensors
    test_x, test_y = dm.test_dataset.tensors
    assert train_x.shape == (60_000, 1, 28, 28) and test_x.shape == (10_000, 1, 28, 28)
    assert 0 <= train_x.min() and train_x.max() == 1
    assert set(train_y.unique().tolist()) == set(range(10)) == set(test_y.unique().tolist())
    x, y = dm.round_batch(0)
    assert x.shape == (10, 32, 1, 28, 28) and y.shape == (10, 32)
    paper = cls(num_clients=10, split="paper")
    paper.setup("fit")
    assert len(paper.train_dataset) == 63_000 and len(paper.test_dataset) == 7_000


def test_real_a9a():
    dm = A9ADataModule(num_clients=10)
    dm.setup("fit")
    x, y = dm.train_dataset.tensors
    assert x.shape == (32_561, 123) and len(dm.test_dataset) == 16_281
    assert set(x.unique().tolist()) == {0.0, 1.0} and set(y.unique().tolist()) == {0, 1}
    assert abs(y.float().mean().item() - 7841 / 32561) < 1e-6  # 7,841 positives (>50K)
    # README's a9a row quotes the test split's majority class (what always answering "<=50K" scores)
    test_labels = dm.test_dataset.tensors[1]
    majority = f"{100 * (test_labels == 0).float().mean().item():.1f}"
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert f"majority class {majority} %" in readme, majority


def test_real_cifar10_jpeg_copy():
    dm = CIFAR10DataModule(num_clients=10, max_test_examples=100)
    dm.setup("fit")
    assert dm.source == "jpeg"
    x, y = dm.train_dataset.tensors
    assert x.shape == (50_000, 3, 32, 32) and x.dtype == torch.uint8
    assert torch.bincount(y).tolist() == [5000] * 10
    assert len(dm.test_dataset) == 100
    again = CIFAR10DataModule(num_clients=10)  # second load: decoded arrays from the cache
    again.setup("fit")
    assert torch.equal(again.train_dataset.tensors[0], x)
    assert torch.bincount(again.test_dataset.tensors[1]).tolist() == [1000] * 10


def _idx(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_generated_mnist_files(tmp_path):
    rng = np.random.default_rng(0)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in [("train", 40), ("t10k", 12)]:
        images = rng.integers(0, 256, (n, 28, 28))
        labels = np.arange(n) % 10
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(_idx(images, 2051))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(labels, 2049))
    dm = MNISTDataModule(data_dir=str(tmp_path), num_clients=4, batch_size=3)
    dm.setup("fit")
    x, y = dm.train_dataset.tensors
    assert x.shape == (40, 1, 28, 28) and y.tolist() == (np.arange(40) % 10).tolist()
    first = np.frombuffer(
        (raw / "train-images-idx3-ubyte").read_bytes()[16 : 16 + 784], np.uint8
    ).reshape(28, 28)
    assert torch.equal(x[0, 0], torch.from_numpy(first.astype(np.float32) / 255))
    assert len(dm.test_dataset) == 12


def _cifar_batch(rng, n):
    return {
        "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        "labels": (np.arange(n) % 10).tolist(),
    }


def test_generated_canonical_cifar10(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = {f"data_batch_{i}": _cifar_batch(rng, 10) for i in range(1, 6)}
    batches["test_batch"] = _cifar_batch(rng, 20)
    for name, batch in batches.items():
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list(CIFAR10_CLASSES)}))
    dm = CIFAR10DataModule(data_dir=str(tmp_path), verify_md5=False, num_clients=2, batch_size=8)
    dm.setup("fit")
    assert dm.source == "canonical"
    x, y = dm.train_dataset.tensors
    assert y.tolist() == [k % 10 for k in range(10)] * 5
    assert x.shape == (50, 3, 32, 32) and len(dm.test_dataset) == 20
    expected = batches["data_batch_1"]["data"][0].reshape(3, 32, 32)
    assert torch.equal(x[0], torch.from_numpy(expected))
    with pytest.raises(RuntimeError, match="corrupted"):  # md5 checked by default
        CIFAR10DataModule(data_dir=str(tmp_path), num_clients=2, batch_size=8).setup("fit")


def _write_jpeg_archive(data: Path) -> None:
    """A miniature CIFAR-10 JPEG archive: 2 training and 1 test image of each class."""
    rng = np.random.default_rng(1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for part, per_class in [("train", 2), ("test", 1)]:
            for name in CIFAR10_CLASSES:
                for k in range(per_class):
                    img = io.BytesIO()
                    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                        img, format="JPEG", quality=75
                    )
                    info = tarfile.TarInfo(f"{part}/{name}/{k:04d}.jpg")
                    info.size = len(img.getvalue())
                    tar.addfile(info, io.BytesIO(img.getvalue()))
    data.mkdir()
    (data / "cifar10-jpeg.tar.gz").write_bytes(buffer.getvalue())


def test_generated_jpeg_archive_is_decoded_once(tmp_path):
    data = tmp_path / "data"
    _write_jpeg_archive(data)
    cache = tmp_path / "cache"
    dm = CIFAR10DataModule(data_dir=str(data), cache=str(cache), num_clients=2, batch_size=2)
    dm.setup("fit")
    assert dm.source == "jpeg"
    assert dm.train_dataset.tensors[1].tolist() == [c for c in range(10) for _ in range(2)]
    cached = cache / "cifar10-jpeg" / "train_x.npy"
    stamp = cached.stat().st_mtime_ns
    again = CIFAR10DataModule(data_dir=str(data), cache=str(cache), num_clients=2, batch_size=2)
    again.setup("fit")
    assert cached.stat().st_mtime_ns == stamp  # decoded once
    assert torch.equal(again.train_dataset.tensors[0], dm.train_dataset.tensors[0])
    # the same images as an (extracted) image folder give the same arrays
    folder = tmp_path / "folder"
    with tarfile.open(data / "cifar10-jpeg.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    from_folder = CIFAR10DataModule(data_dir=str(folder), num_clients=2, batch_size=2)
    from_folder.setup("fit")
    assert (folder / "train_x.npy").is_file()  # cached beside a writable folder
    for a, b in zip(from_folder.train_dataset.tensors, dm.train_dataset.tensors, strict=True):
        assert torch.equal(a, b)
    (data / "cifar10-jpeg.tar.gz").unlink()
    with pytest.raises(FileNotFoundError, match="CIFAR-10 not found"):
        CIFAR10DataModule(data_dir=str(data), cache=str(cache)).setup("fit")


def test_processes_starting_together_decode_the_archive_once(tmp_path, monkeypatch):
    """Loads that start together (DDP ranks, a sweep's points, the test workers sharing one
    cache) decode once under a file lock, and leave only whole arrays behind."""
    data = tmp_path / "data"
    _write_jpeg_archive(data)
    decoded, release = [], threading.Event()
    real = vision._archive_arrays

    def slow_decode(archive):
        decoded.append(archive)
        release.wait(5)  # the second load arrives while the first decodes
        return real(archive)

    monkeypatch.setattr(vision, "_archive_arrays", slow_decode)
    out = [None, None]

    def load(k):
        out[k] = vision.load_cifar10_arrays(data, tmp_path / "cache")

    threads = [threading.Thread(target=load, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    release.set()
    for t in threads:
        t.join(30)
    assert len(decoded) == 1
    for a, b in zip(out[0][:4], out[1][:4], strict=True):
        assert np.array_equal(a, b)
    left = sorted(p.name for p in (tmp_path / "cache" / "cifar10-jpeg").iterdir())
    assert left == [".decode.lock", "test_x.npy", "test_y.npy", "train_x.npy", "train_y.npy"]


def _reference_crop_flip(img, top, left, flip, padding=4):
    c, h, w = img.shape
    padded = torch.zeros(c, h + 2 * padding, w + 2 * padding)
    padded[:, padding : padding + h, padding : padding + w] = img
    out = torch.empty(c, h, w)
    for i in range(h):
        for j in range(w):
            jj = (w - 1 - j) if flip else j
            out[:, i, j] = padded[:, top + i, left + jj]
    return out


def test_random_crop_flip_matches_a_plain_loop():
    images = torch.rand(6, 3, 8, 8)
    gen = torch.Generator().manual_seed(3)
    out = random_crop_flip(images, 4, gen)
    replay = torch.Generator().manual_seed(3)
    top = torch.randint(0, 9, (6,), generator=replay)
    left = torch.randint(0, 9, (6,), generator=replay)
    flip = torch.rand(6, generator=replay) < 0.5
    for m in range(6):
        ref = _reference_crop_flip(images[m], int(top[m]), int(left[m]), bool(flip[m]))
        assert torch.equal(out[m], ref)


def test_cifar_preprocessing_is_seeded_by_round_and_normalizes():
    dm = CIFAR10DataModule(num_clients=2, augment=True, seed=5)
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    a, b, c = dm.preprocess(x, True, 7), dm.preprocess(x, True, 7), dm.preprocess(x, True, 8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    plain = dm.preprocess(x, False, 0)
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    assert torch.allclose(plain, (x.float() / 255 - mean) / std)


def test_svmlight_miniature(tmp_path):
    x = np.eye(5, 123)
    dump_svmlight_file(x, np.array([1, -1, 1, -1, 1]), str(tmp_path / "a9a"), zero_based=False)
    dump_svmlight_file(x[:2, :100], np.array([-1, 1]), str(tmp_path / "a9a.t"), zero_based=False)
    dm = A9ADataModule(data_dir=str(tmp_path), num_clients=1, batch_size=2)
    dm.setup("fit")
    assert dm.train_dataset.tensors[1].tolist() == [1, 0, 1, 0, 1]
    assert dm.test_dataset.tensors[0].shape == (2, 123)


def test_paper_partitions_on_real_mnist():
    iid = MNISTDataModule(num_clients=10, split="paper", partitioner=IIDPartitioner(42))
    iid.setup("fit")
    # 63,000 training images, 6,300 of them held out for validation before partitioning
    assert sorted(iid.client_sizes.tolist()) == [5670] * 10 and len(iid.val_indices) == 6300
    per = MNISTDataModule(
        num_clients=10, partitioner=ClassesPerClientPartitioner(1, seed=0, samples_per_client=1024)
    )
    per.setup("fit")
    labels = per.train_dataset.tensors[1]
    assert per.client_sizes.tolist() == [1024] * 10
    assert all(len(labels[s].unique()) == 1 for s in per.shards)
