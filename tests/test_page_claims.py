"""The qualitative sentences the book's pages keep as fixed text, checked against the committed results.

A page sentence that the data could contradict is either computed (``harness.report.prose``) or
checked here: if a new result breaks one of these, the test names the sentence to rewrite. Each test
quotes the page and the words it backs.
"""

import re

import pandas as pd
import pytest

from harness.report import data, plots, prose, tables
from harness.report.text import oom_held_mib
from harness.spec import CARDS, CONTEXT_GIB
from test_book import ROOT


@pytest.fixture(scope="module")
def committed():
    results = data.read()
    cells, calls = data.load(results)
    return results, cells, calls


def replays(calls: pd.DataFrame) -> pd.DataFrame:
    """Replayed calls that did not run out of memory, with the op's footprint (held + backward spike)."""
    ok = calls[~calls["oom_in_replay"].astype(bool)]
    return ok.assign(total_mib=ok["saved_for_backward_mib"] + ok["backward_transient_peak_mib"])


def test_the_vanilla_grid_grows_with_the_square_of_the_batch_and_the_fused_kernels_never_build_it(committed):
    """intro.md: "the plain PyTorch implementation materialises a `[B, B, Lq, Ld]` similarity grid whose memory
    grows with the *square* of the batch size. Fused kernels (late-interaction-kernels, flash-maxsim) never
    materialise it"; colpali.md: the grid "is kept for `amax`'s backward"."""
    _, _, calls = committed
    ok = replays(calls[calls["stack"].isin(["colpali", "pylate"])])
    checked = 0
    for (stack, regime, card, backend), group in ok.groupby(["stack", "regime", "card", "backend"]):
        footprint = group.groupby("batch_size")["total_mib"].max().sort_index()
        if len(footprint) < 2:
            continue
        factor = plots.doubling_factors(footprint.index.to_numpy(float), footprint.to_numpy(float))
        grid = group.groupby("batch_size")["predicted_grid_mib"].max()
        where = f"{stack} · {regime} on {card}, {backend}"
        if regime == "gradcache":  # pylate-gradcache.md: one chunk of queries against every document, linear in B
            assert backend != "vanilla" or 1.8 <= factor <= 2.2, f"{where}: ×{factor:.2f} per doubling, not linear in B"
            continue
        if backend == "vanilla":
            assert 3.5 <= factor <= 4.6, f"{where}: ×{factor:.2f} per doubling, not the B² of a grid"
        elif backend in ("lik", "flash"):
            assert factor <= 2.5, f"{where}: ×{factor:.2f} per doubling, a fused op growing like a grid"
            share = footprint / grid
            assert (share < 0.25).all() and (share[share.index >= 128] < 0.06).all(), f"{where}: {share.to_dict()}"
        checked += 1
    assert checked >= 10
    colpali = ok[(ok["stack"] == "colpali") & (ok["backend"] == "vanilla")]
    shapes = zip(colpali["query_shape"], colpali["doc_shape"], strict=True)
    grid_bytes = [q[0] * d[0] * q[1] * d[1] * 4 / 2**20 for q, d in shapes]
    assert colpali["predicted_grid_mib"].to_numpy() == pytest.approx(grid_bytes)
    assert ((colpali["saved_for_backward_mib"] - colpali["predicted_saved_for_backward_mib"]).abs() <= 1.0).all()
    assert (colpali["saved_for_backward_mib"] >= colpali["predicted_grid_mib"]).all()  # the grid itself is held


def test_pylate_pads_every_query_to_48_tokens_and_every_document_to_300(committed):
    """pylate-*.md: "queries [B, 48, 128], documents [B, 2, 300, 128], fp32 scores" and "PyLate pads every query
    to 48 tokens and every document to 300, so the text changes which tokens are real but not a single tensor
    shape"."""
    _, _, calls = committed
    pylate = calls[calls["stack"] == "pylate"]
    assert len(pylate) > 20
    for query, doc, dtype in zip(pylate["query_shape"], pylate["doc_shape"], pylate["dtype"], strict=True):
        # the batch dimension is a chunk of queries for PyLate's chunked scoring, so only the rest is fixed
        assert (list(query)[1:], list(doc)[1:], str(dtype)) == ([48, 128], [2, 300, 128], "float32")
    chunked = pylate[pylate["backend"] == "vanilla + chunk 64"]  # intro.md: "computes it in query chunks"
    assert len(chunked) > 0 and all(list(query)[0] == 64 for query in chunked["query_shape"])


