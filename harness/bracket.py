"""The one memory bracket every measurement goes through, and the run-peak ledger it feeds.

A bracket measures a region of work as two numbers on top of what was live when it opened:

* ``transient_peak_bytes`` = peak allocated inside the region − allocated at entry: the most the
  region ever needed at once (forward transient for an op, backward spike for a backward pass).
* ``retained_bytes`` = allocated at exit − allocated at entry: what the region left alive. For a
  forward pass under autograd this is what the graph saved for backward plus the output.

Opening a bracket resets the allocator's peak counters, which would erase the whole-run peak the
step figures need. So before every reset the :class:`PeakLedger` folds the current peaks into
its run maxima: the trap the published harness documents ("fold before reset"), kept in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from harness.memory import MemoryProbe


class PeakLedger:
    """Run-long maxima of allocated and reserved bytes, surviving peak resets."""

    def __init__(self, probe: MemoryProbe) -> None:
        self.probe = probe
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        # the same maxima since the current training step began (see start_step)
        self.step_allocated_bytes = 0
        self.step_reserved_bytes = 0

    def fold(self) -> None:
        """Fold the probe's current peak window into the run (and step) maxima."""
        self.probe.synchronize()
        allocated, reserved = self.probe.peak_allocated_bytes(), self.probe.peak_reserved_bytes()
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, allocated)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, reserved)
        self.step_allocated_bytes = max(self.step_allocated_bytes, allocated)
        self.step_reserved_bytes = max(self.step_reserved_bytes, reserved)

    def start_step(self) -> None:
        """Begin a step's own maxima: fold, reset the peak window, start the step maxima from now."""
        self.reset_window()
        self.step_allocated_bytes = self.probe.allocated_bytes()
        self.step_reserved_bytes = self.probe.reserved_bytes()

    def reset_window(self) -> None:
        """Fold, then start a fresh peak window (the only safe way to reset peaks)."""
        self.fold()
        self.probe.reset_peak()


@dataclasses.dataclass
class BracketReading:
    """What one bracketed region cost, in bytes above what was live when it opened."""

    before_bytes: int = 0
    transient_peak_bytes: int = 0
    retained_bytes: int = 0
    peak_reserved_bytes: int = 0
    closed: bool = False


@contextlib.contextmanager
def bracket(ledger: PeakLedger) -> Iterator[BracketReading]:
    """Measure the enclosed work. The reading is filled on exit, also when the work raises
    (an OOM keeps the peak reached before the failed request)."""
    probe = ledger.probe
    reading = BracketReading()
    ledger.reset_window()
    reading.before_bytes = probe.allocated_bytes()
    try:
        yield reading
    finally:
        probe.synchronize()
        reading.transient_peak_bytes = probe.peak_allocated_bytes() - reading.before_bytes
        reading.retained_bytes = probe.allocated_bytes() - reading.before_bytes
        reading.peak_reserved_bytes = probe.peak_reserved_bytes()
        reading.closed = True
