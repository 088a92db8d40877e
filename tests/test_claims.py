"""The claims page's data and verdicts: every published claim parses and names committed results (or says
why it cannot), the verdict logic on synthetic numbers, and the B=128 ColQwen2 op claim on the committed
results, its numbers read again from the result file without the report."""

import math
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from harness.report import claims, data, text, timing
from harness.report.data import SearchRow
from harness.results import largest_isolated_call, load_result
from harness.search import Ceiling, CeilingSearch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def committed() -> claims.Evidence:
    return claims.evidence()


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple[claims.Claim, claims.Verdict]]:
    return {claim.id: (claim, verdict) for claim, verdict in claims.retest_all()}


# ---- the claims file -----------------------------------------------------------------------------


def test_the_claims_file_parses_with_a_source_on_every_row():
    rows = claims.read_claims()
    assert len(rows) >= 50 and len({row.id for row in rows}) == len(rows)
    for row in rows:
        assert row.claim and row.source and row.published, row.id
        assert row.quantity in claims.QUANTITIES and row.section in claims.SECTIONS
        assert row.quantity == "untestable" or row.tolerance in claims.TOLERANCES, row.id
    # the claims the issue names are there: the op at B=128 held / backward / total, the ~130×, ×4 vs ×2
    by_id = {row.id: row for row in rows}
    assert [by_id[i].published for i in ("colpali-op-held-128", "colpali-op-backward-128", "colpali-op-total-128")] == [
        "2.40", "5.41", "7.81"]  # fmt: skip
    assert by_id["colpali-op-reduction-128"].value == 130
    assert (by_id["colpali-op-growth-vanilla"].value, by_id["colpali-op-growth-lik"].value) == (4.0, 2.1)


def test_a_bad_row_is_refused_with_its_id_and_field():
    good = {field: "" for field in claims.FIELDS} | {
        "id": "x", "section": "colpali", "claim": "c", "source": "s", "published": "1.0", "unit": "GiB",
        "quantity": "op_held", "stack": "colpali", "regime": "plain", "batch": "128", "backend": "vanilla",
        "card": "h100-80gb", "tolerance": "memory"}  # fmt: skip
    assert claims.parse_claim(good).batches == (128,)
    for field, value, words in [("quantity", "op_heldd", "quantity 'op_heldd'"), ("tolerance", "loose", "tolerance 'loose'"),
                                ("batch", "12x", "batch '12x'"), ("published", "about 1", "published 'about 1'"),
                                ("section", "misc", "section 'misc'")]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"published claim x: {words}"):
            claims.parse_claim(good | {field: value})
    with pytest.raises(ValueError, match="says why"):
        claims.parse_claim(good | {"quantity": "untestable"})


def test_every_claim_names_committed_results_or_says_why_it_cannot(committed):
    for claim in claims.read_claims():
        if claim.not_retestable:
            continue  # says why on its own row
        assert claims.resolves(claim, committed) == [], claim.id


def test_the_published_figures_match_the_published_cells_file():
    """The figures both files hold (book/data/published.csv, the stack pages' comparison) are the same."""
    cells = pd.read_csv(data.PUBLISHED)
    column = {"step_peak_alloc": ("step_peak_alloc_gib", 1.0), "step_peak_reserved": ("step_peak_reserved_gib", 1.0),
              "oom_request": ("oom_request_gib", 1.0), "step_time": ("steady_step_time_sec", 1.0),
              "samples_per_sec": ("samples_per_sec", 1.0), "op_held": ("op_held_mib", None),
              "op_backward": ("op_backward_spike_mib", None), "op_total": ("op_total_mib", None),
              "op_forward": ("op_forward_transient_mib", None)}  # fmt: skip
    compared = 0
    for claim in claims.read_claims():
        if claim.quantity not in column or len(claim.batches) != 1:
            continue
        name, _ = column[claim.quantity]
        variant, _, chunk = claim.backend.partition(" + chunk ")
        row = cells[(cells["stack"] == claim.stack) & (cells["regime"] == claim.regime)
                    & (cells["batch_size"] == claim.batch) & (cells["variant"] == variant)
                    & (cells["score_mini_batch_size"].fillna(0) == (int(chunk) if chunk else 0))]  # fmt: skip
        if row.empty or name not in row or pd.isna(row.iloc[0][name]):
            continue
        theirs = float(row.iloc[0][name])
        mine = claims.to_mib(claim.value, claim.unit) if name.endswith("_mib") else claim.value
        assert math.isclose(mine, theirs, abs_tol=1e-6), f"{claim.id}: {mine} here, {theirs} in published.csv"
        compared += 1
    assert compared >= 20


# ---- the verdict logic on synthetic numbers ------------------------------------------------------


