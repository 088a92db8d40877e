"""The front page's answer: per stack and regime, which backend trains the largest batch on each card,
what a step costs there, and one computed sentence saying what to use.

Everything here is read from the ceiling searches (:func:`harness.report.data.ceilings`) and the
cells timed under the timing rule (:func:`harness.report.tables.timed`); a search still under way is
shown as the range it has not settled, never as a number, and a recommendation names only cards whose
searches have all finished.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

import pandas as pd

from harness.report import style, timing
from harness.report.data import LongRunVerdict, SearchRow
from harness.report.tables import timed
from harness.report.text import (
    EARLIER_DRAW_MARK,
    LONG_RUN_MARK,
    RUNNING_MARK,
    card_short,
    cards_in_order,
    ceiling_entry,
    ceiling_text,
    counted,
    joined,
    nowrap,
    regime_label,
    seed_words,
    sig,
)

REGIME_NAMES = {
    ("colpali", "plain"): "ColQwen2 + LoRA (colpali-engine recipe)",
    ("pylate", "grad-checkpoint"): "GTE-ModernColBERT, gradient checkpointing (PyLate)",
    ("pylate", "plain"): "GTE-ModernColBERT, no checkpointing (PyLate)",
    ("pylate", "gradcache"): "GTE-ModernColBERT, GradCache (PyLate's CachedContrastive, mini-batches of 64)",
}


def regimes(searches: Sequence[SearchRow]) -> list[tuple[str, str]]:
    """The (stack, regime) pairs the ceilings grid searches, in its order."""
    return list(dict.fromkeys((row.stack, row.regime) for row in searches))


def panels(searches: Sequence[SearchRow]) -> list[tuple[str, list[SearchRow]]]:
    """Per regime, its name and its searches: the front page figure's panels."""
    return [(regime_name(stack, regime), [row for row in searches if (row.stack, row.regime) == (stack, regime)])
            for stack, regime in regimes(searches)]  # fmt: skip


def regime_name(stack: str, regime: str) -> str:
    return REGIME_NAMES.get((stack, regime), f"{stack} · {regime}")


def _of(searches: Sequence[SearchRow], stack: str, regime: str, allocator: str = "default") -> list[SearchRow]:
    return [row for row in searches if (row.stack, row.regime, row.allocator) == (stack, regime, allocator)]


def criterion(searches: Sequence[SearchRow]) -> str:
    """What 'trains' means in the decision tables, read from the searches: '8 steps on each of seeds 42,
    43 and 44', most searches' terms, then the searches that have run of any regime that differ ('… (pylate ·
    gradcache: 8 steps on seed 42 for 11 searches)')."""
    rows = [row for row in searches if row.allocator == "default"]
    if not rows:
        return "its search's steps on every seed of its search"
    rows = [row for row in rows if row.probes > 0] or rows  # a search not run has no answer to qualify
    counts = Counter((row.search.steps, row.search.seeds) for row in rows)
    main = counts.most_common(1)[0][0]
    others = Counter((regime_label(row.stack, row.regime), row.search.steps, row.search.seeds) for row in rows
                     if (row.search.steps, row.search.seeds) != main)  # fmt: skip
    exceptions = [f"{regime}: {seed_words(steps, seeds)} for {counted(count, 'search', 'searches')}"
                  for (regime, steps, seeds), count in others.items()]  # fmt: skip
    return seed_words(*main) + (f" ({'; '.join(exceptions)})" if exceptions else "")


PREDICTED_BREAK = "<br>"  # a prediction goes on its own line of the table cell


def entry(row: SearchRow | None, predicted: int | None = None) -> str:
    """A search's answer for the decision table, compact: '160' (finished), '≥ 256' (finished at the
    grid's limit), 'A–B*' or '≥ A*' (still running: the ceiling lies in that range), 'not run';
    where the search has not settled and the memory model predicts it, 'pred. 74' on a line below."""
    if row is None:
        return ""
    text = ceiling_entry(row)
    if row.long_run is not None and row.long_run.ran_out:  # the ceilings page says at which step
        text = f"{row.fits}{LONG_RUN_MARK}"
    elif row.stopped:  # still to finish, like a running search; the ceilings page says which probe crashed
        text = (f"≥ {row.fits}" if row.fits else "stopped") + RUNNING_MARK
    if predicted is not None and row.settled is None:
        return f"{nowrap(text)}{PREDICTED_BREAK}<i>pred.\u00a0{predicted}</i>"
    return nowrap(text)


def card_column(card: str) -> str:
    """A card's column heading in the decision table: '24 GB', '141 GB (H200)'."""
    return nowrap(card_short(card).replace("whole H200", "H200"))


