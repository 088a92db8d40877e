"""The pages' sentences about how far a batch goes, read from the ceiling searches (the finer
measurement) and checked against them: a sentence that says which backend binds first, or that one
fails where another trains, must be what the committed searches say."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from harness import host, host_memory
from harness.report import data, decision, prose, style, text
from harness.report.text import nowrap
from harness.search import Ceiling, CeilingSearch


def row(backend: str, card: str, fits: int | None, fails: int | None, where: str | None = None, done: bool = True,
        probes: int = 5, stack: str = "pylate", regime: str = "plain") -> data.SearchRow:  # fmt: skip
    variant, chunk = (backend, None) if "chunk" not in backend else ("vanilla", int(backend.split()[-1]))
    search = CeilingSearch(stack=stack, regime=regime, variant=variant, score_mini_batch_size=chunk, card=card,
                           seeds=(42, 43, 44), start=128, limit=4096, resolution=8)  # fmt: skip
    ceiling = Ceiling(fits=fits, fails=fails, next_batch=None if done else (fails or 2 * (fits or 64)))
    return data.SearchRow(search=search, ceiling=ceiling, probes=probes, usable_gib=78.43, fails_where=where)


@pytest.fixture(scope="module")
def searches():
    return data.ceilings(data.read())


def test_the_ceiling_reading_says_which_backend_binds_first_from_where_the_next_batch_failed():
    binds = [row("vanilla", "h100-80gb", 176, 184, "maxsim"), row("lik", "h100-80gb", 184, 192, "elsewhere"),
             row("flash", "native", None, None, done=False, probes=0), row("vanilla", "native", 304, 320, "maxsim"),
             row("lik", "native", 336, 352, "elsewhere")]  # fmt: skip
    assert prose.ceiling_reach(binds, "pylate", "plain") == [
        "On the 80 GB card: vanilla trains 176 (B=184 runs out of memory in the MaxSim op); lik trains 184 (B=192 runs "
        "out of memory outside the op) — vanilla's score grid binds first: its next batch fails in the MaxSim op, while "
        "the others train more (lik 184: up to 1.05× vanilla's batch).",
        "On the 141 GB (whole H200) card: vanilla trains 304 (B=320 runs out of memory in the MaxSim op); lik trains "
        "336 (B=352 runs out of memory outside the op); flash's search has not run — vanilla's score grid binds first: "
        "its next batch fails in the MaxSim op, while the others train more (lik 336: up to 1.11× vanilla's batch)."]
    same = [row("vanilla", "rtx4090-24gb", 48, 52, "elsewhere"), row("lik", "rtx4090-24gb", 48, 52, "elsewhere")]
    assert prose.ceiling_reach(same, "pylate", "plain")[0].endswith(
        "every backend stops at the same batch, outside the op: the score op is not what fills the card.")
    # a search under way decides nothing: its range is given and nothing is concluded
    running = [row("vanilla", "h100-80gb", 176, 184, "maxsim"), row("lik", "h100-80gb", 184, 256, done=False)]
    assert prose.ceiling_reach(running, "pylate", "plain") == [
        "On the 80 GB card: vanilla trains 176 (B=184 runs out of memory in the MaxSim op); lik 184–255 (searching)."]


@pytest.mark.parametrize("regime", ["plain", "grad-checkpoint"])
def test_the_pylate_pages_never_say_the_score_op_does_not_fill_a_card_where_vanilla_fails_in_it(searches, regime):
    """pylate-plain.md / pylate-grad-checkpoint.md lead: each card's sentence names vanilla's ceiling and
    where the batch above it died exactly as the search recorded it."""
    lines = prose.ceiling_reach(searches, "pylate", regime)
    assert lines
    for line in lines:
        card = next(r.card for r in searches if line.startswith(f"On the {prose.card_short(r.card)} card:"))
        vanilla = data.find_search(searches, "pylate", regime, "vanilla", card)
        assert vanilla is not None
        if vanilla.settled is not None and vanilla.fails is not None:
            where = prose.WHERE_FAILED[vanilla.fails_where or ""]
            assert f"vanilla trains {vanilla.settled} (B={vanilla.fails} runs out of memory {where})" in line
            if vanilla.fails_where == "maxsim":
                assert "the score op is not what fills the card" not in line
        if "binds first" in line:
            others = [r for r in searches if (r.stack, r.regime, r.card, r.allocator) == ("pylate", regime, card, "default")
                      and r.backend != "vanilla" and r.settled is not None]  # fmt: skip
            assert vanilla.fails_where == "maxsim" and any(r.settled > vanilla.settled for r in others), line


@pytest.fixture(scope="module")
def committed():
    results = data.read()
    cells, _ = data.load(results)
    return cells, data.ceilings(results), data.ceiling_probes(results)


def test_a_backend_is_said_to_train_what_vanilla_fails_only_once_both_searches_settle_it(committed):
    """colpali.md / intro.md, 'On the whole H200': 'vanilla scoring fails at a batch that lik trains' only
    where vanilla's search has finished and lik's settled ceiling reaches vanilla's failing batch on every
    seed; a search under way (ColQwen2 on 141 GB) leaves the backends 'not separated'."""
    cells, searches, probes = committed
    for stack, regime, card, backends in [("colpali", "plain", "native", ("vanilla", "lik")),
                                          ("colpali", "plain", "h100-80gb", ("vanilla", "lik")),
                                          ("pylate", "plain", "h100-80gb", ("vanilla", "lik", "flash"))]:  # fmt: skip
        text = prose.batch_reach(cells, searches, probes, stack, regime, card, backends)
        vanilla = data.find_search(searches, stack, regime, "vanilla", card)
        fused = [data.find_search(searches, stack, regime, b, card) for b in backends[1:]]
        beaten = (vanilla is not None and vanilla.settled is not None and vanilla.fails is not None
                  and any(r is not None and r.settled is not None and r.settled >= vanilla.fails for r in fused))  # fmt: skip
        assert ("vanilla scoring fails at a batch that" in text) == beaten, text
        if not beaten and any(r is None or r.settled is None for r in [vanilla, *fused]):
            assert "the searches have not separated the backends on this card" in text, text


def test_the_grid_cells_steps_are_read_from_their_specs_and_results(committed):
    """Pages say how long a grid cell trained from its grid's spec (steps, warm-up, min_steady_steps) and
    its result, never the spec's `steps` alone: a timed cell of `steps: 4` trains past it."""
    cells, _, _ = committed
    train = cells[cells["kind"] == "train"]
    least = [data.least_steps(row) for _, row in train.iterrows()]
    ok = train["outcome"] == "ok"
    assert (train.loc[ok, "n_steps_done"] >= pd.Series(least, index=train.index)[ok]).all()
    words = prose.grid_steps(train)
    done = train.loc[ok, "n_steps_done"]
    assert words.endswith(f": {done.min()}–{done.max()} steps") or words.endswith(f": {done.min()} steps"), words
    assert "4 steps" not in words or (train["steps"] == done.max()).all()


