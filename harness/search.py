"""Batch-size ceilings as data: what a search is, and where it stands, read from its probes' results.

A ceiling answers "how large a batch can I train on my card with this backend", which a fixed grid
cannot: whether a batch fits can hang on the allocator's fragmentation, so it is decided by running
it. One search is a (stack, regime, variant[, chunk], card, allocator) and a list of seeds. Its
probes are ordinary training cells (grid ``ceilings``) of ``steps`` ≥ 8 real optimizer steps (≥ 4 for
GradCache: :data:`MIN_STEPS_OF`). A batch *fits* when every seed trains all its steps without running out
of memory.

The search runs on the first seed: it doubles from ``start`` until a batch does not fit (halving
instead if ``start`` already does not) — or, given a ``step``, gallops from ``start`` by
``step``, 2·``step``, 4·``step``… (a start that is already a good estimate brackets the ceiling in
two probes) — then bisects between the largest batch that fits and the smallest that does not, in
multiples of ``resolution``, until they are ``resolution`` apart. The batch it ends on is then run
with every other seed; if one runs out of memory, that batch fails and the search goes on below
it. Every decision is read back from the probes' results — found by the spec each result embeds,
never by file name — so a search stopped at any point resumes where it was, re-running nothing;
a crashed probe stops its search (``--rerun-crashed`` runs it once more), and a probe off the
search's walk (its start, step, resolution or limit edited after it ran) stops the search rather
than being silently ignored.

A probe of a stack whose batch shapes follow the drawn data (ColQwen2's, :attr:`Stack.shapes_follow_data`)
that trained on an earlier draw of the synthetic data (one draw of batch × steps rows per cell, before
one stream per seed: :data:`CURRENT_DRAW`) still steers the walk, but no ceiling rests on it: where
one decides a finished walk — at the ceiling, or the failure at the batch above it — that probe runs
again on the current draw (:func:`stale_deciding`), and the walk goes on from what it measures.
PyLate pads every query and document to fixed lengths, so its probes of either draw ran the same shapes.

This module is torch-free and runs nothing: the report reads searches through it, and
:mod:`harness.orchestrate.ceiling` runs the probes it names.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.grid import GRIDS_DIR, build_grid
from harness.results import CellResult, read_results
from harness.spec import STACKS, TrainSpec, admits, differences, make_spec

MIN_STEPS = 8
# Regimes whose probes may train fewer steps, and how few. GradCache (PyLate's CachedContrastive): every
# batch has the same shapes (PyLate pads queries and documents to fixed lengths) and the loss frees the
# encoder's activations after each mini-batch, so a step repeats the one before; its steps are long (tens
# of seconds at B in the thousands, linear in B), so an 8-step probe near the fused backends' ceilings
# outlasts a session's device time. The ceilings and GradCache pages compute, from every committed GradCache
# cell that trained longer, how much its peaks rose after this many steps (harness.report.data.steps_check),
# and tests/test_prose_vs_ceilings.py fails the day a reserved peak does (a probe of fewer steps would then
# have missed what must fit).
MIN_STEPS_OF = {"gradcache": 4}
CURRENT_DRAW = "stream"  # the draw of the synthetic data cells train on now: one stream per seed
SEARCH_FIELDS = ("stack", "regime", "variant", "score_mini_batch_size", "mini_batch_size", "card", "allocator",
                 "world_size", "gather", "dataloader_workers")  # fmt: skip
EXPANDABLE = ("variant", "regime", "score_mini_batch_size", "mini_batch_size", "card", "allocator", "world_size")


class CeilingSearch(BaseModel):
    """One ceiling search: what is searched, over which seeds and batch range."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grid: str = "ceilings"
    stack: str
    regime: str
    variant: str
    score_mini_batch_size: int | None = Field(default=None, gt=0)
    mini_batch_size: int | None = Field(default=None, gt=0)  # the gradcache regime's
    card: str
    allocator: str = "default"
    world_size: int = Field(default=1, ge=1)  # a data-parallel search: its probes own W GPUs, the batch is per rank
    gather: bool = False
    dataloader_workers: int | None = Field(default=None, ge=0)  # colpali: fewer than the recipe's, where its host's memory binds
    seeds: tuple[int, ...] = Field(min_length=1)
    steps: int = Field(default=MIN_STEPS, ge=1)  # at least MIN_STEPS, or the regime's MIN_STEPS_OF
    start: int = Field(gt=0)
    limit: int = Field(gt=0)  # the largest batch probed: a search that reaches it reports "≥ limit"
    resolution: int = Field(gt=0)
    step: int | None = Field(default=None, gt=0)  # the first step of a galloping bracket; None: double / halve
    preset: str = "auto"
    device: str = "auto"
    model_source: str | None = None
    data_source: str | None = None
    kernel: str | None = None  # launcher settings: the Jupyter kernel and notebook its probes run in
    notebook: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> CeilingSearch:
        if self.start > self.limit:
            raise ValueError(f"start {self.start} is above limit {self.limit}")
        if self.start % self.resolution or self.limit % self.resolution:
            raise ValueError(f"start {self.start} and limit {self.limit} must be multiples of resolution {self.resolution}")
        if self.step is not None and self.step % self.resolution:
            raise ValueError(f"step {self.step} must be a multiple of resolution {self.resolution}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds repeat: {list(self.seeds)}")
        least = MIN_STEPS_OF.get(self.regime, MIN_STEPS)
        if self.steps < least:
            raise ValueError(f"steps {self.steps} is below the {least} a {self.regime} probe trains at least")
        self.probe(self.start, self.seeds[0])  # a spec it cannot make is an invalid search
        return self

    @property
    def search_id(self) -> str:
        """Its probes' cell id without batch size and seed: ``pylate-grad-checkpoint-lik-a100-40gb``
        (``…-h100-80gb-w8-gather`` for a data-parallel one)."""
        probe = self.probe(self.start, self.seeds[0])
        return f"{self.stack}-{self.regime}-{probe.setting_id}{probe.ranks_id}"

    def probe(self, batch_size: int, seed: int) -> TrainSpec:
        """The spec of the probe at ``batch_size`` for ``seed``."""
        names = ("stack", "regime", "variant", "score_mini_batch_size", "mini_batch_size", "card", "allocator", "steps",
                 "preset", "device", "model_source", "data_source", "world_size", "gather", "dataloader_workers")  # fmt: skip
        spec = make_spec({name: getattr(self, name) for name in names} | {"batch_size": batch_size, "seed": seed})
        assert isinstance(spec, TrainSpec)
        return spec

    def owns(self, spec: object) -> bool:
        """Whether a result's spec is one of this search's probes (any batch, one of its seeds)."""
        return (isinstance(spec, TrainSpec) and spec.seed in self.seeds
                and admits(self.probe(spec.batch_size, spec.seed), spec))  # fmt: skip