def test_every_step_time_shown_rests_on_at_least_8_steady_steps(committed):
    """The stack pages: the step-time tables show cells timed under the timing rule, each of which
    "trained until it had timed at least 8 steady steps"."""
    _, cells, _ = committed
    shown = tables.timed(cells)
    assert len(shown) > 10 and (shown["n_steady_steps"] >= 8).all()


def test_the_colqwen2_loss_head_is_a_small_part_of_its_training_step(committed):
    """op.md: "for ColQwen2's in-batch loss, whose 2B-parameter encoder takes most of the step, it [the head's share]
    is small" — under 5% of the step at every batch measured both ways."""
    _, cells, calls = committed
    ops = data.op_level(cells, calls)
    heads = ops[(ops["stack"] == "op-colpali") & (ops["regime"] == "inbatch") & (ops["outcome"] == "ok")]
    steps = cells[(cells["stack"] == "colpali") & (cells["outcome"] == "ok")]
    compared = 0
    for _, head in heads.iterrows():
        step = steps[(steps["batch_size"] == head["batch_size"]) & (steps["variant"] == head["variant"])]
        if not step.empty:
            assert head["steady_step_time_sec"] < 0.05 * step["steady_step_time_sec"].min(), head["cell_id"]
            compared += 1
    assert compared >= 2


def test_a_probe_on_the_uncapped_card_has_the_gpu_alone_and_every_probe_trains_8_steps_per_seed(committed):
    """ceilings.md: "a probe on the uncapped 141 GB card still has the GPU alone"; a batch fits only if it trains
    "8 steps on each of seeds 42, 43 and 44" (the grid's searches, :func:`harness.report.decision.criterion`): every
    probe ran those steps with one of those seeds."""
    results, _, _ = committed
    probes = data.ceiling_probes(results)
    assert len(probes) > 50
    assert probes[probes["card"] == "native"]["gpu_share_gib"].isna().all()
    assert (probes["steps"] == 8).all() and set(probes["seed"]) <= {42, 43, 44}


def test_an_out_of_memory_cell_has_a_steady_step_time_only_from_steps_it_trained(committed):
    """cells.md: "An out-of-memory cell has a steady step time only where steps past its warm-up trained before
    it ran out of memory"."""
    results, _, _ = committed
    everything = data.all_cells(results)
    oom = everything[everything["outcome"] == "oom"]
    timed = oom[oom["steady_step_time_sec"].notna()]
    assert len(oom) > 5 and (timed["n_steady_steps"] >= 1).all() and (timed["n_steps_done"] > timed["n_steady_steps"]).all()
    assert (oom[oom["n_steady_steps"] == 0]["steady_step_time_sec"].isna()).all()


def test_the_methodology_example_of_a_block_rounding_is_the_committed_one(committed):
    """methodology.md: "PyLate's 225 MiB slot grid at batch 64 occupies a 226 MiB block, and the forward peak
    holds two of them: +2 MiB"."""
    _, _, calls = committed
    chosen = calls[(calls["stack"] == "pylate") & (calls["batch_size"] == 64) & (calls["backend"] == "vanilla")]
    assert len(chosen) > 0
    for _, call in chosen.iterrows():
        assert call["predicted_grid_mib"] / list(call["doc_shape"])[1] == pytest.approx(225.0)  # per document slot
        assert call["forward_transient_peak_mib"] - call["predicted_forward_transient_mib"] == pytest.approx(2.0)


def methodology() -> str:
    return re.sub(r"\s+", " ", (ROOT / "book" / "methodology.md").read_text())


def test_the_context_the_methodology_quotes_is_the_one_in_the_committed_oom_messages(committed):
    """methodology.md glues prose.outside_allocator: "the memory our own processes held on the H200 outside
    PyTorch's allocator was …" — process memory in use less what PyTorch reserved, in every committed OOM
    message from an H200."""
    results, _, _ = committed
    outside = []
    for _, result in results.found:
        message = result.oom_message or ""
        in_use = re.search(r"this process has ([0-9.]+) GiB memory in use", message)
        held = oom_held_mib(message)
        if in_use and held and "H200" in result.env.device_name:
            outside.append(float(in_use.group(1)) - (held[0] + held[1]) / 1024)
    assert len(outside) > 20
    sentence = prose.outside_allocator(results)
    assert f"in the {len(outside)} out-of-memory messages" in sentence
    assert f"outside PyTorch's allocator was {min(outside):.2f}–{max(outside):.2f} GiB" in sentence
    assert "{glue:md}`outside_allocator`" in methodology() and "GiB, depending on what a cell" not in methodology()
    assert prose.outside_allocator(data.read(ROOT / "no-results")).startswith("Whether the context is a constant")


