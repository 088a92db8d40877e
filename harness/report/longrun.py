"""Do the 8-step ceilings hold over a whole run? The long-run cells (``grids/long-run.yaml``) train at
a settled 80 GB ceiling for 100 steps (ColQwen2) or 200 (PyLate) and record allocated and reserved
memory at every step; this module reads them for the ceilings page: per planned cell, whether it
trained every step, how reserved memory and reserved − allocated moved after the ceiling's own
8-step horizon, and the search's ceiling beside the batch the cell trained. A run whose host was
taken back before it ended (a lease that ran out) is read from its progress record
(:class:`harness.results.Progress`): the steps it trained, without a verdict on the rest. What a run
costs is estimated from the cells timed alone (:func:`estimated_minutes`), so a session can plan it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from harness.grid import GridCell, load_grid
from harness.report import style
from harness.report.data import GIB_PER_MIB, LONG_RUN, LongRunVerdict, Results, SearchRow, backend_label, find_search
from harness.report.text import (
    EARLIER_DRAW_MARK,
    STACK_NAMES,
    allocator_words,
    card_short,
    gpu_words,
    joined,
    oom_held_mib,
    other_gpu,
    requested_mib,
    signed,
    span,
)
from harness.results import CellResult, Progress, load_progress
from harness.spec import TrainSpec

ROOT = Path(__file__).resolve().parents[2]
GRID_FILE = ROOT / "grids" / f"{LONG_RUN}.yaml"
HORIZON = 8  # the steps a ceiling probe trains: what the long run checks beyond


@dataclasses.dataclass(frozen=True)
class LongRun:
    """One planned long-run cell and, once it ran, its result."""

    cell: GridCell
    result: CellResult | None
    progress: Progress | None = None  # where a run cut short stood at its last checkpoint (no result)

    @property
    def cut(self) -> bool:
        """Cut short by its host: no result, but steps measured before the host was taken back."""
        return self.result is None and self.progress is not None and self.progress.steps_done > 0

    @property
    def reserved_per_step(self) -> list[float]:
        if self.result is not None:
            return self.result.step_peak_reserved_per_step_mib
        return [] if self.progress is None else self.progress.step_peak_reserved_per_step_mib

    @property
    def allocated_per_step(self) -> list[float]:
        if self.result is not None:
            return self.result.step_peak_alloc_per_step_mib
        return [] if self.progress is None else self.progress.step_peak_alloc_per_step_mib

    @property
    def fragmentation_per_step(self) -> list[float]:
        pairs = zip(self.reserved_per_step, self.allocated_per_step, strict=True)
        return [reserved - allocated for reserved, allocated in pairs]

    @property
    def backend(self) -> str:
        return backend_label(self.cell.spec.variant, self.cell.spec.score_mini_batch_size)

    @property
    def name(self) -> str:
        """The run in words: 'ColQwen2 vanilla at B = 120 on 80 GB, expandable segments'."""
        spec = self.cell.spec
        allocator = "" if spec.allocator == "default" else f", {allocator_words(spec.allocator)}"
        stack = STACK_NAMES.get(spec.stack, spec.stack)
        return f"{stack} {self.backend} at B = {spec.batch_size} on {card_short(spec.card)}{allocator}"

    @property
    def device(self) -> str | None:
        """The GPU it ran on, as its result or progress record names it (None: not run, or not recorded)."""
        if self.result is not None and self.result.env is not None and self.result.env.device_name:
            return self.result.env.device_name
        return None if self.progress is None else self.progress.device_name

    @property
    def where(self) -> str:
        """' on an H100 80GB HBM3 (its card's cap alike)' for a run on a GPU other than the H200 the
        book's cards are measured on; '' for one on an H200 or of no recorded GPU."""
        if self.device is None or not other_gpu(self.device):
            return ""
        return f" on an {gpu_words(self.device)} (its card's cap alike)"

    @property
    def steps_trained(self) -> int:
        return len(self.reserved_per_step)

    @property
    def held(self) -> bool | None:
        """True: trained every step it was asked for; False: ran out of memory (or crashed); None: not run."""
        return None if self.result is None else LongRunVerdict.of(self.result).held

    def after_horizon(self, series: Sequence[float]) -> float | None:
        """How far ``series`` rose from the ceiling's horizon (its largest value over the first
        :data:`HORIZON` steps) to its largest value after it, in MiB; None with no step past it."""
        if len(series) <= HORIZON:
            return None
        return max(series[HORIZON:]) - max(series[:HORIZON])