def test_within_takes_the_wider_of_the_relative_and_the_absolute_tolerance():
    assert claims.within(1000.0, 1020.0, 0.025, 16.0) and claims.within(1000.0, 975.0, 0.025, 16.0)
    assert not claims.within(1000.0, 1030.0, 0.025, 16.0)
    assert claims.within(100.0, 115.0, 0.025, 16.0) and not claims.within(100.0, 117.0, 0.025, 16.0)
    memory = claims.TOLERANCES["memory"]
    assert claims.compare_memory(2457.6, 2457.6 * 1.02, memory)[0] == "holds"
    status, reason = claims.compare_memory(2457.6, 2457.6 * 1.05, memory, if_differs="shapes")
    assert status == "differs" and reason.startswith("+123 MiB (+5.0%), outside ±2.5% or 16 MiB") and reason.endswith("; shapes")
    assert claims.compare_ratio(130.0, 135.0, claims.TOLERANCES["memory-ratio"])[0] == "holds"
    assert claims.compare_ratio(4.0, 2.1, claims.TOLERANCES["growth"])[0] == "differs"
    assert claims.growth_per_doubling((64, 128), (1.0, 4.0)) == 4.0
    assert claims.growth_per_doubling((32, 128), (1.0, 4.0)) == 2.0
    assert claims.last_digit_half("25") == 0.5 and claims.last_digit_half("1.81") == pytest.approx(0.005)
    assert [claims.digits_of(text) for text in ("54.10", "2.40", "61", "0.0596")] == [4, 3, 2, 3]


def claim(**fields) -> claims.Claim:
    values = dict(id="t", section="colpali", claim="c", source="s", published="2.40", unit="GiB", quantity="op_held",
                  stack="colpali", regime="plain", batches=(128,), backends=("vanilla",), versus="", card="h100-80gb",
                  tolerance="memory")  # fmt: skip
    return claims.Claim(**(values | fields))


def cell(batch=128, backend="vanilla", **fields) -> dict:
    return {"stack": "colpali", "regime": "plain", "batch_size": batch, "backend": backend, "card": "h100-80gb",
            "outcome": "ok", "oom_where": None, "oom_message": None, "path": f"{backend}-{batch}.json",
            "op_saved_for_backward_mib": None, "op_backward_transient_peak_mib": None,
            "op_forward_transient_peak_mib": None, "step_peak_alloc_mib": None, "step_peak_reserved_mib": None,
            "pre_oom_alloc_mib": None, "pre_oom_reserved_mib": None, "steady_step_time_sec": 1.0,
            "samples_per_sec": 1.0, "n_steady_steps": 3, "gpu_share_gib": None} | fields  # fmt: skip


def evidence(*cells: dict, searches=()) -> claims.Evidence:
    return claims.Evidence(pd.DataFrame(list(cells)), list(searches))


def test_a_memory_figure_inside_its_tolerance_holds_and_outside_differs():
    held = 2.40 * 1024
    inside = claims.retest(claim(), evidence(cell(op_saved_for_backward_mib=held * 1.02)))
    assert (inside.status, inside.ours) == ("holds", "2.45 GiB")
    outside = claims.retest(claim(if_differs="shapes"), evidence(cell(op_saved_for_backward_mib=held * 1.10)))
    assert outside.status == "differs" and outside.reason.endswith("shapes") and "+10.0%" in outside.reason
    # a step peak of a cell that ran out of memory contradicts a published peak of a cell that trained
    peak = claims.retest(claim(quantity="step_peak_alloc", published="54.38"), evidence(cell(outcome="oom", oom_where="maxsim")))
    assert peak.status == "does not hold" and "ours: oom in the maxsim op" in peak.reason
    missing_cell = claims.retest(claim(), evidence(cell(batch=64)))
    assert missing_cell.status == "not re-tested" and missing_cell.waits_on == "no cell"
    # a rounded figure: half a unit of its last digit
    oom = "CUDA out of memory. Tried to allocate 1.79 GiB. Of the allocated memory 52.06 GiB is allocated by PyTorch, and 24.61 GiB is reserved by PyTorch but unallocated."  # noqa: E501
    rounded = claim(quantity="oom_unallocated", published="25", tolerance="rounded")
    assert claims.retest(rounded, evidence(cell(outcome="oom", oom_message=oom))).status == "holds"
    assert claims.retest(replace(rounded, published="26"), evidence(cell(outcome="oom", oom_message=oom))).status == "differs"
    request = claims.retest(claim(quantity="oom_request", published="1.81"), evidence(cell(outcome="oom", oom_message=oom)))
    assert (request.status, request.ours) == ("holds", "1.79 GiB (grid cell)")


