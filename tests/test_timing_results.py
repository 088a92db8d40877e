"""Claims the pages make about the committed step times, the seed stream and the lik spike, checked
over the committed results (a re-measured result that contradicts one fails here)."""

import dataclasses
import itertools
import re

import pytest

from harness.report import data, prose, tables, text, timing

RESULTS = data.results_of(None)
CELLS, CALLS = data.load(RESULTS)


def stream_results():
    return [r for _, r in RESULTS.found if r.kind == "train" and r.stack == "colpali" and r.data_draw == "stream"]


def test_one_seed_trains_the_same_batches_in_every_cell_of_a_batch_size():
    """The methodology says every one-GPU cell of one seed and batch size trains the same batches (ColQwen2,
    whose shapes follow the batch: PyLate pads every batch to one shape); a data-parallel cell's ranks each
    draw their own share."""
    by_key: dict[tuple[str, int, int, int], list] = {}
    for result in stream_results():
        by_key.setdefault((result.stack, result.batch_size, result.seed, result.world_size), []).append(result)
    compared = 0
    for group in by_key.values():
        for first, second in itertools.combinations(group, 2):
            one, two = prose._step_shapes(first), prose._step_shapes(second)
            for step in one.keys() & two.keys():
                assert one[step] == two[step], (first.cell_id, first.grid, second.grid, step)
                compared += 1
    assert compared >= 50


def test_the_published_grid_was_timed_under_the_rule_with_eight_steady_steps():
    published = [r for _, r in RESULTS.of("published") if r.timing is not None]
    assert len(published) >= 20
    for result in published:
        assert result.times_comparable, (result.cell_id, result.timing.reason)
        assert result.timing.neighbours == 0 and not result.timing.gpu_shared
        if result.outcome == "ok":
            assert len(result.steady_steps) >= 8, result.cell_id
            assert result.spec.min_steady_steps == 8


def test_the_step_time_tables_show_only_timed_cells():
    shown = tables.timed(CELLS)
    assert len(shown) and shown["times_comparable"].all()
    colpali = data.select(CELLS, "colpali", "plain")
    table = tables.step_time_table(colpali)
    assert len(table) == len(tables.timed(colpali))
    coverage = prose.timing_coverage(colpali)
    timed, trained = len(tables.timed(colpali)), int((colpali["outcome"] == "ok").sum())
    assert coverage.startswith(f"All {trained} cells" if timed == trained else f"{timed} of the {trained} cells")
    untimed = colpali.assign(times_comparable=[k % 2 == 0 for k in range(len(colpali))])  # half of them
    shown = len(tables.timed(untimed))
    assert 0 < shown < trained and prose.timing_coverage(untimed).startswith(f"{shown} of the {trained} cells")


def test_the_published_speed_ratios_are_read_with_their_intervals():
    gc = data.select(CELLS, "pylate", "grad-checkpoint")
    noise = data.run_noise(RESULTS)
    band = noise.of("pylate", "grad-checkpoint")
    reading = prose.published_time_reading(gc, data.published("pylate", "grad-checkpoint"), noise)
    assert "At B=512, lik against vanilla: published 1.12×" in reading
    vanilla, lik, chunked = (tables.timed(gc).query(f"batch_size == 512 and backend == '{b}' and card == 'h100-80gb'")
                             ["steady_times_sec"].iloc[0] for b in ("vanilla", "lik", "vanilla + chunk 64"))  # fmt: skip
    assert timing.ratio(vanilla, lik).beyond(band)  # named faster: its interval clears the regime's noise
    assert timing.ratio_words(timing.ratio(vanilla, lik), noise=band) == timing.ratio_words(timing.ratio(vanilla, lik))
    assert timing.ratio_words(timing.ratio(vanilla, lik)) in reading
    # chunk 64 against vanilla, 1.005× slower within the run, reaches into that noise: no difference
    assert not timing.ratio(vanilla, chunked).beyond(band)
    said = timing.ratio_words(timing.ratio(vanilla, chunked), noise=band)
    assert said.startswith("no difference beyond run-to-run noise (") and f"ours {said}" in reading


def test_repeated_cells_say_which_runs_agree():
    pairs = data.repeats(RESULTS)
    assert len(pairs) >= 4
    reading = prose.repeat_reading(pairs)
    wide = [first.cell_id for first, second in pairs
            if timing.repeat_gap(timing.steady_times(first), timing.steady_times(second)) > timing.REPEAT_TOLERANCE]  # fmt: skip
    for cell in wide:
        assert cell in reading
    assert prose.repeat_spread(pairs, CELLS).startswith(f"Each of the {len(pairs)} pairs trained the same batches")


