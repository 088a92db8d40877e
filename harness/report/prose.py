"""Sentences and headlines the pages print, computed from the frames and rows of :mod:`harness.report.data`."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from harness.report import style
from harness.report.data import GIB_PER_MIB, SearchRow, SharedCheck, find_search, finished, group_by, matching, probes_of
from harness.report.tables import call_tokens, largest_call
from harness.report.text import card_label, card_short, ceiling_text, cell_words, failed_request, missing
from harness.results import Skipped

# ---- measured cells ------------------------------------------------------------------------------


def headline(cells: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str = "h100-80gb") -> str:
    """One measured cell in words, for the introduction: its step peak, or the request it died on."""
    if cells.empty:
        return "not measured yet"
    row = matching(cells, stack=stack, regime=regime, batch_size=batch, backend=backend, card=card, allocator="default")
    if row.empty:
        return "not measured yet"
    return cell_words(row.iloc[0])


# ---- ceiling probes of one batch -----------------------------------------------------------------


def _oom_words(row: pd.Series) -> str:
    where = "in the MaxSim op" if row["oom_where"] == "maxsim" else "outside the op"
    return (f"runs out of memory {where} after {row['n_steps_done']} of {row['steps']} steps "
            f"({failed_request(row['oom_message'])}; {row['pre_oom_alloc_mib'] * GIB_PER_MIB:.2f} GiB allocated, "
            f"{row['pre_oom_reserved_mib'] * GIB_PER_MIB:.2f} GiB reserved)")  # fmt: skip


def _ok_words(steps: int, alloc_mib: float, reserved_mib: float, seeds: str = "") -> str:
    return (f"trains all {steps} steps{seeds} (peak {alloc_mib * GIB_PER_MIB:.2f} GiB allocated, "
            f"{reserved_mib * GIB_PER_MIB:.2f} GiB reserved)")  # fmt: skip


def probe_headline(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str,
                   allocator: str = "default") -> str:  # fmt: skip
    """The ceiling probes (:func:`harness.report.data.ceiling_probes`) of one batch in words: every
    seed's steps trained (with the peaks), or the first seed that ran out of memory, where, after
    how many steps and on what request."""
    chosen = probes_of(probes, stack, regime, batch, backend, card, allocator)
    if chosen.empty:
        return "not probed yet"
    failed = chosen[chosen["outcome"] == "oom"]
    ok = chosen[chosen["outcome"] == "ok"]
    if failed.empty and ok.empty:
        return f"crashed ({len(chosen)} probe{'s' if len(chosen) > 1 else ''}; see the cell notebooks)"
    if not failed.empty:
        return _oom_words(failed.iloc[0])
    seeds = f"each of the {len(ok)} seeds run" if len(ok) > 1 else "the one seed run so far"
    return _ok_words(ok["steps"].max(), ok["step_peak_alloc_mib"].max(), ok["step_peak_reserved_mib"].max(), f" for {seeds}")


def probe_seeds(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str,
                allocator: str = "default") -> list[str]:  # fmt: skip
    """Each seed's probe of one batch in words: 'seed 42 trains all 8 steps (…)', 'seed 43 runs out
    of memory outside the op after 3 of 8 steps (…)'."""
    lines = []
    for _, row in probes_of(probes, stack, regime, batch, backend, card, allocator).iterrows():
        if row["outcome"] == "oom":
            words = _oom_words(row)
        elif row["outcome"] == "ok":
            words = _ok_words(row["steps"], row["step_peak_alloc_mib"], row["step_peak_reserved_mib"])
        else:
            words = "crashed (see its cell notebook)"
        lines.append(f"seed {row['seed']} {words}")
    return lines


def seed_reading(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str,
                 allocator: str = "default") -> str:  # fmt: skip
    """The ceiling probes of one batch as a paragraph: steps, cap and seeds run, each seed's outcome,
    and — where one seed trained and another ran out of memory — that the draw decided it. Empty
    where the batch was not probed."""
    chosen = probes_of(probes, stack, regime, batch, backend, card, allocator)
    if chosen.empty:
        return ""
    cap = chosen["memory_limit_mib"].max() * GIB_PER_MIB
    under = "" if missing(cap) else f" under a {cap:.2f} GiB cap"
    seeds = len(chosen)
    text = (f"The ceiling search ran B={batch} for {chosen['steps'].max()} steps{under}, "
            f"with {seeds} seed{'s' if seeds > 1 else ''} (each seed draws other data and lengths): "
            + "; ".join(probe_seeds(probes, stack, regime, batch, backend, card, allocator)) + ".")  # fmt: skip
    if (chosen["outcome"] == "ok").any() and (chosen["outcome"] == "oom").any():
        text += " Same batch, card and backend: whether it trains is decided by the draw."
    return text


# ---- ceiling searches ----------------------------------------------------------------------------


