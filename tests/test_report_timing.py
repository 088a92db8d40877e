"""Step-time statistics: medians, spreads, bootstrap intervals, and which results may publish times."""

import numpy as np

from harness.report import timing
from harness.results import CellResult, Timing
from harness.spec import TrainSpec


def result(times, comparable=True, autotune=(0,), warmup=1):
    spec = TrainSpec(stack="pylate", batch_size=8, steps=len(times), preset="full", device="cuda")
    steady = [i for i in range(len(times)) if i >= warmup and i not in autotune]
    return CellResult(grid="published", cell_id=spec.cell_id, spec=spec, outcome="ok", step_times_sec=list(times),
                      autotune_steps=list(autotune), steady_steps=steady,
                      timing=Timing(cpus="0-7", comparable=comparable, reason=None if comparable else "shared"))  # fmt: skip


def test_only_results_that_met_the_timing_rule_publish_times():
    times = [9.0, 1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 1.0, 0.95, 1.05]
    steady = timing.steady_times(result(times))
    assert steady.n == 9 and steady.median == 1.0 and steady.p10 <= 0.95 and steady.p90 >= 1.1
    assert timing.steady_times(result(times, comparable=False)) is None
    old = result(times).model_copy(update={"timing": None})  # measured before the rule: never published
    assert timing.steady_times(old) is None


def test_a_ratio_whose_interval_holds_one_is_no_measurable_difference():
    rng = np.random.default_rng(1)
    same_a = [0.90, 0.95, 0.97, 1.00, 1.02, 1.05, 1.10, 0.99, 1.01, 1.03]
    same_b = list(reversed(same_a))[1:] + [1.0]  # the same spread, medians 1.01 and 1.005
    tie = timing.ratio(same_a, same_b)
    assert tie.low < 1 < tie.high and not tie.measurable
    assert timing.ratio_words(tie).startswith("no measurable difference (")
    fast = timing.ratio(2 + 0.02 * rng.standard_normal(12), 1 + 0.01 * rng.standard_normal(12))
    assert fast.measurable and 1.9 < fast.low <= fast.value <= fast.high < 2.1
    assert timing.ratio_words(fast).startswith(f"{fast.value:.2f}× faster (")
    assert timing.ratio(same_a, same_b) == tie  # seeded: the book is reproducible
    # an interval that two decimals would print as one number gets a third
    assert timing.ratio_words(timing.Ratio(1.1003, 1.0981, 1.1024)) == "1.100× faster (1.098–1.102)"
    # slower is said the other way up: a step 1/0.98 times as long, the interval inverted with it
    assert timing.ratio_words(timing.Ratio(0.98, 0.975, 0.985)) == "1.02× slower (1.02–1.03)"


def test_speed_against_vanilla_and_autotune_cost():
    vanilla = result([5.0] + [2.0] * 9)
    lik = result([30.0] + [1.0] * 4 + [8.0] + [1.0] * 5, autotune=(0, 5))
    speed = timing.speed_ratio(lik, vanilla)
    assert speed.value == 2.0 and speed.low == speed.high == 2.0
    cost = timing.autotune(lik)
    assert (cost.first_step_sec, cost.retune_steps_sec, cost.steady_median_sec) == (30.0, (8.0,), 1.0)
    assert timing.speed_ratio(lik, result([2.0] * 10, comparable=False)) is None
    assert timing.repeat_gap(timing.StepTimes((1.0, 1.0)), timing.StepTimes((1.02, 1.02))) == 0.020000000000000018


def test_a_ratio_within_run_to_run_noise_is_called_no_difference():
    """A narrow within-run interval does not make a difference that a second run could undo."""
    small = timing.Ratio(1 / 1.004, 1 / 1.007, 1 / 1.002)  # 1.004× slower, measurable within a run
    assert small.measurable
    assert timing.ratio_words(small) == "1.004× slower (1.002–1.007)"
    assert timing.ratio_words(small, noise=0.008) == (
        "no difference beyond run-to-run noise (1.004× slower, 1.002–1.007; a second run moved medians up to 0.8%)")
    large = timing.Ratio(1.10, 1.09, 1.11)
    assert timing.ratio_words(large, noise=0.008) == timing.ratio_words(large) == "1.10× faster (1.09–1.11)"
    assert timing.ratio_words(large, noise=0.11).startswith("no difference beyond run-to-run noise (1.10× faster, 1.09–1.11;")
    tie = timing.Ratio(1.0, 0.98, 1.02)  # an interval that holds 1 stays "no measurable difference"
    assert timing.ratio_words(tie, noise=0.05).startswith("no measurable difference (")


