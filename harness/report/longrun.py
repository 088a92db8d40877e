"""Do the 8-step ceilings hold over a whole run? The long-run cells (``grids/long-run.yaml``) train at
a settled 80 GB ceiling for 100 steps (ColQwen2) or 300 (PyLate) and record allocated and reserved
memory at every step; this module reads them for the ceilings page: per planned cell, whether it
trained every step, how reserved memory and reserved − allocated moved after the ceiling's own
8-step horizon, and the search's ceiling beside the batch the cell trained.
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
from harness.report.data import GIB_PER_MIB, LONG_RUN, Results, SearchRow, backend_label, find_search
from harness.report.text import card_short
from harness.results import CellResult

ROOT = Path(__file__).resolve().parents[2]
GRID_FILE = ROOT / "grids" / f"{LONG_RUN}.yaml"
HORIZON = 8  # the steps a ceiling probe trains: what the long run checks beyond


@dataclasses.dataclass(frozen=True)
class LongRun:
    """One planned long-run cell and, once it ran, its result."""

    cell: GridCell
    result: CellResult | None

    @property
    def backend(self) -> str:
        return backend_label(self.cell.spec.variant, self.cell.spec.score_mini_batch_size)

    @property
    def steps_trained(self) -> int:
        return 0 if self.result is None else len(self.result.step_peak_reserved_per_step_mib)

    @property
    def held(self) -> bool | None:
        """True: trained every step it was asked for; False: ran out of memory (or crashed); None: not run."""
        if self.result is None:
            return None
        return self.result.outcome == "ok" and self.steps_trained >= self.cell.spec.steps

    def after_horizon(self, series: Sequence[float]) -> float | None:
        """How far ``series`` rose from the ceiling's horizon (its largest value over the first
        :data:`HORIZON` steps) to its largest value after it, in MiB; None with no step past it."""
        if len(series) <= HORIZON:
            return None
        return max(series[HORIZON:]) - max(series[:HORIZON])


def long_runs(results: Results, grid_file: Path = GRID_FILE) -> list[LongRun]:
    """Every cell of the long-run grid, in the grid's order, with its result where it has one."""
    found = results.by_id(LONG_RUN)
    return [LongRun(cell, found.get(cell.cell_id)) for cell in load_grid(grid_file)]


def _ceiling_of(run: LongRun, searches: Sequence[SearchRow]) -> str:
    spec = run.cell.spec
    row = find_search(searches, spec.stack, spec.regime, run.backend, spec.card, spec.allocator)
    if row is None or row.probes == 0:
        return "no search"
    return str(row.fits) if row.done and row.fits is not None else "not settled"