def long_runs(results: Results, grid_file: Path = GRID_FILE) -> list[LongRun]:
    """Every cell of the long-run grid, in the grid's order, with its result where it has one."""
    found = results.by_id(LONG_RUN)
    return [LongRun(cell, found.get(cell.cell_id), _progress(results.root, cell)) for cell in load_grid(grid_file)]


def steps_words(runs: Sequence[LongRun]) -> str:
    """How long the long-run grid trains each stack: '100 steps (ColQwen2) or 200 (PyLate)'."""
    steps: dict[str, set[int]] = {}
    for run in runs:
        steps.setdefault(run.cell.spec.stack, set()).add(run.cell.spec.steps)
    said = [f"{'/'.join(str(count) for count in sorted(counts))}{' steps' if index == 0 else ''} "
            f"({STACK_NAMES.get(stack, stack)})" for index, (stack, counts) in enumerate(sorted(steps.items()))]  # fmt: skip
    return " or ".join(said)


def draw_words(runs: Sequence[LongRun], searches: Sequence[SearchRow]) -> str:
    """The long runs whose batch is a ceiling found on probes of the data's earlier draw (its search runs them
    again on the current draw, :data:`EARLIER_DRAW_MARK` in the table): they answer for that ceiling, and run
    again at the current draw's once it settles; "" where none is."""
    earlier = []
    for run in runs:
        spec = run.cell.spec
        row = find_search(searches, spec.stack, spec.regime, run.backend, spec.card, spec.allocator)
        if row is not None and row.ceiling.earlier_draw and (run.result is not None or run.progress is not None):
            earlier.append(run.name)
    if not earlier:
        return ""
    return (f"{joined(earlier)} trained at or below a ceiling found on probes of the data's earlier draw (marked "
            f"{EARLIER_DRAW_MARK}), whose batches had other shapes: they answer for that ceiling, and run again at "
            "the current draw's once its search settles it.")


def _progress(root: Path, cell: GridCell) -> Progress | None:
    """The progress record of a planned cell, where one of its own spec lies beside its result's path."""
    record = load_progress(root.joinpath(cell.grid, *cell.spec.folder, f"{cell.cell_id}.json"))
    return record if record is not None and record.spec == cell.spec else None


def estimated_minutes(run: LongRun, timed: pd.DataFrame) -> float | None:
    """GPU minutes the long run takes alone: :func:`minutes_alone` of its spec."""
    spec = run.cell.spec
    assert isinstance(spec, TrainSpec)  # the long-run grid trains
    return minutes_alone(spec, timed)


def minutes_alone(spec: TrainSpec, timed: pd.DataFrame) -> float | None:
    """GPU minutes a training cell takes with the GPU to itself: its steps times the steady seconds
    per step at its batch, from a line through the cells of its stack, regime and backend timed under
    the timing rule (``timed``: :func:`harness.report.tables.timed` of the cells; any card, since the
    capped profiles run on the same GPU), or in proportion to the batch with one such cell. None
    without any. Loading the model and the data, and a first step's autotuning, are left out: they
    do not grow with B."""
    if timed.empty:
        return None
    backend = backend_label(spec.variant, spec.score_mini_batch_size)
    same = timed[(timed["stack"] == spec.stack) & (timed["regime"] == spec.regime) & (timed["backend"] == backend)]
    if same.empty:
        return None
    batches = same["batch_size"].to_numpy(dtype=float)
    seconds = same["steady_step_time_sec"].to_numpy(dtype=float)
    if len(set(batches)) >= 2:
        slope, intercept = np.polyfit(batches, seconds, 1)
        per_step = slope * spec.batch_size + intercept
    else:
        per_step = float(np.mean(seconds / batches)) * spec.batch_size
    return spec.steps * per_step / 60


def _ceiling_of(run: LongRun, searches: Sequence[SearchRow]) -> str:
    spec = run.cell.spec
    row = find_search(searches, spec.stack, spec.regime, run.backend, spec.card, spec.allocator)
    if row is None or row.probes == 0:
        return "no search"
    if row.ceiling.earlier_draw and row.fits is not None:  # its deciding probes run again on the current draw
        return f"{row.fits}{EARLIER_DRAW_MARK}"
    return str(row.fits) if row.done and row.fits is not None else "not settled"


# the table's columns, short enough for a page: the batch with its search's ceiling, the GPU minutes
# a run takes alone, the rise after the 8-step horizon, and the slack (reserved − allocated) per step
RUN = "run"  # stack and backend, card, allocator setting
BATCH = "batch (ceiling)"
MINUTES = "GPU min"  # what a run that ran took; ≈ what one not run yet takes alone, estimated
AFTER = f"after step {HORIZON} (MiB): reserved / slack"
GAP = "slack per step (GiB)"  # its range over the run's steps
OUTCOME = "outcome"  # how it ended, with the steps it trained


