"""Loading: what the book's pages read, from the committed results only.

A result belongs to the report when the grid it embeds is one of the report's grids (a grid file of
``grids/``, or the shared-GPU check): the grid is read from the result, never derived from where the
file lies. Every other file under the results folder — unreadable, not JSON, not a result, an older
schema, a cell of no report grid — is kept with its reason in :attr:`Results.skipped` and never
stops the book.

Cell data comes as DataFrames whose columns are the result schema's field names (see
:func:`harness.results.frame_of`) plus ``backend``, the label pages group by. Ceiling searches and
the shared-GPU check come as typed rows. Torch-free: nothing here runs a cell.

``python -m harness.report.data --check [RESULTS_DIR]`` prints every file the report skips, with its
reason (``make report`` runs it before building the book).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pandas as pd

from harness import host_memory
from harness.grid import ROOT, GridError, grid_names, load_grid
from harness.report import timing
from harness.results import CellResult, Skipped, default_results_dir, frame_of, read_results
from harness.search import (
    CROSS_CARD,
    SEARCH_FIELDS,
    Ceiling,
    CeilingSearch,
    Probes,
    RepeatSpread,
    bounding_spreads,
    cross_card_pairs,
    earlier_draw,
    load_searches,
    reference_probes,
    repeat_spreads,
    same_bytes,
    search_state,
    spreads_of,
    step_gaps,
    vouched_devices,
    within_repeat,
)
from harness.search import CROSS_CARD_GRID as CROSS_CARD_GRID  # (the pages read it here)
from harness.spec import CARDS, TrainSpec, differences

PUBLISHED_GRID = "published"  # grids/published.yaml
REPEAT = "repeat"  # grids/repeat.yaml: published-grid cells run again, for the repeatability of step times
SHARED_CHECK = "shared-gpu-check"  # grids/shared-gpu-check.yaml: a ceiling search run again on a shared GPU
CEILINGS = "ceilings"  # the grid of the ceiling searches' probes
PARITY = "parity"  # grids/parity.yaml: traced 50-step cells, read by the parity page (harness.report.agreement)
LONG_RUN = "long-run"  # grids/long-run.yaml: 100-200 steps at the 80 GB ceilings, read by the ceilings page
MULTI_GPU = "multi-gpu"  # grids/multi-gpu.yaml: data-parallel cells with gathered negatives (harness.ranks)
MULTI_GPU_CEILINGS = "multi-gpu-ceilings"  # grids/multi-gpu-ceilings.yaml: per-rank ceilings at W = 8, gathered
MULTI_GPU_CEILINGS_GRID = ROOT / "grids" / "multi-gpu-ceilings.yaml"
PINNED_CHECK = "pinned-check"  # grids/pinned-check.yaml: repeat cells timed pinned side by side on two GPUs
# grids with their own pages or tables
APART = (CEILINGS, SHARED_CHECK, CROSS_CARD, REPEAT, PARITY, LONG_RUN, PINNED_CHECK, MULTI_GPU, MULTI_GPU_CEILINGS)
CEILINGS_GRID = ROOT / "grids" / "ceilings.yaml"
PUBLISHED = ROOT / "book" / "data" / "published.csv"
# tools/investigate_lik_spike.py's record of its run on an H200: why an op cell's first lik backward
# read 230–250 MiB more than the same call tuned
LIK_SPIKE = ROOT / "book" / "data" / "lik_spike_investigation.json"
GIB_PER_MIB = 1 / 1024

Item = tuple[Path, CellResult]


def report_grids() -> frozenset[str]:
    """The grids whose results the report reads: every grid file's name (``grids/*.yaml``)."""
    return frozenset(grid_names())


@dataclasses.dataclass(frozen=True)
class Results:
    """The results under a results folder that belong to the report, and every file it cannot use."""

    root: Path
    found: tuple[Item, ...]
    skipped: tuple[Skipped, ...]

    def of(self, *grids: str) -> list[Item]:
        """The (path, result) pairs of ``grids``, in path order."""
        return [(path, result) for path, result in self.found if result.grid in grids]

    def excluding(self, *grids: str) -> list[Item]:
        """The (path, result) pairs of every report grid except ``grids``, in path order."""
        return [(path, result) for path, result in self.found if result.grid not in grids]

    def by_id(self, grid: str) -> dict[str, CellResult]:
        """The results of one grid by cell id."""
        return {result.cell_id: result for _, result in self.of(grid)}


Source = Results | str | os.PathLike[str] | None


def read(results_dir: str | os.PathLike[str] | None = None) -> Results:
    """Every result of a report grid under ``results_dir`` (default: the committed ``results/``, or
    ``$MAXSIM_RESULTS_DIR``), and every file skipped with its one-line reason."""
    root = Path(results_dir or default_results_dir())
    found, skipped = read_results(root, grids=report_grids()) if root.exists() else ([], [])
    return Results(root, tuple(found), tuple(skipped) + tuple(host_memory.read_all(root)[1]))


def results_of(source: Source) -> Results:
    """``source`` as :class:`Results`: read from a folder (None: the default one), or as given."""
    return source if isinstance(source, Results) else read(source)


# ---- cells ---------------------------------------------------------------------------------------


def backend_label(variant: str, chunk: float | None) -> str:
    """vanilla, lik, flash, or 'vanilla + chunk 64' for PyLate's own mitigation."""
    if chunk is None or (isinstance(chunk, float) and math.isnan(chunk)):
        return variant
    return f"{variant} + chunk {int(chunk)}"


def with_backend(frame: pd.DataFrame) -> pd.DataFrame:
    """Add the ``backend`` column (variant, or 'vanilla + chunk N') to a results frame, in place."""
    if not frame.empty:
        frame["backend"] = [backend_label(v, c) for v, c in zip(frame["variant"], frame["score_mini_batch_size"], strict=True)]
    return frame