def test_an_oom_figure_is_read_from_every_run_of_ours_that_ran_out_at_that_batch():
    """The failed request and the memory reserved but unallocated are read from the grid cell and from every
    ceiling probe of that batch that ran out (default allocator): each against the published figure, and the
    claim holds where one run reproduces it (that run named first, the others' figures beside it), differs
    where none does. Both moments — the peak before and the failing request — are read by one function,
    each against its own published figure."""
    def message(request: float, unallocated: float) -> str:
        return (f"CUDA out of memory. Tried to allocate {request:.2f} GiB. Of the allocated memory 48.03 GiB is "
                f"allocated by PyTorch, and {unallocated:.2f} GiB is reserved by PyTorch but unallocated.")  # fmt: skip

    grid = cell(outcome="oom", seed=42, oom_message=message(3.54, 27.09), pre_oom_alloc_mib=53.34 * 1024,
                pre_oom_reserved_mib=77.01 * 1024)  # fmt: skip
    probes = pd.DataFrame([
        cell(outcome="oom", seed=43, allocator="default", oom_message=message(1.81, 24.71),
             pre_oom_alloc_mib=53.45 * 1024, pre_oom_reserved_mib=77.26 * 1024),
        cell(outcome="oom", seed=44, allocator="expandable", oom_message=message(9.0, 1.0)),  # another allocator
        cell(outcome="ok", seed=42, allocator="default"),
    ])  # fmt: skip
    found = claims.Evidence(pd.DataFrame([grid]), [], probes=probes)
    request = claims.retest(claim(quantity="oom_request", published="1.81", if_differs="shapes"), found)
    assert request.ours == "1.81 GiB (ceiling probe, seed 43); 3.54 GiB (grid cell, seed 42)"
    assert request.status == "holds" and request.reason.startswith(
        "reproduced by the ceiling probe (seed 43): 0 MiB (0%), within ±2.5% or 16 MiB; beside it, the grid cell "
        "(seed 42) reads 3.54 GiB: +1772 MiB (+95.6%), outside")
    assert request.reason.endswith("; shapes")  # why the other seed's figure differs
    alone = claims.Evidence(pd.DataFrame([grid]), [], probes=probes.iloc[[0]].assign(oom_message=message(3.54, 27.0)))
    both = claims.retest(claim(quantity="oom_request", published="3.54", if_differs="shapes"), alone)
    assert both.status == "holds" and "reproduced" not in both.reason and not both.reason.endswith("shapes")
    neither = claims.retest(claim(quantity="oom_request", published="2.50", if_differs="shapes"), found)
    assert neither.status == "differs" and "reproduced" not in neither.reason and neither.reason.endswith("; shapes")
    rounded = claim(quantity="oom_unallocated", published="25", tolerance="rounded")
    unallocated = claims.retest(rounded, found)
    assert unallocated.ours.startswith("24.7 GiB (ceiling probe, seed 43, at its 1.81 GiB request); 27.1 GiB (grid cell")
    assert unallocated.status == "holds" and unallocated.reason.startswith("reproduced by the ceiling probe (seed 43): ")
    assert "the grid cell (seed 42) reads 27.1 GiB: +2140 MiB (+8.4%), outside ±0.5 GiB" in unallocated.reason
    key = [claim(id=quantity, quantity=quantity, published=value, tolerance="rounded" if quantity == "oom_unallocated"
                 else "memory") for quantity, value in (("oom_request", "1.81"), ("oom_unallocated", "25"),
                                                        ("pre_oom_alloc", "53.95"), ("pre_oom_reserved", "77.73"))]  # fmt: skip
    reading = claims.oom_reading(found, "colpali", "plain", 128, "vanilla", "h100-80gb", claims=key)
    peaks = {"published": (77.73 - 53.95), "grid": (77.01 - 53.34), "probe": (77.26 - 53.45)}
    assert f"Published: {peaks['published']:.2f} GiB at the peak (77.73 − 53.95 GiB), 25 GiB when its 1.81 GiB" in reading
    assert f"the grid cell (seed 42): {peaks['grid']:.2f} GiB at the peak, 27.09 GiB when its 3.54 GiB request failed" in reading
    assert f"the ceiling probe (seed 43): {peaks['probe']:.2f} GiB at the peak, 24.71 GiB when its 1.81 GiB" in reading
    assert "At the peak, every run of ours agrees with the published figure, within ±2.5% or 16 MiB." in reading
    assert ("When the request failed, the ceiling probe (seed 43) agrees with the published figure, within ±0.5 GiB "
            f"(the published rounding); the grid cell (seed 42) +{27.09 - 25:.2f} GiB off it.") in reading  # fmt: skip
    assert claims.oom_readings(found, key) == [reading]
    assert claims.oom_reading(found, "colpali", "plain", 64, "vanilla", "h100-80gb", claims=key) == ""


def test_outcomes_hold_only_when_the_same_and_in_the_same_place():
    oom_in_op = cell(outcome="oom", oom_where="maxsim", oom_message="CUDA out of memory. Tried to allocate 56.25 GiB. x")
    in_op = claim(quantity="outcome", published="oom in maxsim", unit="outcome")
    assert claims.retest(in_op, evidence(oom_in_op)).status == "holds"
    elsewhere = cell(outcome="oom", oom_where="elsewhere")
    assert claims.retest(claim(quantity="outcome", published="oom in maxsim"), evidence(elsewhere)).status == "does not hold"
    assert claims.retest(claim(quantity="outcome", published="oom"), evidence(elsewhere)).status == "holds"
    assert claims.retest(claim(quantity="outcome", published="oom"), evidence(cell())).status == "does not hold"
    # identical OOMs: every backend out of memory, allocated memory equal within the memory tolerance
    same = claim(quantity="same_oom", published="identical", backends=("vanilla", "lik"))
    both = [cell(backend=b, outcome="oom", oom_where="elsewhere", pre_oom_alloc_mib=80000.0) for b in ("vanilla", "lik")]
    assert claims.retest(same, evidence(*both)).status == "holds"
    both[1]["pre_oom_alloc_mib"] = 70000.0
    assert claims.retest(same, evidence(*both)).status == "does not hold"