def test_the_derived_caps_and_their_alternative_are_the_ones_the_methodology_states():
    """methodology.md: derived caps "less 0.68 GiB … an H100 80 GB's reported 79.11 GiB less the 78.43 GiB cap";
    "With 79.18 GiB the context would be 0.75 GiB and each derived cap 0.07 GiB smaller (22.89, 38.75 and
    43.68 GiB instead of 22.96, 38.82 and 43.75)"; the published lik B=128 cell "reserved 78.37 GiB"."""
    text = methodology()
    assert pytest.approx(79.11 - CARDS["h100-80gb"].usable_gib) == CONTEXT_GIB
    derived = [name for name in CARDS if CARDS[name].usable_gib is not None and name != "h100-80gb"]
    reported = {name: float(re.search(r"\(([0-9.]+) GiB reported\)", CARDS[name].description).group(1)) for name in derived}
    assert all(CARDS[name].usable_gib == round(reported[name] - CONTEXT_GIB, 2) for name in derived)
    other = round(79.18 - CARDS["h100-80gb"].usable_gib, 2)
    alternatives = ", ".join(f"{round(reported[name] - other, 2):.2f}" for name in sorted(derived, key=reported.get))
    current = ", ".join(f"{CARDS[name].usable_gib:.2f}" for name in sorted(derived, key=reported.get))
    assert f"context would be {other:.2f} GiB" in text
    assert f"({alternatives.replace(', 4', ' and 4', 1)} GiB instead of {current.replace(', 4', ' and 4', 1)})" in text
    published = data.published("colpali", "plain")
    lik = published[(published["batch_size"] == 128) & (published["variant"] == "lik")].iloc[0]
    assert lik["outcome"] == "ok" and lik["step_peak_reserved_gib"] <= CARDS["h100-80gb"].usable_gib
    assert f"reserved {lik['step_peak_reserved_gib']:.2f} GiB there and trained" in text


def test_the_published_op_total_is_its_held_memory_plus_its_backward_spike():
    """book/data/published.csv: held, backward spike and total are three figures; total = held + spike to the
    published rounding (a GiB figure to 0.01 GiB, a MiB figure to 1 MiB)."""
    frame = pd.read_csv(data.PUBLISHED)
    split = frame.dropna(subset=["op_held_mib", "op_backward_spike_mib", "op_total_mib"])
    assert len(split) >= 4
    for _, row in split.iterrows():
        tolerance = 0.01 * 1024 if row["op_total_mib"] >= 1024 else 1.0
        assert abs(row["op_held_mib"] + row["op_backward_spike_mib"] - row["op_total_mib"]) <= tolerance, row["source"]
    vanilla = split[(split["stack"] == "colpali") & (split["batch_size"] == 128) & (split["variant"] == "vanilla")].iloc[0]
    assert [round(vanilla[c] / 1024, 2) for c in ("op_held_mib", "op_backward_spike_mib", "op_total_mib")] == [2.40, 5.41, 7.81]


def test_what_the_ceilings_page_says_of_the_stack_pages_times_is_their_timing_records():
    from harness.report import data, prose, tables

    cells, _ = data.load()
    text = prose.stack_page_timing(cells)
    trained = cells[(cells["outcome"] == "ok") & (cells["kind"] == "train")]  # op cells are the op page's
    assert len(trained) < len(cells[cells["outcome"] == "ok"])
    assert f"only for the {len(tables.timed(cells[cells['kind'] == 'train']))} of their {len(trained)} trained grid cells" in text
    assert "parity" not in set(cells["grid"])  # traced cells have their own page


