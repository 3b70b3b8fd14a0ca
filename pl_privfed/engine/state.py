"""Where the algorithms' per-client state lives, and how a chunk reads and writes its rows.

Per-client state (error-feedback memories ``g_i``, shifts, agents' parameters) is one table of
rows per name, holding the rows of the clients this process holds (all of them in a single
process; a block of them under DDP, :class:`~pl_privfed.engine.distributed.ClientShard`). An
algorithm declares its tables in ``allocate()`` with
:meth:`~pl_privfed.algorithms.FederatedAlgorithm.register_client_state`; the store then places
all of them in one of three places (``client_state`` of :class:`~pl_privfed.FederatedModule`):

* ``"device"``: registered buffers of the algorithm on the training device (Lightning
  checkpoints carry them);
* ``"host"``: tensors in host memory (pinned when training on a GPU), rows gathered to the
  device per chunk — for a federation whose state does not fit on the GPU;
* ``"disk"``: memory-mapped ``.npy`` files, whose pages the operating system moves in and out
  as chunks read and write their rows — for a state larger than the memory should hold;
* ``"auto"`` (default): ``device`` while all tables take at most a quarter of the training
  device's memory (on a CPU: of the machine's memory), then ``host`` (on a GPU) while they take
  at most a quarter of the machine's memory, then ``disk``.

A chunk of contiguous clients on the device reads a view of its rows and writes nothing back;
any other chunk (a cohort, or rows on the host or disk) gathers its rows to the training device
and scatters them back when it closes, so only the chunk's rows are ever on the device.

Memory-mapped tables take their whole size on disk when they are allocated
(``os.posix_fallocate``), so a full disk is an error naming the folder then, not a ``SIGBUS``
in the middle of a round. A checkpoint holds a snapshot of each memory-mapped table: beside the
checkpoint file when the checkpoint callback names a folder for it (:data:`SNAPSHOT_DIR_KEY`,
set by :class:`~pl_privfed.callbacks.RoundCheckpoint`: ``round=000300.ckpt`` and
``round=000300.client_state/``, referenced relatively and deleted with the checkpoint), else
under the state folder. Each snapshot's size and SHA-256 are recorded in the checkpoint and
checked before it is loaded: a missing, truncated or modified snapshot is refused
(:class:`ClientStateError`), never loaded silently.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from pl_privfed.checks import check_choice
from pl_privfed.engine.distributed import ClientShard

__all__ = [
    "SNAPSHOT_DIR_KEY",
    "ClientStateError",
    "ClientStates",
    "GridMemoryRefused",
    "Placement",
    "choose_placement",
]

#: key of a Lightning checkpoint under which a checkpoint callback names the folder that is to
#: hold the snapshots of memory-mapped state (beside the checkpoint file)
SNAPSHOT_DIR_KEY = "client_state_snapshot_dir"
_CHUNK = 16 * 2**20  # bytes per read/write when copying and hashing snapshots


class ClientStateError(ValueError):
    """Memory-mapped client state that cannot be written (a full, read-only or missing folder)
    or a snapshot that cannot be trusted; the message names the folder or file."""


Placement = Literal["auto", "device", "host", "disk"]
PLACEMENTS = ("auto", "device", "host", "disk")


#: the memory, in bytes, that ``client_state: auto`` plans for instead of the machine's
MEMORY_ENV = "PL_PRIVFED_MEMORY_BYTES"


def _machine_memory() -> int:
    if os.environ.get(MEMORY_ENV):
        try:
            return int(os.environ[MEMORY_ENV])
        except ValueError:
            raise ValueError(
                f"{MEMORY_ENV}={os.environ[MEMORY_ENV]!r} is not a number of bytes"
            ) from None
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return 8 * 2**30


class GridMemoryRefused(ValueError):
    """A grid refused before training because its configurations' client state would not fit
    in memory together (``grid_memory: refuse``).

    Attributes:
        fit: how many configurations fit in memory at once (at least 1).
    """

    def __init__(self, message: str, fit: int) -> None:
        super().__init__(message)
        self.fit = int(fit)

    def record(self) -> dict[str, Any]:
        """The failure as the run record's ``error`` (``summary.json``), which a batched sweep
        reads to split the group into groups of :attr:`fit` points."""
        return {"type": "grid_memory_refused", "fit": self.fit}


def spills_to_disk(each_bytes: int, device: torch.device, in_memory: int) -> bool:
    """Whether ``client_state: auto`` would memory-map a table set of ``each_bytes`` only
    because ``in_memory`` bytes of other algorithms' state already take the memory it would
    fit in alone (:func:`choose_placement`)."""
    alone = choose_placement(each_bytes, device, "auto")
    return alone != "disk" and choose_placement(each_bytes, device, "auto", in_memory) == "disk"


def choose_placement(
    total_bytes: int, device: torch.device, requested: str = "auto", in_memory: int = 0
) -> str:
    """Where ``total_bytes`` of per-client state go (module docstring). ``in_memory``: the
    bytes the run's other algorithms already hold in the machine's memory (a grid's earlier
    configurations), counted against the same quarter of it, so that a grid of many
    configurations goes to disk where their tables together would not fit."""
    check_choice("client_state", requested, PLACEMENTS)
    if requested != "auto":
        return requested
    ram = _machine_memory() // 4 - max(0, int(in_memory))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)  # live: earlier configurations counted
        if total_bytes <= free // 4:
            return "device"
        return "host" if total_bytes <= ram else "disk"
    return "device" if total_bytes <= ram else "disk"


class ClientStates:
    """An algorithm's per-client state tables (module docstring).

    Args:
        module: the algorithm (device tables are its registered buffers).
        shard: which clients this process holds.
    """

    def __init__(self, module: nn.Module, shard: ClientShard | None = None) -> None:
        self.module = module
        self.shard = shard if shard is not None else ClientShard(0)
        self.placement = "device"
        self.names: list[str] = []
        self._pending: list[tuple[str, tuple[int, ...], torch.dtype]] = []
        self._tables: dict[str, Tensor] = {}
        self._arrays: dict[str, np.memmap] = {}
        self.files: dict[str, Path] = {}
        self.directory: Path | None = None

    # ------------------------------------------------------------------ allocation
    def declare(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """A table ``[clients, *shape]`` to allocate in :meth:`allocate`."""
        self._pending.append((name, tuple(shape), dtype))

    def allocate(
        self,
        device: torch.device,
        requested: str = "auto",
        directory: str | None = None,
        in_memory: int = 0,
    ) -> None:
        """Place and allocate (zero) every declared table for this process's clients
        (``in_memory``: see :func:`choose_placement`)."""
        rows = self.shard.size
        total = sum(
            rows * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for _, shape, dtype in self._pending
        )
        self.placement = choose_placement(total, device, requested, in_memory)
        for name, shape, dtype in self._pending:
            self._allocate(name, (rows, *shape), dtype, device, directory)
            self.names.append(name)
        self._pending = []

    def _allocate(self, name, shape, dtype, device, directory) -> None:
        if self.placement == "device":
            self.module.register_buffer(name, torch.zeros(shape, dtype=dtype, device=device))
            return
        if self.placement == "host":
            table = torch.zeros(shape, dtype=dtype)
            if device.type == "cuda":
                table = table.pin_memory()
            self._tables[name] = table
            return
        if self.directory is None:
            base = Path(directory) if directory else Path(tempfile.gettempdir())
            try:
                base.mkdir(parents=True, exist_ok=True)
                self.directory = Path(tempfile.mkdtemp(prefix="client-state-", dir=base))
            except OSError as exc:
                raise ClientStateError(_disk_error("the client-state folder", base, exc)) from exc
        path = self.directory / f"{name}.rank{self.shard.rank}.npy"
        try:
            # a new .npy file of zeros, its blocks reserved now: writing a page of a sparse
            # memory-mapped file on a full disk kills the process with SIGBUS
            array = np.lib.format.open_memmap(path, mode="w+", dtype=_numpy(dtype), shape=shape)
            _reserve(path)
        except OSError as exc:
            raise ClientStateError(
                _disk_error("the client-state folder", self.directory, exc, _nbytes(shape, dtype))
            ) from exc
        self._tables[name] = torch.from_numpy(array)
        self._arrays[name] = array
        self.files[name] = path

    # ------------------------------------------------------------------ rows
    def table(self, name: str) -> Tensor:
        """This process's rows of table ``name`` (a device buffer, or a host/disk tensor)."""
        table = self._tables.get(name)
        return table if table is not None else getattr(self.module, name)

    def read(self, name: str, ids: Tensor) -> Tensor:
        """The rows of the held clients ``ids`` (global, sorted), on the training device."""
        table = self.table(name)
        local = self.shard.local(ids)
        run = _contiguous(local)
        if name not in self._tables:  # on the device
            if run is not None:
                return table[run[0] : run[1]]
            return table.index_select(0, local.to(table.device))
        device = getattr(self.module, "device", torch.device("cpu"))
        rows = table[run[0] : run[1]] if run is not None else table.index_select(0, local)
        return rows.to(device, copy=True, non_blocking=True)

    def write(self, name: str, ids: Tensor, rows: Tensor) -> None:
        table = self.table(name)
        if rows.untyped_storage().data_ptr() == table.untyped_storage().data_ptr():
            return  # a view of the device table: already written
        local = self.shard.local(ids)
        table.index_copy_(0, local.to(table.device), rows.to(table.device, table.dtype))

    # ------------------------------------------------------------------ checkpoints
    def save(self, checkpoint: dict[str, Any], prefix: str, round_index: int) -> None:
        """Put the whole federation's tables into a Lightning checkpoint, whichever process
        holds which clients: device and host tables as full ``[n, ...]`` tensors (gathered over
        the processes; device ones under ``state_dict[prefix + name]``, host ones under
        ``checkpoint["client_state"]``), memory-mapped tables as a snapshot file of each
        process, named in the checkpoint with its size and SHA-256 (the tables can be larger than
        memory): beside the checkpoint file, named relative to its folder, when the checkpoint
        callback gives a folder (:data:`SNAPSHOT_DIR_KEY`), else under the state folder."""
        extra = checkpoint.setdefault("client_state", {})
        device = getattr(self.module, "device", torch.device("cpu"))
        beside = checkpoint.get(SNAPSHOT_DIR_KEY)
        for name in self.names:
            key = prefix + name
            if self.placement == "disk":
                folder = Path(beside) if beside else None
                snapshot, size, digest = self.snapshot(name, round_index, folder)
                where = f"{folder.name}/{snapshot.name}" if folder else str(snapshot)
                extra[key] = {
                    "files": self.shard.all_gather_object(where),
                    "sizes": self.shard.all_gather_object(size),
                    "sha256": self.shard.all_gather_object(digest),
                    "block": self.shard.block,
                }
                continue
            full = self.shard.gather_rows(self.table(name).to(device))
            if self.placement == "device":
                checkpoint["state_dict"][key] = full
            else:
                extra[key] = {"rows": full.cpu()}
        if not extra:
            del checkpoint["client_state"]

    def load(self, checkpoint: dict[str, Any], prefix: str, base: str | None = None) -> None:
        """This process's rows of every table from a checkpoint written with any number of
        processes (:meth:`save`); device tables go back into ``state_dict`` for Lightning.
        ``base``: the folder of the checkpoint file (snapshots are named relative to it);
        every snapshot's size and SHA-256 are checked first (:class:`ClientStateError`)."""
        extra = checkpoint.get("client_state", {})
        start, stop = self.shard.start, self.shard.stop
        for name in self.names:
            key = prefix + name
            if key in extra:
                rows = _rows_of(extra[key], start, stop, base)
            else:
                full = checkpoint["state_dict"].get(key)
                if full is None:
                    continue
                rows = full[start:stop]
            if self.placement == "device":
                checkpoint["state_dict"][key] = rows
            else:
                self.table(name).copy_(rows)
                checkpoint["state_dict"].pop(key, None)

    def snapshot(
        self, name: str, round_index: int, folder: Path | None = None
    ) -> tuple[Path, int, str]:
        """A copy of memory-mapped table ``name`` as it is now (for a checkpoint), in ``folder``
        (default ``<state dir>/snapshots/round=<k>``) as ``<name>.rank<r>.npy``: its path, size
        and SHA-256 (computed while copying, in one pass)."""
        self._arrays[name].flush()
        folder = folder or self.directory / "snapshots" / f"round={round_index}"
        target = folder / self.files[name].name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            size, digest = _copy_and_hash(self.files[name], target)
        except OSError as exc:
            target.unlink(missing_ok=True)
            raise ClientStateError(
                _disk_error(
                    "the client-state snapshot folder", folder, exc, self.files[name].stat().st_size
                )
            ) from exc
        return target, size, digest

    def nbytes(self) -> int:
        """Bytes of this process's per-client state."""
        return sum(self.table(n).numel() * self.table(n).element_size() for n in self.names)

    def nbytes_in_memory(self) -> int:
        """Bytes of it held in the machine's memory: host tables, and device tables on a CPU
        (not memory-mapped ones, nor a GPU's)."""
        on_cpu = self.placement == "host" or (
            self.placement == "device" and getattr(self.module, "device", None) is not None
            and torch.device(self.module.device).type == "cpu"
        )  # fmt: skip
        return self.nbytes() if on_cpu else 0


