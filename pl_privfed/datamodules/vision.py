"""Image datasets of the papers: MNIST, Fashion-MNIST and CIFAR-10 (torchvision formats, plus the
image-folder JPEG copy of CIFAR-10), with CIFAR preprocessing applied per client batch."""

from __future__ import annotations

import gzip
import io
import math
import os
import tarfile
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from PIL import Image
from torch import Tensor
from torch.utils.data import TensorDataset
from torchvision import datasets
from torchvision.datasets.utils import check_integrity

from pl_privfed.datamodules.base import FederatedDataModule
from pl_privfed.datamodules.files import (
    DataFileError,
    Split,
    cache_dir,
    check_split,
    data_root,
    resplit,
    where_searched,
)
from pl_privfed.rng import STREAM_AUGMENTATION, keyed_generator

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10DataModule",
    "FashionMNISTDataModule",
    "MNISTDataModule",
    "crop_flip",
    "load_cifar10_arrays",
    "random_crop_flip",
]

CIFAR10_CLASSES = tuple("airplane automobile bird cat deer dog frog horse ship truck".split())
# Normalization of the reference implementation the α-NormEC papers build on
# (github.com/akamaster/pytorch_resnet_cifar10, trainer.py).
CIFAR10_MEAN = (0.485, 0.456, 0.406)
CIFAR10_STD = (0.229, 0.224, 0.225)
JPEG_ARCHIVE = "cifar10-jpeg.tar.gz"