@pytest.mark.parametrize("row", data.lik_spike(), ids=lambda row: row["experiment"])
def test_a_tuned_lik_call_takes_what_the_training_replay_reads(row):
    """The op page: the first call is what was live plus the 256 MiB flush buffer; tuned, the
    training cells' replay of the same batch."""
    assert abs(row["first_bwd_mib"] - row["predicted_first_mib"]) <= 1
    lik = CELLS.query("stack == 'pylate' and regime == 'grad-checkpoint' and backend == 'lik'")
    replays = lik[lik["batch_size"] == row["batch"]]
    values = replays["op_backward_transient_peak_mib"].dropna()
    assert len(values) and all(abs(v - min(row["repeat_bwd_mib"])) <= 0.5 for v in values)


def test_the_step_time_tables_call_a_ratio_within_its_regimes_noise_no_difference():
    """A ratio is named faster or slower only where its whole interval lies outside 1 ± its regime's noise."""
    noise = data.run_noise(RESULTS)
    within = 0
    for stack, regime in (("pylate", "plain"), ("pylate", "grad-checkpoint"), ("colpali", "plain")):
        chosen = data.select(CELLS, stack, regime)
        ok = tables.timed(chosen)
        band = noise.of(stack, regime)
        assert band is not None
        plain, told = tables.step_time_table(chosen), tables.step_time_table(chosen, noise=noise)
        assert len(plain) == len(told) == len(ok)
        for before, after in zip(plain["speed vs vanilla (95% interval)"], told["speed vs vanilla (95% interval)"],
                                 strict=True):  # fmt: skip
            if after.startswith("no difference ("):  # a measurable ratio whose interval reaches into the band
                assert not before.startswith("no measurable")
                shown, interval = before.split(" (")  # "1.08× faster (1.02–1.10)": both kept in the words
                assert after == f"no difference ({shown}, {interval[:-1]}, in ±{100 * band:.1f}% noise)"
                low, high = (float(x) for x in interval[:-1].split("–"))
                assert low <= 1 + band + 0.005 if "faster" in shown else low <= 1 / (1 - band) + 0.005
                within += 1
            else:
                assert after == before
                if "×" in after:  # named faster or slower: the whole interval clears the band
                    low = float(after.split("(")[1].split("–")[0])
                    assert low > 1 + band - 0.005, (stack, regime, after)
    assert within >= 1


def pylate_80gb(regime: str, batch: int) -> tuple[list[float], list[float]]:
    """Vanilla's and lik's steady step times at ``batch`` on the 80 GB card."""
    ok = tables.timed(data.select(CELLS, "pylate", regime))
    times = {b: ok.query(f"batch_size == {batch} and backend == '{b}' and card == 'h100-80gb'")["steady_times_sec"].iloc[0]
             for b in ("vanilla", "lik")}  # fmt: skip
    return list(times["vanilla"]), list(times["lik"])


def test_pylate_plains_lik_at_64_is_no_difference_against_its_noise():
    """pylate-plain.md: lik at B=64 on 80 GB was "1.08× faster (1.02–1.10)" though its lower end reaches
    into that regime's run-to-run noise band; now it reads no difference, its numbers kept."""
    noise = data.run_noise(RESULTS)
    ratio = timing.ratio(*pylate_80gb("plain", 64))
    band = noise.of("pylate", "plain")
    assert band is not None and ratio.measurable and ratio.value - 1 > timing.run_noise(data.repeats(RESULTS)).of(
        "pylate", "plain")  # the point estimate alone cleared the repeats' noise: the old rule named it
    assert not ratio.beyond(band) and ratio.low < 1 + band
    table = tables.step_time_table(tables.timed(data.select(CELLS, "pylate", "plain")).query("card == 'h100-80gb'"),
                                   noise=noise)  # fmt: skip
    row = table[(table["batch"] == 64) & (table["backend"] == "lik")]
    assert row["speed vs vanilla (95% interval)"].iloc[0] == timing.ratio_words(ratio, noise=band, compact=True)
    assert row["speed vs vanilla (95% interval)"].iloc[0].startswith(f"no difference ({ratio.value:.2f}× faster, ")


