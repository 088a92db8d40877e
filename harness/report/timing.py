"""Step-time statistics the pages may publish: medians with their spread, ratios with intervals.

Only results that met the timing rule (:mod:`harness.host`: the GPU alone and no other cell on the
cell's CPU cores while it trained) have times the pages show as the card's. A cell's steady steps
(after warm-up, none that autotuned) give its median and p10–p90; a ratio between two cells is
the ratio of their medians with a bootstrap 95% interval (each cell's steady steps resampled with
replacement, seeded so the book is reproducible). An interval that contains 1.0 reads "no
measurable difference". Autotuning is reported apart: the first step and every step that tuned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from harness.results import CellResult

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0
REPEAT_TOLERANCE = 0.03  # two runs of one cell agree when their medians differ by at most 3%


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


def ratio_words(value: Ratio, faster: str = "faster", slower: str = "slower", noise: float | None = None,
                compact: bool = False) -> str:
    """``1.31× faster (1.25–1.37)``, ``1.02× slower (1.01–1.03)`` (a speed ratio below 1 is said as
    how many times longer a step takes, its interval inverted with it) or ``no measurable difference
    (0.97–1.04)``; three decimals where two would print a measurable difference as 1.00, or an
    interval as one number (1.10–1.10). With ``noise`` (how far a second run moved a cell's median,
    :class:`RunNoise`), a measurable ratio no farther from 1 than that is called no difference too:
    ``no difference beyond run-to-run noise (1.005× slower; a second run moved medians up to 0.8%)``, or
    with ``compact`` (a table's column) ``no difference (1.005× slower, in ±0.8% noise)``."""
    word = faster if value.value > 1 else slower
    within_noise = noise is not None and value.measurable and abs(value.value - 1) <= noise
    if value.measurable and value.value < 1:
        value = Ratio(1 / value.value, 1 / value.high, 1 / value.low)
    if within_noise:
        assert noise is not None
        shown = f"{value.value:.{3 if f'{value.value:.2f}' == '1.00' else 2}f}× {word}"
        if compact:
            return f"no difference ({shown}, in ±{100 * noise:.1f}% noise)"
        return f"no difference beyond run-to-run noise ({shown}; a second run moved medians up to {100 * noise:.1f}%)"
    one_number = value.low != value.high and f"{value.low:.2f}" == f"{value.high:.2f}"
    digits = 3 if f"{value.value:.2f}" == "1.00" or one_number else 2
    interval = f"{value.low:.{digits}f}–{value.high:.{digits}f}"
    if not value.measurable:
        return f"no measurable difference ({interval})"
    return f"{value.value:.{digits}f}× {word} ({interval})"


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


@dataclasses.dataclass(frozen=True)
class RunNoise:
    """How far a second run of a cell moved its median step time (the repeat grid), per stack and regime,
    and the widest over all: a speed ratio no farther from 1 than that could be changed by running its
    cells again, however narrow its within-run interval, so it is called no difference."""

    by_regime: dict[tuple[str, str], float]
    widest: float | None

    def of(self, stack: str, regime: str) -> float | None:
        """The widest repeat gap of ``stack`` and ``regime``; of all repeats where that regime has none
        (None without any repeat)."""
        return self.by_regime.get((stack, regime), self.widest)


def run_noise(pairs: Sequence[tuple[CellResult, CellResult]]) -> RunNoise:
    """:class:`RunNoise` from the repeated cells whose times may both be published (:func:`repeat_gaps`)."""
    by_regime: dict[tuple[str, str], float] = {}
    for first, _, _, gap in repeat_gaps(pairs):
        key = (first.stack, first.regime)
        by_regime[key] = max(by_regime.get(key, 0.0), gap)
    return RunNoise(by_regime, max(by_regime.values(), default=None))


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

