"""The memory model's page: its tables and sentences say what the validation file holds."""

from __future__ import annotations

from harness import memmodel
from harness.report import data, predictions


def test_the_validation_table_shows_every_search_with_probes_and_its_verdict():
    document = predictions.validation()
    table = predictions.validation_table(document)
    probed = [row for row in document["validation"] if row["state"] != "not run" and row["allocator"] == "default"]
    assert len(table) == len(probed)
    missed = [row for row in probed if row["within_goal"] is False]
    assert (table["verdict"].str.startswith("misses")).sum() == len(missed)
    assert (table["verdict"] == "within goal").sum() == sum(row["within_goal"] is True for row in probed)
    for row, (_, shown) in zip(probed, table.iterrows(), strict=True):
        if row["measured_ceiling"] is not None:
            assert shown["measured"] == str(row["measured_ceiling"])
        else:
            assert shown["verdict"] in ("", "inside the open range", "below what already trained", "above what already failed")


def test_the_summary_counts_what_the_file_counts():
    document = predictions.validation()
    text = predictions.summary_words(document)
    summary = document["summary"]
    assert text.startswith(f"Leaving each card out, {summary['within_goal']} of the {summary['judged']} finished")
    if summary["worst"]["wrong_term"]:
        assert f"predicted {summary['worst']['predicted_ceiling']} against a measured {summary['worst']['measured_ceiling']}" in text


def test_the_cards_table_is_the_models_prediction_marked_where_its_margin_is_rough():
    rows = memmodel.table(memmodel.fit(data.read()))
    for stack, regime in predictions.recipes(rows):
        table = predictions.cards_table(rows, stack, regime).set_index("card (usable GiB)")
        mine = [row for row in rows if (row["stack"], row["regime"]) == (stack, regime)]
        assert len(table) == len({row["card"] for row in mine})
        for row in mine:
            column = row["backend"].replace(" ", "\u00a0")
            shown = [value for value in table[column] if value.rstrip("*") == str(row["predicted_largest_batch"])]
            assert shown and all(value.endswith("*") == bool(row["margin_misclassifies"]) for value in shown)