def test_grad_checkpoints_noise_counts_its_cap_twins():
    """PyLate grad-checkpoint's noise rests on more than its two repeats at B=512: its runs of one cell at
    80 GB and on the whole H200 (the cap far above the step peak) move their medians further."""
    twins = data.cap_twins(RESULTS)
    mine = [(first, second) for first, second in twins if (first.stack, first.regime) == ("pylate", "grad-checkpoint")]
    assert mine
    for first, second in mine:
        assert first.env.device_name == second.env.device_name and first.card != second.card
        assert dataclasses.replace(first.spec, card="native") == dataclasses.replace(second.spec, card="native")
        assert max(first.step_peak_reserved_mib, second.step_peak_reserved_mib) <= (
            timing.CAP_UNBOUND_SHARE * min(timing.cap_mib(first), timing.cap_mib(second)))
    repeats = timing.repeat_gaps(data.repeats(RESULTS))
    gaps = [gap for first, _, _, gap in [*repeats, *timing.repeat_gaps(mine)]
            if (first.stack, first.regime) == ("pylate", "grad-checkpoint")]  # fmt: skip
    noise = data.run_noise(RESULTS)
    assert noise.of("pylate", "grad-checkpoint") == max(gaps)
    assert noise.pairs[("pylate", "grad-checkpoint")] == len(gaps)
    only_repeats = timing.run_noise(data.repeats(RESULTS)).of("pylate", "grad-checkpoint")
    widest = max(timing.repeat_gaps(mine), key=lambda row: row[3])
    assert widest[3] == max(gaps) > only_repeats  # a twin, not a repeat, sets it
    assert (widest[0].batch_size, widest[0].spec.variant) == (128, "lik")  # B=128: 80 GB against the whole H200
    # at that noise, lik's 1.05× at B=128 on 80 GB is no difference; its 1.10× at B=512 stays a difference
    assert not timing.ratio(*pylate_80gb("grad-checkpoint", 128)).beyond(max(gaps))
    assert timing.ratio(*pylate_80gb("grad-checkpoint", 512)).beyond(max(gaps))


def test_a_cap_that_came_near_the_step_peak_makes_no_twin():
    """ColQwen2 at B=128: capped to 80 GB the step peak sits at the cap (the whole H200 run reserved more than
    80 GB), so those two runs differ in more than noise and are left out."""
    pairs, twins = data.cap_pairs(RESULTS), data.cap_twins(RESULTS)
    left = [pair for pair in pairs if pair not in twins]
    assert left and all(not timing.cap_unbound(*pair) for pair in left)
    for first, second in left:
        assert max(first.step_peak_reserved_mib, second.step_peak_reserved_mib) > (
            timing.CAP_UNBOUND_SHARE * min(timing.cap_mib(first), timing.cap_mib(second)))
    assert any((first.stack, first.batch_size) == ("colpali", 128) for first, _ in left)


def test_a_published_time_derived_from_samples_per_second_says_so_and_every_ratio_has_its_interval():
    """colpali.md: the published ColQwen2 time is the batch over the published samples/s, and says so; ours ÷
    published carries our median's interval (a published time is one figure); pylate-*.md: a published speed
    ratio says it has no interval, and the ratio of ratios carries ours."""
    published = data.published("colpali", "plain")
    table = tables.published_time_table(data.select(CELLS, "colpali", "plain"), published)
    derived = published[published["steady_step_time_sec"].isna() & published["samples_per_sec"].notna()]
    assert len(table) and len(derived)
    for _, row in table.iterrows():
        ref = derived[(derived["batch_size"] == row["batch"])]
        if len(ref):
            assert "÷ the published" in row["published s / step (H100)"] and "samples/s" in row["published s / step (H100)"]
        assert "–" in row["ours ÷ published (95% interval)"].replace("\u00a0", " ")
    gc = data.select(CELLS, "pylate", "grad-checkpoint")
    reading = prose.published_time_reading(gc, data.published("pylate", "grad-checkpoint"), data.run_noise(RESULTS))
    parts = reading.split(". At B=")[1:]
    assert len(parts) > 1 and all("× (no interval)" in part and "ratio of ratios" in part for part in parts)
    assert all("–" in part.split("ratio of ratios")[1] for part in parts)
    agreement = prose.published_agreement(gc, data.published("pylate", "grad-checkpoint"))
    assert "bootstrap 95% interval" in agreement
    # one clause per bracket: no colon inside one, none straight after it (it read "(… alone: … spread): the H200 …")
    brackets = re.findall(r"\(([^()]*)\)", agreement)
    assert brackets and not any(":" in inside for inside in brackets) and "): " not in agreement
    assert agreement.endswith(". " + prose.published_gpus(_timed_on(gc, data.published("pylate", "grad-checkpoint"))) + ".")


def _timed_on(cells, published):
    """(our GPU, the published card) of each cell both runs timed, read straight from the frames."""
    ok = tables.timed(cells)
    pairs = []
    for _, ref in published.dropna(subset=["steady_step_time_sec"]).iterrows():
        backend = data.backend_label(ref["variant"], ref["score_mini_batch_size"])
        mine = ok[(ok["batch_size"] == ref["batch_size"]) & (ok["backend"] == backend) & (ok["card"] == ref["card"])]
        if ref["outcome"] == "ok" and len(mine):
            pairs.append((mine.iloc[0]["device_name"], ref["card"]))
    return pairs