def test_lik_op_memory_that_holds_the_autotuners_buffers_is_marked_and_set_beside_the_tuned_call():
    """op.md: a PyLate lik op cell measured on a call during which Triton autotuned is marked with a mark no other
    page uses (elsewhere † is a ceiling a long run could not train at), and the same call's memory once tuned — a
    PyLate training cell's replay of exactly those shapes — stands beside it, with the difference in the legend."""
    from harness.report import data, predictions, tables, text

    assert len({tables.TUNER_MARK, text.LONG_RUN_MARK, text.LOADER_MARK, text.RUNNING_MARK, predictions.ROUGH_MARK}) == 5
    cells, calls = data.load()
    ops = data.op_level(cells, calls)
    tuned_from = data.tuner_inside_from(data.lik_spike())
    assert tuned_from == 256  # the record saw kernels autotune inside the first backward at B=256 and 512
    ok = calls[~calls["oom_in_replay"].astype(bool) & (calls["backend"] == "lik")]
    training = ok[ok["stack"] == "pylate"]
    tuned = {}
    for _, op in ok[ok["stack"] == "op-pylate"].iterrows():
        same = training[[list(q) == list(op["query_shape"]) and list(d) == list(op["doc_shape"])
                         for q, d in zip(training["query_shape"], training["doc_shape"], strict=True)]]  # fmt: skip
        if not same.empty:
            tuned[int(op["batch_size"])] = float((same["saved_for_backward_mib"] + same["backward_transient_peak_mib"]).min())
    assert tables.tuned_lik_totals(calls) == pytest.approx(tuned)
    shown = tables.op_speed_tables(ops, tuned_from, tuned)
    marked = {(head, row["batch"], row["backend"]): str(row["held + bwd spike (MiB)"]) for head, table in shown.items()
              for _, row in table.iterrows() if tables.TUNER_MARK in str(row["held + bwd spike (MiB)"])}  # fmt: skip
    expected = {(f"{r.stack.removeprefix('op-')} · {r.regime}", r.batch_size, "lik"): r.total_mib for r in ops.itertuples()
                if r.variant == "lik" and r.stack == "op-pylate" and r.batch_size >= 256 and r.migrated and r.outcome == "ok"}
    assert set(marked) == set(expected) and expected
    for key, value in marked.items():
        assert value == f"{text.mib(expected[key])}{tables.TUNER_MARK} ({text.mib(tuned[key[1]])} tuned)"
    legend = prose.tuner_legend(ops, tuned_from, tuned, data.lik_spike())
    assert legend.startswith(f"{tables.TUNER_MARK} ") and "includes the autotuner's buffers" in legend
    for (_, batch, _), total in expected.items():
        assert (f"B={batch}: {text.mib(total)} MiB, {text.mib(tuned[batch])} MiB tuned, "
                f"{text.mib(total - tuned[batch])} MiB more on the first call") in legend  # fmt: skip
    assert "B=1024" in legend and "the record did not run B=1024" in legend  # the record ran B=256 and 512 only


def test_the_op_page_says_what_its_tables_show_and_shows_identical_heads_once():
    """op.md: the sentence before the tables names only the columns they have (no time or speed column where no
    cell was timed under the timing rule), and heads with the same figures in every cell share one table."""
    from harness.report import data, tables

    cells, calls = data.load()
    ops = data.op_level(cells, calls)
    shown = tables.op_speed_tables(ops, data.tuner_inside_from(data.lik_spike()), tables.tuned_lik_totals(calls))
    lead = prose.op_tables_lead(shown)
    timed = not tables.timed(ops).empty
    has_time = any("median (ms)" in table.columns for table in shown.values())
    assert has_time == timed and ("the median forward + backward time" in lead) == has_time
    if not timed:
        assert "show no time and no speed relative to vanilla" in lead
        assert all(list(table.columns)[-1] == "held + bwd spike (MiB)" and "median (ms)" not in table.columns
                   for table in shown.values())  # fmt: skip
    heads = [head for name in shown for head in tables.shared_heads(name)]
    assert sorted(heads) == sorted({f"{r.stack.removeprefix('op-')} · {r.regime}" for r in ops.itertuples()})
    for name in shown:
        parts = tables.shared_heads(name)
        if len(parts) > 1:  # shared only where every head's own table is the same
            assert f"{' and '.join(parts)} have the same figures in every cell" in lead
            first = op_table_of(ops, parts[0])
            assert all(op_table_of(ops, head).equals(first) for head in parts[1:])
    assert any(len(tables.shared_heads(name)) > 1 for name in shown)  # the two negative-CE losses: one table