def _rows_of(saved: dict[str, Any], start: int, stop: int, base: str | None = None) -> Tensor:
    """Rows ``[start, stop)`` of a saved table: gathered ``rows``, or memory-mapped ``files``
    written by processes holding blocks of ``block`` clients each (relative to ``base``, the
    checkpoint's folder; each checked against its recorded size and SHA-256 first)."""
    if "rows" in saved:
        return saved["rows"][start:stop]
    parts, block = [], int(saved["block"])
    sizes = saved.get("sizes") or [None] * len(saved["files"])
    digests = saved.get("sha256") or [None] * len(saved["files"])
    for rank, name in enumerate(saved["files"]):
        lo = rank * block
        if lo >= stop or lo + block <= start:
            continue  # another process's rows
        path = Path(name) if Path(name).is_absolute() or base is None else Path(base) / name
        _verify(path, sizes[rank], digests[rank])
        table = np.load(path, mmap_mode="r")
        hi = lo + table.shape[0]
        a, b = max(start, lo), min(stop, hi)
        if a < b:
            parts.append(torch.from_numpy(np.array(table[a - lo : b - lo])))
    return torch.cat(parts)


def _verify(path: Path, size: int | None, digest: str | None) -> None:
    """Refuse a snapshot that is missing, of another size or another SHA-256 than recorded."""
    what = "the checkpoint's client-state snapshot"
    if not path.is_file():
        raise ClientStateError(
            f"{what} {str(path)!r} is missing (it is kept beside the checkpoint)"
        )
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise ClientStateError(
            f"{what} {str(path)!r} has {actual} bytes, the checkpoint recorded {size}: truncated "
            "or replaced; resume from another checkpoint"
        )
    if digest is not None:
        with path.open("rb") as f:
            found = hashlib.file_digest(f, "sha256").hexdigest()
        if found != digest:
            raise ClientStateError(
                f"{what} {str(path)!r} was modified since the checkpoint was written (SHA-256 "
                f"{found[:12]}…, recorded {digest[:12]}…); resume from another checkpoint"
            )