@dataclasses.dataclass
class Ceiling:
    """Where a search stands: the largest batch that fits, the smallest that does not."""

    fits: int | None = None  # largest batch where every seed trained
    fails: int | None = None  # smallest batch where a seed ran out of memory
    next_batch: int | None = None  # the batch still to decide (None: the search is over)
    stopped: str | None = None  # why it stopped early (a crashed probe)
    crashed: str | None = None  # the crashed probe that stopped it (its cell id), at ``next_batch``
    # the walk is over, but a probe deciding it trained on an earlier draw of the data: ``next_batch``
    # runs it again on the current draw (``fits`` and ``fails`` are the bounds read with it)
    earlier_draw: bool = False

    @property
    def done(self) -> bool:
        return self.next_batch is None


def walk(search: CeilingSearch, decide: Callable[[int], bool | None]) -> Ceiling:
    """Walk the bracket-and-bisect search; ``decide(batch)`` says whether a batch fits (None:
    undecided yet — the walk stops there and names it as the next batch to run)."""
    ceiling = Ceiling()
    batch: int | None = search.start
    while batch is not None:
        verdict = decide(batch)
        if verdict is None:
            ceiling.next_batch = batch
            return ceiling
        if verdict:
            ceiling.fits = batch
        else:
            ceiling.fails = batch
        batch = _next_batch(search, ceiling)
    return ceiling