def table(runs: Sequence[LongRun], searches: Sequence[SearchRow], timed: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per planned long run: what it trained, how it ended, how reserved memory and
    reserved − allocated moved after the ceiling's 8-step horizon, and the GPU minutes it took (its
    wall time) or, not run yet and given ``timed`` (the cells timed under the timing rule), takes
    alone (:func:`estimated_minutes`, marked ≈)."""
    rows = []
    for run in runs:
        spec, result = run.cell.spec, run.result
        row = {RUN: f"{STACK_NAMES.get(spec.stack, spec.stack)} {run.backend}, {card_short(spec.card)}, {spec.allocator}",
               BATCH: f"{spec.batch_size} ({_ceiling_of(run, searches)})"}  # fmt: skip
        if timed is not None and result is not None and result.wall_sec:
            row[MINUTES] = f"{result.wall_sec / 60:.0f}"
        elif timed is not None:
            minutes = estimated_minutes(run, timed)
            row[MINUTES] = "no timed cell" if minutes is None else f"≈ {minutes:.0f}"
        reserved = run.reserved_per_step
        grew, frag_grew = run.after_horizon(reserved), run.after_horizon(run.fragmentation_per_step)
        if result is None and not run.cut:
            outcome = f"not run yet ({spec.steps} steps)"
        elif result is None:
            outcome = f"{run.steps_trained} of {spec.steps} steps{run.where}, then cut short by its host (no OOM)"
        elif run.held:
            outcome = f"trained all {spec.steps} steps{run.where}"
        elif result.outcome == "oom":
            outcome = f"oom at step {run.steps_trained + 1} of {spec.steps}"
        else:
            outcome = f"{result.outcome} after {run.steps_trained} of {spec.steps} steps (no memory verdict)"
        rows.append(row | {
            OUTCOME: outcome,
            "peak reserved (GiB)": "" if not reserved else f"{max(reserved) * GIB_PER_MIB:.2f}",
            AFTER: "" if grew is None or frag_grew is None else f"{signed(grew, '+.0f')} / {signed(frag_grew, '+.0f')}",
            GAP: "" if not run.fragmentation_per_step else _gib_range(run.fragmentation_per_step),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _gib_range(values: Sequence[float]) -> str:
    """'8.1–28.2': the smallest and largest of MiB values, in GiB."""
    return span(min(values) * GIB_PER_MIB, max(values) * GIB_PER_MIB)


def allocator_gap_words(runs: Sequence[LongRun]) -> str:
    """For each stack whose long runs ran under both allocator settings, how far reserved stood above
    allocated at the step peak, step by step, under each: "ColQwen2's reserved − allocated at the step
    peak, step by step, ranged 5.8–27.5 GiB under the default allocator and 0.4–4.5 GiB under
    expandable segments". Empty where no stack ran under both."""
    said = []
    for stack in sorted({run.cell.spec.stack for run in runs}):
        gaps: dict[str, list[float]] = {}
        for run in runs:
            if run.cell.spec.stack == stack and run.fragmentation_per_step:
                gaps.setdefault(run.cell.spec.allocator, []).extend(run.fragmentation_per_step)
        if len(gaps) < 2:
            continue
        settings = [f"{_gib_range(values)} GiB under {'the ' if allocator == 'default' else ''}{allocator_words(allocator)}"
                    for allocator, values in sorted(gaps.items(), key=lambda item: item[0] != "default")]  # fmt: skip
        said.append(f"{STACK_NAMES.get(stack, stack)}'s reserved − allocated at the step peak, step by step, ranged "
                    f"{joined(settings)}")  # fmt: skip
    return "; ".join(said)


