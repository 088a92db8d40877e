"""The front page's decision tables and recommendation: computed from the searches, never ahead of them."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from harness.report import data, decision, text
from harness.report.text import EARLIER_DRAW_MARK, card_short
from harness.search import Ceiling, CeilingSearch


def row(backend: str, card: str, fits: int | None, fails: int | None, done: bool = True, probes: int = 5) -> data.SearchRow:
    variant, chunk = (backend, None) if "chunk" not in backend else ("vanilla", int(backend.split()[-1]))
    search = CeilingSearch(stack="pylate", regime="grad-checkpoint", variant=variant, score_mini_batch_size=chunk,
                           card=card, seeds=(42, 43, 44), start=128, limit=4096, resolution=32)  # fmt: skip
    ceiling = Ceiling(fits=fits, fails=fails, next_batch=None if done else (fails or 2 * (fits or 64)))
    return data.SearchRow(search=search, ceiling=ceiling, probes=probes, usable_gib=22.96)


def test_entries_mark_running_searches_and_the_table_is_backend_by_card():
    rows = [row("vanilla", "rtx4090-24gb", 224, 256), row("lik", "rtx4090-24gb", 352, 384),
            row("vanilla", "h100-80gb", 640, 672), row("lik", "h100-80gb", 1280, 1344, done=False),
            row("vanilla + chunk 64", "rtx4090-24gb", None, None, done=False, probes=0)]  # fmt: skip
    table = decision.decision_table(rows, "pylate", "grad-checkpoint")
    assert list(table.columns) == ["backend", "24\u00a0GB", "80\u00a0GB"]
    assert list(table["backend"]) == ["vanilla", "lik", "vanilla\u00a0+\u00a0chunk\u00a064"]
    assert table.iloc[1].tolist()[1:] == ["352", "1280–1343*"]
    assert table.iloc[2].tolist()[1:] == ["not\u00a0run", ""]
    assert decision.criterion(rows) == "8 steps on each of seeds 42, 43 and 44"


def test_a_ceiling_a_long_run_could_not_train_at_is_marked_and_said():
    base, fused = row("vanilla", "h100-80gb", 120, 128), row("lik", "h100-80gb", 160, 168)
    held, out = data.LongRunVerdict(120, 100, 100, "ok"), data.LongRunVerdict(160, 100, 26, "oom")
    rows = [dataclasses.replace(base, long_run=held), dataclasses.replace(fused, long_run=out)]
    table = decision.decision_table(rows, "pylate", "grad-checkpoint")
    assert table["80\u00a0GB"].tolist() == ["120", f"160{text.LONG_RUN_MARK}"]
    assert text.ceiling_text(rows[1]) == "160† (OOM at step 27 of 100)"
    assert text.ceiling_text(rows[0]) == "120"  # a long run that held changes nothing of the answer
    advice = decision.advice(rows, "pylate", "grad-checkpoint")
    assert advice.startswith("On 80 GB, where the searches have settled, lik trains the largest batch: 160† (over 8 "
                             "steps) against 120 on 80 GB, 1.33×")  # the batch is marked as the 8-step one it is
    assert advice.endswith(". Over a long run, vanilla's 120 on 80 GB trained all 100 steps; lik's 160 on 80 GB ran out "
                           "of memory at step 27 of 100, so that 8-step ceiling is not a batch a run can train at.")  # fmt: skip
    assert decision.long_run_words([base, fused]) == ""  # no long run: nothing said
    # the run below the failed ceiling held: how its batch compares with vanilla's, which held too
    below = dataclasses.replace(out, below=data.LongRunVerdict(144, 100, 100, "ok"))
    rows = [rows[0], dataclasses.replace(fused, long_run=below)]
    assert decision.long_run_words(rows).endswith("so that 8-step ceiling is not a batch a run can train at, while 144 "
                                                  "trained all 100 steps (1.20× vanilla's 120, which held too)")  # fmt: skip


def test_a_recommendation_names_only_cards_whose_searches_have_settled():
    settled = [row("vanilla", "rtx4090-24gb", 224, 256), row("lik", "rtx4090-24gb", 352, 384),
               row("flash", "rtx4090-24gb", 352, 384)]  # fmt: skip
    text = decision.advice(settled, "pylate", "grad-checkpoint")
    assert text.startswith("On 24 GB, where the searches have settled, lik and flash train the largest batch: "
                           "352 against 224 on 24 GB, 1.57×")  # fmt: skip
    # a search still running whose range reaches above the best: that card is not settled
    running = [*settled, row("vanilla + chunk 64", "rtx4090-24gb", 352, 416, done=False)]
    assert decision.advice(running, "pylate", "grad-checkpoint").startswith("No card has its searches settled")
    # one that cannot end above it does not hold the card back
    bounded = [*settled, row("vanilla + chunk 64", "rtx4090-24gb", 320, 352, done=False)]
    assert decision.advice(bounded, "pylate", "grad-checkpoint").startswith("On 24 GB")
    # without vanilla's ceiling nothing is compared
    assert decision.advice(settled[1:], "pylate", "grad-checkpoint").startswith("No card")
    assert decision.advice([], "pylate", "grad-checkpoint").startswith("Not measured yet")
    # a backend that wins on one card and only ties vanilla on another: the tie is said, not hidden
    tied = [*settled, row("vanilla", "h100-80gb", 640, 672), row("lik", "h100-80gb", 640, 672),
            row("flash", "h100-80gb", 640, 704)]  # fmt: skip
    text = decision.advice(tied, "pylate", "grad-checkpoint")
    assert text.startswith("On 24 GB and 80 GB, where the searches have settled, lik and flash train the largest batch: "
                           "352 against 224 on 24 GB, 1.57×; on 80 GB vanilla trains the same batch (640).")  # fmt: skip
    # a backend that ties the winner wherever its own search settled, but has none on another card: said
    unsearched = [*settled, row("vanilla", "h100-80gb", 640, 672), row("lik", "h100-80gb", 1280, 1344),
                  row("flash", "h100-80gb", None, None, done=False, probes=0)]  # fmt: skip
    text = decision.advice(unsearched, "pylate", "grad-checkpoint")
    assert text.startswith("On 24 GB and 80 GB, where the searches have settled, lik trains the largest batch: "
                           "352 against 224 on 24 GB, 1.57×; 1280 against 640 on 80 GB, 2.00×; flash trains the same "
                           "batch as lik on 24 GB, where its search has settled; on 80 GB its search has not run.")  # fmt: skip
    # a search not run is said to be not run, one under way to be searching, with its range
    running = [*unsearched[:-1], row("flash", "h100-80gb", 1216, 1280, done=False)]
    assert ("flash trains the same batch as lik on 24 GB, where its search has settled; on 80 GB it is still searching "
            "(1216–1279).") in decision.advice(running, "pylate", "grad-checkpoint")  # fmt: skip
    # one that lost on a card it was searched on is not said to match
    lost = [*unsearched[:-1], row("flash", "h100-80gb", 1216, 1280)]
    assert "flash trains the same" not in decision.advice(lost, "pylate", "grad-checkpoint")


@pytest.fixture(scope="module")
def committed():
    results = data.read()
    cells, _ = data.load(results)
    return cells, data.ceilings(results)


def test_the_committed_recommendations_follow_the_committed_ceilings(committed):
    cells, searches = committed
    for stack, regime in decision.regimes(searches):
        text = decision.advice(searches, stack, regime)
        assert "faster" not in text and "slower" not in text and "step time" not in text  # said once, by time_words
        mine = [r for r in searches if (r.stack, r.regime, r.allocator) == (stack, regime, "default")]
        for card in decision._decided_cards(mine):
            best = max(r.settled or 0 for r in mine if r.card == card)
            vanilla = next(r for r in mine if r.card == card and r.backend == "vanilla")
            if best > (vanilla.settled or 0):  # the sentence names the gain over vanilla on that card
                winner = next(r for r in mine if r.card == card and r.settled == best)
                ran_out = winner.long_run is not None and winner.long_run.ran_out
                mark = f"{decision.LONG_RUN_MARK} (over {winner.search.steps} steps)" if ran_out else ""
                assert f"{best}{mark} against {vanilla.settled} on {card_short(card)}, {best / vanilla.settled:.2f}×" in text
        table = decision.decision_table(searches, stack, regime)
        for r in mine:  # every entry of the table is its search's state, marked while it runs or runs again
            value = table.set_index("backend").loc[r.backend.replace(" ", "\u00a0"), decision.card_column(r.card)]
            rerun = r.ceiling.earlier_draw  # ended on probes of the data's earlier draw, which run again
            assert value == decision.entry(r) and value.endswith("*") == (r.probes > 0 and not r.done and not rerun)
            assert value.endswith(EARLIER_DRAW_MARK) == rerun
        reruns = sum(r.ceiling.earlier_draw for r in mine)  # the advice says how many wait on the current draw
        assert (f" {reruns} of the searches in the table (marked {EARLIER_DRAW_MARK})" in text) == (
            reruns > 0 and not decision._decided_cards(mine))


def test_the_step_time_line_reads_timed_cells_only(committed):
    cells, _ = committed
    found = decision.timed_batch(cells, "pylate", "grad-checkpoint")
    assert found is not None and "vanilla" in found.seconds and len(found.seconds) >= 2
    timed = cells[(cells["stack"] == "pylate") & (cells["regime"] == "grad-checkpoint") & (cells["card"] == "h100-80gb")
                  & (cells["batch_size"] == found.batch) & cells["times_comparable"].astype(bool)]  # fmt: skip
    for backend, seconds in found.seconds.items():
        assert seconds == float(timed[timed["backend"] == backend]["steady_step_time_sec"].item())
    untimed = cells.assign(times_comparable=False)
    assert decision.timed_batch(untimed, "pylate", "grad-checkpoint") is None
    # a regime timed only on the whole H200 (GradCache) reads its times there, and says the card
    gradcache = cells[(cells["stack"] == "pylate") & (cells["regime"] == "gradcache")]
    if not gradcache[gradcache["card"] == "h100-80gb"]["backend"].nunique() > 1:
        found = decision.timed_batch(cells, "pylate", "gradcache")
        assert found is not None and found.card == "native" and "141 GB" in decision.time_words(found)
    assert decision.time_words(None).startswith("No batch")


def test_the_pages_inputs_digest_changes_with_a_result_and_only_then(tmp_path):
    for top in data.PAGE_INPUTS:
        (tmp_path / top).mkdir(parents=True)
    (tmp_path / "results" / "a.json").write_text("{}")
    before = data.inputs_digest(tmp_path)
    (tmp_path / "harness" / "__pycache__").mkdir()
    (tmp_path / "harness" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    assert data.inputs_digest(tmp_path) == before  # a Python cache is no input
    (tmp_path / "results" / "a.json").write_text('{"x": 1}')
    assert data.inputs_digest(tmp_path) != before
    shutil.rmtree(tmp_path / "results")
    (tmp_path / "results").mkdir()
    assert data.inputs_digest(tmp_path) != before


def test_a_prediction_stands_beside_a_search_that_has_not_settled_and_never_beside_a_measured_ceiling():
    running, finished = row("lik", "h100-80gb", 1280, 1344, done=False), row("vanilla", "h100-80gb", 640, 672)
    assert decision.entry(running, 1300) == "1280–1343*<br><i>pred.\u00a01300</i>"
    assert decision.entry(finished, 700) == "640"
    table = decision.decision_table([running, finished], "pylate", "grad-checkpoint",
                                    {("pylate", "grad-checkpoint", "lik", "h100-80gb"): 1300})  # fmt: skip
    assert table.set_index("backend").loc["lik", "80\u00a0GB"].endswith("pred.\u00a01300</i>")
    assert decision.started([], "pylate", "plain", {("pylate", "plain", "lik", "a100-40gb"): 80})


def test_a_card_held_back_by_a_stopped_search_says_why():
    settled = [row("vanilla", "h100-80gb", 640, 672), row("lik", "h100-80gb", 1280, 1344), row("vanilla", "native", 896, 928)]
    crashed = Ceiling(fits=2304, next_batch=2432, stopped="probe x crashed", crashed="pylate-grad-checkpoint-b2432-lik-native")
    stopped = dataclasses.replace(row("lik", "native", 2304, None, done=False), ceiling=crashed)
    advice = decision.advice([*settled, stopped], "pylate", "grad-checkpoint")
    assert advice.endswith(". Not settled yet on 141 GB (whole H200): lik's search on 141 GB (whole H200) stopped at "
                           "≥ 2304 (the probe at 2432 crashed).")  # fmt: skip
    # a card merely still searching gets no reason
    running = [*settled, row("lik", "native", 2304, 2432, done=False)]
    assert decision.advice(running, "pylate", "grad-checkpoint").endswith(
        ". Not settled yet on 141 GB (whole H200).")


def test_a_fused_backend_is_said_to_move_the_failure_only_where_vanilla_s_failed_in_the_op():
    from harness.report import prose

    def failing(backend: str, card: str, where: str) -> data.SearchRow:
        return dataclasses.replace(row(backend, card, 224, 256), fails_where=where)

    rows = [failing("vanilla", "rtx4090-24gb", "maxsim"), failing("lik", "rtx4090-24gb", "elsewhere"),
            failing("vanilla", "h100-80gb", "elsewhere"), failing("lik", "h100-80gb", "elsewhere")]  # fmt: skip
    assert prose.fused_failure_places(rows) == (
        "In all 2 searches of a fused backend whose next batch has failed, it failed outside the op; in 1 of them "
        "vanilla's next batch failed in the op, so there the fused backend moves the failure out of the score op.")
    assert prose.fused_failure_places(rows[2:]) == (
        "In the one search of a fused backend whose next batch has failed, it failed outside the op.")


def test_the_front_page_answer_is_the_recommendation_its_table_and_the_step_time_line(committed):
    cells, searches = committed
    for stack, regime in decision.regimes(searches):
        pieces = decision.answer(searches, cells, stack, regime, caveat="(caveat)")
        assert pieces[0] == f"**{decision.regime_name(stack, regime)}.** {decision.advice(searches, stack, regime)} (caveat)"
        assert pieces[-1] == decision.time_words(decision.timed_batch(cells, stack, regime))
        assert len(pieces) == 2 + decision.started(searches, stack, regime)
    assert decision.answer(searches, cells, "colpali", "plain", lead="Lead.")[0].startswith("Lead. ")


def test_a_card_with_a_search_ended_on_the_earlier_draw_is_not_decided():
    """Two settled searches and a third whose walk ended on probes of the data's earlier draw: its bounds move
    once those run again, so the card is not decided yet (its entry reads N°, or ≥ N° at the grid's limit)."""
    settled = [row("vanilla", "h100-80gb", 640, 672), row("lik", "h100-80gb", 1280, 1344)]
    earlier = row("flash", "h100-80gb", 1248, 1280, done=False)
    earlier = dataclasses.replace(earlier, ceiling=dataclasses.replace(earlier.ceiling, earlier_draw=True))
    assert decision._decided_cards(settled) == ["h100-80gb"]
    assert decision._decided_cards([*settled, earlier]) == []
    assert decision.entry(earlier) == f"1248{EARLIER_DRAW_MARK}"
    at_limit = dataclasses.replace(earlier, ceiling=dataclasses.replace(earlier.ceiling, fails=None))
    assert decision.entry(at_limit) == f"≥\u00a01248{EARLIER_DRAW_MARK}"
