"""Step-time statistics the pages may publish: medians with their spread, ratios with intervals.

Only results that met the timing rule (:mod:`harness.host`: the GPU alone and no other cell on the
cell's CPU cores while it trained) have times the pages show as the card's. A cell's steady steps
(after warm-up, none that autotuned) give its median and p10–p90; a ratio between two cells is
the ratio of their medians with a bootstrap 95% interval (each cell's steady steps resampled with
replacement, seeded so the book is reproducible). An interval that contains 1.0 reads "no
measurable difference"; with the run-to-run noise of the cells' recipe (:class:`RunNoise`: how far a
second run of one cell moved its median), a ratio is a difference only where its whole interval lies
outside 1 ± that noise. Autotuning is reported apart: the first step and every step that tuned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from harness.results import CellResult
from harness.spec import TrainSpec

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0
REPEAT_TOLERANCE = 0.03  # two runs of one cell agree when their medians differ by at most 3%
# two runs of one cell under two memory caps time as repeats only where the cap did not bind: both
# runs' step peaks (reserved) at most this share of the smaller cap
CAP_UNBOUND_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """A cell's steady step times: how many, their median and p10–p90 (seconds)."""

    times: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.times)

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def p10(self) -> float:
        return float(np.percentile(self.times, 10))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.times, 90))


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``value`` = median(a) / median(b), with the bootstrap 95% interval [low, high]."""

    value: float
    low: float
    high: float

    @property
    def measurable(self) -> bool:
        """False when the interval contains 1.0: no measurable difference."""
        return not self.low <= 1.0 <= self.high

    def beyond(self, noise: float | None) -> bool:
        """Whether the whole interval lies outside 1 ± ``noise`` (a run-to-run noise, :class:`RunNoise`):
        only then is the ratio a difference a second run of its cells could not undo. Without a noise,
        whether the interval excludes 1 (:attr:`measurable`)."""
        band = noise or 0.0
        return self.low > 1.0 + band or self.high < 1.0 - band


@dataclasses.dataclass(frozen=True)
class Autotune:
    """What autotuning cost a cell: its first step, and each later step that tuned, against its median."""

    first_step_sec: float
    retune_steps_sec: tuple[float, ...]
    steady_median_sec: float | None


def steady_times(result: CellResult) -> StepTimes | None:
    """The steady step times of a result whose times may be published; None otherwise."""
    if not result.times_comparable or result.outcome != "ok" or not result.steady_steps:
        return None
    return StepTimes(tuple(result.step_times_sec[i] for i in result.steady_steps))


def ratio(a: Sequence[float], b: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Ratio:
    """median(a) / median(b) and its bootstrap 95% interval."""
    first, second = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not len(first) or not len(second):
        raise ValueError("a ratio needs steady steps on both sides")
    rng = np.random.default_rng(seed)
    ratios = (np.median(rng.choice(first, (resamples, len(first))), axis=1)
              / np.median(rng.choice(second, (resamples, len(second))), axis=1))  # fmt: skip
    low, high = np.percentile(ratios, [2.5, 97.5])
    return Ratio(float(np.median(first) / np.median(second)), float(low), float(high))


def speed_ratio(cell: CellResult, vanilla: CellResult) -> Ratio | None:
    """The cell's speed relative to vanilla: vanilla's median step time over the cell's (above 1:
    the cell is faster), with its interval. None unless both cells' times may be published."""
    mine, theirs = steady_times(cell), steady_times(vanilla)
    if mine is None or theirs is None:
        return None
    return ratio(theirs.times, mine.times)


def autotune(result: CellResult) -> Autotune | None:
    """The first step's time and the times of later steps that autotuned (a fused kernel tuning for
    a new shape bucket), next to the steady median; None without step times."""
    if not result.step_times_sec:
        return None
    retunes = tuple(result.step_times_sec[i] for i in result.autotune_steps if i > 0)
    steady = steady_times(result)
    return Autotune(result.step_times_sec[0], retunes, None if steady is None else steady.median)


def interval_text(ratio: Ratio) -> str:
    """'0.45 (0.44–0.46)': a ratio and its 95% interval, to two decimals (three where two would read as
    one number)."""
    digits = 3 if f"{ratio.low:.2f}" == f"{ratio.high:.2f}" and ratio.low != ratio.high else 2
    return f"{ratio.value:.{digits}f} ({ratio.low:.{digits}f}–{ratio.high:.{digits}f})"


