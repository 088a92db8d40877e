"""The memory model's page: its tables and sentences say what the validation file holds."""

from __future__ import annotations

import pandas as pd
import pytest

from harness import memmodel
from harness.report import data, decision, predictions, style, text
from harness.report.text import regime_label
from test_book import ROOT


@pytest.mark.parametrize("allocator", predictions.ALLOCATORS)
def test_the_validation_table_shows_every_search_with_probes_and_its_verdict(allocator):
    document = predictions.validation()
    tables = predictions.validation_tables(document, allocator)
    table = pd.concat(tables.values(), ignore_index=True)
    probed = [row for row in document["validation"] if row["state"] != "not run" and row["allocator"] == allocator]
    probed.sort(key=lambda row: list(tables).index(regime_label(row['stack'], row['regime'])))
    assert len(table) == len(probed) > 0
    missed = [row for row in probed if row["within_goal"] is False]
    assert (table["verdict"].str.startswith("misses")).sum() == len(missed)
    assert (table["verdict"] == "within goal").sum() == sum(row["within_goal"] is True for row in probed)
    for row, (_, shown) in zip(probed, table.iterrows(), strict=True):
        earlier = row["state"] == predictions.EARLIER_DRAW_STATE  # found on the data's earlier draw, run again: not judged
        assert shown["measured"].endswith(predictions.EARLIER_DRAW_MARK) == earlier
        if earlier:
            assert row["within_goal"] is None and shown["verdict"] == "not judged: its probes run again"
        elif row["measured_ceiling"] is not None:
            assert shown["measured"] == str(row["measured_ceiling"]) and shown["resolution"] == row["resolution"]
        else:
            assert shown["verdict"] in ("", "inside its range", "below a batch that trained", "at a batch that failed",
                                       "above a batch that failed")
        running = row["measured_ceiling"] is None and row["measured_fails"] is not None and not earlier
        assert shown["measured"].endswith(predictions.RUNNING_MARK) == running
        assert predictions.ROUGH_MARK not in shown["measured"]  # the rough mark is the cards table's predictions only


def test_every_judged_search_is_in_a_table_the_page_shows():
    """The page's counts cover both allocators, and each allocator's searches have their own tables: every
    search the summary counts is a row of one of them, and the per-allocator counts add up to the summary's."""
    document = predictions.validation()
    judged = [row for row in document["validation"] if row["within_goal"] is not None]
    shown = sum(len(table) for allocator in predictions.ALLOCATORS
                for table in predictions.validation_tables(document, allocator).values())  # fmt: skip
    assert shown == sum(row["state"] != "not run" for row in document["validation"]) >= len(judged)
    counts = predictions.judged_by_allocator(document)
    assert sum(within for within, _ in counts.values()) == document["summary"]["within_goal"]
    assert sum(total for _, total in counts.values()) == document["summary"]["judged"] == len(judged)
    text = predictions.summary_words(document)
    for allocator, (within, total) in counts.items():
        words = "the default allocator" if allocator == "default" else f"{allocator} segments"
        assert f"{within} of {total} under {words}" in text
    page = (ROOT / "book" / "predict.md").read_text()
    for allocator in predictions.ALLOCATORS:
        assert f'predictions.validation_tables(document, "{allocator}")' in page


def test_each_mark_on_the_page_means_one_thing_and_has_its_legend():
    document = predictions.validation()
    probed = [row for row in document["validation"] if row["state"] != "not run"]
    running = [row for row in probed if row["measured_ceiling"] is None and row["measured_fails"] is not None]
    legend = predictions.searching_legend(document)
    assert legend.startswith(f"`{predictions.RUNNING_MARK}`: a search still running") == bool(running)
    assert predictions.RUNNING_MARK == decision.RUNNING_MARK == text.RUNNING_MARK != predictions.ROUGH_MARK  # one mark
    rows = memmodel.table(memmodel.fit(data.read()))
    assert predictions.misclassifying(rows) == "" or predictions.misclassifying(rows).startswith(f"`{predictions.ROUGH_MARK}N`: ")
    page = (ROOT / "book" / "predict.md").read_text()
    assert "{glue:md}`searching`" in page and "{glue:md}`rough`" in page and "marked `*`" not in page


