"""Memory probes: one interface over CUDA's caching allocator and torch's CPU MemTracker.

Every measurement in this package is a difference of two probe readings, so a probe only has to
answer four questions exactly: how many bytes are live now (``allocated``), how many the
allocator holds from the device (``reserved``), and the highest value of each since the last
``reset_peak``.

* :class:`CudaMemoryProbe` reads ``torch.cuda`` allocator statistics. ``reserved`` includes
  cached-but-free blocks, so ``reserved - allocated`` is the fragmentation a reader sees when a
  small request fails on a card that "still has memory".
* :class:`CpuMemoryProbe` wraps ``torch.distributed._tools.mem_tracker.MemTracker``, a dispatch
  mode that sees every tensor storage created inside it and its release, so live bytes are exact
  to the byte. It has no caching allocator: ``reserved == allocated``. It only sees tensors created
  while it is entered, so measured regions must run inside ``with probe:`` — differences are exact
  regardless of what existed before.
"""

from __future__ import annotations

import abc
from types import TracebackType

import torch

MIB = 2**20
GIB = 2**30


def to_mib(n_bytes: int | float) -> float:
    """Bytes to MiB (2**20), the unit of every ``*_mib`` field."""
    return n_bytes / MIB


class MemoryProbe(abc.ABC):
    """Allocator readings for one device. Enter it (``with probe:``) around measured work."""

    device: torch.device

    def __enter__(self) -> MemoryProbe:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for queued device work, so readings include it."""

    @abc.abstractmethod
    def allocated_bytes(self) -> int:
        """Bytes held by live tensors now."""

    @abc.abstractmethod
    def reserved_bytes(self) -> int:
        """Bytes the allocator holds from the device now (live + cached)."""

    @abc.abstractmethod
    def peak_allocated_bytes(self) -> int:
        """Highest ``allocated_bytes`` since the last :meth:`reset_peak`."""

    @abc.abstractmethod
    def peak_reserved_bytes(self) -> int:
        """Highest ``reserved_bytes`` since the last :meth:`reset_peak`."""

    @abc.abstractmethod
    def reset_peak(self) -> None:
        """Start a new peak window at the current readings."""

    def empty_cache(self) -> None:  # noqa: B027 — a hook: most probes have no cache to empty
        """Return cached blocks to the device (no-op where there is no cache)."""

    def capacity_bytes(self) -> int | None:
        """Physical memory of the device, where known."""
        return None


class CudaMemoryProbe(MemoryProbe):
    """Readings from PyTorch's CUDA caching allocator for one device."""

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaMemoryProbe needs a CUDA device; use CpuMemoryProbe on a CPU-only host.")
        index: int | None = device if isinstance(device, int) else None if device is None else torch.device(device).index
        if index is None:
            index = torch.cuda.current_device()
        self.device = torch.device("cuda", index)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def peak_allocated_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def peak_reserved_bytes(self) -> int:
        return torch.cuda.max_memory_reserved(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def capacity_bytes(self) -> int | None:
        return torch.cuda.get_device_properties(self.device).total_memory


class CpuMemoryProbe(MemoryProbe):
    """Exact live-tensor bytes on the CPU through torch's ``MemTracker``.

    The tracker keeps its running peak in ``_peak_mem``; it has no public reset, so
    :meth:`reset_peak` moves that peak down to the current total. The byte-exact tests in
    ``tests/test_memory.py`` fail if a torch release changes this.
    """

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self._tracker = _live_bytes_tracker()
        self._depth = 0

    def __enter__(self) -> CpuMemoryProbe:
        self._tracker.__enter__()
        self._depth += 1
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        self._depth -= 1
        self._tracker.__exit__(exc_type, exc, tb)

    def _require_active(self) -> None:
        if self._depth == 0:
            raise RuntimeError("CpuMemoryProbe reads only inside `with probe:`; enter it around the measured work.")

    def synchronize(self) -> None:
        return None

    def allocated_bytes(self) -> int:
        self._require_active()
        return int(self._tracker.get_tracker_snapshot("current").get(self.device, {}).get("Total", 0))

    def reserved_bytes(self) -> int:
        return self.allocated_bytes()

    def peak_allocated_bytes(self) -> int:
        self._require_active()
        return int(self._tracker._peak_mem.get(self.device, 0))

    def peak_reserved_bytes(self) -> int:
        return self.peak_allocated_bytes()

    def reset_peak(self) -> None:
        self._require_active()
        self._tracker._peak_mem[self.device] = self.allocated_bytes()


def _live_bytes_tracker():  # type: ignore[no-untyped-def]
    """A MemTracker that keeps device totals only.

    Its per-module attribution refuses a module called twice in one step ("multiple iterative
    calls"), which every bi-encoder does (one encoder for queries and documents). Totals come from
    the dispatch mode alone, so the module hooks are switched off; live bytes stay exact.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class LiveBytesTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs):  # type: ignore[no-untyped-def]
            return None

        def _post_fw_hook(self, module, inputs, outputs):  # type: ignore[no-untyped-def]
            return None

        def _pre_bw_hook(self, module, args):  # type: ignore[no-untyped-def]
            return None

        def _post_bw_hook(self, module, args):  # type: ignore[no-untyped-def]
            return None

    return LiveBytesTracker()


def probe_for(device: torch.device | str) -> MemoryProbe:
    """The probe that measures ``device`` exactly: CUDA allocator stats or the CPU MemTracker."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaMemoryProbe(device)
    if device.type == "cpu":
        return CpuMemoryProbe()
    raise ValueError(f"no memory probe for device type {device.type!r}; use 'cuda' or 'cpu'.")