class _MNISTLike(FederatedDataModule):
    """Shared loader of the torchvision MNIST-format datasets."""

    num_classes = 10
    _dataset: type[datasets.MNIST] = datasets.MNIST
    _mean_std: tuple[float, float] = (0.0, 1.0)

    def __init__(
        self,
        data_dir: str | None = None,
        download: bool = False,
        split: Split = "standard",
        split_seed: int = 42,
        standardize: bool = False,
        cache: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.data_dir = data_dir
        self.download = download
        self.split = check_split(split)
        self.split_seed = split_seed
        self.standardize = standardize
        self.cache = cache

    def _check_files(self) -> None:
        """Before torchvision reads anything (without ``download``): each of the four files is
        there, as its ``.gz`` archive or extracted, and every archive matches its published
        md5 — otherwise torchvision would silently try to download a replacement — with a
        message naming the file, the directory searched and ``PL_PRIVFED_DATA``."""
        if self.download:
            return
        name = self._dataset.__name__
        raw = data_root(self.data_dir) / name / "raw"
        where = where_searched(self.data_dir)
        for filename, md5 in self._dataset.resources:
            archive = raw / filename
            extracted = raw / filename.removesuffix(".gz")
            if archive.is_file():
                if not check_integrity(str(archive), md5):
                    raise DataFileError(
                        f"{name} file {str(archive)!r} is truncated or corrupted (its md5 is not "
                        f"the published {md5}; {archive.stat().st_size} bytes); {where}. "
                        "Replace it with the original file."
                    )
            elif not extracted.is_file():
                raise FileNotFoundError(
                    f"{name} not found: no {filename} (or {extracted.name}) in {str(raw)!r}; "
                    f"{where}. Put the four {name} .gz files in <data>/{name}/raw/, or set "
                    "download: true"
                )

    def _arrays(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """Images ``[N, 28, 28]`` (uint8) and labels of one split.

        Without ``download`` the files are read in memory, from the extracted file where one
        exists (as torchvision does) or else straight from the md5-checked ``.gz`` archive:
        nothing is extracted or written, so a shared or read-only data folder stays as it is.
        With ``download`` torchvision downloads and extracts into ``<data_dir>/<name>/raw``.
        """
        name = self._dataset.__name__
        root = data_root(self.data_dir)
        raw = root / name / "raw"
        if self.download:
            try:
                ds = self._dataset(str(root), train=train, download=True)
            except (RuntimeError, OSError, EOFError, ValueError) as exc:
                raise DataFileError(
                    f"{name} could not be downloaded into {str(raw)!r} ({type(exc).__name__}: "
                    f"{' '.join(str(exc).split())}); {where_searched(self.data_dir)}"
                ) from exc
            return ds.data.numpy(), ds.targets.numpy()
        prefix = "train" if train else "t10k"
        try:
            images = read_idx(raw / f"{prefix}-images-idx3-ubyte")
            labels = read_idx(raw / f"{prefix}-labels-idx1-ubyte")
            if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
                raise ValueError(
                    f"{len(images)} images of shape {images.shape[1:]} and {len(labels)} labels"
                )
        except (OSError, EOFError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        else:
            problem = None
        if problem is not None:  # raised outside the handler: the message is the one reported
            raise DataFileError(
                f"{name} files in {str(raw)!r} cannot be read ({problem}); "
                f"{where_searched(self.data_dir)}. An extracted file cut short by an interrupted "
                "extraction: delete the extracted files (without .gz) to read the archives instead"
            )
        return images, labels.astype(np.int64)

    def load_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        self._check_files()
        x_tr, y_tr, x_te, y_te = resplit(
            self.split, self.split_seed, *self._arrays(True), *self._arrays(False)
        )
        mean, std = self._mean_std if self.standardize else (0.0, 1.0)

        def tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
            images = (torch.from_numpy(x).float().div_(255.0).sub_(mean).div_(std)).unsqueeze(1)
            return TensorDataset(images, torch.from_numpy(y).long())

        return tensors(x_tr, y_tr), tensors(x_te, y_te)


class MNISTDataModule(_MNISTLike):
    """MNIST (LeCun et al.) through torchvision: ``[1, 28, 28]`` images in [0, 1], labels 0–9.

    Reads ``<data_dir>/MNIST/raw`` (the canonical ``.gz`` archives, md5-checked, or their
    extracted files) in memory, writing nothing next to them or anywhere else, or downloads
    there with ``download: true`` (torchvision).

    Args:
        data_dir: root holding ``MNIST/`` (default ``$PL_PRIVFED_DATA`` or ``./data``).
        download: let torchvision download the files if they are missing.
        split: ``"standard"`` (60,000 / 10,000) or ``"paper"`` (pooled, 90 % / 10 %,
            :func:`~pl_privfed.datamodules.files.resplit`).
        split_seed: seed of the paper split (42 in the papers).
        standardize: subtract 0.1307 and divide by 0.3081 (the usual MNIST statistics).
        cache: unused (the files are read in memory; kept so that configs naming it parse).
        **kwargs: :class:`FederatedDataModule` arguments (``num_clients``, ``batch_size``,
            ``partitioner``, ``seed``, ...).
    """

    _dataset = datasets.MNIST
    _mean_std = (0.1307, 0.3081)


class FashionMNISTDataModule(_MNISTLike):
    """Fashion-MNIST (Xiao et al.), same layout and arguments as :class:`MNISTDataModule`
    (``<data_dir>/FashionMNIST/raw``; ``standardize`` uses 0.2860 / 0.3530)."""

    _dataset = datasets.FashionMNIST
    _mean_std = (0.2860, 0.3530)


def read_idx(path: Path) -> np.ndarray:
    """An IDX file of unsigned bytes (LeCun's MNIST format: magic ``00 00 08 <ndim>``, ``ndim``
    big-endian ``int32`` sizes, the values), read from ``path`` if it exists, else from
    ``path.gz``, in memory: nothing is extracted or written."""
    if path.is_file():
        data = path.read_bytes()
    else:
        with gzip.open(path.with_name(path.name + ".gz"), "rb") as file:
            data = file.read()
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path.name}: not an IDX file of unsigned bytes")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path.name}: {len(data)} bytes, shorter than its header")
    shape = tuple(int(n) for n in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    values = np.frombuffer(data, dtype=np.uint8, offset=header)
    if values.size != math.prod(shape):
        raise ValueError(f"{path.name}: {values.size} values, its header says {shape}")
    return values.reshape(shape).copy()  # writable, for torch.from_numpy


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _image_folder_arrays(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for label, name in enumerate(CIFAR10_CLASSES):
        files = sorted((folder / name).glob("*"))
        if not files:
            raise ValueError(f"CIFAR-10 image folder {folder} has no images of class {name!r}")
        for path in files:
            images.append(_decode(path.read_bytes()))
            labels.append(label)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def _archive_arrays(archive: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Decode ``{train,test}/<class>/*.jpg`` straight from the archive (no extraction)."""
    found: dict[str, list[tuple[str, np.ndarray, int]]] = {"train": [], "test": []}
    labels = {name: i for i, name in enumerate(CIFAR10_CLASSES)}
    with tarfile.open(archive) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) < 3 or parts[-3] not in found:
                continue
            if parts[-2] not in labels:
                raise ValueError(f"{archive}: unknown CIFAR-10 class folder {parts[-2]!r}")
            image = _decode(tar.extractfile(member).read())
            found[parts[-3]].append((member.name, image, labels[parts[-2]]))
    out = []
    for part in ("train", "test"):
        items = sorted(found[part], key=lambda t: (t[2], t[0]))  # class, then file name
        if not items:
            raise ValueError(f"{archive} holds no {part}/ images")
        out.append((np.stack([t[1] for t in items]), np.asarray([t[2] for t in items], np.int64)))
    return out


def load_cifar10_arrays(
    data_dir: str | Path | None = None,
    cache: str | Path | None = None,
    download: bool = False,
    verify_md5: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """CIFAR-10 as uint8 arrays ``[N, 32, 32, 3]`` and labels, from the first source found.

    1. the canonical torchvision format ``<data_dir>/cifar-10-batches-py`` (md5-checked unless
       ``verify_md5=False``; downloaded there with ``download=True``);
    2. an image folder ``<data_dir>/{train,test}/<class>/*`` (e.g. the JPEG re-encoding);
    3. the JPEG archive ``cifar10-jpeg.tar.gz`` in ``<data_dir>`` or ``<data_dir>/cifar10-jpeg``,
       decoded once, straight from the archive, into ``<cache>/cifar10-jpeg``.

    The decoded uint8 arrays are cached as ``.npy`` files (beside a writable image folder, else
    in ``<cache>/cifar10-jpeg``), so later loads take a fraction of a second. Returns ``(x_train, y_train, x_test, y_test, source)``
    with ``source`` ``"canonical"`` or ``"jpeg"`` (numbers measured on the JPEG copy must say
    so: it is a lossy re-encoding at quality ≈ 75).
    """
    root = data_root(data_dir)
    if (root / "cifar-10-batches-py").is_dir() or download:
        cls = datasets.CIFAR10 if verify_md5 else _UncheckedCIFAR10
        try:
            train = cls(str(root), train=True, download=download)
            test = cls(str(root), train=False, download=download)
        except (RuntimeError, OSError, EOFError, ValueError) as exc:
            raise DataFileError(
                f"CIFAR-10 batches in {str(root / 'cifar-10-batches-py')!r} cannot be read "
                f"({type(exc).__name__}: {exc}; a file not found or corrupted fails torchvision's "
                f"md5 check); {where_searched(data_dir)}"
            ) from exc
        return (
            train.data,
            np.asarray(train.targets, dtype=np.int64),
            test.data,
            np.asarray(test.targets, dtype=np.int64),
            "canonical",
        )
    folder = root if (root / "train").is_dir() and (root / "test").is_dir() else None
    archive = None
    if folder is None:
        archive = next(
            (p for p in (root / JPEG_ARCHIVE, root / "cifar10-jpeg" / JPEG_ARCHIVE) if p.is_file()),
            None,
        )
        if archive is None:
            raise FileNotFoundError(
                f"CIFAR-10 not found: expected cifar-10-batches-py/, train/ and test/ image "
                f"folders, or {JPEG_ARCHIVE} (or set download: true); {where_searched(data_dir)}"
            )
    writable = folder is not None and os.access(folder, os.W_OK)
    npy = folder if writable else cache_dir(cache, "cifar10-jpeg")
    files = [npy / f"{part}_{kind}.npy" for part in ("train", "test") for kind in ("x", "y")]
    if not all(f.is_file() for f in files):
        # processes that start together (DDP ranks, a sweep's points, test workers sharing a
        # cache) decode once: the first holds the lock, the others then find the arrays
        with FileLock(str(npy / ".decode.lock")):
            if not all(f.is_file() for f in files):
                _decode_cifar10(folder, archive, files, data_dir)
    arrays = [np.load(f) for f in files]
    return (*arrays, "jpeg")


def _decode_cifar10(folder: Path | None, archive: Path | None, files: list[Path], data_dir) -> None:
    """Decodes the JPEG copy (an image folder or the archive) into the ``.npy`` files, each
    written whole (a temporary file renamed into place): a process killed while decoding
    leaves no truncated array for the next one to load."""
    if folder is not None:
        parts = [_image_folder_arrays(folder / part) for part in ("train", "test")]
    else:
        try:
            parts = _archive_arrays(archive)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataFileError(
                f"CIFAR-10 archive {str(archive)!r} cannot be read ({type(exc).__name__}: "
                f"{exc}): truncated or corrupted; {where_searched(data_dir)}"
            ) from exc
    for f, array in zip(files, [a for pair in parts for a in pair], strict=True):
        partial = f.with_name(f".{f.name}.partial")
        with partial.open("wb") as out:
            np.save(out, array)
        os.replace(partial, f)


class _UncheckedCIFAR10(datasets.CIFAR10):
    """torchvision's CIFAR-10 reader without the md5 check (for generated miniature files)."""

    def _check_integrity(self) -> bool:
        return True

    def _load_meta(self) -> None:
        self.classes = list(CIFAR10_CLASSES)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


def random_crop_flip(
    images: Tensor, padding: int, generator: torch.Generator, flip: bool = True
) -> Tensor:
    """Random crop with zero padding and random horizontal flip, vectorized over the batch.

    Equivalent to torchvision's ``RandomCrop(size, padding)`` then ``RandomHorizontalFlip()``
    applied independently to each image of ``images [M, C, H, W]``.
    """
    m = images.shape[0]
    device = generator.device
    top = torch.randint(0, 2 * padding + 1, (m,), generator=generator, device=device)
    left = torch.randint(0, 2 * padding + 1, (m,), generator=generator, device=device)
    mirror = torch.rand(m, generator=generator, device=device) < 0.5 if flip else None
    return crop_flip(images, padding, top, left, mirror)


def crop_flip(
    images: Tensor, padding: int, top: Tensor, left: Tensor, mirror: Tensor | None
) -> Tensor:
    """Crop each zero-padded image of ``images [M, C, H, W]`` at ``(top, left)`` and flip the
    ones where ``mirror`` is true: the deterministic half of :func:`random_crop_flip`."""
    m, _, h, w = images.shape
    device = images.device
    top, left = top.to(device), left.to(device)
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
    rows = (top[:, None] + torch.arange(h, device=device))[:, None, :, None]
    cols = (left[:, None] + torch.arange(w, device=device))[:, None, None, :]
    batch = torch.arange(m, device=device)[:, None, None, None]
    channels = torch.arange(images.shape[1], device=device)[None, :, None, None]
    out = padded[batch, channels, rows, cols]
    if mirror is not None:
        out = torch.where(mirror.to(device)[:, None, None, None], out.flip(-1), out)
    return out


class CIFAR10DataModule(FederatedDataModule):
    """CIFAR-10 (Krizhevsky 2009): ``[3, 32, 32]`` images, labels 0–9 in torchvision's order.

    Sources: see :func:`load_cifar10_arrays` (canonical torchvision files, or the JPEG
    re-encoding in an image folder or its archive). Images are kept as uint8 and preprocessed per
    client batch on the training device (:meth:`preprocess`), as in the reference
    implementation the papers use (akamaster/pytorch_resnet_cifar10): for training, random crop
    with 4-pixel zero padding and random horizontal flip (``augment``), then per-channel
    normalization with mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225); for evaluation
    normalization only. The augmentation generator is seeded by ``(seed, round)``.

    Args:
        data_dir: root of the data (default ``$PL_PRIVFED_DATA`` or ``./data``).
        download: let torchvision download the canonical files into ``data_dir``.
        split: ``"standard"`` (50,000 / 10,000) or ``"paper"`` (pooled, 90 % / 10 %).
        split_seed: seed of the paper split (42 in the papers).
        augment: random crop + flip for training batches.
        cache: writable directory for the extracted JPEG copy and decoded arrays.
        verify_md5: check the canonical files' md5 (turn off only for generated test files).
        **kwargs: :class:`FederatedDataModule` arguments.
    """

    num_classes = 10

    def __init__(
        self,
        data_dir: str | None = None,
        download: bool = False,
        split: Split = "standard",
        split_seed: int = 42,
        augment: bool = True,
        cache: str | None = None,
        verify_md5: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.data_dir = data_dir
        self.download = download
        self.split = check_split(split)
        self.split_seed = split_seed
        self.augment = augment
        self.cache = cache
        self.verify_md5 = verify_md5
        self.source: str | None = None
        self._stats: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def load_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        *arrays, self.source = load_cifar10_arrays(
            self.data_dir, self.cache, self.download, self.verify_md5
        )
        x_tr, y_tr, x_te, y_te = resplit(self.split, self.split_seed, *arrays)

        def tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
            images = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
            return TensorDataset(images, torch.from_numpy(np.asarray(y)).long())

        return tensors(x_tr, y_tr), tensors(x_te, y_te)

    def preprocess(self, inputs: Tensor, train: bool, round_index: int) -> Tensor:
        x = inputs.float().div_(255.0) if inputs.dtype == torch.uint8 else inputs.float()
        if train and self.augment:
            state = np.random.SeedSequence([self.seed, round_index, 0xA06]).generate_state(2)
            gen = torch.Generator(device=x.device)
            gen.manual_seed(int(state[0]) << 32 | int(state[1]))
            x = random_crop_flip(x, 4, gen)
        return self._normalize(x)

    def preprocess_clients(self, inputs: Tensor, round_index: int, clients: Tensor) -> Tensor:
        """Training minibatches ``[c, ..., 3, 32, 32]``: client ``i``'s crops and flips drawn
        from its stream ``(seed, augmentation, round, i)`` on the CPU (a few integers per
        image), then applied to the whole chunk at once on the device."""
        lead = inputs.shape[:-3]
        flat = inputs.reshape(-1, *inputs.shape[-3:])
        x = flat.float().div_(255.0) if flat.dtype == torch.uint8 else flat.float()
        if self.augment:
            per_client = x.shape[0] // max(1, clients.numel())
            tops, lefts, mirrors = [], [], []
            for client in clients.tolist():
                gen = keyed_generator(self.seed, STREAM_AUGMENTATION, round_index, client)
                tops.append(torch.randint(0, 9, (per_client,), generator=gen))
                lefts.append(torch.randint(0, 9, (per_client,), generator=gen))
                mirrors.append(torch.rand(per_client, generator=gen) < 0.5)
            x = crop_flip(x, 4, torch.cat(tops), torch.cat(lefts), torch.cat(mirrors))
        x = self._normalize(x)
        return x.reshape(*lead, *x.shape[1:])

    def _normalize(self, x: Tensor) -> Tensor:
        if x.device not in self._stats:
            mean = torch.tensor(CIFAR10_MEAN, device=x.device).view(1, 3, 1, 1)
            std = torch.tensor(CIFAR10_STD, device=x.device).view(1, 3, 1, 1)
            self._stats[x.device] = (mean, std)
        mean, std = self._stats[x.device]
        return (x - mean) / std

    def describe(self) -> dict:
        return {**super().describe(), "source": self.source}