def binding_reading(searches: Sequence[SearchRow], allocator: str = "default") -> list[str]:
    """Per stack, regime and card with finished searches: each backend's ceiling and where the batch
    above it failed — in the MaxSim op (vanilla's B² grid binds) or outside it (the encoder binds) —
    and how far the largest fused ceiling goes beyond vanilla's."""
    lines = []
    for (stack, regime, card), group in group_by(finished(searches, allocator), "stack", "regime", "card").items():
        parts = []
        for row in group:
            where = {"maxsim": "fails in the MaxSim op", "elsewhere": "fails outside the op"}.get(row.fails_where or "", "")
            parts.append(f"{row.backend} {ceiling_text(row)}" + (f" (the next batch {where})" if where else ""))
        text = f"{stack} · {regime} on {card_label(str(card))}: " + "; ".join(parts)
        vanilla = [row for row in group if row.backend == "vanilla"]
        fused = [row for row in group if row.backend in ("lik", "flash")]
        if vanilla and fused:
            text += f" — the fused kernels train {max(row.fits for row in fused) / vanilla[0].fits:.2f}× vanilla's batch"
        lines.append(text + ".")
    return lines


def allocator_reading(searches: Sequence[SearchRow]) -> list[str]:
    """Per stack, regime, backend and card searched under both allocator settings: the two ceilings,
    and reserved − allocated at each ceiling's step peak (the memory fragmentation kept from use)."""
    ran = [row for row in searches if row.probes > 0]
    lines = []
    for (stack, regime, backend, card), group in group_by(ran, "stack", "regime", "backend", "card").items():
        rows = {row.allocator: row for row in group}
        if not {"default", "expandable"} <= rows.keys():
            continue
        default, expandable = rows["default"], rows["expandable"]
        text = (f"{stack} · {regime}, {backend} on {card_label(str(card))}: {ceiling_text(default)} with the default "
                f"allocator, {ceiling_text(expandable)} with expandable segments")  # fmt: skip
        if default.fragmentation_gib is not None and expandable.fragmentation_gib is not None:
            where = "the ceiling" if default.done and expandable.done else "the largest batch trained so far"
            text += (f" (reserved − allocated at {where}: {default.fragmentation_gib:.2f} → "
                     f"{expandable.fragmentation_gib:.2f} GiB)")  # fmt: skip
        lines.append(text + ".")
    return lines


def ceiling_of(searches: Sequence[SearchRow], stack: str, regime: str, backend: str, card: str,
               allocator: str = "default") -> str:  # fmt: skip
    """One search's ceiling in words (``ceiling_text``), or 'not searched' where the grid has no such search."""
    row = find_search(searches, stack, regime, backend, card, allocator)
    return "not searched" if row is None else ceiling_text(row)


def search_plan(searches: Sequence[SearchRow], stack: str, regime: str, backend: str, card: str) -> str:
    """How one search probes a batch: '8 steps and 3 seeds' ('several seeds' where the grid has no such search)."""
    row = find_search(searches, stack, regime, backend, card)
    return "several seeds" if row is None else f"{row.search.steps} steps and {len(row.search.seeds)} seeds"


def ceiling_gains(searches: Sequence[SearchRow], stack: str, regime: str, card: str, fused: str = "lik") -> str:
    """How far the fused backend and, separately, expandable segments move vanilla's default-allocator
    ceiling on one card, in words; a note that the comparison waits while any of the three searches
    is unfinished."""
    rows = {
        "base": find_search(searches, stack, regime, "vanilla", card),
        "fused": find_search(searches, stack, regime, fused, card),
        "expandable": find_search(searches, stack, regime, "vanilla", card, "expandable"),
    }
    settled = {name: None if row is None else row.settled for name, row in rows.items()}
    if None in settled.values():
        return "How far each choice moves the ceiling is stated once those searches have finished."
    base = rows["base"]
    assert base is not None and base.settled is not None
    base_batch = base.settled

    def change(name: str) -> str:
        row = rows[name]
        assert row is not None and row.settled is not None
        difference = row.settled - base_batch
        at_least = "at least " if row.fails is None else ""
        more = "more" if difference >= 0 else "fewer"
        return f"{at_least}{abs(difference)} {more} ({ceiling_text(row)} against {base_batch})"

    if base.fails is None:
        return f"Vanilla scoring reached the search's limit ({ceiling_text(base)}), so there is nothing to compare."
    return (f"Against vanilla scoring under the default allocator, the fused kernel trains {change('fused')}; "
            f"expandable segments, with vanilla scoring kept, {change('expandable')}.")


# ---- probes on a shared GPU ----------------------------------------------------------------------


def sharing_reading(checks: Sequence[SharedCheck]) -> str:
    """The shared-GPU check (:func:`harness.report.data.shared_checks`) in words."""
    if not checks:
        return "No shared-GPU check has been committed yet."
    same = sum(check.identical for check in checks)
    verdict = "the same outcome and the same peaks to the byte, step by step," if same == len(checks) else (
        f"the same outcome and peaks for only {same} of them,")  # fmt: skip
    text = f"{len(checks)} probes run again on a shared GPU, beside other probes, gave {verdict} as on a GPU they had alone."
    slowdown = [check.slowdown for check in checks if check.slowdown is not None]
    if slowdown:
        text += (f" Their steady step times were {min(slowdown):.1f}× to {max(slowdown):.1f}× those they had alone, "
                 "depending on what ran beside them.")  # fmt: skip
    return text