def test_an_oom_sentence_takes_its_figures_from_one_source(committed):
    """colpali.md / intro.md, ColQwen2 B=128: the peak figures are called the peak's, and what the error message
    says (allocated, reserved but unallocated) is given as the message's, so the two never read as one sum."""
    cells, _, probes = committed
    text = prose.grid_and_probes(cells, probes, "colpali", "plain", 128, "vanilla", "h100-80gb")
    row = cells[(cells["stack"] == "colpali") & (cells["card"] == "h100-80gb") & (cells["batch_size"] == 128)
                & (cells["backend"] == "vanilla") & (cells["grid"] == "published")].iloc[0]  # fmt: skip
    allocated, unallocated = prose.oom_held_mib(row["oom_message"])
    assert (f"{row['pre_oom_alloc_mib'] / 1024:.2f} GiB allocated, {row['pre_oom_reserved_mib'] / 1024:.2f} GiB reserved "
            "at the peak before it") in text  # fmt: skip
    assert (f"counts {allocated / 1024:.2f} GiB allocated and {unallocated / 1024:.2f} GiB reserved but unallocated "
            f"({(allocated + unallocated) / 1024:.2f} GiB reserved") in text  # fmt: skip


def test_the_published_peak_gap_is_compared_with_ours_read_the_same_way(committed):
    """ceilings.md: the published ColQwen2 B=128 failure's reserved − allocated at its peak, and the memory reserved
    but unallocated when its request failed, beside every run of ours that ran out at that batch — through the one
    reading the claims page shows (claims.oom_reading), so the two pages never read these figures differently."""
    from harness.report import claims

    cells, _, _ = committed
    results = data.read()
    evidence = claims.evidence(results)
    published = data.published("colpali", "plain")
    text = prose.published_failure(published, evidence)
    ref = published[(published["outcome"] == "oom") & published["step_peak_alloc_gib"].notna()].iloc[0]
    theirs = ref["step_peak_reserved_gib"] - ref["step_peak_alloc_gib"]
    reading = claims.oom_reading(evidence, "colpali", "plain", 128, "vanilla", "h100-80gb")
    assert reading and reading.removesuffix(".") in text and claims.oom_readings(evidence) == [reading]
    assert f"Published: {theirs:.2f} GiB at the peak" in text
    row = cells[(cells["stack"] == "colpali") & (cells["card"] == "h100-80gb") & (cells["batch_size"] == 128)
                & (cells["backend"] == "vanilla") & (cells["grid"] == "published")].iloc[0]  # fmt: skip
    ours = (row["pre_oom_reserved_mib"] - row["pre_oom_alloc_mib"]) / 1024
    allocated, unallocated = prose.oom_held_mib(row["oom_message"])
    assert f"the grid cell (seed {row['seed']}): {ours:.2f} GiB at the peak, {unallocated / 1024:.2f} GiB when its" in text
    probes = data.ceiling_probes(results)
    failed = data.matching(probes, stack="colpali", card="h100-80gb", batch_size=128, backend="vanilla",
                           allocator="default", outcome="oom")  # fmt: skip
    assert len(failed)
    for _, probe in failed.iterrows():
        gap = (probe["pre_oom_reserved_mib"] - probe["pre_oom_alloc_mib"]) / 1024
        assert f"the ceiling probe (seed {probe['seed']}): {gap:.2f} GiB at the peak" in text
    gaps = [ours] + [(p["pre_oom_reserved_mib"] - p["pre_oom_alloc_mib"]) / 1024 for _, p in failed.iterrows()]
    agree = all(abs(gap - theirs) <= max(0.025 * theirs, 16 / 1024) for gap in gaps)
    assert ("At the peak, every run of ours agrees with the published figure" in text) == agree


def test_the_intro_pages_list_names_every_chapter():
    """intro.md, 'Pages': every chapter of the table of contents is listed (GradCache and gathered were missing)."""
    import yaml

    from test_book import ROOT

    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    intro = (ROOT / "book" / "intro.md").read_text()
    listed = intro[intro.index("## Pages"):]
    missing_pages = [chapter["file"] for chapter in toc["chapters"] if f"{{doc}}`{chapter['file']}`" not in listed]
    assert not missing_pages