def reading(runs: Sequence[LongRun]) -> str:
    """What the long runs say of the 8-step ceilings, in words, computed from their results (and the
    progress of runs cut short by their host)."""
    ran = [run for run in runs if run.result is not None]
    cut = [run for run in runs if run.cut]
    if not ran and not cut:
        return (f"None of the {len(runs)} long runs has run yet (`harness sweep grids/{LONG_RUN}.yaml` on a GPU host), "
                f"so whether an 8-step ceiling holds over a whole run is not measured here.")  # fmt: skip
    failed = [run for run in ran if not run.held]
    # a run below a batch that failed is said beside it, after this sentence of the runs that held
    said_below = [lower for run in failed if run.result is not None and run.result.outcome == "oom"
                  for lower in below(run, runs) if lower.result is not None or lower.cut]  # fmt: skip
    held = [run for run in ran if run.held and run not in said_below]
    ended = [run for run in ran if run not in said_below]
    besides = ("" if not said_below else ", besides the one below a batch that ran out of memory" if len(said_below) == 1
               else f", besides the {len(said_below)} below batches that ran out of memory")  # fmt: skip
    if len(held) == len(ended) == 1:  # one run: named, not counted
        sentences = [f"{held[0].name} trained all {held[0].cell.spec.steps} of its steps"]
    elif held:
        their = "their" if len(held) > 1 else "its"
        sentences = [f"{joined([run.name for run in held])} trained every step at {their} batch ({len(held)} of "
                     f"the {len(ended)} long runs that ended{besides})"]  # fmt: skip
    elif len(ended) > 1:
        sentences = [f"none of the {len(ended)} long runs that ended{besides} trained every step at its batch"]
    else:
        sentences = []
    for run in failed:
        assert run.result is not None
        if run.result.outcome == "oom":
            sentences.append(f"{run.name} ran out of memory after {run.steps_trained} of {run.cell.spec.steps} "
                             f"steps, so its 8-step ceiling does not hold over a run{_why_out(run)}")  # fmt: skip
            sentences += [_below_words(run, lower) for lower in below(run, runs) if lower in said_below]
        else:
            sentences.append(f"{run.name} ended {run.result.outcome} after {run.steps_trained} of "
                             f"{run.cell.spec.steps} steps, which says nothing of its memory")  # fmt: skip
    for run in (run for run in cut if run not in said_below):
        sentences.append(f"{run.name} trained {run.steps_trained} of {run.cell.spec.steps} steps{run.where} before its "
                         "host was taken back, without running out of memory up to there")  # fmt: skip
    growth = [(run, run.after_horizon(run.reserved_per_step)) for run in ran + cut if run.held or run.cut]
    measured = [(run, grew) for run, grew in growth if grew is not None]
    if measured:
        most_run, most = max(measured, key=lambda pair: pair[1])
        if most <= 0:
            named = "it" if len(ran) + len(cut) == 1 else measured[0][0].name  # "it": the sentence before named it
            who = f"{named} reserved no more" if len(measured) == 1 else "none of them reserved more"
            sentences.append(f"{who} after step {HORIZON} than within the first {HORIZON} steps")
        else:
            among = "" if len(measured) == 1 else " of the runs that did not run out of memory"
            sentences.append(f"the largest rise of reserved memory after step {HORIZON} over the first {HORIZON} steps' "
                             f"peak{among} is {most:.0f} MiB ({most_run.name})")  # fmt: skip
    gap = allocator_gap_words(runs)
    if gap:
        sentences.append(gap)
    if len(ran) + len(cut) < len(runs):
        left = len(runs) - len(ran) - len(cut)
        sentences.append(f"{left} more {'has' if left == 1 else 'have'} not run yet")
    return ". ".join(sentence[0].upper() + sentence[1:] for sentence in sentences) + "."


def setting(run: LongRun) -> tuple[object, ...]:
    """What a long run trains but its batch and steps: stack, regime, backend, card, allocator."""
    spec = run.cell.spec
    return spec.stack, spec.regime, run.backend, spec.card, spec.allocator


def below(run: LongRun, runs: Sequence[LongRun]) -> list[LongRun]:
    """The runs of ``run``'s setting at smaller batches (where a run at a ceiling ran out of memory, the
    grid plans one below it), largest first."""
    def batch(other: LongRun) -> int:
        return other.cell.spec.batch_size

    lower = (other for other in runs if setting(other) == setting(run) and batch(other) < batch(run))
    return sorted(lower, key=batch, reverse=True)


def _below_words(run: LongRun, lower: LongRun) -> str:
    """How a run below a batch that ran out of memory went: 'at B = 144, 90% of that batch, a run trained
    all 100 steps' (or ran out of memory, or was cut short by its host)."""
    share = f"{lower.cell.spec.batch_size / run.cell.spec.batch_size:.0%} of that batch"
    steps = lower.cell.spec.steps
    if lower.result is None:
        ended = (f"trained {lower.steps_trained} of {steps} steps{lower.where} before its host was taken back, without "
                 "running out of memory")  # fmt: skip
    elif lower.held:
        ended = f"trained all {steps} steps{lower.where}"
    elif lower.result.outcome == "oom":
        ended = f"ran out of memory after {lower.steps_trained} of {steps} steps as well"
    else:
        ended = f"ended {lower.result.outcome} after {lower.steps_trained} of {steps} steps"
    return f"at B = {lower.cell.spec.batch_size}, {share}, a run {ended}"


