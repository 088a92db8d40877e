"""The memory model's page: its leave-one-card-out validation (``results/predictions/validation.json``,
written by ``harness predict --validate``) and its predictions for cards nobody measured, as tables
and computed sentences. Every figure here is labelled predicted; torch-free like the rest of the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.memmodel import OTHER_CARDS, VALIDATION, MemoryModel, ModelError, fit
from harness.report import data, style
from harness.report.text import nowrap, percent
from harness.spec import CARDS


def fitted(results: data.Results) -> tuple[MemoryModel | None, str]:
    """The model fitted to ``results``, or None with the one-line reason (no training cell yet)."""
    try:
        return fit(results), ""
    except ModelError as error:
        return None, str(error)


def validation(path: Path = VALIDATION) -> dict[str, Any]:
    """The committed validation document."""
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _search(row: dict[str, Any]) -> str:
    return f"{row['stack']} · {row['regime']} · {row['backend']}"


def _card(name: str) -> str:
    """'H100 80 GB' (a measured profile), 'H200 141 GB' (the whole card), 'B200 180 GB' (a named card)."""
    if name in CARDS:
        nominal = CARDS[name].nominal_gb
        return f"H200 {nominal} GB" if CARDS[name].usable_gib is None else f"{name.split('-')[0].upper()} {nominal} GB"
    return OTHER_CARDS[name].label.split(" (")[0] if name in OTHER_CARDS else name


def validation_tables(document: dict[str, Any], allocator: str = "default") -> dict[str, pd.DataFrame]:
    """Per stack · regime, one row per ceiling search that has probes: measured (a range marked ``*``
    while it runs) and the search's resolution, predicted without its card's cells, the error, and the verdict (which
    term misses where it misses; for a search still running, where the prediction lies)."""
    tables: dict[str, list[dict[str, object]]] = {}
    for row in document["validation"]:
        if row["state"] == "not run" or row["allocator"] != allocator:
            continue
        if row["measured_ceiling"] is not None:
            measured = str(row["measured_ceiling"])
        elif row["measured_fails"] is None:
            measured = f"≥ {row['measured_fits']}"
        else:
            measured = f"{row['measured_fits']}–{row['measured_fails'] - 1}*"
        predicted = "—" if row["predicted_ceiling"] is None else str(row["predicted_ceiling"])
        if row["within_goal"] is None:
            verdict = "" if row["predicted_ceiling"] is None else _inside(row)
        else:
            verdict = "within goal" if row["within_goal"] else f"misses: {row['wrong_term']}"
        tables.setdefault(f"{row['stack']} · {row['regime']}", []).append({
            "backend": nowrap(row["backend"]), "card": nowrap(_card(row["card"])),
            "measured": nowrap(measured).replace("–", "–\u2060"), "resolution": row["resolution"], "predicted": predicted,
            "error": "" if row["error_fraction"] is None else percent(100 * row["error_fraction"], "+.0f"),
            "verdict": verdict,
        })  # fmt: skip
    return {key: pd.DataFrame(rows) for key, rows in tables.items()}


def _inside(row: dict[str, Any]) -> str:
    """An unfinished search: whether the prediction lies where the search can still end."""
    low, high, predicted = row["measured_fits"], row["measured_fails"], row["predicted_ceiling"]
    if low is not None and predicted < low:
        return "below a batch that trained"
    if high is not None and predicted >= high:
        return "above a batch that failed"
    return "inside its range"


def summary_words(document: dict[str, Any]) -> str:
    """The validation in words: how many finished searches are within the goal, the worst miss and its cause."""
    summary = document["summary"]
    text = (f"Leaving each card out, {summary['within_goal']} of the {summary['judged']} finished ceiling searches are "
            "predicted within one search resolution or 5% of the measured batch, whichever is larger.")  # fmt: skip
    worst = summary.get("worst")
    if worst and worst.get("wrong_term"):
        text += (f" The worst is {worst['search_id']}: predicted {worst['predicted_ceiling']} against a measured "
                 f"{worst['measured_ceiling']} ({percent(100 * worst['error_fraction'], '+.0f')}); the wrong term is the "
                 f"{worst['wrong_term']} ({worst['note']}).")  # fmt: skip
    unfinished = [row for row in document["validation"]
                  if row["within_goal"] is None and row["predicted_ceiling"] is not None and row["measured_fits"]]  # fmt: skip
    if unfinished:
        inside = sum(_inside(row) == "inside its range" for row in unfinished)
        text += (f" Of the {len(unfinished)} searches still running or at a lower bound, {inside} have their prediction "
                 "where the search can still end.")  # fmt: skip
    return text


def recipes(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The (stack, regime) pairs of the predicted table, in its order."""
    return list(dict.fromkeys((row["stack"], row["regime"]) for row in rows))


