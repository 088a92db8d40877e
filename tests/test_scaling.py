"""The GradCache and gathered-negatives pages: their predictions are the op formula at recorded shapes
(checked against the committed replays), and their sentences say what the committed results hold."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from harness import op_bytes
from harness.report import data, scaling, style, tables
from harness.report import text as text_words
from harness.spec import CARDS


@pytest.fixture(scope="module")
def committed() -> tuple[data.Results, pd.DataFrame, pd.DataFrame]:
    results = data.read()
    cells, calls = data.load(results)
    return results, cells, calls


def _gradcache(committed: tuple[data.Results, pd.DataFrame, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    _, cells, calls = committed
    cells, calls = data.select(cells, "pylate", "gradcache"), data.select(calls, "pylate", "gradcache")
    if cells.empty:
        pytest.skip("no GradCache cell committed")
    return cells, calls


def test_the_gradcache_prediction_is_every_vanilla_replay_at_its_own_shape(committed):
    cells, calls = _gradcache(committed)
    largest = scaling.largest_calls(calls, "pylate", "gradcache")
    vanilla = largest[largest["variant"] == "vanilla"]
    assert not vanilla.empty
    for _, call in vanilla.iterrows():
        chunk, batch = int(call["query_shape"][0]), int(call["doc_shape"][0])
        assert abs(scaling.predicted_call_mib(call, chunk, batch) - call["forward_transient_peak_mib"]) <= 1.0
    assert scaling.formula_gap_mib(calls) <= 1.0


def test_vanilla_s_score_call_is_linear_in_the_batch_and_the_first_batch_over_a_card_is_exact(committed):
    cells, calls = _gradcache(committed)
    call, chunk = scaling.vanilla_reference(cells, calls)
    assert scaling.predicted_call_mib(call, chunk, 2048) == pytest.approx(2 * scaling.predicted_call_mib(call, chunk, 1024))
    # a quarter of the queries: a quarter of the grid, but the documents' copy for the matmul stays
    quarter, whole = scaling.predicted_call_mib(call, 16, 1024), scaling.predicted_call_mib(call, 64, 1024)
    assert whole / 4 < quarter < whole / 3
    for card in CARDS.values():
        if card.usable_gib is None:
            continue
        first = scaling.batch_over(call, chunk, card.usable_gib)
        assert scaling.predicted_call_mib(call, chunk, first) > card.usable_gib * 1024
        assert scaling.predicted_call_mib(call, chunk, first - 1) <= card.usable_gib * 1024


def test_the_fused_gradcache_cells_ran_their_kernels_inside_the_cached_loss(committed):
    cells, calls = _gradcache(committed)
    fused = scaling.reaches(cells)
    assert fused and all(r.entry_point_calls > 0 and r.score_calls > 0 for r in fused)
    text = " ".join(scaling.gradcache_reading(cells, calls))
    assert "The fused kernels run inside the cached loss" in text and "**not**" not in text


def test_the_peak_sentence_says_the_op_does_not_set_the_peak_only_when_every_backend_peaks_alike(committed):
    cells, calls = _gradcache(committed)
    native = cells[(cells["card"] == "native") & (cells["batch_size"] == 1024) & (cells["outcome"] == "ok")]
    spread = (native["step_peak_alloc_mib"] - native[native["backend"] == "vanilla"]["step_peak_alloc_mib"].iloc[0]).abs().max()
    sentences = [line for line in scaling.gradcache_reading(cells, calls) if line.startswith("At B = 1024 on the 141 GB")]
    assert len(sentences) == 1
    if spread <= 64:
        assert f"within {spread:.0f} MiB" in sentences[0] and "set outside the MaxSim op" in sentences[0]
    # a fused backend that peaked 4 GiB lower would mean the grid set vanilla's peak: the sentence must change
    lower = cells.copy()
    fused = (lower["card"] == "native") & (lower["backend"] == "lik") & (lower["batch_size"] == 1024)
    lower.loc[fused, "step_peak_alloc_mib"] -= 4096
    changed = [line for line in scaling.gradcache_reading(lower, calls) if line.startswith("At B = 1024 on the 141 GB")]
    assert "the MaxSim op sets the step's peak" in changed[0] and "outside the MaxSim op" not in changed[0]


def test_at_4096_on_80_gb_the_maxsim_op_sets_vanillas_gradcache_peak_and_the_h100_times_name_it(committed):
    """Where the GradCache backends' step peaks part (B = 4096, 80 GB), the page says the op sets the peak, with
    each other backend's peak and how many times less it is, computed from the cells; the step-time sentence of
    cells timed on another GPU names that GPU."""
    cells, calls = _gradcache(committed)
    mine = cells[(cells["card"] == "h100-80gb") & (cells["batch_size"] == 4096) & (cells["outcome"] == "ok")]
    if set(mine["backend"]) < {"vanilla", "lik"}:
        pytest.skip("the 80 GB B = 4096 cells are not all committed")
    base = float(mine[mine["backend"] == "vanilla"]["step_peak_alloc_mib"].iloc[0])
    lik = float(mine[mine["backend"] == "lik"]["step_peak_alloc_mib"].iloc[0])
    (sentence,) = [line for line in scaling.gradcache_reading(cells, calls) if line.startswith("At B = 4096 on the 80 GB")]
    assert abs(base - lik) > 0.01 * base  # measured: the peaks part
    assert "the MaxSim op sets the step's peak" in sentence and f"lik's {lik / 1024:.2f} GiB ({base / lik:.2f}× less)" in sentence
    # and what must fit the card, the allocator's reserved memory, each backend's with its ratio to vanilla's
    held = float(mine[mine["backend"] == "vanilla"]["step_peak_reserved_mib"].iloc[0])
    lik_held = float(mine[mine["backend"] == "lik"]["step_peak_reserved_mib"].iloc[0])
    slack = (held - base) / 1024
    assert f"which is what must fit it: vanilla {held / 1024:.2f} GiB ({slack:.2f} GiB above its allocated" in sentence
    assert f"lik's {lik_held / 1024:.2f} GiB ({held / lik_held:.2f}× less)" in sentence
    gpus = set(mine["device_name"])
    (timed,) = [line for line in scaling.gradcache_reading(cells, calls) if line.startswith("Step time at B = 4096 on the 80")]
    if len(gpus) == 1 and "H200" not in next(iter(gpus)):
        assert f"timed alone on {text_words.a_gpu(next(iter(gpus)))}," in timed


def test_the_gradcache_tables_and_figure_show_every_cell(committed):
    cells, calls = _gradcache(committed)
    table = scaling.peak_table(cells, calls)
    assert len(table) == len(cells) and not table.isna().any().any()
    assert "None" not in table.to_string() and "nan" not in table.to_string()
    predicted = scaling.prediction_table(cells, calls)
    assert list(predicted["chunk (queries)"]) == scaling.chunks_of(cells)
    figure = scaling.plot_gradcache(cells, calls)
    colours = {line.get_label().split(":")[0]: line.get_color() for line in figure.axes[0].get_lines() if ":" in line.get_label()}
    assert colours and all(colour == style.colour(backend) for backend, colour in colours.items())


def test_the_multi_gpu_grid_plans_every_recipe_at_every_world_size():
    planned = scaling.planned_recipes()
    recipes = {recipe for recipe, _ in planned}
    assert len(planned) == 4 * len(recipes) and {world for _, world in planned} == set(scaling.WORLDS)
    assert {r.backend for r in recipes if r.stack == "pylate"} == {"vanilla", "lik", "flash"}


def test_the_gathered_model_grows_from_the_measured_base_by_the_op_formula(committed):
    results, cells, calls = committed
    rows = scaling.scalings(results, cells, calls)
    assert rows
    for row in rows:
        if not row.predicted_mib:
            continue
        assert row.predicted_mib[1] == pytest.approx(row.base_mib)
        bucket = row.bucket_mib or 0.0  # DDP's buckets: from W = 2 on, the base cell's trainable parameters
        for world in (2, 4, 8):
            assert row.predicted_mib[world] == pytest.approx(row.base_mib + bucket + row.op_growth_mib[world])
        call = scaling._vanilla_call(calls, row.recipe)
        stack, itemsize = row.recipe.stack, op_bytes.ITEMSIZE[str(call["dtype"])]
        if row.recipe.backend == "vanilla":
            grid = [op_bytes.gathered(stack, call["query_shape"], call["doc_shape"], itemsize, w).forward_transient
                    for w in (1, 8)]  # fmt: skip
            assert row.op_growth_mib[8] == pytest.approx((grid[1] - grid[0]) / 2**20)
        else:  # the other ranks' documents and their gradient: linear in W − 1
            growth = [row.op_growth_mib[w] for w in (2, 4, 8)]
            assert growth[1] == pytest.approx(3 * growth[0]) and growth[2] == pytest.approx(7 * growth[0])


def test_the_scaling_table_and_sentences_mark_measured_and_predicted(committed):
    results, cells, calls = committed
    rows = scaling.scalings(results, cells, calls)
    table = scaling.scaling_table(rows)
    measured = sum(1 for row in rows for world in row.measured if world > 1)
    shared = sum(1 for row in rows for world in row.one_gpu if world not in row.measured)
    marks = table[["W = 2", "W = 4", "W = 8"]]
    assert marks.apply(lambda col: col.str.contains("(m)", regex=False)).sum().sum() == measured
    assert marks.apply(lambda col: col.str.contains("(m1)", regex=False)).sum().sum() == shared
    lines = scaling.scaling_reading(rows)
    assert lines[0].startswith(f"Measured on several GPUs so far: {measured} cells at W > 1")
    usable = CARDS["h100-80gb"].usable_gib
    for row in rows:
        over = scaling.first_over(row, usable)
        if over is not None:
            assert any(f"{row.recipe.backend} passes the card's {usable} GiB from W = {over}" in line for line in lines)
    # a measured W = 2 cell shows as measured, with the outcome where it failed
    some = next(row for row in rows if row.predicted_mib)
    fake = [dataclasses.replace(some, measured={2: ("oom", None), 4: ("ok", 40960.0)})]
    shown = scaling.scaling_table(fake).iloc[0]
    predicted = {w: f"{some.predicted_mib[w] / 1024:.2f}" for w in (2, 4)}  # what the model said, beside each
    assert shown["W = 2"] == f"OOM\u00a0(m)<br>{predicted[2]}\u00a0(p)"
    assert shown["W = 4"] == f"40.00\u00a0(m)<br>{predicted[4]}\u00a0(p)" and shown["W = 8"].endswith("(p)")
    assert scaling.plot_scaling(rows) is not None


def test_the_cost_sentence_counts_the_searches_and_scales_the_measured_step(committed):
    results, _, _ = committed
    cells, _ = _gradcache(committed)
    searches = data.ceilings(results)
    mine = [row for row in searches if (row.search.stack, row.search.regime) == ("pylate", "gradcache")]
    text = scaling.gradcache_cost_words(cells, searches)
    assert text.startswith(f"The ceilings grid holds {len(mine)} GradCache searches")
    timed = tables.timed(cells)  # (cells timed under the timing rule)
    vanilla = timed[(timed["variant"] == "vanilla") & timed["score_mini_batch_size"].isna()]
    assert len(vanilla)
    for gpu, of_gpu in vanilla.groupby("device_name"):  # each GPU's bound, from its largest batch, its fastest cell there
        largest = of_gpu[of_gpu["batch_size"] == of_gpu["batch_size"].max()]
        row = largest.loc[largest["steady_step_time_sec"].idxmin()]
        minutes = max(r.search.steps for r in mine) * row["steady_step_time_sec"] * 16384 / row["batch_size"] / 60
        name = "the H200" if "H200" in gpu else text_words.a_gpu(gpu)
        assert f"{row['steady_step_time_sec']:.2f} s at B = {row['batch_size']:,} on {name}" in text
        assert f"{minutes:.0f} minutes of {name}" in text


def test_what_is_left_to_measure_of_the_gradcache_grid_is_read_from_the_grid_and_the_results(committed):
    """pylate-gradcache.md: the planned cells with no committed result, per batch (it read "Batches of 4096 and
    16384" as fixed text, while lik and flash at B = 1024 on the capped cards had not run either)."""
    from harness.grid import load_grid

    _, cells, _ = committed
    planned = list(load_grid(scaling.GRADCACHE_GRID))
    ran = set(cells.loc[cells["grid"] == "gradcache", "cell_id"])
    left = [cell for cell in planned if cell.cell_id not in ran]
    text = scaling.gradcache_unmeasured(cells)
    if not left:
        assert text == f"Every one of the {len(planned)} cells `grids/gradcache.yaml` plans has a committed result."
        return
    assert text.startswith(f"Of the {len(planned)} cells `grids/gradcache.yaml` plans, {len(left)} ")
    for batch in {cell.spec.batch_size for cell in planned}:
        missing = [cell for cell in left if cell.spec.batch_size == batch]
        assert (f" at B = {batch:,} (" in text) == bool(missing), batch
    assert scaling.gradcache_unmeasured(cells.iloc[0:0]).startswith(
        f"Of the {len(planned)} cells `grids/gradcache.yaml` plans, {len(planned)} have no committed result yet: all ")
    done = pd.DataFrame({"grid": "gradcache", "cell_id": [cell.cell_id for cell in planned]})
    assert scaling.gradcache_unmeasured(done).startswith("Every one of the")
    one_left = done.iloc[1:]
    assert scaling.gradcache_unmeasured(one_left) == (
        f"Of the {len(planned)} cells `grids/gradcache.yaml` plans, 1 has no committed result yet: 1 of the "
        f"{sum(cell.spec.batch_size == planned[0].spec.batch_size for cell in planned)} at "
        f"B = {planned[0].spec.batch_size:,} (on the {CARDS[planned[0].spec.card].nominal_gb} GB card).")


def test_the_checkpointing_comparison_pairs_cells_of_one_batch_backend_and_card(committed):
    _, cells, _ = committed
    text = scaling.against_checkpointing(cells)
    timed = cells[cells["times_comparable"].astype(bool) & (cells["outcome"] == "ok") & (cells["stack"] == "pylate")]
    cached = timed[timed["regime"] == "gradcache"]
    pairs = [row for _, row in cached.iterrows()
             if not timed[(timed["regime"] == "grad-checkpoint") & (timed["batch_size"] == row["batch_size"])
                          & (timed["backend"] == row["backend"]) & (timed["card"] == row["card"])].empty]  # fmt: skip
    assert text.count(" against ") == len(pairs)
    for row in pairs:
        assert f"{row['backend']} at B = {row['batch_size']}" in text and f"{row['steady_step_time_sec']:.2f} s against" in text
    assert scaling.against_checkpointing(cells.assign(times_comparable=False)) == ""


def test_the_fused_backends_reach_is_a_line_through_their_measured_peaks_labelled_as_extrapolated(committed):
    """pylate-gradcache.md: where a fused backend's GradCache step peak would fill each capped card, from a
    least-squares line through its measured batches plus the reserved-above-allocated of the largest."""
    frame = pd.DataFrame({
        "stack": "pylate", "regime": "gradcache", "variant": ["lik", "lik", "flash", "vanilla", "lik"],
        "backend": ["lik", "lik", "flash", "vanilla", "lik"], "batch_size": [1000, 3000, 1000, 1000, 9000],
        "outcome": ["ok", "ok", "ok", "ok", "oom"], "step_peak_alloc_mib": [10_000.0, 11_000.0, 10_000.0, 9.0, 1.0],
        "step_peak_reserved_mib": [10_500.0, 11_800.0, 10_400.0, 9.0, 1.0], "card": "native"})  # fmt: skip
    (lik,) = scaling.fused_reach(frame)  # flash has one batch, vanilla builds the grid, the OOM cell is no peak
    assert (lik.backend, lik.batches, lik.reserved_above_mib) == ("lik", (1000, 3000), 800.0)
    assert lik.per_sample_mib == pytest.approx(0.5)
    for name, card in CARDS.items():
        if card.usable_gib is not None:
            assert lik.over[name] == round((card.usable_gib * 1024 - 800.0 - 9_500.0) / 0.5, -2)
    words = scaling.fused_reach_words([lik])
    assert words.startswith("Predicted for the fused backends, extrapolated from the measured batches (B = 1,000 and "
                            "3,000): a straight line through each one's step peaks (lik 0.50 MiB a sample)")
    assert f"lik would fill 24 GB at B ≈ {lik.over['rtx4090-24gb']:,}" in words
    assert words.endswith("A line through two batches, not a measurement: the ceiling searches decide.")
    assert scaling.fused_reach(frame[frame["batch_size"] == 1000]) == [] and scaling.fused_reach_words([]) == ""
    # the committed cells: every fused backend measured at two batches or more is on the page's first screen
    cells, calls = _gradcache(committed)
    reach = scaling.fused_reach(cells)
    assert {r.backend for r in reach} == {"lik", "flash"}
    assert scaling.fused_reach_words(reach) in scaling.gradcache_reading(cells, calls)
    for r in reach:  # the 24 GB searches start below the prediction (grids/ceilings.yaml)
        assert 0.3 < r.per_sample_mib < 0.4 and r.over["rtx4090-24gb"] > 25_600


def test_the_one_gpu_cells_put_two_ranks_well_inside_one_gpu(committed):
    """grids/multi-gpu.yaml's -onegpu cells: the model puts each rank below half an H100 (40 GiB), so two
    ranks on one GPU can fail only at their card's cap, never for want of the GPU's own memory."""
    from harness.grid import load_grid

    results, cells, calls = committed
    rows = {row.recipe: row for row in scaling.scalings(results, cells, calls)}
    shared = [cell.spec for cell in load_grid(scaling.MULTI_GPU_GRID) if getattr(cell.spec, "ranks_share_gpu", False)]
    assert shared and {spec.world_size for spec in shared} == {2}
    for spec in shared:
        recipe = scaling.Recipe(spec.stack, spec.regime, spec.batch_size, spec.variant)
        assert rows[recipe].predicted_mib[spec.world_size] < 40 * 1024, recipe


def test_a_cell_whose_ranks_shared_one_gpu_is_shown_as_such_and_checks_the_model(committed):
    results, cells, calls = committed
    rows = [row for row in scaling.scalings(results, cells, calls) if row.predicted_mib]
    first, second = rows[0], rows[1]
    near, far = first.predicted_mib[2] + 100.0, second.predicted_mib[2] - 3000.0
    fake = [dataclasses.replace(first, measured={}, one_gpu={2: ("ok", near)}),
            dataclasses.replace(second, measured={}, one_gpu={2: ("ok", far), 4: ("oom", None)})]  # fmt: skip
    table = scaling.scaling_table(fake)
    assert table.iloc[0]["W = 2"].startswith(f"{near / 1024:.2f}\u00a0(m1)<br>")
    assert table.iloc[1]["W = 4"].startswith("OOM\u00a0(m1)")
    check = scaling.model_check(fake)
    assert check is not None and check.one_gpu and check.worlds == (2,)
    assert [round(gap) for _, _, gap in check.gaps_mib] == [100, -3000]  # the OOM has no peak to compare
    words = scaling.model_check_words(check)
    assert words.startswith("Checked on 2 cells that trained at W = 2 (every one with its ranks on one GPU): the measured "
                            "per-rank step peak lies within 2.93 GiB of the predicted (median 1.51 GiB)")  # fmt: skip
    assert f"the largest gap, −2.93 GiB (measured below predicted), is {scaling.recipe_name(second.recipe)}" in words
    lines = scaling.scaling_reading(fake)
    assert "with every rank on one GPU: 3 cells at W = 2, 4" in lines[0] and lines[1] == words
    ran = [world for row in rows for world, (outcome, _) in (row.measured | row.one_gpu).items() if world > 1 and outcome == "ok"]
    assert (scaling.model_check(rows) is None) == (not ran)
    assert scaling.plot_scaling(fake) is not None


def test_the_gathered_cells_op_calls_are_read_in_full(committed):
    """gathered_ops: every rank's in-train call counted, its documents W × B, vanilla's replays against the formula."""
    results, _, _ = committed
    ran = [r for _, r in results.of(data.MULTI_GPU) if r.world_size > 1 and r.outcome == "ok"]
    ops = scaling.gathered_ops(results)
    if not ran:
        assert ops is None and scaling.gathered_ops_words(ops) == ""
        return
    assert ops is not None and ops.cells == len(ran)
    assert ops.calls == sum(len(rank.maxsim_calls_in_train) for r in ran for rank in r.ranks)
    gathered = sum(call.doc_shape[0] == r.world_size * r.batch_size for r in ran for rank in r.ranks
                   for call in rank.maxsim_calls_in_train)  # fmt: skip
    assert ops.gathered == gathered
    fused = [r for r in ran if r.variant != "vanilla"]
    assert (ops.fused_cells, ops.fused_reached) == (len(fused), sum(bool(r.backend_entry_point_calls) for r in fused))
    words = scaling.gathered_ops_words(ops)
    gpus = sorted({r.env.device_name for r in ran if r.env is not None and r.env.device_name})
    assert ops.gpus == tuple(gpus)
    where = f" (on {text_words.joined([text_words.a_gpu(gpu) for gpu in gpus])})" if gpus else ""
    assert words.startswith(f"Inside the steps of these {ops.cells} cells{where}: ")
    assert ("every one of the" in words) == (ops.gathered == ops.calls)
    if ops.formula_gap_mib is not None:
        assert f"within {ops.formula_gap_mib:.2f} MiB" in words


def test_the_score_calls_share_of_the_step_is_read_from_the_base_and_the_gathered_cells(committed):
    results, cells, calls = committed
    rows = scaling.scalings(results, cells, calls)
    words = scaling.score_share_words(rows, results, calls)
    ran = [r for _, r in results.of(data.MULTI_GPU) if r.world_size > 1 and r.outcome == "ok" and r.variant == "vanilla"]
    if not ran:
        assert words == ""
        return
    for result in ran:
        row = next(row for row in rows if (row.recipe.stack, row.recipe.batch, row.recipe.backend)
                   == (result.stack, result.batch_size, "vanilla"))  # fmt: skip
        op = max(call.forward_transient_peak_mib for call in result.maxsim_calls_isolated)
        share = f"{op / 1024:.2f} of {result.step_peak_alloc_mib / 1024:.2f} GiB ({100 * op / result.step_peak_alloc_mib:.0f}%)"
        assert f"{share} at W = {result.world_size}" in words
        base = scaling._vanilla_call(calls, row.recipe)["forward_transient_peak_mib"]
        assert f"{scaling.recipe_name(row.recipe)}: {base / 1024:.2f} of {row.base_mib / 1024:.2f} GiB" in words
        # gathered.md: "the grid's share of the step grows with every GPU added"
        assert op / result.step_peak_alloc_mib > base / row.base_mib, result.cell_id


def test_the_buckets_are_the_w1_cells_trainable_parameters_and_the_rises_are_measured_less_base(committed):
    """The DDP term comes from the W = 1 cell's recorded trainable parameters (one copy of their fp32
    gradients per rank), and each rise is the W = 2 cell's per-rank peak less that W = 1 peak."""
    results, cells, calls = committed
    rows = scaling.scalings(results, cells, calls)
    ones = {(r.stack, r.regime, r.batch_size, r.variant): r for _, r in results.of(data.MULTI_GPU)
            if r.world_size == 1 and r.outcome == "ok"}  # fmt: skip
    for row in rows:
        one = ones.get((row.recipe.stack, row.recipe.regime, row.recipe.batch, row.recipe.backend))
        if one is None:
            assert row.bucket_mib is None
            continue
        assert row.base_mib == one.step_peak_alloc_mib and row.bucket_mib == one.trainable_parameter_mib
    found = scaling.rises(rows)
    if not found:
        pytest.skip("no W = 2 cell beside a W = 1 cell that recorded its trainable parameters")
    for rise in found:
        outcome, peak = rise.scaling.one_gpu[rise.world] if rise.one_gpu else rise.scaling.measured[rise.world]
        assert outcome == "ok" and rise.measured_mib == pytest.approx(peak - rise.scaling.base_mib)
        assert rise.residual_mib == pytest.approx(rise.measured_mib - rise.bucket_mib - rise.op_mib)
        # the model check's gap is the same residual
        assert rise.scaling.predicted_mib[rise.world] == pytest.approx(peak - rise.residual_mib)
    table = scaling.rise_table(found)
    assert len(table) == len(found) and not table.isna().any().any()
    assert list(table["measured − model"]) == [f"{r.residual_mib:+,.0f}".replace("-", "\u2212") for r in found]


def test_the_rise_sentences_name_exactly_the_cells_below_the_buckets_above_the_model_and_alike(committed):
    results, cells, calls = committed
    rows = [row for row in scaling.scalings(results, cells, calls) if row.predicted_mib]
    vanilla = next(row for row in rows if row.recipe.backend == "vanilla")
    fused = next(row for row in rows if row.recipe.backend != "vanilla" and row.recipe.batch == vanilla.recipe.batch
                 and row.recipe.stack == vanilla.recipe.stack)  # fmt: skip
    base_v, base_f = vanilla.base_mib, fused.base_mib
    fake = [dataclasses.replace(vanilla, bucket_mib=500.0, op_growth_mib={1: 0.0, 2: 100.0}, measured={},
                                one_gpu={2: ("ok", base_v + 450.0)}),
            dataclasses.replace(fused, bucket_mib=500.0, op_growth_mib={1: 0.0, 2: 10.0}, measured={},
                                one_gpu={2: ("ok", base_f + 480.0)})]  # fmt: skip
    found = scaling.rises(fake)
    assert [round(r.residual_mib) for r in found] == [-150, -30]
    words = " ".join(scaling.rise_words(found))
    assert words.startswith("From W = 1 to the measured W, the 2 cells rose by 450 MiB to 480 MiB per rank.")
    assert "2 cells rose by less than DDP's buckets alone" in words and "rose by more than both terms" not in words
    assert "Vanilla rose as the fused backend did, within 64 MiB" in words  # 450 and 480 lie 30 MiB apart
    fake[1] = dataclasses.replace(fake[1], one_gpu={2: ("ok", base_f + 700.0)})
    words = " ".join(scaling.rise_words(scaling.rises(fake)))
    assert "1 cell rose by more than both terms" in words and "Vanilla rose as" not in words
    assert scaling.rise_words([]) == []


def test_the_lengths_drawn_at_w2_differ_from_w1_only_where_the_data_is_drawn_per_rank(committed):
    """PyLate's shapes are fixed, so its W = 2 ranks score the W = 1 cell's lengths; ColQwen2's pages vary."""
    results, _, _ = committed
    found = scaling.drawn_lengths(results)
    assert all(stack != "pylate" for stack, _ in found)
    for (stack, batch), (one, two) in found.items():
        assert set(one) != set(two)
        assert f"{text_words.STACK_NAMES[stack]} B = {batch}: query tokens" in scaling.drawn_lengths_words(results)
    assert (scaling.drawn_lengths_words(results) == "") == (not found)