def test_ratios_and_growth_against_their_tolerance():
    vanilla = {128: 8154.0, 64: 8154.0 / 4.2}
    lik = {128: 60.0, 64: 29.0}
    cells = [cell(batch=b, op_saved_for_backward_mib=v / 3, op_backward_transient_peak_mib=2 * v / 3) for b, v in vanilla.items()]
    cells += [cell(batch=b, backend="lik", op_saved_for_backward_mib=v / 2, op_backward_transient_peak_mib=v / 2)
              for b, v in lik.items()]  # fmt: skip
    found = evidence(*cells)
    reduction = claim(quantity="op_reduction", published="130", unit="×", backends=("lik",), versus="vanilla",
                      tolerance="memory-ratio")  # fmt: skip
    verdict = claims.retest(reduction, found)
    assert verdict.status == "holds" and verdict.ours.startswith("136×")  # 8154 / 60
    assert claims.retest(replace(reduction, published="100"), found).status == "differs"
    growth = claim(quantity="op_growth", published="4.0", unit="×", batches=(64, 128), tolerance="growth")
    assert claims.retest(growth, found).status == "holds"  # 4.2 is within 10% of 4.0
    lik_growth = replace(growth, backends=("lik",))
    assert claims.retest(lik_growth, found).status == "differs"  # 2.07 is not 4.0


def test_times_wait_until_they_are_trustworthy_then_ratios_are_compared():
    pair = [cell(batch=512, backend="vanilla", steady_step_time_sec=2.27),
            cell(batch=512, backend="lik", steady_step_time_sec=2.05)]
    speedup = claim(quantity="speedup", published="1.07–1.12", unit="×", batches=(512,), backends=("lik",),
                    versus="vanilla", tolerance="time-ratio")  # fmt: skip
    waiting = claims.retest(speedup, evidence(*pair))
    assert waiting.status == "not re-tested" and waiting.waits_on == "times"
    assert waiting.ours == f"on {text.card_label('h100-80gb')}: B=512: {2.27 / 2.05:.2f}× (medians)"
    assert waiting.reason.startswith(claims.TIMES_WAIT) and "3 steady steps, not 8" in waiting.reason
    trusted = [row | {"n_steady_steps": 8, "times_comparable": True} for row in pair]
    assert claims.timing_doubt([pd.Series(row) for row in trusted]) == ""
    assert claims.retest(speedup, evidence(*trusted)).status == "holds"
    trusted[1]["steady_step_time_sec"] = 1.5  # 1.51×: faster than published
    assert claims.retest(speedup, evidence(*trusted)).status == "differs"
    shared = [row | {"gpu_share_gib": 30.0} for row in trusted]
    assert "shared GPU" in claims.timing_doubt([pd.Series(row) for row in shared])
    # an absolute time is never compared across cards, trustworthy or not
    absolute = claim(quantity="step_time", published="2.40", unit="s/step", batches=(512,), backends=("lik",), tolerance="time")
    verdict = claims.retest(absolute, evidence(*trusted))
    assert verdict.status == "not re-tested" and verdict.reason.startswith("not compared")