def cards_table(rows: list[dict[str, Any]], stack: str, regime: str) -> pd.DataFrame:
    """Card (rows, by usable memory) × backend (columns): the predicted largest batch per device of one
    recipe, marked ``*`` where the backend's margin misclassifies committed cells."""
    mine = [row for row in rows if (row["stack"], row["regime"]) == (stack, regime)]
    if not mine:
        return pd.DataFrame()
    frame = pd.DataFrame(mine)
    frame["shown"] = frame.apply(
        lambda r: f"{r['predicted_largest_batch']}{'*' if r['margin_misclassifies'] else ''}", axis=1)
    frame["card (usable GiB)"] = frame.apply(lambda r: nowrap(f"{_card(r['card'])} ({r['usable_gib']:.1f})"), axis=1)
    order = list(frame.sort_values("usable_gib").drop_duplicates("card")["card (usable GiB)"])
    table = frame.pivot_table(index="card (usable GiB)", columns="backend", values="shown", aggfunc="first")
    backends = style.in_order(set(frame["backend"]))
    return table.reindex(index=order, columns=backends).rename(columns=nowrap).rename_axis(columns=None).reset_index()


def misclassifying(rows: list[dict[str, Any]]) -> str:
    """Which backends' margins misclassify committed cells, in words (empty where none does)."""
    wrong = sorted({(r["stack"], r["regime"], r["backend"], r["margin_misclassifies"])
                    for r in rows if r["margin_misclassifies"]})  # fmt: skip
    if not wrong:
        return ""
    named = "; ".join(f"{stack} · {regime} · {backend}: {count} committed cell{'s' if count > 1 else ''}"
                      for stack, regime, backend, count in wrong)  # fmt: skip
    return (f"`*`: the backend's margin, fitted on every card, still puts committed cells on the wrong side of their "
            f"outcome ({named}); read those entries as rough.")  # fmt: skip


def ceiling_predictions(searches: list[data.SearchRow], model: MemoryModel | None) -> dict[tuple[str, ...], int]:
    """The model's ceiling for every default-allocator search not finished yet (running or not run),
    at the search's resolution and limit: (stack, regime, backend, card) → batch. Searches of a
    backend the model has no cells or margin for are left out."""
    predicted: dict[tuple[str, ...], int] = {}
    if model is None:
        return predicted
    for row in searches:
        if row.allocator != "default" or row.settled is not None or row.usable_gib is None:
            continue
        key = (row.stack, row.regime, row.backend)
        try:
            predicted[(*key, row.card)] = model.predict_ceiling(
                key, "default", row.usable_gib * 1024, resolution=row.search.resolution, limit=row.search.limit)
        except ModelError:
            continue
    return predicted


NARROW_LENGTHS = 0.05  # documents whose lengths vary less than this leave a per-token cost undetermined


def length_coverage(source: data.Source = None) -> str:
    """Which sequence lengths the committed training steps cover, per stack, in words: the range of
    query and document tokens their MaxSim calls saw (what the per-token coefficient is fitted over)."""
    spans: dict[str, tuple[set[int], set[int]]] = {}
    for _, result in data.results_of(source).found:
        if result.kind != "train":
            continue
        queries, documents = spans.setdefault(result.stack, (set(), set()))
        for call in result.maxsim_calls_in_train:
            queries.add(int(call.query_shape[1]))
            documents.add(int(call.doc_shape[-2]))
    if not spans:
        return ""

    def span(values: set[int]) -> str:
        return f"{min(values)}" if len(values) == 1 else f"{min(values)}–{max(values)}"

    parts = [f"{stack}: queries of {span(q)} tokens, documents of {span(d)}" for stack, (q, d) in sorted(spans.items())]
    narrow = [stack for stack, (_, d) in sorted(spans.items()) if (max(d) - min(d)) / max(d) < NARROW_LENGTHS]
    text = "The committed training steps saw " + "; ".join(parts) + "."
    if narrow:
        text += (f" Document lengths vary by less than {NARROW_LENGTHS:.0%} there ({', '.join(narrow)}), so the fit "
                 "cannot tell a document token from a query token or from a cost per sample: a prediction for other "
                 "lengths extrapolates with one coefficient per token.")  # fmt: skip
    return text
