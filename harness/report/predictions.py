"""The memory model's page: its leave-one-card-out validation (``results/predictions/validation.json``,
written by ``harness predict --validate``) and its predictions for cards nobody measured, as tables
and computed sentences. Every figure here is labelled predicted; torch-free like the rest of the report."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness.memmodel import EARLIER_DRAW_STATE, OTHER_CARDS, VALIDATION, MemoryModel, ModelError, fit
from harness.report import data, style
from harness.report.text import (
    EARLIER_DRAW_MARK,
    RUNNING_MARK,
    allocator_words,
    ceiling_entry,
    earlier_draw_words,
    joined,
    nowrap,
    percent,
    regime_label,
)
from harness.spec import ALLOCATORS as SPEC_ALLOCATORS
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
    return f"{regime_label(row['stack'], row['regime'])} · {row['backend']}"


def _card(name: str) -> str:
    """'H100 80 GB' (a measured profile), 'H200 141 GB' (the whole card), 'B200 180 GB' (a named card)."""
    if name in CARDS:
        nominal = CARDS[name].nominal_gb
        return f"H200 {nominal} GB" if CARDS[name].usable_gib is None else f"{name.split('-')[0].upper()} {nominal} GB"
    return OTHER_CARDS[name].label.split(" (")[0] if name in OTHER_CARDS else name


ROUGH_MARK = "≈"  # before a predicted batch whose backend's margin misclassifies committed cells: read it as rough
ALLOCATORS = tuple(SPEC_ALLOCATORS)  # the validation tables, in the page's order: default, then expandable


def searching_legend(document: dict[str, Any]) -> str:
    """The legend line of :data:`RUNNING_MARK`, where a validation table shows one (else empty)."""
    shown = [_measured(row) for row in document["validation"] if row["state"] != "not run"]
    said = []
    if any(measured.endswith(RUNNING_MARK) for measured in shown):
        said.append(f"`{RUNNING_MARK}`: a search still running; its measured range is where its ceiling can still end, "
                    "and its verdict says where the prediction lies against it.")  # fmt: skip
    if any(measured.endswith(EARLIER_DRAW_MARK) for measured in shown):
        said.append(f"`N{EARLIER_DRAW_MARK}`: {earlier_draw_words()}; it is not judged until then.")
    return " ".join(said)


def _measured(row: dict[str, Any]) -> str:
    """A search's measured ceiling: the batch, '≥ 96' (at the search's limit), '84–99*' (still running) or '36°'
    (found on probes of the data's earlier draw, which run again)."""
    if row["state"] == EARLIER_DRAW_STATE:
        return (f"≥ {row['measured_fits']}" if row["measured_fails"] is None else str(row["measured_fits"])) + EARLIER_DRAW_MARK
    if row["measured_ceiling"] is not None:
        return str(row["measured_ceiling"])
    if row["measured_fails"] is None:
        return f"≥ {row['measured_fits']}"
    return f"{row['measured_fits']}–{row['measured_fails'] - 1}{RUNNING_MARK}"


def validation_tables(document: dict[str, Any], allocator: str = "default") -> dict[str, pd.DataFrame]:
    """Per stack · regime, one row per ceiling search under ``allocator`` that has probes: measured (a range
    marked :data:`RUNNING_MARK` while it runs) and the search's resolution, predicted without its card's
    cells, the error, and the verdict (which term misses where it misses; for a search still running, where
    the prediction lies)."""
    tables: dict[str, list[dict[str, object]]] = {}
    for row in document["validation"]:
        if row["state"] == "not run" or row["allocator"] != allocator:
            continue
        measured = _measured(row)
        predicted = "—" if row["predicted_ceiling"] is None else str(row["predicted_ceiling"])
        if row["state"] == EARLIER_DRAW_STATE:  # its bounds are the earlier draw's: nothing to judge against yet
            verdict = "not judged: its probes run again"
        elif row["within_goal"] is None:
            verdict = "" if row["predicted_ceiling"] is None else _inside(row)
        else:
            verdict = "within goal" if row["within_goal"] else f"misses: {row['wrong_term']}"
        tables.setdefault(regime_label(row['stack'], row['regime']), []).append({
            "backend": nowrap(style.short(row["backend"])), "card": nowrap(_card(row["card"])),
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
    if high is not None and predicted == high:
        return "at a batch that failed"
    if high is not None and predicted > high:
        return "above a batch that failed"
    return "inside its range"


def _note_words(note: str) -> str:
    """The validation's note on a miss, for a sentence of its own: card ids by their names, a half-open
    interval '(0.397, 0.534]' as 'a margin above 0.397 and at most 0.534', the first letter capitalised."""
    for card in sorted(CARDS, key=len, reverse=True):
        note = re.sub(rf"\b{re.escape(card)}\b", _card(card), note)
    note = re.sub(r"\(([0-9.]+), ([0-9.]+)\]", r"a margin above \1 and at most \2", note)
    return note[:1].upper() + note[1:]


def judged_by_allocator(document: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per allocator (in :data:`ALLOCATORS` order), the finished searches the validation judged and how many
    of them are within the goal: allocator → (within, judged)."""
    counts: dict[str, tuple[int, int]] = {}
    for allocator in ALLOCATORS:
        judged = [row for row in document["validation"] if row["allocator"] == allocator and row["within_goal"] is not None]
        if judged:
            counts[allocator] = (sum(row["within_goal"] is True for row in judged), len(judged))
    return counts


def _under(allocator: str) -> str:
    """'under the default allocator', 'under expandable segments'."""
    return f"under {'the ' if allocator == 'default' else ''}{allocator_words(allocator)}"


def summary_words(document: dict[str, Any]) -> str:
    """The validation in words: how many finished searches are within the goal, in all and under each
    allocator (each has its own tables on the page), the worst miss and its cause, and how many searches
    still running have their prediction where they can still end, per allocator too."""
    summary = document["summary"]
    scope = joined([f"{within} of {judged} {_under(allocator)}"
                    for allocator, (within, judged) in judged_by_allocator(document).items()])  # fmt: skip
    text = (f"Leaving each card out, {summary['within_goal']} of the {summary['judged']} finished ceiling searches are "
            f"predicted within one search resolution or 5% of the measured batch, whichever is larger: {scope}, each "
            "allocator's searches in its own tables below.")  # fmt: skip
    worst = summary.get("worst")
    if worst and worst.get("wrong_term"):
        where = next((row["allocator"] for row in document["validation"] if row["search_id"] == worst["search_id"]), None)
        under = "" if where is None else f" ({_under(where)})"
        row = next((row for row in document["validation"] if row["search_id"] == worst["search_id"]), None)
        name = worst["search_id"] if row is None else (
            f"{regime_label(row['stack'], row['regime'])} · {row['backend']} on {_card(row['card'])}")  # fmt: skip
        text += (f" The worst is {name}{under}: predicted {worst['predicted_ceiling']} against a measured "
                 f"{worst['measured_ceiling']} ({percent(100 * worst['error_fraction'], '+.0f')}); the wrong term is the "
                 f"{worst['wrong_term']}. {_note_words(str(worst['note']))}.")  # fmt: skip
    unfinished = [row for row in document["validation"]
                  if row["within_goal"] is None and row["predicted_ceiling"] is not None and row["measured_fits"]]  # fmt: skip
    if unfinished:
        inside = sum(_inside(row) == "inside its range" for row in unfinished)
        split = joined([f"{count} {_under(allocator)}" for allocator in ALLOCATORS
                        if (count := sum(row["allocator"] == allocator for row in unfinished))])  # fmt: skip
        text += (f" Of the {len(unfinished)} searches still running or at a lower bound ({split}), {inside} "
                 f"{'has its' if inside == 1 else 'have their'} prediction where the search can still end.")  # fmt: skip
    return text


def recipes(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The (stack, regime) pairs of the predicted table, in its order."""
    return list(dict.fromkeys((row["stack"], row["regime"]) for row in rows))


def cards_table(rows: list[dict[str, Any]], stack: str, regime: str,
                searches: Sequence[data.SearchRow] = ()) -> pd.DataFrame:  # fmt: skip
    """Card (rows, by usable memory) × backend (columns): the predicted largest batch per device of one
    recipe, marked ``*`` where the backend's margin misclassifies committed cells. Where ``searches``
    has a default-allocator search of that card and backend that ran, its measured ceiling goes beside
    the prediction, on a line below ('271*', 'measured 224'), so a card we measured never shows a prediction alone."""
    mine = [row for row in rows if (row["stack"], row["regime"]) == (stack, regime)]
    if not mine:
        return pd.DataFrame()
    frame = pd.DataFrame(mine)

    def shown(r: pd.Series) -> str:
        text = f"{ROUGH_MARK if r['margin_misclassifies'] else ''}{r['predicted_largest_batch']}"
        found = data.find_search(searches, stack, regime, str(r["backend"]), str(r["card"]))
        if found is not None and found.probes > 0:
            measured = ceiling_entry(found)  # a running search marked as the intro's table marks it
            return f"{nowrap(text)}<br><i>measured {nowrap(measured)}</i>"
        return nowrap(text)

    frame["shown"] = frame.apply(shown, axis=1)
    frame["card (usable GiB)"] = frame.apply(lambda r: nowrap(f"{_card(r['card'])} ({r['usable_gib']:.1f})"), axis=1)
    order = list(frame.sort_values("usable_gib").drop_duplicates("card")["card (usable GiB)"])
    table = frame.pivot_table(index="card (usable GiB)", columns="backend", values="shown", aggfunc="first")
    backends = style.in_order(set(frame["backend"]))
    table = table.reindex(index=order, columns=backends).rename(columns=lambda b: nowrap(style.short(str(b))))
    return table.rename_axis(columns=None).reset_index()  # a chunked backend's column is 'chunk 64': the table fits


def misclassifying(rows: list[dict[str, Any]]) -> str:
    """Which backends' margins misclassify committed cells, in words (empty where none does)."""
    wrong = sorted({(r["stack"], r["regime"], r["backend"], r["margin_misclassifies"])
                    for r in rows if r["margin_misclassifies"]})  # fmt: skip
    if not wrong:
        return ""
    named = "; ".join(f"{regime_label(stack, regime)} · {backend}: {count} committed cell{'s' if count > 1 else ''}"
                      for stack, regime, backend, count in wrong)  # fmt: skip
    return (f"`{ROUGH_MARK}N`: the backend's margin, fitted on every card, still puts committed cells on the wrong side of their "
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
    spreads = {stack: (max(d) - min(d)) / max(d) for stack, (_, d) in sorted(spans.items())}
    narrow = [f"{stack}: {span(spans[stack][1])} tokens, a spread of {spread:.1%}"
              for stack, spread in spreads.items() if spread < NARROW_LENGTHS]  # fmt: skip
    text = "The committed training steps saw " + "; ".join(parts) + "."
    if narrow:
        text += (f" Document lengths vary by less than {NARROW_LENGTHS:.0%} there ({'; '.join(narrow)}), so the fit "
                 "cannot tell a document token from a query token or from a cost per sample: a prediction for other "
                 "lengths extrapolates with one coefficient per token.")  # fmt: skip
    return text


GATHER_WORLDS = (1, 2, 4, 8)
MIB = 1024 * 1024


def gathered_rows(calls: pd.DataFrame, worlds: tuple[int, ...] = GATHER_WORLDS) -> list[dict[str, Any]]:
    """Per training recipe and local batch (the vanilla replay with the largest forward, on the whole
    H200): the peak of one rank's vanilla op forward (above its inputs; for ColQwen2 also what it
    holds for backward) with documents gathered across W ranks, predicted by
    :func:`harness.op_bytes.gathered` from the recorded shapes, beside what the replay measured at
    W = 1."""
    from harness import op_bytes

    if calls.empty:
        return []
    vanilla = calls[(calls["stack"].isin(["colpali", "pylate"])) & (calls["backend"] == "vanilla") & (calls["card"] == "native")
                    & ~calls["oom_in_replay"].astype(bool) & calls["forward_transient_peak_mib"].notna()]  # fmt: skip
    rows = []
    for _, group in vanilla.groupby(["stack", "regime", "batch_size"], sort=True):
        call = group.sort_values("forward_transient_peak_mib").iloc[-1]
        stack, regime, batch = str(call["stack"]), str(call["regime"]), int(call["batch_size"])
        itemsize = op_bytes.ITEMSIZE[call["dtype"]]
        forward = {world: op_bytes.gathered(stack, call["query_shape"], call["doc_shape"], itemsize, world).forward_transient
                   / MIB for world in worlds}  # fmt: skip
        rows.append({"stack": stack, "regime": regime, "batch": int(batch), "query_shape": list(call["query_shape"]),
                     "doc_shape": list(call["doc_shape"]), "measured_mib": float(call["forward_transient_peak_mib"]),
                     "forward_mib": forward})  # fmt: skip
    return rows


def gathered_recipes(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted({(row["stack"], row["regime"]) for row in rows})


def gathered_table(rows: list[dict[str, Any]], stack: str, regime: str) -> pd.DataFrame:
    """One recipe's rows of :func:`gathered_rows`: the GiB of one rank's vanilla op forward per world
    size (predicted), the W = 1 replay beside its prediction."""
    table = []
    for row in sorted((row for row in rows if (row["stack"], row["regime"]) == (stack, regime)), key=lambda r: r["batch"]):
        entry = {"local batch": row["batch"], "queries · documents per rank (W=1)":
                 nowrap(f"{'×'.join(map(str, row['query_shape']))} · {'×'.join(map(str, row['doc_shape']))}"),
                 "measured, W=1": f"{row['measured_mib'] / 1024:.2f}"}  # fmt: skip
        entry |= {f"W={world}": f"{mib / 1024:.2f}" for world, mib in row["forward_mib"].items()}
        table.append(entry)
    return pd.DataFrame(table)


def gathered_reading(rows: list[dict[str, Any]], card: str = "h100-80gb", measured: Sequence[int] = ()) -> str:
    """How far the W = 1 predictions are from the replays, and where one rank's vanilla op alone would
    pass an 80 GB card's usable memory, in words; ``measured``: the world sizes above 1 that committed
    multi-GPU cells trained at."""
    if not rows:
        return "No vanilla replay on the whole H200 is committed yet, so there is nothing to scale."
    usable = CARDS[card].usable_gib
    worst = max(abs(row["forward_mib"][1] - row["measured_mib"]) for row in rows if 1 in row["forward_mib"])
    parts = []
    for row in rows:
        over = [world for world, mib in row["forward_mib"].items() if mib / 1024 > usable]
        if over:
            parts.append(f"{regime_label(row['stack'], row['regime'])} at a local batch of {row['batch']} from W = {over[0]}")
    text = (f"At W = 1 the formula gives every replay's forward peak within {worst:.1f} MiB. With documents gathered, "
            "one rank's vanilla grid grows in proportion to W (its queries and its encoder do not)")
    if parts:
        text += (f"; the op's forward alone would need more than the {usable:.2f} GiB an 80 GB card gives PyTorch "
                 "for " + ", ".join(parts))
    if not measured:
        return text + ". These are predictions from one formula, not measurements: no multi-GPU cell has run yet."
    worlds = ", ".join(str(world) for world in sorted(set(measured)))
    return (text + f". The tables below are predictions from one formula; the cells measured at W = {worlds} are read "
            "above.")