def test_a_speed_ratio_names_its_batch_and_card_and_inside_the_noise_is_no_difference():
    """Each ratio says the batch and card it was measured at, with its 95% interval; one whose interval reaches
    into 1 ± the regime's run-to-run noise is no difference: it cannot back a claimed speedup, and agrees with a
    claimed parity."""
    steady = {"vanilla": [2.20 + 0.02 * k for k in range(8)], "lik": [2.00 + 0.02 * k for k in range(8)]}
    cells = [cell(batch=batch, backend=backend, steady_times_sec=[t * scale for t in times],
                  steady_step_time_sec=float(pd.Series(times).median()) * scale, n_steady_steps=8, times_comparable=True)
             for batch, scale in ((128, 1.0), (256, 2.0)) for backend, times in steady.items()]  # fmt: skip
    speedup = claim(quantity="speedup", published="1.07–1.12", unit="×", batches=(128, 256), backends=("lik",),
                    versus="vanilla", tolerance="time-ratio")  # fmt: skip
    intervals = [timing.ratio(steady["vanilla"], steady["lik"]) for _ in (128, 256)]  # the scale cancels
    quiet = claims.Evidence(pd.DataFrame(cells), [], noise=timing.RunNoise({("colpali", "plain"): 0.02}, 0.02))
    verdict = claims.retest(speedup, quiet)
    value = intervals[0]
    assert value.beyond(0.02) and verdict.status == "holds"
    words = f"{value.value:.2f}× faster ({value.low:.2f}–{value.high:.2f})"
    assert verdict.ours == f"on {text.card_label('h100-80gb')}: B=128: {words}; B=256: {words}"
    noisy = claims.Evidence(pd.DataFrame(cells), [], noise=timing.RunNoise({("colpali", "plain"): 0.15}, 0.15))
    assert not value.beyond(0.15)
    verdict = claims.retest(speedup, noisy)
    # inside the noise but reaching the published band: consistent with the claim, not a contradiction
    assert verdict.status == "holds" and verdict.reason.startswith("every ratio's 95% interval reaches")
    assert "at B=128 and 256 ours are also inside the ±15.0% run-to-run noise" in verdict.reason
    assert "no difference (" in verdict.ours and "in ±15.0% noise" in verdict.ours
    far = claims.retest(replace(speedup, published="1.50"), noisy)  # a band these intervals miss
    assert far.status == "differs" and far.reason.startswith("at B=128 and 256 the 95% interval lies outside")
    parity = replace(speedup, published="1.00")
    assert claims.retest(parity, noisy).status == "holds"  # no difference agrees with parity
    assert claims.retest(parity, quiet).status == "differs"  # a difference beyond the noise, outside ±5% of 1.00


def search_row(backend: str, fits: int | None, fails: int | None, done: bool = True, probes: int = 5,
               allocator: str = "default") -> SearchRow:  # fmt: skip
    search = CeilingSearch(stack="colpali", regime="plain", variant=backend, card="h100-80gb", allocator=allocator,
                           seeds=(42, 43, 44), start=128, limit=512, resolution=8)  # fmt: skip
    return SearchRow(search=search, ceiling=Ceiling(fits=fits, fails=fails, next_batch=None if done else fails),
                     probes=probes, usable_gib=78.43)  # fmt: skip


def test_ceiling_claims_hold_where_the_search_settles_them_and_wait_where_it_has_not():
    below = claim(quantity="ceiling_below", published="128", unit="batch", tolerance="search")
    at_least = claim(quantity="ceiling_at_least", published="128", unit="batch", backends=("lik",), tolerance="search")
    gain = claim(quantity="ceiling_gain", published="2", unit="×", batches=(), backends=("lik",), versus="vanilla",
                 tolerance="search")  # fmt: skip
    settled = evidence(searches=[search_row("vanilla", 120, 128), search_row("lik", 160, 168)])
    assert claims.retest(below, settled).status == "holds"
    assert claims.retest(at_least, settled).status == "holds"
    verdict = claims.retest(gain, settled)
    assert verdict.status == "does not hold" and "1.26–1.39×" in verdict.reason  # 160/127 to 167/120
    doubled = evidence(searches=[search_row("vanilla", 120, 128), search_row("lik", 256, 264)])
    assert claims.retest(gain, doubled).status == "holds"
    assert claims.retest(below, evidence(searches=[search_row("vanilla", 128, 136)])).status == "does not hold"
    unfinished = evidence(searches=[search_row("vanilla", 120, 128), search_row("lik", 160, 192, done=False)])
    for pending in (at_least, gain):
        verdict = claims.retest(pending, unfinished)
        assert verdict.status == "not re-tested" and verdict.waits_on == "search" and "unfinished" in verdict.reason
    not_run = evidence(searches=[search_row("vanilla", None, None, done=False, probes=0), search_row("lik", 160, 168)])
    assert "has not run" in claims.retest(below, not_run).reason


def test_the_summary_counts_every_verdict_once():
    rows = [(claim(id=str(k)), claims.Verdict(status, "x", "r", "times" if status == "not re-tested" else ""))
            for k, status in enumerate(["holds", "holds", "differs", "does not hold", "not re-tested"])]  # fmt: skip
    assert claims.counts(rows) == {"holds": 2, "differs": 1, "does not hold": 1, "not re-tested": 1}
    assert claims.summary(rows) == (
        "Of the 5 quantitative claims of the published work, 2 hold, 1 differs and 1 does not hold on our data. "
        "1 is not re-tested yet: 1 step-time claim, whose times are being re-measured (issue 16: trustworthy step times).")
    assert len(claims.contradictions(rows)) == 2


# ---- the committed results -----------------------------------------------------------------------