def load(source: Source = None,
         leave_out: tuple[str, ...] = APART) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """(cells, isolated calls) with a ``backend`` column, of every report grid but ``leave_out``:
    ceiling probes have their own page, the shared-GPU check its own table, the repeated cells
    their twins in the published grid (:func:`repeats`), the traced cells the parity page, and the
    long runs the ceilings page."""
    results = results_of(source)
    chosen = results.excluding(*leave_out)
    cells = with_backend(frame_of(chosen))
    unvouched = pinned_unvouched(results, chosen)
    if unvouched:  # the timing rule: pinned side-by-side times count only where the pinned check vouches
        demoted = cells["path"].isin(list(unvouched))
        cells.loc[demoted, "times_comparable"] = False
        cells.loc[demoted, "timing_reason"] = [unvouched[path] for path in cells.loc[demoted, "path"]]
    calls = with_backend(frame_of(chosen, level="calls"))
    if not calls.empty:
        calls = calls[calls["call_kind"] == "isolated"]
    return cells, calls


@functools.cache
def _cell_specs(grid: str) -> dict[str, TrainSpec]:
    """The training cells' specs of a cell grid by cell id; empty for a grid that is not a cell grid (the
    ceiling searches) or that cannot be read."""
    path = grid_names().get(grid)
    if path is None:
        return {}
    try:
        cells = load_grid(path)
    except GridError:
        return {}
    return {cell.cell_id: cell.spec for cell in cells if isinstance(cell.spec, TrainSpec)}


def grid_spec(row: pd.Series) -> TrainSpec | None:
    """A result row's spec as its grid file states it (None where the grid does not list the cell)."""
    return _cell_specs(str(row.get("grid", ""))).get(str(row.get("cell_id", "")))


def least_steps(row: pd.Series) -> int:
    """The least steps a cell was to train, from its grid's spec: ``steps``, or — for a timed cell
    (``min_steady_steps``) — the warm-up and every steady step it trains past ``steps`` for. The
    result's own ``steps`` field is the spec's ``steps`` alone, so a timed grid cell with ``steps: 4``
    trains at least 9 (1 warm-up + 8 steady), not 4."""
    spec = grid_spec(row)
    if spec is None:
        return int(row["steps"])
    return max(spec.steps, spec.warmup_steps + spec.min_steady_steps)


def all_cells(source: Source = None) -> pd.DataFrame:
    """Every result of every report grid, one row each (the results page)."""
    return frame_of(results_of(source).found)


def select(frame: pd.DataFrame, stack: str, regime: str, card: str | None = None) -> pd.DataFrame:
    """The rows of one stack and regime (and card, if given)."""
    if frame.empty:
        return frame
    chosen = frame[(frame["stack"] == stack) & (frame["regime"] == regime)]
    return chosen if card is None else chosen[chosen["card"] == card]


def matching(frame: pd.DataFrame, **values: object) -> pd.DataFrame:
    """The rows of ``frame`` whose columns equal ``values`` (column=value for each)."""
    keep = pd.Series(True, index=frame.index)
    for column, value in values.items():
        keep &= frame[column] == value
    return frame[keep]