def started(searches: Sequence[SearchRow], stack: str, regime: str,
            predicted: Mapping[tuple[str, ...], int] | None = None) -> bool:  # fmt: skip
    """Whether the regime's table has anything to show: a search with a probe, or a prediction."""
    return any(row.probes > 0 for row in _of(searches, stack, regime)) or any(
        key[:2] == (stack, regime) for key in (predicted or {}))


def decision_table(searches: Sequence[SearchRow], stack: str, regime: str,
                   predicted: Mapping[tuple[str, ...], int] | None = None) -> pd.DataFrame:  # fmt: skip
    """Backend (rows, in the legend's order) × card (columns, smallest first): the largest batch that
    trains on every seed under the default allocator, measured, with the memory model's prediction
    beside each search that has not settled (``predicted``: (stack, regime, backend, card) → batch)."""
    rows = _of(searches, stack, regime)
    if not rows:
        return pd.DataFrame()
    cards = cards_in_order(row.card for row in rows)
    table = []
    for backend in style.in_order({row.backend for row in rows}):
        line = {"backend": nowrap(backend)}
        for card in cards:
            line[card_column(card)] = entry(next((r for r in rows if r.card == card and r.backend == backend), None),
                                            (predicted or {}).get((stack, regime, backend, card)))  # fmt: skip
        table.append(line)
    return pd.DataFrame(table)


@dataclasses.dataclass(frozen=True)
class TimedBatch:
    """A batch on one card at which vanilla and other backends of a regime trained and were timed alone."""

    card: str
    batch: int
    seconds: dict[str, float]  # backend → median steady s/step
    against_vanilla: dict[str, timing.Ratio]  # backend → vanilla's median over its (above 1: faster)
    noise: float | None = None  # how far a second run moved this regime's medians (timing.RunNoise)


def timed_batch(cells: pd.DataFrame, stack: str, regime: str, cards: Sequence[str] = ("h100-80gb", "native"),
                noise: timing.RunNoise | None = None) -> TimedBatch | None:  # fmt: skip
    """The batch on the first of ``cards`` that has one where the most backends, vanilla among them,
    have steady step times (the largest such batch); None where no card has vanilla and another
    backend timed at one batch. With ``noise`` (the repeats and cap twins), a ratio whose interval
    reaches into 1 ± its regime's run-to-run noise is said as no difference."""
    for card in cards:
        found = _timed_on(cells, stack, regime, card)
        if found is not None:
            return found if noise is None else dataclasses.replace(found, noise=noise.of(stack, regime))
    return None


def _timed_on(cells: pd.DataFrame, stack: str, regime: str, card: str) -> TimedBatch | None:
    ok = timed(cells)
    if ok.empty:
        return None
    ok = ok[(ok["stack"] == stack) & (ok["regime"] == regime) & (ok["card"] == card) & (ok["allocator"] == "default")]
    if ok.empty or "vanilla" not in set(ok["backend"]):
        return None
    sets = {int(batch): set(ok[ok["batch_size"] == batch]["backend"]) for batch in ok["batch_size"].unique()}
    both = [batch for batch, present in sets.items() if "vanilla" in present and len(present) > 1]
    if not both:
        return None
    batch = max(both, key=lambda b: (len(sets[b]), b))  # the most backends side by side, then the largest batch
    at = {str(row["backend"]): row for _, row in ok[ok["batch_size"] == batch].iterrows()}
    order = style.in_order(sets[batch])
    seconds = {backend: float(at[backend]["steady_step_time_sec"]) for backend in order}
    base = list(at["vanilla"]["steady_times_sec"])
    ratios = {backend: timing.ratio(base, list(at[backend]["steady_times_sec"])) for backend in order if backend != "vanilla"}
    return TimedBatch(card, batch, seconds, ratios)


def time_words(found: TimedBatch | None) -> str:
    """'At B=1024 on the 80 GB card, timed alone: vanilla 2.97 s/step; lik no measurable difference (…)'."""
    if found is None:
        return "No batch of this regime has been timed alone for vanilla and a fused backend yet."
    parts = [f"vanilla {sig(found.seconds['vanilla'])} s"]
    parts += [f"{backend} {sig(seconds)} s, {timing.ratio_words(found.against_vanilla[backend], noise=found.noise)}"
              for backend, seconds in found.seconds.items() if backend != "vanilla"]  # fmt: skip
    return (f"Step time at B={found.batch} on the {card_short(found.card)} card (median of the steady steps, each "
            f"cell alone on an H200; speed against vanilla with its 95% interval): " + "; ".join(parts) + ".")