def test_the_b128_colqwen2_op_claim_gets_the_verdict_its_result_file_gives(verdicts):
    """Published: held 2.40 + backward spike 5.41 = 7.81 GiB. Ours, read again from the result file: the
    replay that held the most, its held and spike, against ±2.5% or 16 MiB."""
    path = ROOT / "results" / "published" / "colpali" / "plain" / "colpali-plain-b128-vanilla-h100-80gb.json"
    call = largest_isolated_call(load_result(path))
    assert call is not None and call.saved_for_backward_mib and call.backward_transient_peak_mib
    ours = {"held": call.saved_for_backward_mib, "backward": call.backward_transient_peak_mib}
    ours["total"] = ours["held"] + ours["backward"]
    for name, published_gib in (("held", 2.40), ("backward", 5.41), ("total", 7.81)):
        claim_row, verdict = verdicts[f"colpali-op-{name}-128"]
        published_mib = published_gib * 1024
        expected = "holds" if abs(ours[name] - published_mib) <= max(0.025 * published_mib, 16) else "differs"
        assert verdict.status == expected, (name, ours[name], verdict.text)
        assert verdict.ours.startswith(f"{ours[name] / 1024:.2f} GiB")
    # the shape-free check: backward over held is the published ratio to a fraction of a percent
    assert ours["backward"] / ours["held"] == pytest.approx(5.41 / 2.40, rel=0.005)


def test_the_committed_verdicts_read_as_words_and_numbers(verdicts):
    rows = list(verdicts.values())
    table = claims.claims_table(rows)
    words = {str(value) for value in table.to_numpy().ravel()}
    assert not {word for word in words if any(bad in word for bad in ("nan", "None", "<NA>"))}
    assert all(text for text in table["verdict"]) and all(text for text in table["ours"])
    n = claims.counts(rows)
    assert sum(n.values()) == len(rows) and n["holds"] > 0
    # a time claim is re-tested only on cells timed under the timing rule: a speed ratio with its intervals;
    # an absolute time never (another card); otherwise it says what it waits for
    for claim_row, verdict in rows:
        if claim_row.section != "times":
            continue
        if verdict.status == "not re-tested":
            assert verdict.reason.startswith(("not yet re-tested: step times", "not compared"))
        else:
            assert claim_row.quantity == "speedup" and "(" in verdict.ours  # each ratio with its interval


def test_the_search_tolerance_describes_the_searches_the_ceiling_claims_read(committed):
    """The 'search' tolerance's sentence names a search's steps and seeds in words: every search a
    ceiling claim is read against must train that many steps on that many seeds under the default
    allocator, or the sentence is wrong."""
    why = claims.TOLERANCES["search"].why
    read = [data.find_search(committed.searches, claim.stack, claim.regime, backend, claim.card)
            for claim in claims.read_claims() if claim.quantity in claims.CEILING_QUANTITIES
            for backend in {claim.backend, claim.versus} - {""}]  # fmt: skip
    assert [row for row in read if row is not None], "no ceiling claim reads a committed search"
    for row in read:
        if row is not None:
            assert row.allocator == "default"
            assert f"{row.search.steps} steps, {len(row.search.seeds)} seeds" in why, row.search.name