def ratio_words(value: Ratio, faster: str = "faster", slower: str = "slower", noise: float | None = None,
                compact: bool = False) -> str:
    """``1.31× faster (1.25–1.37)``, ``1.02× slower (1.01–1.03)`` (a speed ratio below 1 is said as
    how many times longer a step takes, its interval inverted with it) or ``no measurable difference
    (0.97–1.04)``; three decimals where two would print a measurable difference as 1.00, or an
    interval as one number (1.10–1.10). With ``noise`` (how far a second run moved a cell's median,
    :class:`RunNoise`), a ratio is named faster or slower only where its whole interval lies outside
    1 ± noise (:meth:`Ratio.beyond`); a measurable one whose interval reaches into that band is called
    no difference, its numbers kept: ``no difference beyond run-to-run noise (1.08× faster, 1.02–1.10;
    a second run moved medians up to 6.5%)``, or with ``compact`` (a table's column) ``no difference
    (1.08× faster, 1.02–1.10, in ±6.5% noise)``."""
    word = faster if value.value > 1 else slower
    within_noise = value.measurable and not value.beyond(noise)
    if value.measurable and value.value < 1:
        value = Ratio(1 / value.value, 1 / value.high, 1 / value.low)
    one_number = value.low != value.high and f"{value.low:.2f}" == f"{value.high:.2f}"
    digits = 3 if f"{value.value:.2f}" == "1.00" or one_number else 2
    interval = f"{value.low:.{digits}f}–{value.high:.{digits}f}"
    if not value.measurable:
        return f"no measurable difference ({interval})"
    shown = f"{value.value:.{digits}f}× {word}"
    if within_noise:
        assert noise is not None
        if compact:
            return f"no difference ({shown}, {interval}, in ±{100 * noise:.1f}% noise)"
        return (f"no difference beyond run-to-run noise ({shown}, {interval}; a second run moved medians up to "
                f"{100 * noise:.1f}%)")  # fmt: skip
    return f"{shown} ({interval})"


def repeat_gap(first: StepTimes, second: StepTimes) -> float:
    """How far two runs' medians differ, relative to the first: |m2 - m1| / m1."""
    return abs(second.median - first.median) / first.median


def repeat_gaps(pairs: Sequence[tuple[CellResult, CellResult]]) -> list[tuple[CellResult, StepTimes, StepTimes, float]]:
    """Each pair of runs of one cell whose times may both be published: the first run, both runs'
    steady times, and how far their medians are apart (:func:`repeat_gap`)."""
    gaps = []
    for first, second in pairs:
        one, two = steady_times(first), steady_times(second)
        if one is not None and two is not None:
            gaps.append((first, one, two, repeat_gap(one, two)))
    return gaps


def cap_mib(result: CellResult) -> float | None:
    """The memory a result's allocator could use (MiB): its card's cap, or the whole GPU without one."""
    if result.env is None:
        return None
    return result.env.card_cap_mib or result.env.device_capacity_mib


def cap_unbound(first: CellResult, second: CellResult) -> bool:
    """Whether neither of two runs came near the smaller of their two caps: both recorded a step peak
    (reserved) and neither is above :data:`CAP_UNBOUND_SHARE` of that cap, so the cap never made the
    allocator free its cache or fail, and the two runs differ in nothing that sets the step time."""
    caps = [cap_mib(first), cap_mib(second)]
    peaks = [first.step_peak_reserved_mib, second.step_peak_reserved_mib]
    if None in caps or None in peaks:
        return False
    smaller = min(cap for cap in caps if cap is not None)
    return max(peak for peak in peaks if peak is not None) <= CAP_UNBOUND_SHARE * smaller


def cap_pairs(results: Sequence[CellResult]) -> list[tuple[CellResult, CellResult]]:
    """Every pair of runs of one cell under two memory caps: the same spec but for the card (recipe,
    backend, batch, chunk, allocator, seed, steps) and the same model and data source, on the same GPU
    model, both times publishable (:func:`steady_times`). The run under the smaller cap comes first (a
    repeat gap is relative to it); pairs in the order of ``results``."""
    groups: dict[tuple[object, ...], list[CellResult]] = {}
    for result in results:
        if not isinstance(result.spec, TrainSpec) or result.env is None or steady_times(result) is None:
            continue
        key = (result.env.device_name or result.env.device, result.env.model_source, result.env.data_source,
               dataclasses.replace(result.spec, card="native"))  # fmt: skip
        groups.setdefault(key, []).append(result)
    pairs = []
    for runs in groups.values():
        for k, one in enumerate(runs):
            for other in runs[k + 1:]:
                caps = cap_mib(one), cap_mib(other)
                if one.card != other.card and None not in caps and caps[0] != caps[1]:
                    pairs.append((one, other) if (caps[0] or 0) < (caps[1] or 0) else (other, one))
    return pairs


def cap_twins(results: Sequence[CellResult]) -> list[tuple[CellResult, CellResult]]:
    """The cap pairs (:func:`cap_pairs`) whose cap bound neither run (:func:`cap_unbound`): runs of one
    cell that differ in nothing that sets the step time, so they time as repeats."""
    return [(first, second) for first, second in cap_pairs(results) if cap_unbound(first, second)]