def _decided_cards(rows: Sequence[SearchRow]) -> list[str]:
    """Cards where vanilla's and at least one other backend's searches have finished and no search still
    running there could end above the best of them (a range reaching past it, or an open one), nor one whose
    walk ended on probes of the data's earlier draw (its bounds move once they run again); searches not run
    are left out."""
    decided = []
    for card in cards_in_order(row.card for row in rows):
        on_card = [row for row in rows if row.card == card and row.probes > 0]
        settled = [int(row.settled) for row in on_card if row.settled is not None]
        if len(settled) < 2 or not any(row.backend == "vanilla" and row.settled is not None for row in on_card):
            continue
        running = [row for row in on_card if row.settled is None]
        if any(row.ceiling.earlier_draw for row in running):  # its bounds may move once it runs again
            continue
        if all(row.fails is not None and row.fails - 1 <= max(settled) for row in running):
            decided.append(card)
    return decided


def _matching_where_settled(rows: Sequence[SearchRow], decided: Sequence[str], winners_per_card: dict[str, list[str]],
                            everywhere: Sequence[str]) -> list[tuple[str, list[str], list[str]]]:  # fmt: skip
    """Fused backends that train the winners' batch on every decided card where their own search has
    settled, but lack a settled search on some decided card: (backend, cards settled in words, the cards
    not settled), so the sentence does not read as if they lost there."""
    if not everywhere or "vanilla" in everywhere:
        return []
    found = []
    for backend in style.in_order({row.backend for row in rows} - set(everywhere) - {"vanilla"}):
        where = [card for card in decided
                 if any(row.card == card and row.backend == backend and row.settled is not None for row in rows)]  # fmt: skip
        missing = [card for card in decided if card not in where]
        if where and missing and all(backend in winners_per_card[card] for card in where):
            found.append((backend, [card_short(card) for card in where], missing))
    return found


def unsettled_words(rows: Sequence[SearchRow], backend: str, cards: Sequence[str]) -> str:
    """Where one backend's search has not settled, by its state: 'on 141 GB (whole H200) its search has not
    run', 'on 80 GB it is still searching (2304–2431)', 'on 141 GB its search stopped: ≥ 288 (the probe at
    320 crashed)' — never 'not settled'
    for a search that has not started."""
    states: dict[str, list[str]] = {}
    for card in cards:
        row = next((r for r in rows if r.card == card and r.backend == backend), None)
        if row is None or row.probes == 0:
            state = "its search has not run"
        elif row.stopped:
            state = f"its search stopped: {ceiling_text(row)}"
        else:
            state = f"it is still searching ({ceiling_text(row, running_note='')})"
        states.setdefault(state, []).append(card_short(card))
    return "; ".join(f"on {joined(names)} {state}" for state, names in states.items())


def long_run_words(rows: Sequence[SearchRow]) -> str:
    """How the long runs at a regime's settled ceilings (default allocator) ended, in one clause:
    'Over a long run, vanilla's 120 on 80 GB trained all 100 steps; lik's 160 on 80 GB ran out of
    memory at step 27 of 100, so that 8-step ceiling is not a batch a run can train at, while 144 trained
    all 100 steps'; '' where none ran."""
    said = []
    for row in rows:
        run = row.long_run
        if run is None or row.allocator != "default":
            continue
        where = f"{row.backend}'s {run.batch_size} on {card_short(row.card)}"
        if run.held:
            said.append(f"{where} trained all {run.steps} steps")
        elif run.ran_out:
            lower = run.below
            after = "" if lower is None or not lower.held else (
                f", while {lower.batch_size} trained all {lower.steps} steps{_against_vanilla(lower, row, rows)}")  # fmt: skip
            said.append(f"{where} ran out of memory at step {run.steps_trained + 1} of {run.steps}, "
                        f"so that 8-step ceiling is not a batch a run can train at{after}")  # fmt: skip
        else:
            said.append(f"{where} ended {run.outcome} after {run.steps_trained} of {run.steps} steps")
    return f"Over a long run, {'; '.join(said)}" if said else ""


def _against_vanilla(lower: LongRunVerdict, row: SearchRow, rows: Sequence[SearchRow]) -> str:
    """How the batch a fused backend's whole run trained compares with vanilla's, where vanilla's
    ceiling on the same card and allocator held over its own long run: ' (1.20× vanilla's 120, which held
    too)'."""
    for other in rows:
        held = other.long_run
        if (other.backend == "vanilla" and (other.card, other.allocator) == (row.card, row.allocator)
                and other is not row and held is not None and held.held):  # fmt: skip
            return f" ({lower.batch_size / held.batch_size:.2f}× vanilla's {held.batch_size}, which held too)"
    return ""