def test_every_gpu_result_ran_on_the_gpu_the_card_labels_name():
    """The book labels the native card 'the whole H200', and every other card by its cap alone, with the GPUs its
    probes ran on said in words (intro, ceilings and methodology: 'on an H200, or for N of the M probes on an H100
    80GB HBM3, which the cross-card check vouches for'). True only while every committed GPU result ran on an H200,
    except a long run that names its GPU, the cross-card check's probes (whose table names the GPU in every row),
    capped ceiling probes from a GPU the check vouches for, which those words count, and the data-parallel cells, whose
    GPUs the gathered page names."""
    from collections import Counter

    from harness.report import data, longrun, prose, scaling, tables, text
    from harness.results import read_results
    from harness.spec import CARDS

    results, _ = read_results(ROOT / "results")
    on_gpu = [result for _, result in results if result.env and result.env.device.startswith("cuda")]
    # a long run on another GPU at its card's cap is said to be one, in its row, its sentence and its legend
    elsewhere = [run for run in longrun.long_runs(data.read()) if run.device and "H200" not in run.device]
    for run in elsewhere:
        assert run.device and run.device.removeprefix("NVIDIA ") in run.where
        assert run.where in longrun.table([run], [])[longrun.OUTCOME].iloc[0]
    named = {(run.result.grid, run.result.cell_id) for run in elsewhere if run.result is not None}
    # the cross-card check runs on another GPU by design, and its table names that GPU in every row
    checks = data.cross_card_checks(data.read())
    if checks:
        assert all(check.device.removeprefix("NVIDIA ") in row for check, row in
                   zip(checks, tables.card_check(checks)["other GPU"], strict=True))  # fmt: skip
    # the data-parallel cells above W = 1: the gathered and predictions pages name the GPUs they ran on
    gathered_words = scaling.gathered_ops_words(scaling.gathered_ops(data.read()))
    named |= {(result.grid, result.cell_id) for result in on_gpu if result.grid == data.MULTI_GPU and result.world_size > 1
              and f"{text.a_gpu(str(result.env.device_name))}" in gathered_words}  # type: ignore[union-attr]  # fmt: skip
    # the W = 1 data-parallel cells: the gathered page's first line names the GPUs its bases ran on
    cells_now, calls_now = data.load(data.read())
    first_line = scaling.scaling_reading(scaling.scalings(data.read(), cells_now, calls_now))[0]
    named |= {(result.grid, result.cell_id) for result in on_gpu if result.grid == data.MULTI_GPU and result.world_size == 1
              and f"{text.a_gpu(str(result.env.device_name))}" in first_line}  # type: ignore[union-attr]  # fmt: skip
    capped = data.capped_probe_gpus(data.read())
    words = prose.capped_gpus_words(capped)
    admitted = [result for result in on_gpu if result.grid == data.CEILINGS and CARDS[result.spec.card].usable_gib is not None
                and result.env.device_name in capped.vouched]  # type: ignore[union-attr]  # fmt: skip
    for gpu in {result.env.device_name for result in admitted}:  # type: ignore[union-attr]
        assert f"on an {text.gpu_words(str(gpu))}, which the cross-card check vouches for" in words
    # a cell of a stack page timed on another GPU: its step-time row names that GPU (its model; the card's heading names
    # it in full), and speeds compare one GPU's times
    cells, _ = data.load(data.read())
    for result in on_gpu:
        device = str(result.env.device_name)  # type: ignore[union-attr]
        if "H200" in device or result.grid in (data.CEILINGS, data.CROSS_CARD, data.LONG_RUN):
            continue
        mine = cells[(cells["grid"] == result.grid) & (cells["cell_id"] == result.cell_id)]
        peers = cells[(cells["stack"] == result.spec.stack) & (cells["regime"] == result.spec.regime)
                      & (cells["card"] == result.spec.card)]  # the table this cell's time sits in  # fmt: skip
        table = tables.step_time_table(peers)
        if not tables.timed(mine).empty:
            backend = text.nowrap(str(mine["backend"].iloc[0]))  # (as the table writes it)
            rows = table[(table["batch"] == result.spec.batch_size) & (table["GPU"] == text.gpu_short(device))
                         & (table["backend"] == backend)]  # fmt: skip
            assert len(rows) == 1, (result.cell_id, table)
            vanilla = tables.timed(peers[(peers["batch_size"] == result.spec.batch_size) & (peers["backend"] == "vanilla")
                                         & (peers["device_name"] == device)])  # fmt: skip
            unmatched = result.spec.variant == "vanilla" or vanilla.empty
            assert (rows["speed vs vanilla (95% interval)"].iloc[0] == "") == unmatched
            named.add((result.grid, result.cell_id))
    left = {(result.grid, result.cell_id) for result in admitted} | named
    ran_on = Counter(result.env.device_name for result in on_gpu  # type: ignore[union-attr]
                     if (result.grid, result.cell_id) not in left and result.grid != data.CROSS_CARD)  # fmt: skip
    assert sum(ran_on.values()) > 400, ran_on
    assert set(ran_on) == {"NVIDIA H200"}, ran_on
    assert "H200" not in text.card_label("h100-80gb") and "the whole H200" in text.card_label("native")
    assert words.startswith("on an H200")


def test_the_op_ratio_and_growth_claims_compare_one_call_shape(verdicts):
    """The ~130× and the ×4 / ×2 claims: our figures are read from the result files' replays at one call shape
    that every cell compared replayed (the largest such), named in the verdict, never a vanilla call of one
    shape over a lik call of another."""
    folder = ROOT / "results" / "published" / "colpali" / "plain"

    def totals(batch: int, backend: str) -> dict[tuple[int, int], float]:
        result = load_result(folder / f"colpali-plain-b{batch}-{backend}-h100-80gb.json")
        return {(call.query_shape[1], call.doc_shape[1]): call.saved_for_backward_mib + call.backward_transient_peak_mib
                for call in result.maxsim_calls_isolated if not call.oom_in_replay}  # fmt: skip

    def largest_common(*tables: dict[tuple[int, int], float]) -> tuple[int, int]:
        return max(set.intersection(*(set(table) for table in tables)), key=lambda shape: shape[0] * shape[1])

    vanilla, lik = totals(128, "vanilla"), totals(128, "lik")
    shape = largest_common(vanilla, lik)
    assert max(lik, key=lambda s: lik[s]) != shape  # lik's own largest call is another shape: the old, mixed ratio
    ratio = vanilla[shape] / lik[shape]
    claim_row, verdict = verdicts["colpali-op-reduction-128"]
    assert verdict.ours.startswith(f"{ratio:.0f}× at {shape[0]} × {shape[1]} tokens")
    assert verdict.status == ("holds" if abs(ratio - claim_row.value) <= 0.12 * claim_row.value else "differs")
    assert "the published ratio is of the published run's own shapes" in verdict.reason
    for backend, claim_id in (("vanilla", "colpali-op-growth-vanilla"), ("lik", "colpali-op-growth-lik")):
        small, large = totals(64, backend), totals(128, backend)
        shape = largest_common(small, large)
        factor = large[shape] / small[shape]  # one doubling
        claim_row, verdict = verdicts[claim_id]
        assert verdict.ours.startswith(f"{text.significant(factor, 3)}× at {shape[0]} × {shape[1]} tokens in both")
        assert verdict.status == ("holds" if abs(factor - claim_row.value) <= 0.10 * claim_row.value else "differs")