def shared_probe_count(probes: pd.DataFrame) -> str:
    """How many committed probes ran under ``--share-gpu``, in words."""
    if probes.empty:
        return ""
    shared = int(probes["gpu_share_gib"].notna().sum())
    return (f"{shared} of the {len(probes)} committed probes were run under `--share-gpu`, beside whatever "
            "else fitted at the time; the others had the GPU alone.")


def shared_seed_agreement(probes: pd.DataFrame) -> str:
    """For batches whose every seed ran on a shared GPU with the same shapes (PyLate's are fixed
    lengths), whether the seeds' peaks agree to the byte — per backend, so the fused backends,
    whose Triton kernels are chosen by timing, are checked beside whatever else ran."""
    if probes.empty:
        return ""
    shared = probes[(probes["stack"] == "pylate") & probes["gpu_share_gib"].notna()]
    keys = ["card", "allocator", "batch_size", "regime"]
    parts = []
    for backend, group in shared.groupby("backend"):
        batches = [g for _, g in group.groupby(keys) if g["seed"].nunique() > 1 and (g["outcome"] == "ok").all()]
        if batches:
            agree = sum(g["step_peak_alloc_mib"].nunique() == 1 and g["step_peak_reserved_mib"].nunique() == 1 for g in batches)
            parts.append(f"{backend} {agree} of {len(batches)}")
    if not parts:
        return ""
    return ("PyLate batches whose seeds all trained on a shared GPU (same shapes, run at different moments beside "
            "different neighbours) with identical allocated and reserved peaks for every seed: " + ", ".join(parts) + ".")


# ---- the results folder --------------------------------------------------------------------------


def skipped_reading(skipped: Sequence[Skipped]) -> str:
    """How many files under the results folder the report could not use, in words (empty: none)."""
    if not skipped:
        return ""
    count = f"{len(skipped)} file{'s' if len(skipped) > 1 else ''}"
    return (f"**Files not read.** {count} under the results folder could not be used and "
            f"{'are' if len(skipped) > 1 else 'is'} left out of every page:")


# ---- op replays ----------------------------------------------------------------------------------


def prediction_shapes(calls: pd.DataFrame) -> str:
    """Which recorded call each row of the op-memory table shows and why the predicted vanilla memory
    of two backends at one batch can differ: every row is the largest call (most query × page tokens)
    its own cell recorded, and a cell that stopped early recorded fewer calls. Names the batches and
    cards where the backends' calls differ, with each call's tokens and how many calls each cell recorded."""
    if calls.empty:
        return ""
    found: dict[tuple[int, tuple[tuple[str, str, float, int], ...]], list[str]] = {}
    same = 0
    whole = calls[[style.chunk_size(str(b)) is None for b in calls["backend"]]]  # a chunked backend has its own grid
    for (batch, card), group in whole.reset_index(drop=True).groupby(["batch_size", "card"], sort=True):
        shapes: list[tuple[str, str, float, int]] = []
        for backend in style.in_order(group["backend"].unique()):
            call = largest_call(group[group["backend"] == backend])
            shapes.append((str(backend), call_tokens(call), float(call["predicted_saved_for_backward_mib"]),
                           int((group["backend"] == backend).sum())))  # fmt: skip
        if len({round(mib, 1) for _, _, mib, _ in shapes}) > 1:
            found.setdefault((int(str(batch)), (*shapes,)), []).append(card_short(str(card)))
        elif len(shapes) > 1:
            same += 1
    if not found:
        return "" if not same else ("At every batch the backends' cells recorded calls of the same shapes, so each "
                                    "batch's rows show the same call and the same predicted vanilla memory.")  # fmt: skip
    parts = []
    for (batch, recorded), cards in found.items():
        cells = ", ".join(f"{backend}'s cell {count} call{'s' if count > 1 else ''}, the largest {tokens} tokens "
                          f"({mib:.1f} MiB predicted)" for backend, tokens, mib, count in recorded)  # fmt: skip
        parts.append(f"at B={batch} on {' and '.join(cards)}: {cells}")
    return ("**Why two rows of one batch predict different vanilla memory.** Each row shows the largest call "
            "(most query × page tokens) its own cell recorded, and the grid grows with the batch's longest query "
            "and page; the synthetic lengths a step draws differ from step to step, so a cell that recorded "
            "fewer steps (e.g. one that ran out of memory) may not have met the longest draw. Calls recorded, "
            + "; ".join(parts) + f". At the other {same} batch and card pairs every backend's largest call has "
            "the same shape, and the rows agree.")  # fmt: skip
