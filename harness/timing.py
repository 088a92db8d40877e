"""Step timing inside the library's own trainer, with honest steady-state statistics.

Device work is asynchronous, so the timer synchronizes at step begin and end: a step's time is
then the wall time of its device work. Steady state excludes warm-up steps *and* any step during
which a Triton kernel autotuned — a fused kernel re-tunes when a new shape bucket appears, which
was seen mid-run costing 30 s on one step; averaging it in would misstate the cost per step.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from transformers import TrainerCallback

if TYPE_CHECKING:
    from harness.bracket import PeakLedger


class AutotuneWatch:
    """Counts Triton autotuner runs that benchmarked configs (their cache grew)."""

    def __init__(self) -> None:
        self.events = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[AutotuneWatch]:
        try:
            from triton.runtime.autotuner import Autotuner
        except ImportError:  # no Triton, no autotuning
            yield self
            return
        original = Autotuner.run
        watch = self

        @functools.wraps(original)
        def run(autotuner, *args, **kwargs):  # type: ignore[no-untyped-def]
            cache = getattr(autotuner, "cache", None)
            before = len(cache) if cache is not None else 0
            try:
                return original(autotuner, *args, **kwargs)
            finally:
                if cache is not None and len(cache) > before:
                    watch.events += 1

        Autotuner.run = run
        try:
            yield self
        finally:
            Autotuner.run = original


def steady_state(
    step_times_sec: Sequence[float], autotune_steps: Sequence[int], warmup_steps: int
) -> tuple[list[int], float | None]:
    """Indices of the steady steps and their median time (None when no step qualifies)."""
    excluded = set(autotune_steps)
    steady = [i for i in range(len(step_times_sec)) if i >= warmup_steps and i not in excluded]
    if not steady:
        return [], None
    return steady, statistics.median(step_times_sec[i] for i in steady)


class StepTimer(TrainerCallback):
    """Times every optimizer step (synchronized) and notes which steps autotuned.

    With ``min_steps`` and ``min_steady`` the trainer is stopped once it has trained at least
    ``min_steps`` steps and timed ``min_steady`` steady ones (after ``warmup_steps``, none that
    autotuned); its ``max_steps`` bounds the run either way.
    """

    def __init__(self, device: torch.device, watch: AutotuneWatch, on_step: Callable[[int], None] | None = None,
                 ledger: PeakLedger | None = None, min_steps: int = 0, min_steady: int = 0,
                 warmup_steps: int = 0) -> None:  # fmt: skip
        self.device = device
        self.watch = watch
        self.on_step = on_step
        self.ledger = ledger
        self.min_steps = min_steps
        self.min_steady = min_steady
        self.warmup_steps = warmup_steps
        self.step_times_sec: list[float] = []
        self.autotune_steps: list[int] = []
        # per completed step, when a ledger is given: its peak allocated and reserved bytes, so the
        # fragmentation (reserved - allocated) and its growth across steps can be read
        self.step_peak_allocated_bytes: list[int] = []
        self.step_peak_reserved_bytes: list[int] = []
        self._start = 0.0
        self._events_at_start = 0

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.on_step is not None:
            self.on_step(len(self.step_times_sec))
        self._synchronize()
        if self.ledger is not None:
            self.ledger.start_step()
        self._events_at_start = self.watch.events
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self._synchronize()
        self.step_times_sec.append(time.perf_counter() - self._start)
        if self.ledger is not None:
            self.ledger.fold()
            self.step_peak_allocated_bytes.append(self.ledger.step_allocated_bytes)
            self.step_peak_reserved_bytes.append(self.ledger.step_reserved_bytes)
        if self.watch.events > self._events_at_start:
            self.autotune_steps.append(len(self.step_times_sec) - 1)
        if self.min_steady and len(self.step_times_sec) >= self.min_steps:
            steady, _ = steady_state(self.step_times_sec, self.autotune_steps, self.warmup_steps)
            if len(steady) >= self.min_steady:
                control.should_training_stop = True


@contextlib.contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    """Add the seconds the block took to ``phases[name]``, also when it raises (an OOM in train)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - began