def test_the_failed_request_claim_shows_our_probe_beside_our_grid_cell(verdicts):
    """'…on a 1.81 GiB request': our grid cell's request and the ceiling probe's of the same batch that ran out,
    read again from their result files, each with its own verdict: the claim holds where one of those runs
    asked for the published size (within ±2.5% or 16 MiB), named with its seed, the others' requests beside it."""
    grid = load_result(ROOT / "results" / "published" / "colpali" / "plain" / "colpali-plain-b128-vanilla-h100-80gb.json")
    probes = [load_result(path) for path in sorted((ROOT / "results" / "ceilings" / "colpali" / "plain").glob(
        "colpali-plain-b128-vanilla-h100-80gb*.json")) if "expandable" not in path.name]  # fmt: skip
    failed = [probe for probe in probes if probe.outcome == "oom"]
    assert grid.outcome == "oom" and failed
    _, verdict = verdicts["colpali-request-128-vanilla"]
    asked_mib = {}
    for label, result in [("grid cell", grid), *(("ceiling probe", probe) for probe in failed)]:
        asked = re.search(r"Tried to allocate ([0-9.]+) GiB", result.oom_message).group(1)
        assert f"{asked} GiB ({label}, seed {result.spec.seed})" in verdict.ours
        asked_mib[label, result.spec.seed] = 1024 * float(asked)
    claim_row = verdicts["colpali-request-128-vanilla"][0]
    published_mib = claim_row.value * 1024
    same = [run for run, mib in asked_mib.items() if abs(mib - published_mib) <= max(0.025 * published_mib, 16)]
    # a ceiling probe of that batch asked the published size (on the stream draw, seed 44: 1.79 GiB), the grid cell 3.54
    assert same and {label for label, _ in same} == {"ceiling probe"}
    assert verdict.status == "holds"
    assert verdict.reason.startswith(f"reproduced by the {same[0][0]} (seed {same[0][1]}): ")
    for label, seed in set(asked_mib) - set(same):
        assert f"the {label} (seed {seed}) reads {asked_mib[label, seed] / 1024:.2f} GiB: " in verdict.reason
    _, unallocated = verdicts["colpali-unallocated-128-vanilla"]
    for result in [grid, *failed]:
        held = re.search(r"([0-9.]+) GiB is reserved by PyTorch but unallocated", result.oom_message).group(1)
        assert f"{float(held):.3g} GiB" in unallocated.ours


def test_every_committed_speed_ratio_names_its_batch_and_card(verdicts):
    for claim_row, verdict in verdicts.values():
        if claim_row.quantity != "speedup" or verdict.ours == "—":
            continue
        assert verdict.ours.startswith(f"on {text.card_label(claim_row.card)}: ")
        assert [int(b) for b in re.findall(r"B=(\d+): ", verdict.ours)] == list(claim_row.batches)


def test_the_ceilings_page_names_every_search_decided_on_the_earlier_data_draw():
    """The draw sentences count, per stack, the searches whose ceiling or the batch above it has a probe of the
    earlier draw: recounted here from the probes' recorded data sources. ColQwen2's (shapes follow the data) run
    those probes again, each search's next probe being one of them; PyLate's (fixed shapes) keep them."""
    import re

    from harness.report import prose

    rows = data.ceilings(data.read())
    text = prose.draw_reading(rows, data.ceilings(data.read(), data.CROSS_CARD_GRID))
    note = prose.draw_note(rows)

    def rows_draw(result) -> bool:
        return result.env is not None and bool(re.search(r":rows=\d+$", result.env.data_source or ""))

    for stack, name in (("colpali", "ColQwen2"), ("pylate", "PyLate")):
        mine = [row for row in rows if row.stack == stack]
        finished = [row for row in mine if row.ceiling.done and row.fits is not None]
        earlier, again = 0, 0
        for row in mine:
            probes = data.Probes(row.search, data.results_of(None).by_id(row.search.grid))
            probed = {**probes.earlier, **probes.by_probe}
            # every probe at the ceiling, and the failed ones above it: one that trained there decides nothing
            deciding = [result for (batch, _), result in probed.items()
                        if batch == row.fits or (batch == row.fails and result.outcome != "ok")]  # fmt: skip
            if row.ceiling.earlier_draw:
                again += 1
                assert any(rows_draw(result) and result.batch_size == row.ceiling.next_batch for result in deciding)
            elif row in finished:
                earlier += any(rows_draw(result) for result in deciding)
        if stack == "colpali":
            assert earlier == 0 and again > 0  # no ColQwen2 ceiling rests on the earlier draw
            ran = sum(row.probes > 0 for row in mine)
            assert f"{name}: {again} searches (" in text and f"{again} of the {ran} {name} searches that have run" in note
        else:
            assert again == 0 and earlier > 0
            assert f"{name}: {earlier} of its {len(finished)} finished searches" in text
            assert f"{earlier} of {name}'s {len(finished)} finished ceilings" in note
