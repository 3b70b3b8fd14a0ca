"""Where the algorithms' per-client state lives, and how a chunk reads and writes its rows.

Per-client state (error-feedback memories ``g_i``, shifts, agents' parameters) is one ``[N, ...]``
tensor per name. :class:`DeviceRows` keeps it as the algorithm's registered buffers on the
training device (so Lightning checkpoints carry it); a chunk of contiguous clients reads a view
of its rows and writes nothing back, any other chunk (a cohort) gathers its rows and scatters
them back when it closes.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["DeviceRows"]


class DeviceRows:
    """Per-client state as registered buffers of ``module`` (rows along dimension 0)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def full(self, name: str) -> Tensor:
        return getattr(self.module, name)

    def read(self, name: str, ids: Tensor) -> Tensor:
        full = self.full(name)
        span = _span(ids)
        if span is not None:
            return full[span[0] : span[1]]
        return full.index_select(0, ids.to(full.device))

    def write(self, name: str, ids: Tensor, rows: Tensor) -> None:
        full = self.full(name)
        if rows.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
            return  # a view of the buffer: already written
        full.index_copy_(0, ids.to(full.device), rows)


def _span(ids: Tensor) -> tuple[int, int] | None:
    """``(a, b)`` when the sorted ``ids`` are exactly ``a, a+1, ..., b-1``."""
    if ids.numel() == 0:
        return None
    first, last = int(ids[0]), int(ids[-1])
    return (first, last + 1) if last - first + 1 == ids.numel() else None