def test_the_published_agreement_names_the_gpus_our_timed_cells_ran_on_and_says_they_differ_only_where_they_do():
    """pylate-grad-checkpoint.md: the sentence after the step-time ratios names our GPUs (each result records
    its own) and the published card's, and says a time compares across the runs only for a cell that ran on
    the published card's GPU — over the committed results, and with some or all cells moved to that GPU."""
    gc, published = data.select(CELLS, "pylate", "grad-checkpoint"), data.published("pylate", "grad-checkpoint")
    timed_on = _timed_on(gc, published)
    assert len(timed_on) >= 2 and {card for _, card in timed_on} == {"h100-80gb"}
    ours = sorted({device.removeprefix("NVIDIA ") for device, _ in timed_on})
    agreement = prose.published_agreement(gc, published)
    if all("H100" not in device for device, _ in timed_on):  # the committed cells: none ran on an H100
        assert f"Our {len(timed_on)} timed cells ran on an {ours[0]}" in agreement and len(ours) == 1
        assert ", the published ones on an H100, so compare backends within one run, not across the two." in agreement
        assert "does not set" not in agreement
    some = gc.copy()
    some.loc[some["backend"] == "lik", "device_name"] = "NVIDIA H100 80GB HBM3"  # the fused cells ran on an H100
    mixed = prose.published_agreement(some, published)
    n_same = sum(device == "NVIDIA H100 80GB HBM3" for device, _ in _timed_on(some, published))
    assert 0 < n_same < len(timed_on)
    assert (f" {n_same} of our {len(timed_on)} timed cells ran on an H100 80GB HBM3, the GPU the published figures "
            "name, so the GPU does not set their times apart from the published ones; the other "
            f"{len(timed_on) - n_same} ran on an {ours[0]}, not an H100, so for those compare backends") in mixed
    everywhere = gc.copy()
    everywhere["device_name"] = "NVIDIA H100 80GB HBM3"
    alike = prose.published_agreement(everywhere, published)
    assert alike.endswith(f" Our {len(timed_on)} timed cells ran on an H100 80GB HBM3, the GPU the published figures "
                          "name, so the GPU does not set their times apart from the published ones.")
    assert "H200" not in alike and "compare backends within one run" not in alike


def test_the_gpus_are_counted_where_our_cells_ran_on_several_and_a_missing_one_is_said_to_be_unrecorded():
    assert prose.published_gpus([]) == ""
    assert prose.published_gpus([("NVIDIA H200", "h100-80gb"), (None, "h100-80gb"), ("NVIDIA H200", "h100-80gb")]) == (
        "Our 3 timed cells ran on an H200 (2) and an unrecorded GPU (1), the published ones on an H100, so compare "
        "backends within one run, not across the two")
    assert prose.published_gpus([("NVIDIA H100 PCIe", "h100-80gb")]) == (
        "Our 1 timed cell ran on an H100 PCIe, the GPU the published figures name, so the GPU does not set its time "
        "apart from the published ones")
    assert [text.card_gpu(card) for card in ("h100-80gb", "a100-40gb", "native")] == ["H100", "A100", None]
    assert not text.on_card_gpu("NVIDIA H200", "h100-80gb") and not text.on_card_gpu(None, "h100-80gb")
    assert text.on_card_gpu("NVIDIA GeForce RTX 4090", "rtx4090-24gb") and not text.on_card_gpu("NVIDIA H100", "native")


def test_the_published_agreement_says_on_which_side_of_the_published_step_peaks_ours_lie():
    """colpali.md / pylate-grad-checkpoint.md: 'our step peaks allocated lie 0.5–1.5% below the published ones'
    reads the Δ column of the table above it (its sizes, its signs), and 'equal … to the hundredth of a GiB'
    holds where every one of ours reads the published figure at its precision."""
    for stack, regime in [("colpali", "plain"), ("pylate", "grad-checkpoint")]:
        cells, published = data.select(CELLS, stack, regime), data.published(stack, regime)
        shown = tables.published_comparison(cells, published)
        column = [delta.replace("\u2212", "-").rstrip("%") for delta in shown["Δ step peak"] if delta != "—"]
        offsets = [float(delta) for delta in column]
        agreement = prose.published_agreement(cells, published)
        assert f"Where both runs trained ({len(offsets)} cells), our step peaks allocated " in agreement
        if all(offset == 0 for offset in offsets):
            assert "equal the published ones to the hundredth of a GiB (the Δ column)" in agreement
            continue
        sizes = sorted({abs(offset) for offset in offsets})
        side = "below" if max(offsets) <= 0 else "above" if min(offsets) >= 0 else None
        assert side is not None, "the committed Δ column lies on one side of the published peaks"
        assert f"lie {sizes[0]:.1f}–{sizes[-1]:.1f}% {side} the published ones (the Δ column)" in agreement
        assert "−" not in agreement.split("(the Δ column)")[0]  # the side says the sign: no signed figure beside it