def _next_batch(search: CeilingSearch, ceiling: Ceiling) -> int | None:
    """Bracket, then bisect between the two bounds on multiples of the resolution; None once the
    search is decided. The bracket doubles while everything fits and halves while everything fails;
    with a ``step`` it moves away from ``start`` by ``step``, then twice as far each time
    (start, start + step, start + 2·step, start + 4·step, … and the same downwards)."""
    fits, fails, resolution, step = ceiling.fits, ceiling.fails, search.resolution, search.step
    if fits is not None and fails is not None:
        return None if fails - fits <= resolution else fits + (fails - fits) // (2 * resolution) * resolution
    if fits is not None:
        if fits >= search.limit:
            return None
        return min(fits * 2 if step is None else fits + max(step, fits - search.start), search.limit)
    assert fails is not None
    if fails <= resolution:
        return None
    lower = fails // 2 if step is None else fails - max(step, search.start - fails)
    return max(resolution, lower // resolution * resolution)


def plan_search(search: CeilingSearch, screen: Callable[[int], bool | None], confirm: Callable[[int], bool | None]) -> Ceiling:
    """The whole search: walk on the first seed (``screen``), then confirm the batch it ends on with
    every seed (``confirm``). A seed that runs out of memory there makes that batch a failing one —
    ``screen`` must say so from then on — and the walk goes on below it. Under the assumption a
    ceiling rests on (what fits for a seed at B fits at any smaller B), this is the answer of
    running every seed at every probed batch, at a fraction of the probes."""
    while True:
        ceiling = walk(search, screen)
        if not ceiling.done or ceiling.fits is None:
            return ceiling
        verdict = confirm(ceiling.fits)
        if verdict is None:
            ceiling.next_batch = ceiling.fits
            return ceiling
        if verdict:
            return ceiling


class ProbeMismatch(ValueError):
    """A probe's result that was run with other settings than the search's, or off its walk."""


class Probes:
    """A search's probes as their results say, by (batch, seed): the one view of what has run.

    Built from the results of the search's grid under a results folder, keeping those whose
    embedded spec is one of the search's probes; those of an earlier draw of the data whose shapes
    it changes (:func:`earlier_draw`) are kept apart in ``earlier``. A result under a probe's id whose spec differs
    (a smoke test with other steps, a grid edited since) is kept aside as a mismatch, never taken
    for the probe's verdict.
    """

    def __init__(self, search: CeilingSearch, results: Mapping[str, CellResult]) -> None:
        self.search = search
        self.by_probe: dict[tuple[int, int], CellResult] = {}
        self.earlier: dict[tuple[int, int], CellResult] = {}
        self.mismatched: dict[str, CellResult] = {}
        for cell_id, result in results.items():
            if search.owns(result.spec):
                (self.earlier if earlier_draw(result) else self.by_probe)[(result.batch_size, result.seed)] = result
            elif isinstance(result.spec, TrainSpec) and result.seed in search.seeds and cell_id == search.probe(
                result.batch_size, result.seed
            ).cell_id:  # fmt: skip
                self.mismatched[cell_id] = result

    @classmethod
    def read(cls, search: CeilingSearch, results_dir: Path) -> Probes:
        return read_probes([search], results_dir)[0]

    def outcome(self, batch_size: int, seed: int) -> str:
        """``missing``, ``crashed``, ``ok`` or ``oom`` for one probe: on the current draw of the data,
        else on an earlier one (which steers the walk but decides no ceiling: :func:`stale_deciding`)."""
        probe = self.search.probe(batch_size, seed)
        if probe.cell_id in self.mismatched:
            ran = self.mismatched[probe.cell_id].spec
            raise ProbeMismatch(
                f"the result of {probe.cell_id} ran as {ran}, but the probe asks {probe}; move that result away to run the probe."
            )
        result = self.by_probe.get((batch_size, seed)) or self.earlier.get((batch_size, seed))
        return "missing" if result is None else result.outcome

    def batches(self) -> set[int]:
        """The batches probed on the current draw of the data."""
        return {batch for batch, _ in self.by_probe}

    def devices(self) -> set[str]:
        """The GPUs its probes ran on (of either draw), as their results name them."""
        return {result.env.device_name for result in [*self.by_probe.values(), *self.earlier.values()]
                if result.env and result.env.device_name}  # fmt: skip


def earlier_draw(result: CellResult) -> bool:
    """Whether a result trained on an earlier draw of the synthetic data than :data:`CURRENT_DRAW`, on a
    stack whose batch shapes follow the drawn data: its probe, run now, would train other shapes."""
    stack = STACKS.get(result.spec.stack) if isinstance(result.spec, TrainSpec) else None
    return stack is not None and stack.shapes_follow_data and result.data_draw not in (None, CURRENT_DRAW)


def stale_deciding(probes: Probes, ceiling: Ceiling) -> TrainSpec | None:
    """The probe a finished walk still has to run again on the current draw of the data, or None where
    its ceiling rests on the current draw: a probe of the earlier draw at the ceiling (the first seed
    first), then, where no seed failed at the batch above it on the current draw, a failure there of
    the earlier draw, then the ceiling's other seeds (the cheapest order: a ceiling that moves down
    makes the probes above it moot)."""
    search = probes.search

    def earlier_only(batch: int | None, seeds: Sequence[int], outcome: str | None = None) -> TrainSpec | None:
        for seed in seeds if batch is not None else ():
            earlier = probes.earlier.get((batch, seed))  # type: ignore[arg-type]
            if (batch, seed) not in probes.by_probe and earlier is not None and outcome in (None, earlier.outcome):
                return search.probe(batch, seed)  # type: ignore[arg-type]
        return None

    failed_now = any(result.outcome == "oom" for (batch, _), result in probes.by_probe.items() if batch == ceiling.fails)
    return (earlier_only(ceiling.fits, search.seeds[:1])
            or (None if failed_now else earlier_only(ceiling.fails, search.seeds, "oom"))
            or earlier_only(ceiling.fits, search.seeds[1:]))  # fmt: skip


CROSS_CARD = "cross-card-check"  # grids/cross-card-check.yaml: capped searches run again on another GPU
CROSS_CARD_GRID = GRIDS_DIR / f"{CROSS_CARD}.yaml"


REFERENCE_GPU = "H200"  # the GPU every card is measured on ("the whole H200"), unless the cross-card check vouches for another


def device_mismatch(probes: Probes, here: str | None, vouched: frozenset[str] = frozenset()) -> str | None:
    """Why a search may not run its next probe on ``here``. A search of the whole, uncapped device (card
    ``native``) runs on the H200 the pages name and never mixes devices, since a ceiling read off two
    answers for neither. A capped one runs on an H200, or on a GPU the cross-card check vouches for
    (``vouched``: :func:`vouched_devices`) — one shown to measure, under a cap, the bytes an H200
    measures. None where it may (``here`` unknown; the cross-card check's own searches, which run on
    another GPU by design)."""
    if here is None or probes.search.grid == CROSS_CARD:
        return None
    ran_on = probes.devices()
    if probes.search.card == "native":
        if ran_on and here not in ran_on:
            return (f"its probes ran on the whole {', '.join(sorted(ran_on))}; this GPU is {here}, and a search of the "
                    "whole device does not mix devices")  # fmt: skip
        if not ran_on and REFERENCE_GPU not in here:
            return f"its card is the whole {REFERENCE_GPU} the pages name; this GPU is {here}"
        return None
    if REFERENCE_GPU in here or here in vouched:
        return None
    return (f"this GPU is {here}, which the cross-card check (grids/{CROSS_CARD}.yaml) has not shown to measure "
            f"the same bytes under a cap as the {REFERENCE_GPU}")  # fmt: skip


def same_bytes(one: CellResult, other: CellResult) -> bool:
    """Whether two runs of a probe measured the same of memory: outcome, and every step's allocated and
    reserved peaks to the byte."""
    def measured(result: CellResult) -> tuple[object, ...]:
        return result.outcome, result.step_peak_alloc_per_step_mib, result.step_peak_reserved_per_step_mib

    return measured(one) == measured(other)


# A step that tuned a kernel (its first call's search) is held to the repeats of such steps, every other step to
# the repeats of steps that tuned none: a fused kernel's autotuning allocates differently run to run (PyLate lik's
# B = 128 probe, run twice on one H200, 48.7 MiB apart at its tuning step and equal to the byte after it), and a
# gap there must not license one as wide at a steady step.
AUTOTUNE, STEADY = "autotune", "steady"
# Two runs of one cell id are runs of one probe where their specs differ at most in how long they train: a traced
# run (grids/parity.yaml, ``trace``) keeps more per step, so it repeats nothing.
RUN_LENGTH = frozenset({"steps", "min_steady_steps"})


@dataclasses.dataclass(frozen=True)
class RepeatSpread:
    """How far two runs of one probe (same cell id, same GPU, same draw of the data) measured apart on one GPU:
    the largest gap at any step of one phase both ran (``autotune``: a step that tuned a kernel; ``steady``: one
    that tuned none), allocated and reserved (MiB), and the probe and grids that gave it. The most a GPU may
    differ from the H200 by and still measure 'the same' is what a GPU differs from itself by."""

    alloc_mib: float
    reserved_mib: float
    probe: str
    grids: tuple[str, str]
    device: str
    phase: str = STEADY


def phase_gaps(one: CellResult, other: CellResult) -> dict[str, tuple[float, float]] | None:
    """The largest gap between two runs' peaks (allocated, reserved, MiB) at the steps both measured, per phase:
    ``autotune`` at a step where either run tuned a kernel, ``steady`` at the others; None where they share no
    step."""
    series = (one.step_peak_alloc_per_step_mib, other.step_peak_alloc_per_step_mib,
              one.step_peak_reserved_per_step_mib, other.step_peak_reserved_per_step_mib)  # fmt: skip
    if not min(len(values) for values in series):
        return None
    tuned = set(one.autotune_steps) | set(other.autotune_steps)
    gaps: dict[str, tuple[float, float]] = {}
    for step, (alloc, alloc_other, reserved, reserved_other) in enumerate(zip(*series, strict=False)):
        phase = AUTOTUNE if step in tuned else STEADY
        known = gaps.get(phase, (0.0, 0.0))
        gaps[phase] = (max(known[0], abs(alloc - alloc_other)), max(known[1], abs(reserved - reserved_other)))
    return gaps


def step_gaps(one: CellResult, other: CellResult) -> tuple[float, float] | None:
    """The largest gap between two runs' peaks at any step both measured (allocated, reserved, MiB); None where
    they share no step."""
    gaps = phase_gaps(one, other)
    if gaps is None:
        return None
    return max(alloc for alloc, _ in gaps.values()), max(reserved for _, reserved in gaps.values())


def repeat_setting(result: CellResult) -> tuple[str, str]:
    """The setting whose runs on one GPU bound how far a probe may differ on another: (stack, backend)."""
    return result.spec.stack, result.spec.variant


def repeat_spreads(results: Iterable[CellResult]) -> dict[tuple[str, str, str], RepeatSpread]:
    """Per (stack, backend, phase): the widest gap between two runs of one probe on one GPU (as the results name
    it), on the same draw, with the same outcome and a spec that differs at most in its length (:data:`RUN_LENGTH`),
    over every grid — a probe run twice by two grids, or alone and beside others — at its steps of that phase
    (:func:`phase_gaps`). Where the widest is 0 MiB the runs repeat themselves to the byte. A setting and phase
    with no such pair is absent: a comparison across GPUs then asks for equality to the byte at those steps."""
    runs: dict[tuple[str, str, str | None], list[CellResult]] = {}
    for result in results:
        device = result.env.device_name if result.env is not None else None
        if device and result.spec.kind == "train":
            runs.setdefault((result.cell_id, device, result.data_draw), []).append(result)
    spreads: dict[tuple[str, str, str], RepeatSpread] = {}
    for (cell_id, device, _), twins in runs.items():
        for i, one in enumerate(twins):
            for other in twins[i + 1:]:
                same_probe = one.outcome == other.outcome and set(differences(one.spec, other.spec)) <= RUN_LENGTH
                for phase, gap in ((phase_gaps(one, other) if same_probe else None) or {}).items():
                    key = (*repeat_setting(one), phase)
                    known = spreads.get(key)
                    if known is None or gap > (known.alloc_mib, known.reserved_mib):
                        spreads[key] = RepeatSpread(gap[0], gap[1], cell_id, (str(one.grid), str(other.grid)), device, phase)
    return spreads


def spreads_of(spreads: Mapping[tuple[str, str, str], RepeatSpread], result: CellResult) -> dict[str, RepeatSpread]:
    """The repeat spreads of ``result``'s setting, by phase (from :func:`repeat_spreads`)."""
    stack, backend = repeat_setting(result)
    return {phase: spreads[(stack, backend, phase)] for phase in (AUTOTUNE, STEADY) if (stack, backend, phase) in spreads}


def bounding_spreads(one: CellResult, other: CellResult, spreads: Mapping[str, RepeatSpread]) -> list[RepeatSpread]:
    """The spreads (by phase, :func:`spreads_of`) that the phases where two runs differ are held to."""
    gaps = phase_gaps(one, other) or {}
    return [spreads[phase] for phase, gap in gaps.items() if gap != (0.0, 0.0) and phase in spreads]


def within_repeat(one: CellResult, other: CellResult, spreads: Mapping[str, RepeatSpread]) -> bool:
    """Whether two runs of a probe on two GPUs measured the same: the same outcome and steps, and every step's
    peaks equal to the byte, or apart by no more than the same setting's runs on one GPU at steps of the same
    phase (``spreads``, by phase: :func:`spreads_of`)."""
    if same_bytes(one, other):
        return True
    gaps = phase_gaps(one, other)
    steps = [(len(run.step_peak_alloc_per_step_mib), len(run.step_peak_reserved_per_step_mib)) for run in (one, other)]
    if gaps is None or one.outcome != other.outcome or steps[0] != steps[1]:
        return False
    for phase, (alloc, reserved) in gaps.items():
        spread = spreads.get(phase)
        if (alloc, reserved) != (0.0, 0.0) and (spread is None or alloc > spread.alloc_mib or reserved > spread.reserved_mib):
            return False
    return True


def cross_card_pairs(results: Iterable[CellResult]) -> list[tuple[CellResult, CellResult | None]]:
    """Each probe of the cross-card check whose result names its GPU, beside the same probe (same cell
    id) from an H200 in the ``ceilings`` grid that trained on the same draw of the data (None where that
    grid has none: a twin of another draw saw other batches, so it compares draws, not GPUs), in
    ``results``' order."""
    results = list(results)
    h200 = reference_probes(results)
    return [(result, h200.get((result.cell_id, result.data_draw))) for result in results
            if result.grid == CROSS_CARD and result.env is not None and result.env.device_name]  # fmt: skip


def reference_probes(results: Iterable[CellResult]) -> dict[tuple[str, str | None], CellResult]:
    """The ``ceilings`` grid's probes run on an H200, by cell id and data draw: the twins the cross-card
    check is compared with."""
    return {(result.cell_id, result.data_draw): result for result in results
            if result.grid == "ceilings" and REFERENCE_GPU in ((result.env and result.env.device_name) or "")}  # fmt: skip


def vouched_devices(results_dir: Path, grid_file: Path, repeats_dir: Path | None = None) -> frozenset[str]:
    """The GPUs the cross-card check (``grid_file``, its results under ``results_dir``) vouches for:
    every one of its searches finished on that GPU, each has a probe there with a twin (the same probe,
    same cell id and data draw, from an H200 in the ``ceilings`` grid), and every such pair gave the same
    outcome and every step's peaks — to the byte, or no further apart than two runs of the same stack and
    backend on one GPU ever measured (:func:`repeat_spreads`). A probe without a twin on its draw compares
    nothing and is left out. The repeats are read from ``results_dir`` and from ``repeats_dir`` as well where
    given: a device's results directory holds only the grids its jobs resume from, while the runs that say how
    a GPU repeats itself (grids published and repeat) are among the committed results."""
    if not grid_file.exists():
        return frozenset()
    results, _ = read_results(results_dir)
    searches = load_searches(grid_file)
    repeats = results if repeats_dir is None or not repeats_dir.is_dir() else results + read_results(repeats_dir)[0]
    spreads = repeat_spreads(result for _, result in repeats)
    same: dict[str, list[bool]] = {}
    paired: dict[str, set[CeilingSearch]] = {}
    for result, twin in cross_card_pairs(result for _, result in results):
        assert result.env is not None and result.env.device_name  # (cross_card_pairs keeps only those)
        if twin is not None:
            same.setdefault(result.env.device_name, []).append(within_repeat(result, twin, spreads_of(spreads, result)))
            paired.setdefault(result.env.device_name, set()).update(s for s in searches if s.owns(result.spec))
    finished = all(search_state(search, results_dir)[0].done for search in searches)
    return frozenset(device for device, equal in same.items() if finished and all(equal)
                     and paired[device] >= set(searches) and REFERENCE_GPU not in device)  # fmt: skip


def batch_verdict(probes: Probes, batch_size: int, seeds: Sequence[int] | None = None,
                  rerun_crashed: bool = False) -> tuple[bool | None, TrainSpec | None, str | None]:  # fmt: skip
    """Whether ``batch_size`` fits for ``seeds`` (default: all), seed by seed: (verdict, the probe
    to run next, a crashed probe's id). A failure recorded for any seed of the search at this batch
    decides it. A crashed probe stops the search, or with ``rerun_crashed`` is the probe to run again."""
    search = probes.search
    outcomes = {seed: probes.outcome(batch_size, seed) for seed in search.seeds}
    if "oom" in outcomes.values():
        return False, None, None
    for seed in search.seeds if seeds is None else seeds:
        probe = search.probe(batch_size, seed)
        if outcomes[seed] == "missing" or (outcomes[seed] == "crashed" and rerun_crashed):
            return None, probe, None
        if outcomes[seed] == "crashed":
            return None, None, probe.cell_id
    return True, None, None


def read_probes(searches: Sequence[CeilingSearch], results_dir: Path) -> list[Probes]:
    """Each search's probes under ``results_dir``, reading every grid's results once, not once a search."""
    by_grid = {}
    for grid in dict.fromkeys(search.grid for search in searches):
        results, _ = read_results(results_dir / grid, grids={grid})
        by_grid[grid] = {result.cell_id: result for _, result in results}
    return [Probes(search, by_grid[search.grid]) for search in searches]


def search_state(search: CeilingSearch, results: Path | Probes, rerun_crashed: bool = False) -> tuple[Ceiling, TrainSpec | None]:
    """The search as far as its probes' results decide it, and the probe to run next (if any).
    Raises ProbeMismatch where a probe lies off the walk: the search was edited after it ran."""
    probes = results if isinstance(results, Probes) else Probes.read(search, results)
    pending: dict[str, Any] = {}
    visited: set[int] = set()

    def decider(seeds: Sequence[int] | None) -> Callable[[int], bool | None]:
        def decide(batch_size: int) -> bool | None:
            visited.add(batch_size)
            verdict, plan, crashed = batch_verdict(probes, batch_size, seeds, rerun_crashed)
            pending.update(plan=plan, crashed=crashed)
            return verdict

        return decide

    ceiling = plan_search(search, decider(search.seeds[:1]), decider(None))
    # A seed failing the confirmation drops the batches walked above it from the walk read back
    # now; those all failed, above the bound. A stack whose shapes follow the data also leaves probes
    # off the walk that it ran again on the current draw, where the draw moved the bracket: those agree
    # with it (they fit at or below the ceiling). Any other probe off the walk means an edited search.
    redrawn = STACKS[search.stack].shapes_follow_data

    def agrees(batch: int) -> bool:
        verdict = batch_verdict(probes, batch)[0]
        failed_above = ceiling.fails is not None and batch >= ceiling.fails and verdict is False
        return failed_above or (redrawn and ceiling.fits is not None and batch <= ceiling.fits and verdict is True)

    off_walk = sorted(batch for batch in probes.batches() - visited if not agrees(batch))
    if off_walk:
        raise ProbeMismatch(
            f"{search.search_id}: probes at B={off_walk} are not on this search's walk, so its start, step, "
            f"resolution or limit changed after they ran; restore them, or move those results away."
        )
    if pending.get("crashed"):
        ceiling.stopped, ceiling.crashed = f"probe {pending['crashed']} crashed", pending["crashed"]
        return ceiling, None
    stale = stale_deciding(probes, ceiling) if ceiling.done else None
    if stale is not None:
        ceiling.next_batch, ceiling.earlier_draw = stale.batch_size, True
        return ceiling, stale
    return ceiling, pending.get("plan") if not ceiling.done else None


def describe(search: CeilingSearch, ceiling: Ceiling) -> str:
    if ceiling.stopped:
        return f"{search.search_id}: stopped, {ceiling.stopped}"
    if ceiling.earlier_draw:
        return (f"{search.search_id}: next B={ceiling.next_batch} runs again on the current data draw a probe of an "
                f"earlier one (fits {ceiling.fits}, fails {ceiling.fails})")  # fmt: skip
    if not ceiling.done:
        return f"{search.search_id}: next B={ceiling.next_batch} (fits {ceiling.fits}, fails {ceiling.fails})"
    if ceiling.fails is None:
        return f"{search.search_id}: ≥ {ceiling.fits} (the limit)"
    if ceiling.fits is None:
        return f"{search.search_id}: < {ceiling.fails} (nothing probed fits)"
    return f"{search.search_id}: {ceiling.fits} fits, {ceiling.fails} does not"


def load_searches(path: str | Path, match: Sequence[str] = ()) -> list[CeilingSearch]:
    """Expand and validate a ceiling grid (``defaults`` + ``searches``); raise GridError naming every problem."""

    def build(grid: str, fields: dict[str, Any]) -> CeilingSearch:
        return CeilingSearch(**fields | {"grid": grid})

    searches = build_grid(path, "searches", EXPANDABLE, build, lambda search: search.search_id, title="ceiling grid")
    if match:
        searches = [s for s in searches if any(fnmatch.fnmatchcase(s.search_id, pattern) for pattern in match)]
    return searches