def _why_out(run: LongRun) -> str:
    """How a long run that ran out of memory got there, from its steps and its OOM message: ': after step
    8 its reserved peak rose 884 MiB while its allocated peak changed −158 MiB, and the request that
    failed (2.25 GiB) found 17.10 GiB reserved but unallocated' ('' where nothing past step 8 was measured)."""
    assert run.result is not None
    reserved, allocated = run.after_horizon(run.reserved_per_step), run.after_horizon(run.allocated_per_step)
    if reserved is None or allocated is None:
        return ""
    words = (f": after step {HORIZON} its reserved peak changed {signed(reserved, '+.0f')} MiB while its allocated peak "
             f"changed {signed(allocated, '+.0f')} MiB")  # fmt: skip
    held, asked = oom_held_mib(run.result.oom_message), requested_mib(run.result.oom_message)
    if held is not None and asked is not None and held[1] > asked:  # free bytes enough, but no block of them
        words += (f", and the request that failed ({asked * GIB_PER_MIB:.2f} GiB) found {held[1] * GIB_PER_MIB:.2f} GiB "
                  f"reserved but unallocated: the {run.cell.spec.allocator} allocator's cache, fragmented, "
                  "could not serve it")  # fmt: skip
    return words


def plot(runs: Sequence[LongRun]) -> Figure | None:
    """Reserved (solid) and allocated (dotted) step peaks per step of every long run that ran, one
    panel per stack and allocator setting (one above the other, legends below them), a further run of
    a backend there (a batch below one that ran out of memory) in a panel of its own, so no two runs of
    one backend share a panel; one colour per backend; the ceiling's 8-step horizon marked, a
    cross where a run ran out of memory and a bar where its host was taken back; a run on a GPU other than
    an H200 names it ("lik B=144 (H100)")."""
    ran = [run for run in runs if run.reserved_per_step]
    if not ran:
        return None
    # the nth run of a backend in a stack and allocator setting goes to that setting's nth panel
    panel = [(run.cell.spec.stack, run.cell.spec.allocator, [setting(other) for other in ran[:index]].count(setting(run)))
             for index, run in enumerate(ran)]  # fmt: skip
    panels = sorted(set(panel))
    figure, axes = plt.subplots(len(panels), 1, figsize=(9.0, 4.0 * len(panels)), squeeze=False)
    for axis, (stack, allocator, nth) in zip(axes[:, 0], panels, strict=True):
        for run in (run for run, key in zip(ran, panel, strict=True) if key == (stack, allocator, nth)):
            reserved = np.asarray(run.reserved_per_step) * GIB_PER_MIB
            allocated = np.asarray(run.allocated_per_step) * GIB_PER_MIB
            steps = np.arange(1, len(reserved) + 1)
            colour = style.colour(run.backend)
            gpu = f" ({gpu_words(run.device).split()[0]})" if run.where and run.device else ""  # "(H100)"
            label = f"{run.backend} B={run.cell.spec.batch_size}{gpu}"
            axis.plot(steps, reserved, color=colour, linewidth=1.5, label=f"{label}: reserved")
            axis.plot(steps[: len(allocated)], allocated, color=colour, linestyle=":", linewidth=1.2,
                      label=f"{label}: allocated")  # fmt: skip
            if run.cut:  # where its host was taken back: a bar after its last step
                axis.plot([len(reserved)], [reserved[-1]], color=colour, marker="|", markersize=10, linestyle="none",
                          label=f"{label}: cut short by its host after step {len(reserved)}")  # fmt: skip
            elif run.result is not None and not run.held:  # where it ran out of memory: the step after its last
                axis.plot([len(reserved) + 1], [reserved[-1]], color=colour, marker="x", markersize=8, linestyle="none",
                          label=f"{label}: {run.result.outcome} at step {len(reserved) + 1}")  # fmt: skip
        axis.axvline(HORIZON, color="#7f7f7f", linewidth=0.8, linestyle="--")
        further = "" if nth == 0 else ", a further run of a backend"
        axis.set_title(f"{STACK_NAMES.get(stack, stack)}, {allocator_words(allocator)}{further}: step peaks per step",
                       fontsize=10)  # fmt: skip
        axis.set_xlabel("optimizer step")
        axis.set_ylabel("GiB")
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        style.ticks(axis)
        # below the panel, so the axes keep the figure's width whatever a label's length
        axis.legend(fontsize=style.LEGEND_PT - 1, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    figure.tight_layout()
    return figure