def test_a_ratio_is_a_difference_only_where_its_whole_interval_lies_outside_the_noise_band():
    """The point estimate beyond the noise is not enough: 1.08× (1.02–1.10) against ±6.5% noise reaches
    into 1 ± 0.065 with its lower end, so a second run could undo it."""
    reaching = timing.Ratio(1.08, 1.02, 1.10)
    assert reaching.measurable and abs(reaching.value - 1) > 0.065  # the old rule called it a difference
    assert not reaching.beyond(0.065) and reaching.beyond(0.019) and reaching.beyond(None)
    assert timing.ratio_words(reaching, noise=0.065) == (
        "no difference beyond run-to-run noise (1.08× faster, 1.02–1.10; a second run moved medians up to 6.5%)")
    assert timing.ratio_words(reaching, noise=0.065, compact=True) == "no difference (1.08× faster, 1.02–1.10, in ±6.5% noise)"
    assert timing.ratio_words(reaching, noise=0.019) == timing.ratio_words(reaching) == "1.08× faster (1.02–1.10)"
    # slower: the band is 1 ± noise on the measured ratio, below 1 its upper end must clear 1 - noise
    slow = timing.Ratio(0.90, 0.88, 0.93)
    assert slow.beyond(0.06) and not slow.beyond(0.08)
    assert timing.ratio_words(slow, noise=0.06) == timing.ratio_words(slow) == "1.11× slower (1.08–1.14)"
    assert timing.ratio_words(slow, noise=0.08, compact=True) == "no difference (1.11× slower, 1.08–1.14, in ±8.0% noise)"
    # an interval that holds 1 is no measurable difference whatever the noise
    assert not timing.Ratio(1.0, 0.98, 1.02).beyond(None) and not timing.Ratio(1.0, 0.98, 1.02).beyond(0.0)


def repeated(stack, regime, times_first, times_second, batch=8):
    spec = TrainSpec(stack=stack, regime=regime, batch_size=batch, steps=len(times_first), preset="full", device="cuda")

    def run(times):
        return CellResult(grid="repeat", cell_id=spec.cell_id, spec=spec, outcome="ok", step_times_sec=list(times),
                          autotune_steps=[0], steady_steps=list(range(1, len(times))),
                          timing=Timing(cpus="0-7", comparable=True, reason=None))  # fmt: skip

    return run(times_first), run(times_second)


def test_run_noise_is_the_widest_repeat_gap_per_regime_and_over_all():
    pairs = [repeated("pylate", "grad-checkpoint", [5.0] + [2.0] * 9, [5.0] + [2.01] * 9),  # 0.5%
             repeated("pylate", "grad-checkpoint", [5.0] + [1.0] * 9, [5.0] + [1.008] * 9, batch=16),  # 0.8%
             repeated("colpali", "plain", [5.0] + [4.0] * 9, [5.0] + [4.4] * 9),  # 10%
             repeated("colpali", "plain", [5.0] + [4.0] * 9, [5.0] + [4.2] * 9, batch=16)]  # 5%
    noise = timing.run_noise(pairs)
    assert abs(noise.of("pylate", "grad-checkpoint") - 0.008) < 1e-12
    assert abs(noise.of("colpali", "plain") - 0.1) < 1e-12
    assert noise.of("pylate", "gradcache") == noise.widest == noise.of("colpali", "plain")  # no repeat: the widest
    empty = timing.run_noise([])
    assert empty.widest is None and empty.of("pylate", "plain") is None


def test_pairs_of_a_single_cell_do_not_set_their_regimes_noise():
    """Three repeats of one cell say how that cell repeats: the regime takes the widest of all pairs."""
    pairs = [repeated("pylate", "gradcache", [5.0] + [2.0] * 9, [5.0] + [2.02] * 9) for _ in range(3)]  # 1%
    pairs += [repeated("colpali", "plain", [5.0] + [4.0] * 9, [5.0] + [4.4] * 9),
              repeated("colpali", "plain", [5.0] + [4.0] * 9, [5.0] + [4.0] * 9, batch=16)]  # fmt: skip
    noise = timing.run_noise(pairs)
    assert timing.NOISE_MIN_CELLS == 2 and ("pylate", "gradcache") not in noise.by_regime
    gap, count, cells = noise.too_few[("pylate", "gradcache")]
    assert abs(gap - 0.01) < 1e-12 and (count, cells) == (3, 1)
    assert noise.of("pylate", "gradcache") == noise.widest and abs(noise.widest - 0.1) < 1e-12


