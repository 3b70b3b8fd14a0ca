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
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from pl_privfed.engine.distributed import ClientShard

__all__ = ["ClientStates", "Placement", "choose_placement"]

Placement = Literal["auto", "device", "host", "disk"]
PLACEMENTS = ("auto", "device", "host", "disk")


def _machine_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return 8 * 2**30


def choose_placement(total_bytes: int, device: torch.device, requested: str = "auto") -> str:
    """Where ``total_bytes`` of per-client state go (module docstring)."""
    if requested not in PLACEMENTS:
        raise ValueError(f"client_state must be one of {PLACEMENTS}, got {requested!r}")
    if requested != "auto":
        return requested
    ram = _machine_memory() // 4
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
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
        self, device: torch.device, requested: str = "auto", directory: str | None = None
    ) -> None:
        """Place and allocate (zero) every declared table for this process's clients."""
        rows = self.shard.size
        total = sum(rows * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                    for _, shape, dtype in self._pending)  # fmt: skip
        self.placement = choose_placement(total, device, requested)
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
            base.mkdir(parents=True, exist_ok=True)
            self.directory = Path(tempfile.mkdtemp(prefix="client-state-", dir=base))
        path = self.directory / f"{name}.rank{self.shard.rank}.npy"
        # a new .npy file of zeros: sparse on disk until rows are written
        array = np.lib.format.open_memmap(path, mode="w+", dtype=_numpy(dtype), shape=shape)
        self._tables[name] = torch.from_numpy(array)
        self._arrays[name] = array
        self.files[name] = path

    # ------------------------------------------------------------------ rows
    def table(self, name: str) -> Tensor:
        """This process's rows of table ``name`` (a device buffer, or a host/disk tensor)."""
        table = self._tables.get(name)
        return table if table is not None else getattr(self.module, name)

    def full(self, name: str) -> Tensor:
        """Table ``name`` (kept for callers that read the whole local table)."""
        return self.table(name)

    def read(self, name: str, ids: Tensor) -> Tensor:
        """The rows of the held clients ``ids`` (global, sorted), on the training device."""
        table = self.table(name)
        local = self.shard.local(ids)
        span = _span(local)
        if name not in self._tables:  # on the device
            if span is not None:
                return table[span[0] : span[1]]
            return table.index_select(0, local.to(table.device))
        device = getattr(self.module, "device", torch.device("cpu"))
        rows = table[span[0] : span[1]] if span is not None else table.index_select(0, local)
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
        process, named in the checkpoint (the tables can be larger than memory)."""
        extra = checkpoint.setdefault("client_state", {})
        device = getattr(self.module, "device", torch.device("cpu"))
        for name in self.names:
            key = prefix + name
            if self.placement == "disk":
                snapshot = self.snapshot(name, round_index)
                extra[key] = {"files": self.shard.all_gather_object(str(snapshot)),
                              "block": self.shard.block}  # fmt: skip
                continue
            full = self.shard.gather_rows(self.table(name).to(device))
            if self.placement == "device":
                checkpoint["state_dict"][key] = full
            else:
                extra[key] = {"rows": full.cpu()}
        if not extra:
            del checkpoint["client_state"]

    def load(self, checkpoint: dict[str, Any], prefix: str) -> None:
        """This process's rows of every table from a checkpoint written with any number of
        processes (:meth:`save`); device tables go back into ``state_dict`` for Lightning."""
        extra = checkpoint.get("client_state", {})
        start, stop = self.shard.start, self.shard.stop
        for name in self.names:
            key = prefix + name
            if key in extra:
                rows = _rows_of(extra[key], start, stop)
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

    def off_device(self) -> dict[str, Tensor]:
        """The host and disk tables (the device ones are the module's buffers)."""
        return dict(self._tables)

    def snapshot(self, name: str, round_index: int) -> Path:
        """A copy of memory-mapped table ``name`` as it is now (for a checkpoint):
        ``<state dir>/snapshots/round=<k>/<name>.rank<r>.npy``."""
        self._arrays[name].flush()
        target = self.directory / "snapshots" / f"round={round_index}" / self.files[name].name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.files[name], target)
        return target

    def nbytes(self) -> int:
        """Bytes of this process's per-client state."""
        return sum(self.table(n).numel() * self.table(n).element_size() for n in self.names)


def _rows_of(saved: dict[str, Any], start: int, stop: int) -> Tensor:
    """Rows ``[start, stop)`` of a saved table: gathered ``rows``, or memory-mapped ``files``
    written by processes holding blocks of ``block`` clients each."""
    if "rows" in saved:
        return saved["rows"][start:stop]
    parts, block = [], int(saved["block"])
    for rank, path in enumerate(saved["files"]):
        lo = rank * block
        table = np.load(path, mmap_mode="r")
        hi = lo + table.shape[0]
        a, b = max(start, lo), min(stop, hi)
        if a < b:
            parts.append(torch.from_numpy(np.array(table[a - lo : b - lo])))
    return torch.cat(parts)


def _numpy(dtype: torch.dtype):
    return torch.empty((), dtype=dtype).numpy().dtype


def _span(ids: Tensor) -> tuple[int, int] | None:
    """``(a, b)`` when the sorted ``ids`` are exactly ``a, a+1, ..., b-1``."""
    if ids.numel() == 0:
        return None
    first, last = int(ids[0]), int(ids[-1])
    return (first, last + 1) if last - first + 1 == ids.numel() else None
