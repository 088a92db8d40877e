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
        "no difference beyond run-to-run noise (1.004× slower; a second run moved medians up to 0.8%)")
    large = timing.Ratio(1.10, 1.09, 1.11)
    assert timing.ratio_words(large, noise=0.008) == timing.ratio_words(large) == "1.10× faster (1.09–1.11)"
    assert timing.ratio_words(large, noise=0.11).startswith("no difference beyond run-to-run noise (1.10× faster;")
    tie = timing.Ratio(1.0, 0.98, 1.02)  # an interval that holds 1 stays "no measurable difference"
    assert timing.ratio_words(tie, noise=0.05).startswith("no measurable difference (")


def repeated(stack, regime, times_first, times_second):
    spec = TrainSpec(stack=stack, regime=regime, batch_size=8, steps=len(times_first), preset="full", device="cuda")

    def run(times):
        return CellResult(grid="repeat", cell_id=spec.cell_id, spec=spec, outcome="ok", step_times_sec=list(times),
                          autotune_steps=[0], steady_steps=list(range(1, len(times))),
                          timing=Timing(cpus="0-7", comparable=True, reason=None))  # fmt: skip

    return run(times_first), run(times_second)


def test_run_noise_is_the_widest_repeat_gap_per_regime_and_over_all():
    pairs = [repeated("pylate", "grad-checkpoint", [5.0] + [2.0] * 9, [5.0] + [2.01] * 9),  # 0.5%
             repeated("pylate", "grad-checkpoint", [5.0] + [1.0] * 9, [5.0] + [1.008] * 9),  # 0.8%
             repeated("colpali", "plain", [5.0] + [4.0] * 9, [5.0] + [4.4] * 9)]  # 10%
    noise = timing.run_noise(pairs)
    assert abs(noise.of("pylate", "grad-checkpoint") - 0.008) < 1e-12
    assert abs(noise.of("colpali", "plain") - 0.1) < 1e-12
    assert noise.of("pylate", "gradcache") == noise.widest == noise.of("colpali", "plain")  # no repeat: the widest
    empty = timing.run_noise([])
    assert empty.widest is None and empty.of("pylate", "plain") is None


def test_a_table_says_a_ratio_within_noise_in_a_few_words():
    small = timing.Ratio(1 / 1.004, 1 / 1.007, 1 / 1.002)
    assert timing.ratio_words(small, noise=0.008, compact=True) == "no difference (1.004× slower, in ±0.8% noise)"
    assert timing.ratio_words(small, compact=True) == "1.004× slower (1.002–1.007)"  # no noise given: as before