def test_the_op_page_says_how_many_op_cells_were_timed_only_where_one_was():
    """op.md: the coverage line under the tables' lead is the stack pages' (how many were timed, why the others
    are not), and nothing where no op cell was timed: the lead says so then."""
    from harness.report import data, tables

    cells, calls = data.load()
    ops = data.op_level(cells, calls)
    trained = int((ops["outcome"] == "ok").sum())
    untimed = ops.assign(times_comparable=False)  # as committed today: no op cell ran alone
    assert prose.timing_coverage(untimed).startswith("None of the") and prose.op_timing_coverage(untimed) == ""
    assert prose.op_timing_coverage(ops) == ("" if tables.timed(ops).empty else prose.timing_coverage(ops))
    half = ops.assign(times_comparable=[k % 2 == 0 for k in range(len(ops))])
    timed = len(tables.timed(half))
    assert 0 < timed < trained and prose.op_timing_coverage(half).startswith(f"{timed} of the {trained} cells")
    assert "prose.op_timing_coverage(ops)" in (ROOT / "book" / "op.md").read_text()


def op_table_of(ops: pd.DataFrame, head: str) -> pd.DataFrame:
    """One head's memory table alone, its rows as the op page's table lists them."""
    stack, _, regime = head.partition(" · ")
    chosen = ops[(ops["stack"] == f"op-{stack}") & (ops["regime"] == regime)]
    (table,) = tables.op_speed_tables(chosen).values()
    return table


def test_where_each_repeated_pair_ran_is_read_from_their_platform_strings():
    from harness.report import data, prose, timing

    pairs = data.repeats()
    text = prose.repeat_hosts(pairs)
    same = [first for first, second in pairs if first.env.platform == second.env.platform]
    gaps = {first.cell_id: gap for first, _, _, gap in timing.repeat_gaps(pairs)}
    if same:
        widest = 100 * max(gaps[c.cell_id] for c in same)
        assert f"{len(same)} on one host build (the same platform string), medians apart by up to {widest:.1f}%" in text
    if len(same) < len(pairs):
        assert f"{len(pairs) - len(same)} on two host builds" in text


def page(name: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / "book" / f"{name}.md").read_text())


def test_the_colqwen2_page_s_fixed_words_on_the_runs_it_compares_hold(committed):
    """colpali.md: "A document page is up to 768 visual tokens + 11 prompt tokens" (the 128-d projection);
    "ours uses colpali-engine 0.3.18's native switch under transformers 5.17 (the release the colpali
    environment pins) on an H200 capped to 78.43 GiB"; "The published run's vanilla B=128 cell ran out of
    memory"."""
    results, _, calls = committed
    text = page("colpali")
    colqwen = calls[calls["stack"] == "colpali"]
    assert len(colqwen) > 10 and "up to 768 visual tokens + 11 prompt tokens" in text
    assert all(list(doc)[1] <= 768 + 11 and list(doc)[-1] == list(query)[-1] == 128
               for query, doc in zip(colqwen["query_shape"], colqwen["doc_shape"], strict=True))  # fmt: skip
    compared = [result for _, result in results.of(data.PUBLISHED_GRID)
                if result.stack == "colpali" and result.card == "h100-80gb"]  # fmt: skip
    assert len(compared) >= 4 and "colpali-engine 0.3.18's native switch under transformers 5.17" in text
    pins = (ROOT / "envs" / "colpali" / "no-deps.txt").read_text() + (ROOT / "envs" / "colpali" / "constraints.txt").read_text()
    assert "colpali-engine==0.3.18" in pins and re.search(r"^transformers==5\.17\.", pins, re.M)
    for result in compared:
        assert result.env.packages["colpali-engine"] == "0.3.18", result.cell_id
        assert result.env.packages["transformers"].startswith("5.17."), result.cell_id
        assert result.env.device_name == "NVIDIA H200", result.cell_id  # "on an H200 capped to 78.43 GiB"
        assert result.env.card_cap_mib / 1024 == pytest.approx(CARDS["h100-80gb"].usable_gib)
    assert f"on an H200 capped to {CARDS['h100-80gb'].usable_gib:.2f} GiB" in text
    published = data.published("colpali", "plain")
    vanilla = published[(published["batch_size"] == 128) & (published["variant"] == "vanilla")]
    assert "The published run's vanilla B=128 cell ran out of memory" in text and list(vanilla["outcome"]) == ["oom"]