def test_the_summary_counts_what_the_file_counts():
    document = predictions.validation()
    text = predictions.summary_words(document)
    summary = document["summary"]
    assert text.startswith(f"Leaving each card out, {summary['within_goal']} of the {summary['judged']} finished")
    assert document["goal"] == "|predicted - measured| <= max(resolution, 5% of measured)"  # what the sentence says
    worst = summary["worst"]
    if worst["wrong_term"]:
        assert f"predicted {worst['predicted_ceiling']} against a measured {worst['measured_ceiling']}" in text
    unfinished = [row for row in document["validation"]
                  if row["within_goal"] is None and row["predicted_ceiling"] is not None and row["measured_fits"]]  # fmt: skip
    if unfinished:
        expandable = sum(row["allocator"] == "expandable" for row in unfinished)
        assert f"Of the {len(unfinished)} searches still running or at a lower bound (" in text
        assert (f"{expandable} under expandable segments" in text) == bool(expandable)


def test_the_cards_table_is_the_models_prediction_marked_where_its_margin_is_rough():
    rows = memmodel.table(memmodel.fit(data.read()))
    for stack, regime in predictions.recipes(rows):
        table = predictions.cards_table(rows, stack, regime).set_index("card (usable GiB)")
        mine = [row for row in rows if (row["stack"], row["regime"]) == (stack, regime)]
        assert len(table) == len({row["card"] for row in mine})
        for row in mine:
            column = style.short(row["backend"]).replace(" ", "\u00a0")
            batch = str(row["predicted_largest_batch"])
            shown = [value for value in table[column] if value.split("<br>")[0].removeprefix(predictions.ROUGH_MARK) == batch]
            assert shown and all(value.startswith(predictions.ROUGH_MARK) == bool(row["margin_misclassifies"]) for value in shown)


def test_the_lengths_sentence_names_what_the_committed_steps_saw():
    text = predictions.length_coverage()
    lengths = data.query_lengths(stack="colpali")
    assert f"queries of {lengths['query_tokens'].min()}–{lengths['query_tokens'].max()} tokens" in text
    assert "pylate: queries of 48 tokens, documents of 300" in text  # PyLate pads to fixed lengths


def test_gathered_negatives_scale_each_ranks_vanilla_grid_with_the_world_size():
    """At W = 1 the formula is the replays' own (within 2 MiB of every committed vanilla replay on the
    whole H200); gathering W ranks' documents multiplies one rank's op forward by exactly W."""
    import pytest

    from harness import op_bytes
    from harness.report import data, predictions

    rows = predictions.gathered_rows(data.load()[1])
    assert {(row["stack"], row["regime"]) for row in rows} >= {("colpali", "plain"), ("pylate", "grad-checkpoint")}
    for row in rows:
        assert abs(row["forward_mib"][1] - row["measured_mib"]) <= 2.0, row
        for world in predictions.GATHER_WORLDS:
            assert row["forward_mib"][world] == pytest.approx(world * row["forward_mib"][1], rel=1e-12)
    text = predictions.gathered_reading(rows)
    assert text.startswith("At W = 1 the formula gives every replay's forward peak within") and "not measurements" in text
    assert predictions.gathered_reading(rows, measured=[2, 2]).endswith(
        "The tables below are predictions from one formula; the cells measured at W = 2 are read above.")
    with pytest.raises(ValueError, match="world size 0"):
        op_bytes.gathered("colpali", [4, 8, 16], [4, 30, 16], 4, 0)
    table = predictions.gathered_table(rows, "colpali", "plain")
    assert list(table.columns)[-4:] == ["W=1", "W=2", "W=4", "W=8"]
    assert list(table["local batch"]) == sorted(table["local batch"])


def test_a_prediction_at_the_batch_that_failed_is_said_to_be_at_it_not_above_it():
    row = {"measured_fits": 84, "measured_fails": 88}
    assert predictions._inside({**row, "predicted_ceiling": 88}) == "at a batch that failed"
    assert predictions._inside({**row, "predicted_ceiling": 96}) == "above a batch that failed"
    assert predictions._inside({**row, "predicted_ceiling": 86}) == "inside its range"
    assert predictions._inside({**row, "predicted_ceiling": 80}) == "below a batch that trained"


def test_the_worst_miss_is_named_in_words_not_by_its_search_id():
    document = predictions.validation()
    worst = document["summary"].get("worst")
    words = predictions.summary_words(document)
    if worst and worst.get("wrong_term"):
        assert worst["search_id"] not in words and "(0." not in words  # no ids, no '(a, b]' notation
        assert f"predicted {worst['predicted_ceiling']} against a measured {worst['measured_ceiling']}" in words