def answer(searches: Sequence[SearchRow], cells: pd.DataFrame, stack: str, regime: str,
           predicted: Mapping[tuple[str, ...], int] | None = None, noise: timing.RunNoise | None = None,
           caveat: str = "", lead: str | None = None) -> list[str | pd.DataFrame]:  # fmt: skip
    """One regime's answer as the front page gives it, in order: the recommendation (after ``lead``, the
    regime's name in bold by default, and followed by ``caveat``), its ceiling table where a search has
    started, and the step-time line. The ColQwen2 page opens with the same answer."""
    lead = f"**{regime_name(stack, regime)}.**" if lead is None else lead
    parts: list[str | pd.DataFrame] = [f"{lead} {advice(searches, stack, regime)}" + (f" {caveat}" if caveat else "")]
    if started(searches, stack, regime, predicted):
        parts.append(decision_table(searches, stack, regime, predicted))
    parts.append(time_words(timed_batch(cells, stack, regime, noise=noise)))
    return parts


def advice(searches: Sequence[SearchRow], stack: str, regime: str) -> str:
    """What to use for one regime, in one sentence computed from the finished searches: which backends
    train the largest batch on the cards whose searches have all finished, by how much against vanilla,
    and how the long runs at those ceilings went. Step time is left to `time_words` (every backend
    timed beside vanilla), which the intro prints under the table, so the verdict is said once."""
    rows = _of(searches, stack, regime)
    if not rows or all(row.probes == 0 for row in rows):
        return "Not measured yet: no ceiling search of this regime has run."
    decided = _decided_cards(rows)
    if not decided:
        rerun = [row for row in rows if row.ceiling.earlier_draw]
        why = "" if not rerun else (
            f" {len(rerun)} of the searches in the table (marked {EARLIER_DRAW_MARK}) ended on probes of the data's earlier "
            "draw, whose batches had other shapes, and run those probes again on the current draw.")  # fmt: skip
        return ("No card has its searches settled yet (vanilla's and another finished, none running that could end above them), "
                f"so no backend is recommended; the table shows where each search stands.{why}")  # fmt: skip
    winners_per_card: dict[str, list[str]] = {}
    for card in decided:
        on_card = [row for row in rows if row.card == card and row.settled is not None]
        best = max(int(row.settled or 0) for row in on_card)
        winners_per_card[card] = style.in_order({row.backend for row in on_card if row.settled == best})
    everywhere = [backend for backend in style.in_order({b for w in winners_per_card.values() for b in w})
                  if all(backend in winners for winners in winners_per_card.values())]  # fmt: skip
    gains = []
    for card in decided:
        base = next((row for row in rows if row.card == card and row.backend == "vanilla"), None)
        best_row = next(row for row in rows if row.card == card and row.backend == winners_per_card[card][0])
        if base is not None and base.settled and best_row.settled and best_row.backend != "vanilla":
            run = best_row.long_run  # an 8-step ceiling a long run could not train at says so where it is compared
            mark = f"{LONG_RUN_MARK} (over {best_row.search.steps} steps)" if run is not None and run.ran_out else ""
            gains.append(f"{best_row.settled}{mark} against {base.settled} on {card_short(card)}, "
                         f"{best_row.settled / base.settled:.2f}×")  # fmt: skip
    cards = joined([card_short(card) for card in decided])
    if everywhere:
        verb = "trains" if len(everywhere) == 1 else "train"
        text = f"On {cards}, where the searches have settled, {joined(everywhere)} {verb} the largest batch"
    else:
        per_card = "; ".join(f"{card_short(card)}: {joined(w)}" for card, w in winners_per_card.items())
        text = f"Where the searches have settled, the largest batch goes to a different backend per card ({per_card})"
    if gains:
        text += f": {'; '.join(gains)}"
    elif everywhere == ["vanilla"] or "vanilla" in everywhere:
        text += ": the fused kernels buy no batch there"
    ties = [card for card in decided if gains and "vanilla" in winners_per_card[card] and len(winners_per_card[card]) > 1]
    if ties:  # cards where a named backend only matches vanilla: the gain is not everywhere
        batches = [str(next(row.settled for row in rows if row.card == card and row.backend == "vanilla")) for card in ties]
        text += (f"; on {joined([card_short(card) for card in ties])} vanilla trains the same batch "
                 f"({joined(batches)})")  # fmt: skip
    for backend, where, missing in _matching_where_settled(rows, decided, winners_per_card, everywhere):
        text += (f"; {backend} trains the same batch as {joined(everywhere)} on {joined(where)}, "
                 f"where its search has settled; {unsettled_words(rows, backend, missing)}")  # fmt: skip
    long = long_run_words(rows)
    if long:
        text += f". {long}"
    pending = cards_in_order(row.card for row in rows if row.card not in decided)
    if pending:
        text += f". Not settled yet on {joined([card_short(card) for card in pending])}"
        stops = [f"{row.backend}'s search on {card_short(row.card)} stopped at {ceiling_text(row)}"
                 for row in rows if row.card in pending and row.stopped]  # fmt: skip
        if stops:  # why a search will not settle by running on: the ceilings page says more
            text += f": {'; '.join(stops)}"
    return text + "."