@dataclasses.dataclass(frozen=True)
class RunNoise:
    """How far a second run of a cell moved its median step time, per stack and regime, and the widest
    over all: a speed ratio whose interval reaches within that distance of 1 could be changed by running
    its cells again, however narrow its within-run interval, so it is called no difference
    (:meth:`Ratio.beyond`). The second runs are the repeat grid's and the cap twins (:func:`cap_twins`);
    ``pairs`` counts them per stack and regime."""

    by_regime: dict[tuple[str, str], float]
    widest: float | None
    pairs: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    too_few: dict[tuple[str, str], tuple[float, int, int]] = dataclasses.field(default_factory=dict)
    """Regimes whose pairs come from fewer than :data:`NOISE_MIN_CELLS` cells: (their own widest gap,
    pairs, cells). Their own gap is not trusted as the regime's noise; they take the widest."""

    def of(self, stack: str, regime: str) -> float | None:
        """The widest gap between two runs of a cell of ``stack`` and ``regime``, where its pairs come
        from at least :data:`NOISE_MIN_CELLS` cells; else the widest of all pairs (None without any)."""
        return self.by_regime.get((stack, regime), self.widest)


NOISE_MIN_CELLS = 2
"""Distinct cells (backend and batch) a regime's pairs must cover before their widest gap is taken as that
regime's noise: the pairs of one cell say how that cell repeats, not how the regime's other cells do."""


def run_noise(pairs: Sequence[tuple[CellResult, CellResult]]) -> RunNoise:
    """:class:`RunNoise` from pairs of runs of one cell whose times may both be published
    (:func:`repeat_gaps`): the repeats, and the cap twins with them (:func:`cap_twins`)."""
    gaps: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], int] = {}
    cells: dict[tuple[str, str], set[tuple[str, int]]] = {}
    for first, _, _, gap in repeat_gaps(pairs):
        key = (first.stack, first.regime)
        gaps[key] = max(gaps.get(key, 0.0), gap)
        counts[key] = counts.get(key, 0) + 1
        cells.setdefault(key, set()).add((str(first.variant), int(first.batch_size)))
    own = {key: gap for key, gap in gaps.items() if len(cells[key]) >= NOISE_MIN_CELLS}
    too_few = {key: (gap, counts[key], len(cells[key])) for key, gap in gaps.items() if key not in own}
    return RunNoise(own, max(gaps.values(), default=None), {key: counts[key] for key in own}, too_few)


PINNED_MIN_CELLS = 4  # cells per stack the pinned check needs before it can vouch for that stack


def same_host_build(first: CellResult, second: CellResult) -> bool:
    """Whether two results ran on one host build (the same platform string: kernel build and image)."""
    return first.env is not None and second.env is not None and first.env.platform == second.env.platform


@dataclasses.dataclass(frozen=True)
class PinnedCheck:
    """One cell of the pinned check: its alone medians (each run alone), its median pinned beside
    others, and how far the latter is from the mean of the former."""

    cell_id: str
    stack: str
    alone: tuple[float, ...]
    pinned: float

    @property
    def gap(self) -> float:
        reference = float(np.mean(self.alone))
        return abs(self.pinned - reference) / reference

    @property
    def agrees(self) -> bool:
        return self.gap <= REPEAT_TOLERANCE


def pinned_checks(pinned: Sequence[CellResult], alone: Sequence[CellResult]) -> list[PinnedCheck]:
    """Every pinned-check cell that ran beside another cell and has at least one alone run of the same
    spec on the same host build whose times may be published, set beside those alone runs."""
    checks = []
    for result in pinned:
        times = steady_times(result)
        # alone on the same host build (the platform string): another leased machine moves medians by
        # more than the 3% asked (the repeat grid shows it), so only such twins can vouch
        twins = [steady_times(twin) for twin in alone if twin.spec == result.spec and twin.timed_alone
                 and same_host_build(twin, result)]  # fmt: skip
        medians = tuple(twin.median for twin in twins if twin is not None)
        if times is not None and result.ran_beside_others and medians:
            checks.append(PinnedCheck(result.cell_id, result.stack, medians, times.median))
    return checks


def pinned_verdicts(checks: Sequence[PinnedCheck]) -> dict[str, bool]:
    """Per stack the check covered: True when at least :data:`PINNED_MIN_CELLS` of its cells ran
    pinned and every one of them times as alone (within 3%)."""
    stacks = sorted({check.stack for check in checks})
    return {stack: len(mine := [c for c in checks if c.stack == stack]) >= PINNED_MIN_CELLS and all(c.agrees for c in mine)
            for stack in stacks}  # fmt: skip