def test_step_peak_offsets_read_below_above_either_side_or_equal():
    assert prose.peak_offsets([(29.09, 29.54), (54.11, 54.38)]) == (
        "our step peaks allocated lie 0.5–1.5% below the published ones")
    assert prose.peak_offsets([(30.0, 29.70)]) == "our step peak allocated lies 1.0% above the published one"
    assert prose.peak_offsets([(29.0, 29.5), (30.3, 30.0)]) == (
        "our step peaks allocated lie between 1.7% below and 1.0% above the published ones")
    assert prose.peak_offsets([(54.1043, 54.10), (29.7175, 29.72)]) == (
        "our step peaks allocated equal the published ones to the hundredth of a GiB")
    assert prose.peak_offsets([(54.12, 54.10)]) == "our step peak allocated lies 0.04% above the published one"


def _sentences(text):
    """A paragraph's sentences, split where a full stop ends one ('1.12×' and '0.5–1.5%' keep theirs)."""
    return [sentence for sentence in re.split(r"(?<=[.:])\s+(?=[A-Z0-9])", text) if sentence]


@pytest.mark.parametrize("stack, regime", [("colpali", "plain"), ("pylate", "plain"), ("pylate", "grad-checkpoint")])
def test_the_published_time_sentences_have_one_colon_at_most_and_none_in_a_bracket(stack, regime):
    """colpali.md / pylate-*.md: the lead over the published step-time table, the speed ratios after it and the
    agreement under the published table read one clause per bracket and at most one colon per sentence (the
    lead read "…interval: a published time is one figure, with no spread to resample:")."""
    cells, published = data.select(CELLS, stack, regime), data.published(stack, regime)
    table = tables.published_time_table(cells, published)
    texts = [prose.published_time_lead(table, published), prose.published_agreement(cells, published),
             prose.published_time_reading(cells, published, data.run_noise(RESULTS))]  # fmt: skip
    for paragraph in filter(None, texts):
        assert not any(":" in inside for inside in re.findall(r"\(([^()]*)\)", paragraph)), paragraph
        assert "): " not in paragraph, paragraph
        assert all(sentence.count(":") <= 1 for sentence in _sentences(paragraph)), paragraph
    assert texts[0].endswith(":") == (not table.empty)  # the lead's one colon, if any, opens the table
    if not table.empty:
        assert texts[0].count(":") == 1


@pytest.mark.parametrize("stack, regime", [("colpali", "plain"), ("pylate", "grad-checkpoint")])
def test_the_published_time_words_that_name_the_gpus_hold_for_the_cells_compared(stack, regime):
    """colpali.md / pylate-*.md: the step-time lead ("the published run timed its cells on an H100 80 GB, ours on an
    H200 capped to that card's memory"), the speed ratios' lead and the table's headers ("published s / step
    (H100)", "ours s / step (H200 as the 80 GB card)") name the GPUs as fixed words, unlike the agreement
    sentence, which computes them (prose.published_gpus): every cell they set beside a published time ran on
    an H200 under the 80 GB card's cap, and every published time is the H100 80 GB card's."""
    cells, published = data.select(CELLS, stack, regime), data.published(stack, regime)
    table = tables.published_time_table(cells, published)
    assert len(table) and set(published.dropna(subset=["step_sec"])["card"]) == {"h100-80gb"}
    assert {"published s / step (H100)", "ours s / step (H200 as the 80 GB card)"} <= set(table.columns)
    ok = tables.timed(cells)
    for _, ref in published.dropna(subset=["step_sec"]).iterrows():
        backend = data.backend_label(ref["variant"], ref["score_mini_batch_size"])
        mine = ok[(ok["batch_size"] == ref["batch_size"]) & (ok["backend"] == backend) & (ok["card"] == ref["card"])]
        assert set(mine["device_name"]) <= {"NVIDIA H200"}, (ref["batch_size"], backend)
    lead = prose.published_time_lead(table, published)
    assert "published run timed its cells on an H100 80 GB, ours on an H200 capped to that card's memory" in lead