def _copy_and_hash(source: Path, target: Path) -> tuple[int, str]:
    """Copy ``source`` to ``target`` (its blocks reserved first), returning the size and the
    SHA-256 of what was written."""
    size = source.stat().st_size
    digest = hashlib.sha256()
    with source.open("rb") as src, target.open("wb") as dst:
        if size and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(dst.fileno(), 0, size)
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    return size, digest.hexdigest()


def _reserve(path: Path) -> None:
    """Allocate every block of ``path`` now (``posix_fallocate``; where the system has none,
    nothing is reserved)."""
    if not hasattr(os, "posix_fallocate"):
        return
    size = path.stat().st_size
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it
            return
        raise
    finally:
        os.close(fd)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _disk_error(what: str, folder: Path, exc: OSError, needed: int | None = None) -> str:
    """One line naming the folder, the system's reason and, for a full disk, the bytes asked."""
    reason = exc.strerror or str(exc)
    line = f"{what} {str(folder)!r} cannot hold the state: {reason}"
    if exc.errno == errno.ENOSPC and needed is not None:
        line += f" (it needs {needed / 2**20:.1f} MiB; set model.state_dir to a larger disk)"
    elif exc.errno in (errno.EACCES, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        line += " (set model.state_dir to a writable folder)"
    return line


def _numpy(dtype: torch.dtype):
    return torch.empty((), dtype=dtype).numpy().dtype


def _contiguous(ids: Tensor) -> tuple[int, int] | None:
    """``(a, b)`` when the sorted ``ids`` are exactly ``a, a+1, ..., b-1``."""
    if ids.numel() == 0:
        return None
    first, last = int(ids[0]), int(ids[-1])
    return (first, last + 1) if last - first + 1 == ids.numel() else None