def test_the_intro_predictions_are_the_predict_pages_model_rounded_to_each_search(searches):
    """intro.md: 'pred. N' is the model of predict.md's table for every card, rounded down to the search's
    resolution — the same fit, so the two pages never disagree beyond that rounding."""
    from harness import memmodel
    from harness.report import predictions

    model, _ = predictions.fitted(data.read())
    assert model is not None
    rows = {(r["stack"], r["regime"], r["backend"], r["card"]): r["predicted_largest_batch"] for r in memmodel.table(model)}
    predicted = predictions.ceiling_predictions(searches, model)
    assert predicted
    for key, batch in predicted.items():
        search = data.find_search(searches, *key)
        assert search is not None
        table = rows[key]
        assert batch == min(search.search.limit, table // search.search.resolution * search.search.resolution), key


def test_a_card_we_searched_shows_its_measured_ceiling_beside_the_prediction(searches):
    """predict.md: no card that a ceiling search ran on shows a prediction alone (an RTX4090 'vanilla 271*'
    beside a measured 224 read as a contradiction)."""
    from harness import memmodel
    from harness.report import predictions
    from harness.report.text import ceiling_entry

    model, _ = predictions.fitted(data.read())
    rows = memmodel.table(model)
    for stack, regime in predictions.recipes(rows):
        table = predictions.cards_table(rows, stack, regime, searches)
        for row in searches:
            if (row.stack, row.regime, row.allocator) != (stack, regime, "default") or row.probes == 0:
                continue
            name = predictions._card(row.card).replace(" ", "\u00a0")
            label = next(c for c in table["card (usable GiB)"] if c.startswith(name))
            cell = table.loc[table["card (usable GiB)"] == label, nowrap(style.short(row.backend))].iloc[0]
            measured = ceiling_entry(row)  # a running search: the range, marked as on the intro
            assert f"measured {nowrap(measured)}" in cell, (row.card, row.backend, cell)


def test_no_published_time_heading_stands_over_an_empty_table():
    """colpali.md / pylate-*.md: the sentence before the published step-time table says there is none when
    the table is empty (PyLate without checkpointing has no published step time)."""
    from harness.report import tables

    results = data.read()
    cells, _ = data.load(results)
    for stack, regime in [("colpali", "plain"), ("pylate", "plain"), ("pylate", "grad-checkpoint")]:
        published = data.published(stack, regime)
        table = tables.published_time_table(data.select(cells, stack, regime), published)
        lead = prose.published_time_lead(table, published)
        assert lead.endswith(":") == (not table.empty), (stack, regime, lead)


def test_a_signed_figure_uses_a_true_minus():
    from harness.report.text import percent, signed

    assert percent(-1.5) == "\u22121.5%" and percent(2.0) == "+2.0%" and percent(-0.01) == "0%"
    assert signed(-0.5) == "\u22120.50" and signed(0.001) == "0"


def test_the_speed_intervals_are_said_to_be_within_a_run_and_set_against_each_recipes_noise():
    """methodology.md: a narrow bootstrap interval is the noise within a run; the page names each recipe's
    run-to-run noise (the repeats and the cap twins, as the recipe pages use it, not one global figure)
    and every measurable lik ratio whose interval reaches into its own recipe's band."""
    import re

    from harness.report import timing
    from harness.report.text import regime_label

    results = data.read()
    cells, _ = data.load(results)
    noise = data.run_noise(results)
    text = prose.interval_scope(noise, cells)
    if not noise.by_regime:
        assert text == ""
        return
    for (stack, regime), gap in noise.by_regime.items():
        assert f"{regime_label(stack, regime)}, {100 * gap:.1f}% over {noise.pairs[(stack, regime)]} pair" in text
    for (stack, regime), (gap, pairs, n) in noise.too_few.items():  # GradCache's three pairs of one cell
        assert n < timing.NOISE_MIN_CELLS and noise.of(stack, regime) == noise.widest
        assert f"{regime_label(stack, regime)} the {pairs} pair" in text and f"({100 * gap:.1f}%)" in text
        assert f"the widest, {100 * noise.widest:.1f}%" in text
    # PyLate grad-checkpoint's noise is no longer its two repeats' alone: its cap twins widen it
    repeats_only = timing.run_noise(data.repeats(results))
    assert noise.of("pylate", "grad-checkpoint") > repeats_only.of("pylate", "grad-checkpoint")
    named = re.findall(r"(\S+ · [a-z-]+) B=(\d+) on ([^,]+), ([0-9.]+)× \(([0-9.]+)–([0-9.]+)\)", text)
    assert named  # PyLate plain's 1.08× (1.02–1.10) at B=64 on 80 GB among them
    labels = {regime_label(stack, regime): (stack, regime) for stack, regime in noise.by_regime}
    for label, _, _, _, low, high in named:
        band = noise.of(*labels[label])
        assert float(low) > 1 or float(high) < 1  # measurable within the run
        assert float(low) <= 1 + band + 0.005 and float(high) >= 1 - band - 0.005  # reaches into 1 ± noise
    assert f", {len(named)} reach into their recipe's noise" in text  # the count is the list's
    assert "pylate · plain B=64 on 80 GB, 1.08× (1.02–1.10)" in text


def test_the_results_table_shows_a_time_only_for_a_cell_timed_alone():
    """results.md: probes and op cells that shared their host show no step time (the timing rule)."""
    from harness.report import results_table

    cells = data.all_cells(data.read())
    table = results_table.rows(cells)
    shown = table["time per step (s)"] != ""
    assert (table.loc[shown, "times"] == results_table.TIMED).all()
    assert (table["times"] == results_table.TIMED).sum() == int(cells["times_comparable"].fillna(False).astype(bool).sum())


def test_a_speed_named_on_the_front_page_lies_beyond_its_regimes_run_to_run_noise(searches):
    """intro.md: a ratio a second run could undo (its interval reaching into 1 ± its regime's run-to-run
    noise, the repeats and cap twins) is said as no difference, however narrow that interval; every ratio
    named faster or slower has its whole interval beyond that noise (to the printed digits)."""
    import re

    from harness.report import decision

    results = data.read()
    cells, _ = data.load(results)
    noise = data.run_noise(results)
    timed = 0
    for stack, regime in decision.regimes(searches):
        found = decision.timed_batch(cells, stack, regime, noise=noise)
        if found is None:
            continue
        assert found.noise == noise.of(stack, regime)
        timed += 1
        text = decision.time_words(found)
        for backend, ratio in found.against_vanilla.items():
            if ratio.measurable and not ratio.beyond(found.noise):
                said = rf"{re.escape(backend)} (?:[0-9.]+ s, )?no difference beyond run-to-run noise \("
                assert re.search(said, text), (stack, regime, backend, text)
        # every ratio named faster or slower has its whole interval outside 1 ± the noise (to the printed digits)
        for low, high in re.findall(r"(?<!noise \()\b\d+\.\d+× (?:faster|slower) \((\d+\.\d+)–(\d+\.\d+)\)", text):
            assert found.noise is None or float(low) - 1 > found.noise - 0.005, (stack, regime, low, high, text)
    assert timed >= 3  # ColQwen2 and PyLate's two regimes have vanilla and a fused backend timed at one batch


def test_a_search_stopped_by_a_crash_says_why_from_the_probes_marker():
    crashed = Ceiling(fits=288, next_batch=320, stopped="probe x crashed", crashed="colpali-plain-b320-lik-native")
    stopped = dataclasses.replace(row("lik", "native", 288, None, stack="colpali"), ceiling=crashed,
                                  crash_message="RuntimeError: worker exited")  # fmt: skip
    settled = row("vanilla", "native", 224, 240)
    assert text.ceiling_text(stopped) == "≥ 288 (the probe at 320 crashed)"
    assert prose.crash_reading([stopped, settled]) == (
        "Stopped by a crash: ColQwen2 lik on 141 GB (whole H200), the probe at 320 — RuntimeError: worker exited. "
        "`harness ceiling --rerun-crashed` runs a crashed probe again.")  # fmt: skip
    assert prose.crash_reading([settled]) == ""
    # one the host's out-of-memory killer ended: said so, and a rerun on the same host is not offered
    killed = dataclasses.replace(stopped, crash_message="the kernel stopped" + host.oom_kill_words(0, 2))
    assert text.ceiling_text(killed) == "≥ 288 (the probe at 320 ran out of host memory)"
    assert prose.crash_reading([killed]) == (
        "Stopped by a crash: ColQwen2 lik on 141 GB (whole H200), the probe at 320 — the host's out-of-memory killer "
        "killed 2 processes of this cell's control group while it ran (oom_kill 0 → 2): the host's memory, not the "
        "GPU's, ran out. A probe the host's memory ended is settled on a host with more memory, or by a search of its own "
        "with fewer dataloader workers.")  # fmt: skip


def test_a_colpali_probe_the_host_memory_ended_says_what_collating_its_batch_asks(tmp_path):
    killed = dataclasses.replace(
        row("lik", "native", 288, None, stack="colpali"),
        ceiling=Ceiling(fits=288, next_batch=320, stopped="probe x crashed", crashed="colpali-plain-b320-lik-native"),
        crash_message="the kernel stopped" + host.oom_kill_words(0, 2))  # fmt: skip
    measured = [{"batch_size": 32, "seed": 42, "batch_tensors_mib": 320.0, "rss_before_mib": 1000.0,
                 "peak_rss_mib": 1000.0 + 32 * 50.0, "pixel_values_shape": [1, 1]},
                {"batch_size": 128, "seed": 42, "batch_tensors_mib": 1280.0, "rss_before_mib": 1000.0,
                 "peak_rss_mib": 1000.0 + 128 * 54.0, "pixel_values_shape": [1, 1]}]  # fmt: skip
    written = json.loads(host_memory.write(measured, tmp_path / host_memory.FOLDER / "colpali.json").read_text())
    assert written["provenance"]["harness_sha256"] and written["dataloader_workers"] == 4  # the recipe's
    (tmp_path / host_memory.FOLDER / "broken.json").write_text("{")  # a broken file is named and left out
    (tmp_path / host_memory.FOLDER / "foreign.json").write_text('{"kind": "op-parity"}')
    documents, skipped = host_memory.read_all(tmp_path)
    assert len(documents) == 1 and [item.path.name for item in skipped] == ["broken.json", "foreign.json"]
    assert skipped[0].reason.startswith("unreadable: ") and "not a host-memory record" in skipped[1].reason
    assert {item.path.name for item in data.read(tmp_path).skipped} == {"broken.json", "foreign.json"}
    collate = host_memory.per_page(host_memory.read(tmp_path))
    assert collate["collate_mib_per_page"].tolist() == [50.0, 54.0]
    # 4 workers × 320 pages × 50–54 MiB = 62.5–67.5 GiB
    assert prose.crash_reading([killed], collate).endswith(
        "A probe the host's memory ended is settled on a host with more memory, or by a search of its own with fewer "
        "dataloader workers. Collating a ColQwen2 batch "
        "on the CPU raised a process's peak resident memory by 50–54 MiB a page (batches of 32, 128 pages, "
        "`tools/collate_host_memory.py`), and each of the recipe's 4 dataloader workers collates a whole batch: at "
        "B = 320 that is ≈ 62–68 GiB of host memory while all 4 collate at once, before the collated batches they "
        "hand to the trainer.")  # fmt: skip
    # without measurements, or for a probe that crashed otherwise, nothing is added
    assert prose.crash_reading([killed], pd.DataFrame()) == prose.crash_reading([killed])
    crashed = dataclasses.replace(killed, crash_message="RuntimeError: worker exited")
    assert "Collating" not in prose.crash_reading([crashed], collate)


def test_the_committed_collate_measurements_are_per_page_and_grow_with_the_batch(searches):
    collate = host_memory.per_page(host_memory.read())
    killed = [row for row in searches if row.stack == "colpali" and text.ran_out_of_host_memory(row)]
    assert ("Collating a ColQwen2 batch" in prose.crash_reading(searches, collate)) == bool(killed)
    assert len(collate) >= 2
    # collating grows with the batch: the rise a page stays within 10% over a 4× range of batches
    assert collate["collate_mib_per_page"].max() / collate["collate_mib_per_page"].min() < 1.1
    assert (collate["collate_mib"].diff().dropna() > 0).all()
    assert (collate["tensors_mib_per_page"] > 0).all()


def test_the_committed_crash_reading_names_every_stopped_search(searches):
    reading = prose.crash_reading(searches)
    stopped = [row for row in searches if row.ceiling.crashed]
    assert (reading == "") == (not stopped)
    assert all(f"the probe at {row.ceiling.next_batch}" in reading and row.crash_message.split("; ")[-1] in reading
               for row in stopped)  # fmt: skip


def test_the_allocator_reading_goes_by_stack_then_card_from_the_smallest_then_backend():
    both = []
    for backend, card, stack in [("lik", "h100-80gb", "pylate"), ("vanilla", "h100-80gb", "pylate"),
                                 ("vanilla", "rtx4090-24gb", "pylate"), ("vanilla", "native", "colpali")]:  # fmt: skip
        default = row(backend, card, 176, 184, stack=stack)
        expandable = dataclasses.replace(default, search=default.search.model_copy(update={"allocator": "expandable"}))
        both += [default, expandable]
    lines = prose.allocator_reading(both)
    assert [line.split(":")[0] for line in lines] == [
        "colpali · recipe (grad-checkpointed), vanilla on 141 GB (the whole H200)",
        "pylate · plain, vanilla on 24 GB (RTX4090 profile, capped at 22.96 GiB)",
        "pylate · plain, vanilla on 80 GB (H100 profile, capped at 78.43 GiB)",
        "pylate · plain, lik on 80 GB (H100 profile, capped at 78.43 GiB)"]  # fmt: skip


def probe_result(search: CeilingSearch, batch: int, seed: int, alloc: list[float], reserved: list[float]):
    from harness.results import CellResult
    from harness.spec import with_fields

    spec = with_fields(search.probe(batch, seed), preset="full", device="cuda")
    return CellResult(grid="ceilings", cell_id=spec.cell_id, spec=spec, outcome="ok", step_times_sec=[1.0] * len(alloc),
                      step_peak_alloc_mib=max(alloc), step_peak_reserved_mib=max(reserved),
                      step_peak_alloc_per_step_mib=alloc, step_peak_reserved_per_step_mib=reserved)  # fmt: skip


def made_results(made) -> data.Results:
    """Results as the report reads them, of results made in a test (each at its cell id's file name)."""
    return data.Results(Path("."), tuple((Path(f"{result.cell_id}.json"), result) for result in made), ())


def test_a_search_with_fewer_dataloader_workers_answers_for_the_recipe_s_and_checks_the_gpu_bytes():
    from harness.search import Probes

    recipe = CeilingSearch(stack="colpali", regime="plain", variant="lik", card="native", seeds=(42, 43, 44), start=256,
                           step=16, limit=512, resolution=16)  # fmt: skip
    fewer = CeilingSearch(**recipe.model_dump() | {"dataloader_workers": 1, "start": 288})
    assert fewer.search_id == "colpali-plain-lik-native-dw1"
    killed = Ceiling(fits=288, next_batch=320, stopped="probe x crashed", crashed="colpali-plain-b320-lik-native")
    recipe_row = data.SearchRow(search=recipe, ceiling=killed, probes=4, usable_gib=139.8,
                                crash_message="the kernel stopped" + host.oom_kill_words(0, 2))  # fmt: skip
    fewer_row = data.SearchRow(search=fewer, ceiling=Ceiling(fits=320, fails=336), probes=5, usable_gib=139.8)
    both = [probe_result(search, 288, 42, [70_000.0, 71_000.0], [80_000.0, 80_000.0]) for search in (recipe, fewer)]
    both[1] = both[1].model_copy(update={"step_peak_alloc_per_step_mib": [70_000.0, 71_003.0]})
    probes = {recipe: Probes(recipe, {both[0].cell_id: both[0]}), fewer: Probes(fewer, {both[1].cell_id: both[1]})}
    pylate = row("lik", "native", 2304, 2432)
    # the recipe's search keeps its place (after nothing, before PyLate's), answered by the one with fewer workers
    merged = data.with_fewer_workers([recipe_row, pylate, fewer_row], probes)
    assert [r.search for r in merged] == [fewer, pylate.search] and merged[0].recipe == recipe_row
    assert merged[0].loader_check == (data.LoaderCheck(288, 42, 3.0, 0.0),)
    assert text.ceiling_text(merged[0]) == "320‡" and text.ceiling_text(pylate) == "2304"
    assert prose.loader_reading(merged) == (
        "‡ The dataloader workers collate pages on the host; where the lent host's memory cannot hold the recipe's, a "
        "search runs with fewer. ColQwen2 lik on 141 GB (whole H200) trained with 1 dataloader worker: with the recipe's "
        "4 its search stands at ≥ 288 (the probe at 320 ran out of host memory). At B=288, trained both ways (1 probe), "
        "every step's peaks differ by at most 3 MiB allocated and 0 MiB reserved.")  # fmt: skip
    # before the search with fewer workers has a probe, the recipe's answers alone, and nothing is said
    alone = data.with_fewer_workers([recipe_row, pylate, dataclasses.replace(fewer_row, probes=0)], probes)
    assert alone == [recipe_row, pylate] and prose.loader_reading(alone) == ""
    # with probes but none trained both ways, the check is said to be missing
    unchecked = data.with_fewer_workers([recipe_row, fewer_row], {recipe: Probes(recipe, {}), fewer: probes[fewer]})
    assert unchecked[0].loader_check == () and prose.loader_reading(unchecked).endswith(
        "No batch has trained both ways yet: whether the workers change the GPU's bytes is unchecked.")
    # a search with fewer workers and no recipe twin (the whole H200 under expandable segments) answers alone
    lone = dataclasses.replace(fewer_row, search=CeilingSearch(**fewer.model_dump() | {"allocator": "expandable"}))
    assert data.with_fewer_workers([lone], {lone.search: Probes(lone.search, {})}) == [lone]
    assert "ColQwen2 lik on 141 GB (whole H200), expandable segments trained with 1 dataloader worker, the recipe's 4 " \
           "never tried." in prose.loader_reading([lone])


def test_what_the_seed_changed_is_read_from_the_probes_and_backs_the_searches_that_train_one_seed():
    from harness.results import OpCall

    def call(query: int, document: int) -> OpCall:
        return OpCall(call_index=0, variant="lik", query_shape=[64, query, 128], doc_shape=[1024, 2, document, 128],
                          dtype="float32", predicted_grid_mib=1.0)  # fmt: skip

    cached = CeilingSearch(stack="pylate", regime="gradcache", variant="lik", mini_batch_size=64, card="native",
                           seeds=(42, 43, 44), start=1024, limit=16384, resolution=512)  # fmt: skip
    recipe = CeilingSearch(stack="colpali", regime="plain", variant="vanilla", card="h100-80gb", seeds=(42, 43),
                           start=120, limit=512, resolution=8)  # fmt: skip
    made = [probe_result(cached, 1024, seed, [14_000.0, 14_500.0 + seed - 42], [15_000.0, 15_002.0])
            for seed in (42, 43, 44)]  # fmt: skip
    made.append(probe_result(cached, 2048, 42, [20_000.0], [21_000.0]))  # one seed: nothing to compare
    crashed = probe_result(cached, 2048, 43, [1.0], [1.0]).model_copy(update={"outcome": "crashed"})
    made = [result.model_copy(update={"maxsim_calls_in_train": [call(48, 300)]}) for result in made] + [crashed]
    recipe_made = [probe_result(recipe, 128, 42, [70_000.0, 71_000.0], [75_000.0, 76_000.0]),
                   probe_result(recipe, 128, 43, [72_000.0], [79_000.0]).model_copy(update={"outcome": "oom"})]
    recipe_made = [result.model_copy(update={"maxsim_calls_in_train": [call(40 + i, 770)]})
                   for i, result in enumerate(recipe_made)]  # fmt: skip
    results = made_results(made + recipe_made)
    effects = [data.seed_effect(results, "pylate"), data.seed_effect(results, "colpali")]
    assert effects == [data.SeedEffect("pylate", ("gradcache",), 1, 2, 2.0, 0.0, (), ((48, 300),)),
                       data.SeedEffect("colpali", ("plain",), 1, 1, 2000.0, 4000.0,
                                       ("colpali-plain-b128-vanilla-h100-80gb-s43",), ((40, 770), (41, 770)))]  # fmt: skip
    one_seed = CeilingSearch(**cached.model_dump() | {"seeds": (42,)})
    rows = [data.SearchRow(search=one_seed, ceiling=Ceiling(next_batch=2048), probes=1, usable_gib=139.8),
            data.SearchRow(search=recipe, ceiling=Ceiling(fits=120, fails=128), probes=3, usable_gib=78.4)]
    assert prose.one_seed_reading(rows, effects) == (
        "The search of pylate · gradcache trains seed 42 alone. A seed draws other data; every PyLate score call had "
        "queries of 48 tokens and documents of 300, whatever the seed: at 1 batch probed on several seeds (gradcache; 2 "
        "later-seed probes), a step's peaks came within 2 MiB allocated and 0 MiB reserved of the first seed's, and none "
        "ended otherwise than the first seed — so the one seed answers for the others. Not so everywhere: ColQwen2's "
        "score calls came in 2 (query, document) lengths: at 1 batch probed on several seeds (recipe (grad-checkpointed); "
        "1 later-seed probe), a step's peaks came within 2000 MiB allocated and 4000 MiB reserved of the first seed's, "
        "and 1 ended otherwise than the first seed (colpali-plain-b128-vanilla-h100-80gb-s43); its searches keep every "
        "seed.")  # fmt: skip
    # evidence from other regimes of the stack only: the rule is said to carry over, and the regime's
    # searches that keep every seed are named as its own check
    elsewhere = [dataclasses.replace(effects[0], regimes=("grad-checkpoint", "plain"))]
    checking = data.SearchRow(search=cached, ceiling=Ceiling(next_batch=1024), probes=0, usable_gib=139.8)
    assert prose.one_seed_reading([rows[0], checking], elsewhere).endswith(
        "— so one seed should answer for the others in pylate · gradcache too, where no batch has run on several "
        "seeds yet; there, lik's search on 141 GB (whole H200) keeps every seed: the regime's own check.")
    # a seed that changed an outcome in the one-seed searches' own stack withdraws the rule; no evidence neither
    changed = [dataclasses.replace(effects[0], differing=("x",))]
    for effect in (changed, []):
        assert prose.one_seed_reading(rows[:1], effect).endswith(
            "— which does not show that one seed answers for the others: these searches need their other seeds.")
    assert prose.one_seed_reading(rows[1:], effects) == ""
    assert decision.criterion(rows + rows[1:]) == (
        "8 steps on each of seeds 42 and 43 (pylate · gradcache: 8 steps on seed 42 for 1 search)")
    # a one-seed search not run yet answers nothing, so nothing qualifies its terms
    not_run = [dataclasses.replace(rows[0], probes=0), rows[1]]
    assert prose.one_seed_reading(not_run, effects) == ""
    assert decision.criterion(not_run) == "8 steps on each of seeds 42 and 43"


def test_the_searches_that_train_one_seed_are_pylate_s_whose_seeds_never_changed_a_probe(searches):
    """grids/ceilings.yaml: GradCache's searches train seed 42 alone (but for the regime's own check)
    because no PyLate seed has changed an outcome, or a step's peaks by 64 MiB (ceilings.md computes the
    sentence; this fails the day a committed confirmation disagrees, and the rule must be revisited)."""
    results = data.read()
    assert {(row.stack, row.regime) for row in searches if len(row.search.seeds) == 1} == {("pylate", "gradcache")}
    assert any(row.regime == "gradcache" and len(row.search.seeds) == 3 for row in searches)  # its own check
    pylate = data.seed_effect(results, "pylate")
    assert pylate.batches >= 40 and pylate.differing == () and pylate.lengths == ((48, 300),)
    assert pylate.alloc_mib < 64 and pylate.reserved_mib < 64
    assert data.seed_effect(results, "colpali").differing  # the contrast the page draws: ColQwen2's seeds do


def test_a_loader_check_with_no_difference_says_the_peaks_are_the_same():
    """ColQwen2 lik's B=288 on the whole H200 trained with 1 and with 4 dataloader workers: where every
    step's peaks match to the MiB, the page says so instead of 'differ by at most 0 MiB'."""
    searches = data.ceilings(data.read())
    checked = [row for row in searches if row.loader_check]
    text = prose.loader_reading(searches)
    assert "differ by at most 0 MiB allocated and 0 MiB reserved" not in text
    for row in checked:
        checks = row.loader_check
        same = round(max(c.alloc_mib for c in checks)) == 0 and round(max(c.reserved_mib for c in checks)) == 0
        assert ("are the same to the MiB" in text) == same or len(checked) > 1


def test_the_colpali_page_keys_the_loader_mark_only_under_a_reach_that_shows_it(searches):
    """colpali.md: under the whole H200's reach, the key to ‡ is the loader reading of that card's searches where
    the reach shows the mark, and nothing where it does not."""
    from harness.report.text import LOADER_MARK

    colpali = [row for row in searches if (row.stack, row.regime) == ("colpali", "plain")]
    native = [row for row in colpali if row.card == "native"]
    marked = [row for row in native if row.search.dataloader_workers is not None and row.probes]
    assert marked  # the committed ColQwen2 lik search on the whole H200 collated with fewer workers
    reach = prose.batch_reach(data.load()[0], searches, data.ceiling_probes(data.read()), "colpali", "plain", "native")
    assert LOADER_MARK in reach
    key = prose.loader_key(reach, colpali, "native")
    assert key == prose.loader_reading(native) and key.startswith(f"{LOADER_MARK} ")
    assert prose.loader_key(reach.replace(LOADER_MARK, ""), colpali, "native") == ""
    other = [row for row in colpali if row.card != "native" and row.search.dataloader_workers is not None and row.probes]
    assert all(prose._search_name(row) not in key for row in other)  # only that card's searches


def test_the_ceilings_page_marks_a_running_search_as_every_page_does(searches):
    """ceilings.md: a search still under way reads 'A–B*' in its tables, as on the front page, never
    'A–B (searching)', and the page's key explains the mark."""
    from harness.report import tables
    from harness.report.text import LOADER_MARK, RUNNING_MARK

    running = [row for row in searches if row.running]
    assert running  # the committed results hold searches still under way (ColQwen2 lik)
    for allocator in ("default", "expandable"):
        grid = tables.ceiling_grid(searches, allocator)
        assert not grid.map(lambda entry: "searching" in entry).any().any()
    details = tables.ceiling_details(searches)
    assert not details.map(lambda entry: "searching" in str(entry)).any().any()
    for row in running:
        shown = details[(details["backend"] == row.backend) & details["card · allocator"].str.endswith(row.allocator)
                        & (details["stack · regime"] == text.regime_label(row.stack, row.regime))]["ceiling"]  # fmt: skip
        bracket = f"≥ {row.fits}" if row.fails is None else f"{row.fits}–{row.fails - 1}"
        expected = bracket + (LOADER_MARK if row.search.dataloader_workers is not None else "") + RUNNING_MARK
        assert expected in set(shown), (row.card, row.allocator, set(shown))
    page = (Path(__file__).parents[1] / "book" / "ceilings.md").read_text()
    key = text.ceiling_key(figure=True)  # the page's key (test_every_page_with_a_table_of_ceilings_shows_the_one_key)
    assert f"an entry marked `{RUNNING_MARK}`" in key and f"`A–B{RUNNING_MARK}`" in key and "(searching)" not in page
    assert "ceiling_key(figure=True)" in page and "{glue:md}`ceiling_key`" in page


def _marks_in(*functions: object) -> dict[str, str]:
    """The mark constants (``*_MARK``) the source of ``functions`` names, with their marks."""
    import inspect
    import re

    source = "".join(inspect.getsource(function) for function in functions)  # type: ignore[arg-type]
    return {name: getattr(text, name) for name in sorted(set(re.findall(r"\b[A-Z_]+_MARK\b", source)))}


def test_the_key_names_every_mark_a_ceiling_entry_carries_and_follows_the_constants(monkeypatch):
    """text.ceiling_key, the one key to a table of ceilings: every mark constant that ceiling_text and
    ceiling_entry write (read from their source, so a new mark there fails here until the key explains it),
    and those of the decision table's entries (decision.entry) in the compact key, each in the form the
    table shows; and it is written from the constants, so a mark changed in one place changes the tables'
    entries and the key alike."""
    entry_marks = _marks_in(text.ceiling_text, text.ceiling_entry, text._answer, text.below_words)
    assert set(entry_marks) == {"RUNNING_MARK", "LONG_RUN_MARK", "LOADER_MARK", "EARLIER_DRAW_MARK"}
    assert set(_marks_in(decision.entry)) <= set(entry_marks)  # the compact entries add no mark of their own
    forms = {"RUNNING_MARK": ["`A–B{}`", "`≥ A{}`", "an entry marked `{}`"], "LOADER_MARK": ["`N{}`"],
             "LONG_RUN_MARK": ["`N{} (OOM at step k of S; M trained all S)`"], "EARLIER_DRAW_MARK": ["`N{}`"]}  # fmt: skip
    compact_forms = forms | {"LONG_RUN_MARK": ["`N{}`,"]}
    for name, mark in entry_marks.items():
        for figure in (False, True):
            full, compact = text.ceiling_key(figure=figure), text.ceiling_key(compact=True, figure=figure)
            assert all(form.format(mark) in full for form in forms[name]), (name, full)
            assert all(form.format(mark) in compact for form in compact_forms[name]), (name, compact)
            assert (f"a {text.LONG_RUN_MARK} beside its marker" in full + compact) == figure
    running = row("lik", "h100-80gb", 256, 512, done=False)
    settled = row("lik", "native", 288, 296, stack="colpali")
    loader = dataclasses.replace(settled, search=settled.search.model_copy(update={"dataloader_workers": 2}))
    assert text.ceiling_entry(running) == f"256–511{text.RUNNING_MARK}" and text.ceiling_entry(loader) == f"288{text.LOADER_MARK}"
    earlier = dataclasses.replace(settled, ceiling=dataclasses.replace(settled.ceiling, next_batch=288, earlier_draw=True))
    assert text.ceiling_entry(earlier) == f"288{text.EARLIER_DRAW_MARK}" and not earlier.running
    for name, other in (("RUNNING_MARK", "§"), ("LOADER_MARK", "¶"), ("LONG_RUN_MARK", "‖"), ("EARLIER_DRAW_MARK", "¤")):
        monkeypatch.setattr(text, name, other)
    assert text.ceiling_entry(running) == "256–511§" and text.ceiling_entry(loader) == "288¶"
    moved = text.ceiling_key(figure=True) + text.ceiling_key(compact=True, figure=True)
    assert "`A–B§`" in moved and "`N¶`" in moved and "`N‖`," in moved and "a ‖ beside its marker" in moved
    assert text.ceiling_entry(earlier) == "288¤" and "`N¤`" in moved
    assert not any(mark in moved for mark in entry_marks.values())  # none of the old marks is left


PAGES_WITH_CEILINGS = {"decision.answer(": "the decision table", "ceiling_grid(": "the ceilings grid",
                       "scaling.ceiling_table(": "the gathered ceilings"}  # fmt: skip


def test_every_page_with_a_table_of_ceilings_shows_the_one_key():
    """Every page that shows a table of ceiling entries glues text.ceiling_key into its text, compact where
    the table is the decision table (its entries are decision.entry's), with the figures' mark where it
    draws ceilings (plots.draw_ceilings); no page types a mark or a key of its own."""
    from myst_nb.core.read import read_myst_markdown_notebook

    book = Path(__file__).parents[1] / "book"
    shown = []
    for path in sorted(book.glob("*.md")):
        notebook = read_myst_markdown_notebook(path.read_text())
        code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
        prose_text = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
        assert text.LONG_RUN_MARK not in prose_text and text.LOADER_MARK not in prose_text, path.name
        assert f"A–B{text.RUNNING_MARK}" not in prose_text and "entry marked" not in prose_text, path.name
        if not any(call in code for call in PAGES_WITH_CEILINGS):
            continue
        shown.append(path.stem)
        assert "{glue:md}`ceiling_key`" in prose_text, path.name
        (call,) = [line for line in code.splitlines() if "ceiling_key(" in line and "import" not in line]
        assert call.startswith('glue("ceiling_key", Markdown(ceiling_key('), path.name
        assert ("compact=True" in call) == ("decision.answer(" in code), path.name
        assert ("figure=True" in call) == ("plot_decision(" in code or "plot_ceiling_bars(" in code), path.name
    assert sorted(shown) == ["ceilings", "colpali", "gathered", "intro"]


def test_a_regime_whose_probes_train_fewer_steps_rests_on_its_longer_cells_never_rising_after_them():
    """ceilings.md / pylate-gradcache.md: GradCache probes train 4 steps (harness.search.MIN_STEPS_OF) because
    its longer cells reserved nothing more after their 4th step; the sentence is computed from those cells, says
    where one rose, and contrasts the regimes that keep 8 steps."""
    cached = CeilingSearch(stack="pylate", regime="gradcache", variant="lik", mini_batch_size=64, card="native",
                           seeds=(42,), steps=4, start=1024, limit=16384, resolution=512)  # fmt: skip
    checkpointed = CeilingSearch(stack="pylate", regime="grad-checkpoint", variant="vanilla", card="h100-80gb",
                                 seeds=(42,), start=512, limit=4096, resolution=32)  # fmt: skip
    longer = [probe_result(CeilingSearch(**cached.model_dump() | {"steps": 9}), batch, 42,
                           [14_000.0, 14_500.0, 14_501.0, 14_502.0, 14_503.5, 14_501.0, 14_500.0, 14_500.0, 14_500.0],
                           [15_000.0, 15_600.0, 15_600.0, 15_600.0, 15_600.0, 15_600.0, 15_600.0, 15_600.0, 15_600.0])
              for batch in (1024, 4096)]  # fmt: skip
    short = probe_result(cached, 2048, 42, [1.0] * 4, [1.0] * 4)  # trained no longer than a probe: not evidence
    rising = probe_result(checkpointed, 512, 42, [9_000.0] * 8, [10_000.0] * 5 + [10_140.0] * 3)
    results = made_results([*longer, short, rising])
    check = data.steps_check(results, "pylate", "gradcache", 4)
    assert check == data.StepsCheck("pylate", "gradcache", 4, 2, 9, (1024, 4096), 1.5, 0.0, ())
    assert check.holds
    assert data.steps_check(results, "pylate", "grad-checkpoint", 4).rose == (rising.cell_id,)
    rows = [data.SearchRow(search=cached, ceiling=Ceiling(next_batch=1024), probes=0, usable_gib=139.8),
            data.SearchRow(search=checkpointed, ceiling=Ceiling(fits=512, fails=544), probes=3, usable_gib=78.4)]
    assert prose.fewer_steps_reading(rows, results) == (
        "The PyLate GradCache search trains 4 steps a probe, not 8: in each of the 2 committed PyLate GradCache cells "
        "that trained longer (9 steps or more, at B = 1,024 and 4,096), the most the allocator reserved in a step was "
        "reached within the first 4, and the allocated peak rose after them by at most 1.50 MiB — so at those batches, "
        "4 steps see what the longer runs had to fit. Not so in the regimes that keep 8: in the one committed PyLate "
        "gradient-checkpointing cell that trained longer, the most the allocator reserved rose after step 4, by up to "
        "140 MiB.")  # fmt: skip
    # a longer cell whose reserved peak rose after the probe's steps withdraws the rule; no longer cell neither
    grew = longer[0].model_copy(update={"step_peak_reserved_per_step_mib": [15_000.0] * 5 + [15_064.0] * 4})
    for evidence in ([grew, longer[1]], [short]):
        alone = made_results(evidence)
        assert not data.steps_check(alone, "pylate", "gradcache", 4).holds
        assert prose.fewer_steps_reading(rows[:1], alone).endswith(
            "— which does not show that 4 steps see what a longer run must fit.")
    assert "in 1 of the 2 committed PyLate GradCache cells that trained longer, the most the allocator reserved rose " \
           "after step 4, by up to 64 MiB" in prose.fewer_steps_reading(rows[:1], made_results([grew, longer[1]]))
    assert prose.fewer_steps_reading(rows[1:], results) == ""  # every search trains 8: nothing to say


def test_the_gradcache_probes_of_4_steps_rest_on_every_committed_gradcache_cell_reserving_nothing_after_step_4(searches):
    """grids/ceilings.yaml: the GradCache searches train 4 steps a probe. This fails the day a committed GradCache
    cell that trained longer reserved more after its 4th step (then those searches must train more), and checks
    that the regimes keeping 8 steps would have missed a later peak with 4 (why the exception is GradCache's)."""
    from harness.search import MIN_STEPS, MIN_STEPS_OF

    results = data.read()
    fewer = {(row.stack, row.regime, row.search.steps) for row in searches if row.search.steps < MIN_STEPS}
    assert fewer == {("pylate", "gradcache", MIN_STEPS_OF["gradcache"])}
    for stack, regime, steps in fewer:
        check = data.steps_check(results, stack, regime, steps)
        assert check.cells >= 9 and check.holds, check
        assert f"the most the allocator reserved in a step was reached within the first {steps}" in \
            prose.fewer_steps_reading(searches, results)
    assert data.steps_check(results, "colpali", "plain", 4).rose  # ColQwen2's reserved peak grows past step 4