def op_level(cells: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Op-level cells (a loss head alone), one row each, with the head's isolated memory joined in
    (``saved_for_backward_mib``, ``backward_transient_peak_mib`` and their sum ``total_mib``)."""
    if cells.empty or "negatives" not in cells:
        return pd.DataFrame()
    ops = cells[cells["stack"].str.startswith("op-")].copy()
    if ops.empty:
        return ops
    ops["negatives"] = ops["negatives"].astype("Int64")
    memory = calls[calls["stack"].str.startswith("op-")] if not calls.empty else calls
    keys = ["stack", "regime", "batch_size", "negatives", "variant"]
    if not memory.empty:
        memory = memory.assign(negatives=memory["negatives"].astype("Int64"))
        footprint = memory.assign(total_mib=memory["saved_for_backward_mib"] + memory["backward_transient_peak_mib"])
        columns = keys + ["saved_for_backward_mib", "backward_transient_peak_mib", "total_mib"]
        ops = ops.merge(footprint[columns], on=keys, how="left")
    return ops


# The published op memory of a cell, in MiB (the published tables print GiB above 1 GiB, MiB below; a
# GiB figure is stored × 1024): forward transient, held for backward, the backward spike on top of
# what is held, and held + spike. Held, spike and total are three figures, never one for another.
PUBLISHED_OP = {
    "op_forward_transient_mib": "forward transient",
    "op_held_mib": "held",
    "op_backward_spike_mib": "backward spike",
    "op_total_mib": "total",
}


def published(stack: str, regime: str) -> pd.DataFrame:
    """The published measurements of one stack and regime (``book/data/published.csv``): a cell's
    outcome, step peaks and time, and, where the published text gives them, its op memory
    (:data:`PUBLISHED_OP`). ``step_sec``: the published seconds per step, or the batch over the
    published samples per second where only that is given."""
    frame = pd.read_csv(PUBLISHED)
    frame["step_sec"] = frame["steady_step_time_sec"].fillna(frame["batch_size"] / frame["samples_per_sec"])
    return frame[(frame["stack"] == stack) & (frame["regime"] == regime)]


def published_op(published: pd.DataFrame) -> pd.DataFrame:
    """The published cells (rows of :func:`published`) that give any op memory figure."""
    return published[published[list(PUBLISHED_OP)].notna().any(axis=1)] if not published.empty else published


# ---- ceiling probes and searches -----------------------------------------------------------------


def ceiling_probes(source: Source = None) -> pd.DataFrame:
    """Every committed ceiling probe, one row each, with its backend label, and what it records of what ran
    beside it (the timing rule, :mod:`harness.host`): ``timing_recorded`` (it has that record at all) and
    ``timed_alone`` (it had its GPU and its host to itself)."""
    items = results_of(source).of(CEILINGS)
    probes = with_backend(frame_of(items))
    if not probes.empty:
        probes["timing_recorded"] = [result.timing is not None for _, result in items]
        probes["timed_alone"] = [result.timed_alone for _, result in items]
    return probes


@dataclasses.dataclass(frozen=True)
class SeedEffect:
    """What the seed changed in one stack's ceiling probes: every probe run at a setting and batch on a
    later seed, set against the same probe on the first seed run there (crashed probes left out)."""

    stack: str
    regimes: tuple[str, ...]  # the regimes of those batches
    batches: int  # settings and batches probed on more than one seed
    probes: int  # later-seed probes compared with their first seed's
    alloc_mib: float  # the largest gap between two seeds' allocated peaks at any step both ran
    reserved_mib: float  # the same for reserved
    differing: tuple[str, ...]  # later-seed probes whose outcome (trained or ran out) was not the first seed's
    lengths: tuple[tuple[int, int], ...]  # every (query, document) token length the probes' score calls had


def seed_effect(source: Source, stack: str) -> SeedEffect:
    """How far the seed moved ``stack``'s ceiling probes (:class:`SeedEffect`): the data a search that
    confirms on one seed rests on."""
    by_setting: dict[TrainSpec, list[CellResult]] = {}
    lengths = set()
    for _, result in results_of(source).of(CEILINGS):
        spec = result.spec
        if not isinstance(spec, TrainSpec) or spec.stack != stack or result.outcome not in ("ok", "oom"):
            continue
        by_setting.setdefault(dataclasses.replace(spec, seed=0), []).append(result)
        lengths |= {(call.query_shape[-2], call.doc_shape[-2]) for call in result.maxsim_calls_in_train}
    alloc = reserved = 0.0
    compared, differing = 0, []
    runs = [sorted(group, key=lambda result: result.spec.seed) for group in by_setting.values() if len(group) > 1]
    for first, *later in runs:
        for result in later:
            compared += 1
            if result.outcome != first.outcome:
                differing.append(result.cell_id)
            alloc = max(alloc, _largest_gap(first.step_peak_alloc_per_step_mib, result.step_peak_alloc_per_step_mib))
            reserved = max(reserved, _largest_gap(first.step_peak_reserved_per_step_mib,
                                                  result.step_peak_reserved_per_step_mib))  # fmt: skip
    regimes = tuple(sorted({first.spec.regime for first, *_ in runs}))
    return SeedEffect(stack, regimes, len(runs), compared, alloc, reserved, tuple(sorted(differing)), tuple(sorted(lengths)))


@dataclasses.dataclass(frozen=True)
class StepsCheck:
    """Whether a regime's probes of fewer steps than the rest (:data:`harness.search.MIN_STEPS_OF`) see
    what a longer run sees: every committed cell of the regime that trained more steps than a probe, and
    how far its peaks rose after the probe's steps."""

    stack: str
    regime: str
    steps: int  # what the regime's probes train
    cells: int  # the regime's committed cells that trained more steps (and every one of them)
    least: int  # the fewest steps one of them trained (0: none)
    batches: tuple[int, ...]  # their batch sizes
    alloc_rise_mib: float  # the most a cell's allocated peak rose after ``steps`` steps
    reserved_rise_mib: float  # the same for reserved: what must fit the card
    rose: tuple[str, ...]  # the cells whose reserved peak rose after them

    @property
    def holds(self) -> bool:
        """A probe of ``steps`` steps reserves what the longer runs did: there are some, and none rose."""
        return bool(self.cells) and not self.rose


def steps_check(source: Source, stack: str, regime: str, steps: int) -> StepsCheck:
    """How far the peaks of ``stack``'s ``regime`` cells that trained more than ``steps`` steps rose after
    their first ``steps`` (:class:`StepsCheck`), over every report grid: what a probe of ``steps`` rests on."""
    alloc = reserved = 0.0
    lengths, rose, batches = [], [], set()
    for _, result in results_of(source).found:
        spec = result.spec
        done = result.step_peak_reserved_per_step_mib
        if (not isinstance(spec, TrainSpec) or (spec.stack, spec.regime) != (stack, regime) or result.outcome != "ok"
                or len(done) <= steps):  # fmt: skip
            continue
        lengths.append(len(done))
        batches.add(spec.batch_size)
        allocated = result.step_peak_alloc_per_step_mib
        alloc = max(alloc, max(allocated) - max(allocated[:steps]))
        rise = max(done) - max(done[:steps])
        reserved = max(reserved, rise)
        if rise > 0:
            rose.append(result.cell_id)
    return StepsCheck(stack, regime, steps, len(lengths), min(lengths, default=0), tuple(sorted(batches)), alloc, reserved,
                      tuple(sorted(rose)))  # fmt: skip


def _largest_gap(one: Sequence[float], other: Sequence[float]) -> float:
    """The largest difference between two runs' per-step values at any step both recorded (0 if none)."""
    return max((abs(a - b) for a, b in zip(one, other, strict=False)), default=0.0)


def probes_of(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str,
              allocator: str = "default") -> pd.DataFrame:  # fmt: skip
    """The ceiling probes of one batch (every seed run), sorted by seed."""
    if probes.empty:
        return probes
    chosen = matching(probes, stack=stack, regime=regime, batch_size=batch, backend=backend, card=card, allocator=allocator)
    return chosen.sort_values("seed")


@dataclasses.dataclass(frozen=True)
class LongRunVerdict:
    """How a long run (``grids/long-run.yaml``) at a search's ceiling batch ended: it trained
    ``steps_trained`` of its ``steps`` steps, ending ``outcome`` (``ok``, ``oom`` or ``crashed``), on
    the GPU ``device_name``; where it ran out of memory, ``below`` is the run of the same setting at the
    largest smaller batch (the grid's stated margin), where one ended."""

    batch_size: int
    steps: int
    steps_trained: int
    outcome: str
    device_name: str | None = None
    below: LongRunVerdict | None = None

    @classmethod
    def of(cls, result: CellResult) -> LongRunVerdict:
        """How the long run ``result`` ended: the steps it asked for and the steps it measured."""
        assert isinstance(result.spec, TrainSpec)  # the long-run grid trains
        device = result.env.device_name if result.env is not None else None
        return cls(result.spec.batch_size, result.spec.steps, len(result.step_peak_reserved_per_step_mib), result.outcome,
                   device or None)  # fmt: skip

    @property
    def held(self) -> bool:
        """It trained every step it asked for."""
        return self.outcome == "ok" and self.steps_trained >= self.steps

    @property
    def ran_out(self) -> bool:
        """It ran out of memory part way: the 8-step ceiling does not hold over a run."""
        return self.outcome == "oom"


LONG_RUN_FREE = ("steps", "warmup_steps", "min_steady_steps", "seed", "trace")  # what a long run may change of a probe


def long_run_at(search: CeilingSearch, batch_size: int | None, long: Sequence[CellResult]) -> LongRunVerdict | None:
    """The long run of ``search``'s cell at ``batch_size`` (its ceiling): a long-run result whose spec
    differs from the search's probe at that batch in nothing but its steps, seed and tracing."""
    if batch_size is None:
        return None
    probe = search.probe(batch_size, search.seeds[0])
    ended = [result for result in long if result.outcome in ("ok", "oom", "crashed")]
    for result in ended:
        if set(differences(probe, result.spec)) <= set(LONG_RUN_FREE):
            verdict = LongRunVerdict.of(result)
            if not verdict.ran_out:
                return verdict
            lower = [LongRunVerdict.of(other) for other in ended
                     if set(differences(probe, other.spec)) <= {"batch_size", *LONG_RUN_FREE}
                     and isinstance(other.spec, TrainSpec) and other.spec.batch_size < batch_size]  # fmt: skip
            below = max(lower, key=lambda run: run.batch_size, default=None)
            return dataclasses.replace(verdict, below=below)
    return None


@dataclasses.dataclass(frozen=True)
class LoaderCheck:
    """One probe trained with the recipe's dataloader workers and with fewer (same batch, same seed): the
    largest gap between their peaks at any step (MiB)."""

    batch_size: int
    seed: int
    alloc_mib: float
    reserved_mib: float


@dataclasses.dataclass(frozen=True)
class SearchRow:
    """One ceiling search: what it searches, where it stands (read from its probes exactly as the
    search itself decides), and what its probes measured at the ceiling and on the batch above it.

    The peaks are the largest over the seeds that trained the ceiling batch (None before a batch
    fits). ``usable_gib`` is the cap the probes ran under (the whole device for the native card);
    for a search with no probe yet, the card's.
    """

    search: CeilingSearch
    ceiling: Ceiling
    probes: int  # probes with a result
    usable_gib: float | None
    peak_alloc_gib: float | None = None
    peak_reserved_gib: float | None = None
    fragmentation_gib: float | None = None  # reserved − allocated at the step peak
    fragmentation_growth_mib: float | None = None  # its change from the first step to the last
    op_held_mib: float | None = None  # the MaxSim op's memory held for backward (isolated replay)
    fails_where: str | None = None  # where the batch above ran out of memory: "maxsim" or "elsewhere"
    fails_message: str | None = None  # that out-of-memory message
    long_run: LongRunVerdict | None = None  # how a long run at the ceiling batch ended, where one ran
    crash_message: str | None = None  # why the crashed probe that stopped the search crashed (its marker's message)
    recipe: SearchRow | None = None  # where this search collates with fewer dataloader workers: the recipe's own
    loader_check: tuple[LoaderCheck, ...] = ()  # then: the probes both searches trained, their peaks compared
    # the data draws of the probes at the ceiling and of those that failed at the batch above it (those of an earlier
    # draw where they decide nothing, harness.search.earlier_draw, only while the search runs them again)
    deciding_draws: frozenset[str] = frozenset()
    devices: frozenset[str] = frozenset()  # the GPUs its probes ran on, as their results name them

    stack = property(lambda self: self.search.stack)
    regime = property(lambda self: self.search.regime)
    card = property(lambda self: self.search.card)
    allocator = property(lambda self: self.search.allocator)
    fits = property(lambda self: self.ceiling.fits)
    fails = property(lambda self: self.ceiling.fails)
    done = property(lambda self: self.ceiling.done)
    stopped = property(lambda self: self.ceiling.stopped)

    @property
    def backend(self) -> str:
        return backend_label(self.search.variant, self.search.score_mini_batch_size)

    @property
    def headroom_gib(self) -> float | None:
        """Usable memory less the peak reserved at the ceiling."""
        if self.usable_gib is None or self.peak_reserved_gib is None:
            return None
        return self.usable_gib - self.peak_reserved_gib

    @property
    def settled(self) -> int | None:
        """The batch a finished search found to fit on every seed (for a search that reached its
        limit, a lower bound); None while it runs, once it stopped, or where nothing fit."""
        return self.fits if self.done and not self.stopped else None

    @property
    def running(self) -> bool:
        """Whether the search is still under way: it has probes, has not finished, no crashed probe stopped it, and
        its walk is not one that ended on probes of the data's earlier draw (which runs them again: a mark of its own,
        :data:`harness.report.text.EARLIER_DRAW_MARK`)."""
        return self.probes > 0 and not self.done and not self.stopped and not self.ceiling.earlier_draw


def ceilings(source: Source = None, grid_file: Path = CEILINGS_GRID) -> list[SearchRow]:
    """One row per ceiling search of ``grid_file``, in the grid's order."""
    results = results_of(source)
    searches = load_searches(grid_file)
    grids = sorted({search.grid for search in searches})
    frame = frame_of(results.of(*grids))
    by_grid = {grid: results.by_id(grid) for grid in grids}
    long = [result for _, result in results.of(LONG_RUN)]
    probes = {search: Probes(search, by_grid[search.grid]) for search in searches}
    rows = [search_row(search, probes[search], frame) for search in searches]
    rows = [dataclasses.replace(row, long_run=long_run_at(row.search, row.settled, long)) for row in rows]
    return with_fewer_workers(rows, probes)


def with_fewer_workers(rows: Sequence[SearchRow], probes: dict[CeilingSearch, Probes]) -> list[SearchRow]:
    """One row per search the reader asks about: a search whose probes collate with fewer dataloader
    workers than the recipe's (where the lent host's memory cannot hold the recipe's) answers for the
    recipe's search of the same setting once it has probes, in that search's place, naming it
    (``recipe``) and comparing the probes both trained (``loader_check``); before, the recipe's
    search answers alone."""
    def setting(row: SearchRow) -> tuple[object, ...]:
        return tuple(getattr(row.search, name) for name in SEARCH_FIELDS if name != "dataloader_workers")

    recipes = {setting(row): row for row in rows if row.search.dataloader_workers is None}
    fewer = {setting(row): row for row in rows if row.search.dataloader_workers is not None}
    kept = []
    for row in rows:
        if row.search.dataloader_workers is None:
            twin = fewer.get(setting(row))
            if twin is not None and twin.probes > 0:
                check = loader_check(probes[row.search], probes[twin.search])
                kept.append(dataclasses.replace(twin, recipe=row, loader_check=check))
            else:
                kept.append(row)
        elif setting(row) not in recipes:  # no recipe search of its setting: it answers alone
            kept.append(row)
    return kept


def loader_check(recipe: Probes, fewer: Probes) -> tuple[LoaderCheck, ...]:
    """The probes that trained with the recipe's dataloader workers and with fewer, same batch and seed:
    how far apart their peaks came at any step both recorded."""
    checks = []
    for key in sorted(recipe.by_probe.keys() & fewer.by_probe.keys()):
        ran, fewer_ran = recipe.by_probe[key], fewer.by_probe[key]
        recorded = ran.step_peak_alloc_per_step_mib and fewer_ran.step_peak_alloc_per_step_mib
        if ran.outcome == fewer_ran.outcome == "ok" and recorded:
            alloc = _largest_gap(ran.step_peak_alloc_per_step_mib, fewer_ran.step_peak_alloc_per_step_mib)
            reserved = _largest_gap(ran.step_peak_reserved_per_step_mib, fewer_ran.step_peak_reserved_per_step_mib)
            checks.append(LoaderCheck(*key, alloc, reserved))
    return tuple(checks)


def search_row(search: CeilingSearch, probes: Probes, frame: pd.DataFrame) -> SearchRow:
    """A search's row: its state from ``probes``, its measurements from their rows of ``frame``."""
    ceiling, _ = search_state(search, probes)
    probed = {**probes.earlier, **probes.by_probe}  # every probe, of the data's earlier draw or the current one
    ids = {result.cell_id for result in probed.values()}
    mine = frame[(frame["grid"] == search.grid) & frame["cell_id"].isin(ids)] if ids else frame.iloc[0:0]
    at_fit = mine[mine["batch_size"] == ceiling.fits]
    at_fail = mine[(mine["batch_size"] == ceiling.fails) & (mine["outcome"] == "oom")]
    current = at_fail[at_fail["cell_id"].isin({result.cell_id for result in probes.by_probe.values()})]
    at_fail = at_fail if current.empty else current  # the failure that decided, where one of the current draw did
    usable = _largest(mine, "memory_limit_mib", GIB_PER_MIB)
    failure = at_fail.iloc[0] if not at_fail.empty else None
    return SearchRow(
        search=search, ceiling=ceiling, probes=len(mine),
        usable_gib=usable if usable is not None else CARDS[search.card].usable_gib,
        peak_alloc_gib=_largest(at_fit, "step_peak_alloc_mib", GIB_PER_MIB),
        peak_reserved_gib=_largest(at_fit, "step_peak_reserved_mib", GIB_PER_MIB),
        fragmentation_gib=_largest(at_fit, "fragmentation_mib", GIB_PER_MIB),
        fragmentation_growth_mib=_largest(at_fit, "fragmentation_growth_mib"),
        op_held_mib=_largest(at_fit, "op_saved_for_backward_mib"),
        fails_where=None if failure is None else failure["oom_where"],
        fails_message=None if failure is None else failure["oom_message"],
        crash_message=_crash_message(probes, ceiling.crashed),
        # every probe at the ceiling (each seed had to train) and the failed ones above it (a probe that trained
        # there decides nothing)
        deciding_draws=frozenset(draw for (batch, _), result in (probed if ceiling.earlier_draw else probes.by_probe).items()
                                 if (batch == ceiling.fits or (batch == ceiling.fails and result.outcome != "ok"))
                                 and (draw := result.data_draw) is not None),
        devices=frozenset(probes.devices()),
    )  # fmt: skip


def _crash_message(probes: Probes, crashed: str | None) -> str | None:
    """The message of the crash marker of probe ``crashed`` (a cell id), where it has one."""
    marker = next((result for result in probes.by_probe.values() if result.cell_id == crashed), None) if crashed else None
    return None if marker is None else marker.oom_message


def _largest(frame: pd.DataFrame, column: str, scale: float = 1.0) -> float | None:
    """The largest value of a column, scaled; None where the frame has no value there."""
    value = pd.to_numeric(frame[column], errors="coerce").max() if not frame.empty else None
    return None if value is None or pd.isna(value) else float(value) * scale


def device_of(result: CellResult) -> str:
    """The GPU a result names ('NVIDIA H100 80GB HBM3'), :data:`UNRECORDED` where it names none."""
    return result.env.device_name if result.env is not None and result.env.device_name else UNRECORDED


def failed_step(result: CellResult) -> int:
    """The step (from 1) a run that ran out of memory failed in: the one after the last whose peaks were recorded
    (1 where none were: it failed before finishing its first step)."""
    return len(result.step_peak_alloc_per_step_mib) + 1


@dataclasses.dataclass(frozen=True)
class BelowCeiling:
    """A probe of a finished search that ran out of memory at a batch no larger than the search's ceiling: the
    search's own walk never failed there (its ceiling trained every seed, the batch above it failed), but a grid
    that runs its probes again (the cross-card or shared-GPU check) did. Only on a data draw the ceiling's deciding
    probes trained on."""

    row: SearchRow
    result: CellResult

    @property
    def device(self) -> str:
        return device_of(self.result)

    @property
    def failed_step(self) -> int:
        return failed_step(self.result)


RERUN_GRIDS = (CEILINGS, CROSS_CARD, SHARED_CHECK)  # the grids whose probes are a ceiling search's probes, run again


def below_ceiling_failures(rows: Sequence[SearchRow], source: Source = None) -> list[BelowCeiling]:
    """Every probe of the grids that run a search's probes (:data:`RERUN_GRIDS`) that a finished search owns (same
    stack, recipe, backend, card, cap, allocator and seed list) and that failed at its ceiling or below it, on a
    draw of the data its deciding probes trained on, in the searches' order, then by batch and seed."""
    found = sorted((result for _, result in results_of(source).of(*RERUN_GRIDS)
                    if result.outcome == "oom" and isinstance(result.spec, TrainSpec) and not earlier_draw(result)),
                   key=lambda result: (result.spec.batch_size, result.spec.seed))  # fmt: skip
    return [BelowCeiling(row, result) for row in rows if row.done and row.fits is not None for result in found
            if row.search.owns(result.spec) and result.spec.batch_size <= row.fits
            and (not row.deciding_draws or result.data_draw in row.deciding_draws)]  # fmt: skip


def find_search(rows: Sequence[SearchRow], stack: str, regime: str, backend: str, card: str,
                allocator: str = "default") -> SearchRow | None:  # fmt: skip
    """One search's row; None where the grid has no such search."""
    for row in rows:
        if (row.stack, row.regime, row.backend, row.card, row.allocator) == (stack, regime, backend, card, allocator):
            return row
    return None


def finished(rows: Sequence[SearchRow], allocator: str = "default") -> list[SearchRow]:
    """The searches under ``allocator`` that are over with a batch that fits."""
    return [row for row in rows if row.allocator == allocator and row.done and row.fits is not None]


def group_by(rows: Sequence[SearchRow], *fields: str, sort: bool = False) -> dict[tuple[object, ...], list[SearchRow]]:
    """Rows grouped by the values of ``fields``: in order of first appearance, or sorted by key."""
    groups: dict[tuple[object, ...], list[SearchRow]] = {}
    for row in rows:
        groups.setdefault(tuple(getattr(row, field) for field in fields), []).append(row)
    return dict(sorted(groups.items())) if sort else groups


# ---- the shared-GPU check ------------------------------------------------------------------------


# the fewest check probes whose twin records that it owned its host (CellResult.timed_alone) for the
# check to set step times side by side: fewer give no range of slowdowns, and the check is of bytes only
TIMED_TWINS_NEEDED = 2


@dataclasses.dataclass(frozen=True)
class SharedCheck:
    """A ceiling probe run again on a shared GPU (grid ``shared-gpu-check``) beside the same probe
    (same cell id) committed from a run without ``--share-gpu`` (grid ``ceilings``). Only a twin whose
    result records that it had its GPU and its host to itself (:attr:`timed_alone`) lends its step
    time to a comparison; the bytes compare whatever the twin recorded."""

    shared: CellResult
    alone: CellResult

    @property
    def probe(self) -> str:
        return self.shared.cell_id

    @property
    def same_steps(self) -> bool:
        """Every step's allocated and reserved peaks equal to the byte."""
        shared, alone = self.shared, self.alone
        return (shared.step_peak_alloc_per_step_mib, shared.step_peak_reserved_per_step_mib) == (
            alone.step_peak_alloc_per_step_mib, alone.step_peak_reserved_per_step_mib)  # fmt: skip

    @property
    def identical(self) -> bool:
        """The same outcome and step peaks, and the same peaks step by step."""
        shared, alone = self.shared, self.alone
        return self.same_steps and (shared.outcome, shared.step_peak_alloc_mib, shared.step_peak_reserved_mib) == (
            alone.outcome, alone.step_peak_alloc_mib, alone.step_peak_reserved_mib)  # fmt: skip

    @property
    def timed_alone(self) -> bool:
        """Whether the twin's result records that it had its GPU and its host to itself (the timing rule,
        :mod:`harness.host`): only then may its step time be compared."""
        return self.alone.timed_alone

    @property
    def slowdown(self) -> float | None:
        """The shared run's steady step time over its twin's, where the twin is recorded alone (else None)."""
        shared, alone = self.shared.steady_step_time_sec, self.alone.steady_step_time_sec
        return None if shared is None or alone is None or not self.timed_alone else shared / alone


def timed_checks(checks: Sequence[SharedCheck]) -> list[SharedCheck]:
    """The checks whose step times may be set side by side: those whose twin is recorded alone, or none
    where fewer than :data:`TIMED_TWINS_NEEDED` are."""
    timed = [check for check in checks if check.timed_alone]
    return timed if len(timed) >= TIMED_TWINS_NEEDED else []


def shared_checks(source: Source = None) -> list[SharedCheck]:
    """Every probe of the shared-GPU check that has its twin among the ceiling probes, in path order."""
    results = results_of(source)
    alone = results.by_id(CEILINGS)
    shared = [result for _, result in results.of(SHARED_CHECK)]
    return [SharedCheck(result, alone[result.cell_id]) for result in shared if result.cell_id in alone]


@dataclasses.dataclass(frozen=True)
class CardCheck:
    """A ceiling probe run again, under the same cap, on a GPU other than an H200 (grid
    ``cross-card-check``) beside the same probe (same cell id) committed from an H200 (grid ``ceilings``)."""

    other: CellResult
    h200: CellResult
    # two runs of this stack and backend on one GPU: how far apart they measured, at steps that tuned a kernel and
    # at steps that tuned none (search.spreads_of)
    spreads: Mapping[str, RepeatSpread] = dataclasses.field(default_factory=dict)

    @property
    def probe(self) -> str:
        return self.other.cell_id

    @property
    def device(self) -> str:
        """The other GPU, as its result names it: 'NVIDIA H100 80GB HBM3'."""
        return device_of(self.other)

    @property
    def identical(self) -> bool:
        """The same outcome, and every step's allocated and reserved peaks equal to the byte."""
        return same_bytes(self.other, self.h200)

    @property
    def matches(self) -> bool:
        """The same outcome and steps, every step's peaks equal to the byte or apart by no more than two runs of
        the same stack and backend on one GPU at steps of the same phase (:attr:`spreads`): what the check asks
        of the GPU it vouches for."""
        return within_repeat(self.other, self.h200, self.spreads)

    @property
    def bounding(self) -> list[RepeatSpread]:
        """The repeat spreads the pair's differing steps are held to (one per phase where it differs)."""
        return bounding_spreads(self.other, self.h200, self.spreads)

    def largest_gap_mib(self) -> tuple[float, float] | None:
        """The largest difference between the two runs' peaks at any step both measured (allocated,
        reserved, MiB); None where they share no step."""
        return step_gaps(self.other, self.h200)


def cross_card_checks(source: Source = None) -> list[CardCheck]:
    """Every probe of the cross-card check that has its twin among the ceiling probes, run on an H200
    on the same draw of the data, in path order."""
    results = results_of(source)
    pairs = cross_card_pairs(result for _, result in results.of(CEILINGS, CROSS_CARD))
    spreads = repeat_spreads(result for _, result in results.found)
    return [CardCheck(result, twin, spreads_of(spreads, result)) for result, twin in pairs if twin is not None]


@dataclasses.dataclass(frozen=True)
class Rerun:
    """One probe run twice on one GPU, on one draw of the data: by the cross-card check and by its search (the
    ``ceilings`` grid), on a GPU the check vouches for. Whether a probe repeats itself there is what the check's
    comparison with the H200 takes for granted."""

    first: CellResult
    second: CellResult

    @property
    def device(self) -> str:
        return device_of(self.first)

    @property
    def identical(self) -> bool:
        return same_bytes(self.first, self.second)


def same_gpu_reruns(source: Source = None) -> list[Rerun]:
    """Every probe that the cross-card check and the ceiling search both ran on the same GPU (as their results
    name it) on the same draw of the data: (the check's, the search's), in the check's path order."""
    results = results_of(source)
    search = {(result.cell_id, device_of(result), result.data_draw): result for _, result in results.of(CEILINGS)
              if device_of(result) != UNRECORDED}  # fmt: skip
    return [Rerun(result, twin) for _, result in results.of(CROSS_CARD) if device_of(result) != UNRECORDED
            and (twin := search.get((result.cell_id, device_of(result), result.data_draw))) is not None]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class VouchScope:
    """What the cross-card check compared and what the capped searches took from the GPUs it vouches for:
    ``compared``, the (stack, allocator) settings of its same-draw pairs; ``admitted``, (GPU, stack, allocator) →
    the capped ceiling probes that ran on a vouched GPU."""

    compared: frozenset[tuple[str, str]]
    admitted: dict[tuple[str, str, str], int]

    def beyond(self) -> dict[tuple[str, str, str], int]:
        """The admitted probes of a setting the check did not compare."""
        return {key: count for key, count in self.admitted.items() if key[1:] not in self.compared}


def vouch_scope(source: Source = None, vouched: frozenset[str] | None = None) -> VouchScope:
    """The settings the cross-card check compared against those of the capped probes it let in (``vouched``: the
    GPUs it vouches for, :attr:`CappedGpus.vouched` where a page has them; read from the results where None)."""
    results = results_of(source)
    vouched = vouched_devices(results.root, CROSS_CARD_GRID) if vouched is None else vouched
    compared = frozenset((check.other.spec.stack, check.other.spec.allocator) for check in cross_card_checks(results))
    return VouchScope(compared, _tally([(device_of(result), result.spec.stack, result.spec.allocator)
                                        for result in _capped_probes(results) if device_of(result) in vouched]))  # fmt: skip


def cross_card_other_draws(source: Source = None) -> list[CardCheck]:
    """The probes of the cross-card check whose only twin among the H200 ceiling probes (same cell id)
    trained on the other draw of the data (``stream`` against ``rows``, :attr:`CellResult.data_draw`):
    such a pair saw other batches as well as another GPU, so it is no check of the GPU. In path order."""
    ran = [result for _, result in results_of(source).of(CEILINGS, CROSS_CARD)]
    by_id = {cell_id: twin for (cell_id, _), twin in reference_probes(ran).items()}  # a twin of any draw
    return [CardCheck(result, by_id[result.cell_id]) for result, twin in cross_card_pairs(ran)
            if twin is None and result.cell_id in by_id]  # fmt: skip


Key = TypeVar("Key", str, tuple[str, str, str])  # what _tally counts: GPU names, (GPU, stack, allocator) settings
UNRECORDED = "unrecorded"  # a probe whose result names no GPU (a crashed kernel records no environment)


def probe_devices(source: Source = None) -> dict[str, int]:
    """The GPUs the committed ceiling probes ran on: name → probes, :data:`UNRECORDED` for those whose
    result names none."""
    return _tally([device_of(result) for _, result in results_of(source).of(CEILINGS)])


def _tally(items: Sequence[Key]) -> dict[Key, int]:
    """Each distinct item → how often it occurs, in sorted order."""
    return {item: items.count(item) for item in sorted(set(items))}


def _capped_probes(results: Results) -> list[CellResult]:
    """The ceiling probes of capped cards whose result names its GPU."""
    return [result for _, result in results.of(CEILINGS)
            if device_of(result) != UNRECORDED and CARDS[result.spec.card].usable_gib is not None]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CappedGpus:
    """The GPUs the committed ceiling probes of capped cards ran on (name → probes; a crashed probe that
    recorded none is left out) and those of them the cross-card check vouches for
    (:func:`harness.search.vouched_devices`)."""

    probes: dict[str, int]
    vouched: frozenset[str]


def capped_probe_gpus(source: Source = None) -> CappedGpus:
    """Which GPUs the capped cards' ceiling probes ran on: an H200 unless the cross-card check vouched for another."""
    results = results_of(source)
    return CappedGpus(_tally([device_of(result) for result in _capped_probes(results)]),
                      vouched_devices(results.root, CROSS_CARD_GRID))


def query_lengths(source: Source = None, stack: str = "colpali") -> pd.DataFrame:
    """Each recorded training step's padded query length, one row per (cell, step): the batch, the
    tokens, and which draw of the synthetic data it came from (``stream``: one stream per seed;
    ``rows``: the batch × steps rows drawn before it, which every cell of a seed shared)."""
    rows = []
    for _, result in results_of(source).found:
        draw = result.data_draw
        if result.stack != stack or result.kind != "train" or draw is None:
            continue
        seen = set()
        for call in result.maxsim_calls_in_train:
            if call.step is None or call.step in seen:
                continue
            seen.add(call.step)
            rows.append({"cell_id": result.cell_id, "grid": result.grid, "batch_size": result.batch_size, "draw": draw,
                         "seed": result.seed, "step": call.step, "query_tokens": call.query_shape[1]})  # fmt: skip
    return pd.DataFrame(rows)


def pinned(source: Source = None) -> list[timing.PinnedCheck]:
    """The pinned check's cells beside their alone runs (the published and repeat grids' twins)."""
    results = results_of(source)
    alone = [result for _, result in results.of(PUBLISHED_GRID, REPEAT)]
    return timing.pinned_checks([result for _, result in results.of(PINNED_CHECK)], alone)


def pinned_unvouched(results: Results, chosen: Sequence[Item]) -> dict[str, str]:
    """Path → reason for every chosen result timed while other cells ran on the host (on other cores,
    pinned or not) in a stack whose pinned check has not shown that such cells time as alone."""
    verdicts = timing.pinned_verdicts(pinned(results))
    return {str(path): (f"timed beside {result.timing.neighbours} other cell(s) on other cores, which the pinned "
                        f"check has not shown to time as alone for {result.stack}")
            for path, result in chosen
            if result.ran_beside_others and result.timing is not None and not verdicts.get(result.stack, False)}


def repeats(source: Source = None) -> list[tuple[CellResult, CellResult]]:
    """(published-grid result, the same cell run again in the repeat grid) for every repeated cell
    whose twin exists with the same spec, in the repeat grid's path order."""
    results = results_of(source)
    first = results.by_id(PUBLISHED_GRID)
    pairs = []
    for _, again in results.of(REPEAT):
        twin = first.get(again.cell_id)
        if twin is not None and twin.spec == again.spec:
            pairs.append((twin, again))
    return pairs


def cap_pairs(source: Source = None) -> list[tuple[CellResult, CellResult]]:
    """Every pair of runs of one cell, among all the report's results, that differ only in a memory cap
    (:func:`harness.report.timing.cap_pairs`), the smaller cap's run first."""
    return timing.cap_pairs([result for _, result in results_of(source).found])


def cap_twins(source: Source = None) -> list[tuple[CellResult, CellResult]]:
    """The cap pairs whose cap bound neither run (:func:`harness.report.timing.cap_twins`): the same
    recipe, backend, batch, allocator and seed on the same GPU model, both step peaks (reserved) at most
    :data:`~harness.report.timing.CAP_UNBOUND_SHARE` of the smaller cap."""
    return timing.cap_twins([result for _, result in results_of(source).found])


def run_noise(source: Source = None) -> timing.RunNoise:
    """How far a second run moved a cell's median step time, per stack and regime: the widest gap over
    the repeats (:func:`repeats`) and the cap twins (:func:`cap_twins`), each pair's gap relative to its
    first run (the published grid's; the smaller cap's). A twin is a run again as much as a repeat is:
    the cap it differs in never came near its step peak, so it changed nothing the step time depends on."""
    results = results_of(source)
    return timing.run_noise([*repeats(results), *cap_twins(results)])


def lik_spike(path: Path = LIK_SPIKE) -> list[dict[str, object]]:
    """The lik backward-spike experiments (:data:`LIK_SPIKE`), one dict each: the experiment, the
    batch, the first and repeated backward spikes (MiB), the kernels that autotuned inside the
    first one's bracket, and the prediction from what was live plus Triton's 256 MiB flush buffer."""
    import json

    if not path.exists():
        return []
    return [row for row in json.loads(path.read_text())["summary"] if row.get("error") is None]


def tuner_inside_from(experiments: list[dict[str, object]]) -> int | None:
    """The smallest batch at which the lik spike record saw kernels autotune inside an op cell's first
    backward (None: nowhere): committed lik op cells from before replays were measured again after an
    autotune may hold the tuner's buffers from there up."""
    tuned = [int(str(row["batch"])) for row in experiments if row.get("swept_in_bwd")]
    return min(tuned, default=None)


# ---- what the pages are computed from -----------------------------------------------------------

# The pages' inputs besides their own sources: a change here re-executes every page; Sphinx itself
# notices a changed page source or configuration.
PAGE_INPUTS = ("results", "book/data", "grids", "harness")


def inputs_digest(root: Path = ROOT) -> str:
    """sha256 over the path and bytes of every file the executed pages read besides their own source
    (:data:`PAGE_INPUTS`; Python caches left out): equal digests, equal pages."""
    import hashlib

    digest = hashlib.sha256()
    for top in PAGE_INPUTS:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# ---- the check `make report` runs ----------------------------------------------------------------


def check_lines(results: Results) -> list[str]:
    """What the report reads and every file it skips, with the reason, one line each."""
    grids = ", ".join(sorted({result.grid or "" for _, result in results.found})) or "none"
    lines = [f"{len(results.found)} results of the report's grids under {results.root} (grids: {grids})."]
    if results.skipped:
        lines.append(f"{len(results.skipped)} file{'s' if len(results.skipped) > 1 else ''} skipped:")
        lines += [f"  {_relative(item.path, results.root)}: {item.reason}" for item in results.skipped]
    return lines


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """``--check``: print the results read and every file skipped with its reason; ``--digest``: print
    :func:`inputs_digest` (``make report`` re-executes every page only when it changed)."""
    parser = argparse.ArgumentParser(prog="python -m harness.report.data", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="print what the report reads and every file it skips")
    parser.add_argument("--digest", action="store_true", help="print the digest of the pages' inputs")
    parser.add_argument("results_dir", nargs="?", default=None, help="default: results/ (or $MAXSIM_RESULTS_DIR)")
    args = parser.parse_args(argv)
    if args.digest:
        print(inputs_digest())
        return 0
    if not args.check:
        parser.print_help()
        return 0
    results = read(args.results_dir)
    print("\n".join(check_lines(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