def test_what_the_pages_call_an_h200_ran_on_one(committed):
    """intro.md: "24–80 GB: capped to what PyTorch can use on such a card, on an H200, or for N of the M probes on
    an H100 80GB HBM3, which the cross-card check vouches for; 141 GB: the whole H200" (the ceiling searches' probes
    the front page's tables read) and "On the whole 141 GB H200 (native card)"; colpali.md: "On the whole H200 …
    the uncapped 141 GB card". Every probe names an H200 (or no GPU: a crashed kernel records none) or, under a cap,
    a GPU the cross-card check vouches for; every probe and grid cell on the native card names an H200."""
    results, cells, _ = committed
    capped = data.capped_probe_gpus(results)
    assert "capped to what PyTorch can use on such a card, {glue:md}`capped_gpus`; 141 GB: the whole H200" in page("intro")
    assert 'glue("capped_gpus", Markdown(prose.capped_gpus_words(data.capped_probe_gpus(results))), ' in page("intro")
    assert prose.capped_gpus_words(capped).startswith("on an H200")
    assert set(data.probe_devices(results)) <= {"NVIDIA H200", data.UNRECORDED} | capped.vouched
    whole = {result.env.device_name for _, result in results.of(data.CEILINGS)
             if result.env and result.env.device_name and CARDS[result.spec.card].usable_gib is None}  # fmt: skip
    assert whole == {"NVIDIA H200"}
    native = cells[cells["card"] == "native"]
    assert len(native) > 10 and set(native["device_name"].dropna()) == {"NVIDIA H200"}
    assert "On the whole 141 GB H200 (native card)" in page("intro") and "## On the whole H200" in page("colpali")


def test_the_gathered_page_describes_its_grids_as_they_are():
    """gathered.md: "(`grids/multi-gpu.yaml`: the 80 GB profile, W = 1, 2, 4 and 8)", its table "on the 80 GB
    profile", and the per-rank ceilings: "trains 8 steps on every seed with negatives gathered across 8 GPUs
    (`grids/multi-gpu-ceilings.yaml`; each probe a world-size-8 cell …)"."""
    from harness.grid import load_grid
    from harness.report import scaling
    from harness.search import load_searches

    text = page("gathered")
    cells = [cell.spec for cell in load_grid(scaling.MULTI_GPU_GRID)]
    assert {spec.card for spec in cells} == {scaling.GATHER_CARD} == {"h100-80gb"}
    assert sorted({spec.world_size for spec in cells}) == [1, 2, 4, 8] and all(spec.gather for spec in cells)
    assert "the 80 GB profile, W = 1, 2, 4 and 8" in text and "(GiB) on the 80 GB profile" in text
    searches = load_searches(data.MULTI_GPU_CEILINGS_GRID)
    assert searches and all((s.steps, s.world_size, s.gather, s.card) == (8, 8, True, "h100-80gb") for s in searches)
    assert "trains 8 steps on every seed with negatives gathered across 8 GPUs" in text


def test_the_gradcache_page_s_shapes_chunks_and_card_lines_are_the_committed_ones(committed):
    """pylate-gradcache.md: "documents [B, 2, 300, 128] … `mini_batch_size` 64", one chunk of queries "against
    all B·2 documents at a time", the chunk "by default the mini-batch"; "dotted: the usable memory of the
    24 GB and 80 GB profiles"."""
    from harness.report import scaling

    _, cells, calls = committed
    text = page("pylate-gradcache")
    assert "`mini_batch_size` 64" in text and "against all B·2 documents at a time" in text
    cached, cached_calls = data.select(cells, "pylate", "gradcache"), data.select(calls, "pylate", "gradcache")
    assert len(cached) and set(cached["mini_batch_size"]) == {64}
    for _, call in cached_calls.iterrows():
        chunk = 64 if pd.isna(call["score_mini_batch_size"]) else int(call["score_mini_batch_size"])
        assert list(call["doc_shape"])[:2] == [call["batch_size"], 2] and list(call["query_shape"])[0] == chunk
    figure = scaling.plot_gradcache(cached, cached_calls)
    dotted = {round(line.get_ydata()[0], 2) for line in figure.axes[0].get_lines() if line.get_linestyle() == ":"}
    assert dotted == {CARDS["rtx4090-24gb"].usable_gib, CARDS["h100-80gb"].usable_gib}
    assert "the usable memory of the 24 GB and 80 GB profiles" in text