def table(runs: Sequence[LongRun], searches: Sequence[SearchRow]) -> pd.DataFrame:
    """One row per planned long run: what it trained, how it ended, and how reserved memory and
    reserved − allocated moved after the ceiling's 8-step horizon."""
    rows = []
    after = f"after step {HORIZON}: reserved / reserved − alloc (MiB)"
    for run in runs:
        spec, result = run.cell.spec, run.result
        row = {"stack · backend": f"{spec.stack} · {run.backend}",
               "card · allocator": f"{card_short(spec.card)} · {spec.allocator}",
               "batch (search's ceiling)": f"{spec.batch_size} ({_ceiling_of(run, searches)})"}  # fmt: skip
        if result is None:
            rows.append(row | {"steps": f"0 of {spec.steps}", "outcome": "not run yet", "peak reserved (GiB)": "", after: ""})
            continue
        reserved, fragmentation = result.step_peak_reserved_per_step_mib, result.fragmentation_per_step_mib
        grew, frag_grew = run.after_horizon(reserved), run.after_horizon(fragmentation)
        outcome = ("trained every step" if run.held else f"oom at step {run.steps_trained + 1}" if result.outcome == "oom"
                   else f"{result.outcome} (no memory verdict)")  # fmt: skip
        rows.append(row | {
            "steps": f"{run.steps_trained} of {spec.steps}", "outcome": outcome,
            "peak reserved (GiB)": "" if not reserved else f"{max(reserved) * GIB_PER_MIB:.2f}",
            after: "" if grew is None or frag_grew is None else f"{grew:+.0f} / {frag_grew:+.0f}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def reading(runs: Sequence[LongRun]) -> str:
    """What the long runs say of the 8-step ceilings, in words, computed from their results."""
    ran = [run for run in runs if run.result is not None]
    if not ran:
        return (f"None of the {len(runs)} long runs has run yet (`harness sweep grids/{LONG_RUN}.yaml` on a GPU host), "
                f"so whether an 8-step ceiling holds over a whole run is not measured here.")  # fmt: skip
    held = [run for run in ran if run.held]
    failed = [run for run in ran if not run.held]
    sentences = [f"{len(held)} of the {len(ran)} long runs that ran trained every step at their batch"]
    for run in failed:
        assert run.result is not None
        if run.result.outcome == "oom":
            sentences.append(f"{run.cell.cell_id} ran out of memory after {run.steps_trained} of {run.cell.spec.steps} "
                             "steps, so its 8-step ceiling does not hold over a run")  # fmt: skip
        else:
            sentences.append(f"{run.cell.cell_id} ended {run.result.outcome} after {run.steps_trained} of "
                             f"{run.cell.spec.steps} steps, which says nothing of its memory")  # fmt: skip
    growth = [(run, run.after_horizon(run.result.step_peak_reserved_per_step_mib)) for run in held if run.result]
    measured = [(run, grew) for run, grew in growth if grew is not None]
    if measured:
        most_run, most = max(measured, key=lambda pair: pair[1])
        if most <= 0:
            sentences.append(f"none of them reserved more after step {HORIZON} than within the first {HORIZON} steps")
        else:
            sentences.append(f"the most any reserved after step {HORIZON} beyond its first {HORIZON} steps' largest is "
                             f"{most:.0f} MiB ({most_run.cell.cell_id})")  # fmt: skip
    if len(ran) < len(runs):
        sentences.append(f"{len(runs) - len(ran)} more have not run yet")
    return "; ".join(sentences) + "."


def plot(runs: Sequence[LongRun]) -> Figure | None:
    """Reserved (solid) and allocated (dotted) step peaks per step of every long run that ran, one
    panel per stack (one above the other, legends beside them), one colour per backend; the
    ceiling's 8-step horizon marked, and a cross where a run ran out of memory."""
    ran = [run for run in runs if run.result is not None and run.result.step_peak_reserved_per_step_mib]
    if not ran:
        return None
    stacks = sorted({run.cell.spec.stack for run in ran})
    figure, axes = plt.subplots(len(stacks), 1, figsize=(8.0, 3.2 * len(stacks)), squeeze=False)
    for axis, stack in zip(axes[:, 0], stacks, strict=True):
        for run in (run for run in ran if run.cell.spec.stack == stack):
            assert run.result is not None
            reserved = np.asarray(run.result.step_peak_reserved_per_step_mib) * GIB_PER_MIB
            allocated = np.asarray(run.result.step_peak_alloc_per_step_mib) * GIB_PER_MIB
            steps = np.arange(1, len(reserved) + 1)
            colour = style.colour(run.backend)
            label = f"{run.backend} B={run.cell.spec.batch_size}" + (
                f" ({run.cell.spec.allocator})" if run.cell.spec.allocator != "default" else "")  # fmt: skip
            dash = "-" if run.cell.spec.allocator == "default" else "-."
            axis.plot(steps, reserved, color=colour, linestyle=dash, linewidth=1.5, label=f"{label}: reserved")
            axis.plot(steps[: len(allocated)], allocated, color=colour, linestyle=":", linewidth=1.2,
                      label=f"{label}: allocated")  # fmt: skip
            if not run.held:  # where it ran out of memory: the step after its last
                axis.plot([len(reserved) + 1], [reserved[-1]], color=colour, marker="x", markersize=8, linestyle="none",
                          label=f"{label}: {run.result.outcome} at step {len(reserved) + 1}")  # fmt: skip
        axis.axvline(HORIZON, color="#7f7f7f", linewidth=0.8, linestyle="--")
        axis.set_title(f"{stack}: step peaks per step", fontsize=10)
        axis.set_xlabel("optimizer step")
        axis.set_ylabel("GiB")
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        style.ticks(axis)
        axis.legend(fontsize=style.LEGEND_PT - 1, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    return figure