def test_a_table_says_a_ratio_within_noise_in_a_few_words():
    small = timing.Ratio(1 / 1.004, 1 / 1.007, 1 / 1.002)
    assert timing.ratio_words(small, noise=0.008, compact=True) == "no difference (1.004× slower, 1.002–1.007, in ±0.8% noise)"
    assert timing.ratio_words(small, compact=True) == "1.004× slower (1.002–1.007)"  # no noise given: as before


def capped(card, times, peak_mib, cap_mib=None, device="NVIDIA H200", batch=8, grid="ours"):
    """A timed PyLate cell on ``card``: an H200 capped to ``cap_mib`` (None: the whole GPU)."""
    from harness.results import Environment

    spec = TrainSpec(stack="pylate", regime="grad-checkpoint", batch_size=batch, card=card, steps=len(times),
                     preset="full", device="cuda")  # fmt: skip
    env = Environment(packages={}, python="3.12", platform="Linux", device="cuda", device_name=device,
                      device_capacity_mib=143155.9, card=card, card_cap_mib=cap_mib, seed=spec.seed)  # fmt: skip
    return CellResult(grid=grid, cell_id=spec.cell_id, spec=spec, outcome="ok", step_times_sec=list(times),
                      autotune_steps=[0], steady_steps=list(range(1, len(times))), env=env,
                      step_peak_reserved_mib=peak_mib, step_peak_alloc_mib=peak_mib,
                      timing=Timing(cpus="0-7", comparable=True, reason=None))  # fmt: skip


def test_runs_of_one_cell_under_a_cap_that_did_not_bind_count_as_repeats():
    """Two runs of one cell on one GPU model under two caps are a repeat where both step peaks stay well
    below the smaller cap; the capped run comes first, so the gap is relative to it."""
    whole = capped("native", [5.0] + [1.075] * 9, 9_458.0)
    eighty = capped("h100-80gb", [5.0] + [1.0] * 9, 9_458.0, cap_mib=80_312.3)
    assert timing.cap_mib(whole) == 143155.9 and timing.cap_mib(eighty) == 80_312.3
    assert timing.cap_unbound(eighty, whole)
    assert timing.cap_twins([whole, eighty]) == [(eighty, whole)]
    noise = timing.run_noise(timing.cap_twins([whole, eighty]))
    assert abs(noise.too_few[("pylate", "grad-checkpoint")][0] - 0.075) < 1e-12  # one cell: not the regime's own
    # a repeat of another cell at 0.8% and a twin at 7.5%: the regime's noise is the twin's
    both = timing.run_noise([repeated("pylate", "grad-checkpoint", [5.0] + [1.0] * 9, [5.0] + [1.008] * 9, batch=16),
                             *timing.cap_twins([whole, eighty])])  # fmt: skip
    assert abs(both.of("pylate", "grad-checkpoint") - 0.075) < 1e-12 and both.pairs[("pylate", "grad-checkpoint")] == 2


def test_a_cap_that_came_near_a_step_peak_or_another_gpu_model_makes_no_twin():
    near = 0.95 * 80_312.3  # above CAP_UNBOUND_SHARE of the smaller cap in the capped run
    assert near > timing.CAP_UNBOUND_SHARE * 80_312.3
    eighty = capped("h100-80gb", [5.0] + [1.0] * 9, near, cap_mib=80_312.3)
    whole = capped("native", [5.0] + [1.2] * 9, 105_440.0)  # uncapped, it wanted more than the smaller cap
    assert timing.cap_pairs([eighty, whole]) == [(eighty, whole)] and timing.cap_twins([eighty, whole]) == []
    below = capped("h100-80gb", [5.0] + [1.0] * 9, 9_458.0, cap_mib=80_312.3)
    assert timing.cap_twins([below, capped("native", [5.0] + [1.2] * 9, 90_000.0)]) == []  # the big run's peak
    assert timing.cap_twins([below, capped("native", [5.0] + [1.2] * 9, 9_458.0, device="NVIDIA H100")]) == []
    assert timing.cap_twins([below, capped("native", [5.0] + [1.2] * 9, 9_458.0, batch=16)]) == []  # another cell
    assert timing.cap_twins([below, capped("h100-80gb", [5.0] + [1.2] * 9, 9_458.0, cap_mib=80_312.3)]) == []  # one cap
    no_peak = capped("native", [5.0] + [1.2] * 9, None)
    assert timing.cap_pairs([below, no_peak]) == [(below, no_peak)] and not timing.cap_unbound(below, no_peak)
