"""Tables the pages show, with display headers, computed from the frames and rows of :mod:`harness.report.data`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd

from harness.report import style, timing
from harness.report.data import (
    GIB_PER_MIB,
    PUBLISHED_OP,
    CardCheck,
    SearchRow,
    SharedCheck,
    backend_label,
    published_op,
    timed_checks,
)
from harness.report.text import (
    TUNER_MARK,
    as_published,
    card_column,
    card_label,
    card_short,
    cards_in_order,
    ceiling_entry,
    cell_words,
    failed_request,
    gpu_short,
    gpu_words,
    mib,
    missing,
    nowrap,
    number,
    other_gpu,
    percent,
    regime_label,
    regime_words,
    sig,
    signed,
)
from harness.results import Skipped
from harness.search import AUTOTUNE

# ---- a stack page's cells ------------------------------------------------------------------------


PREDICTED = "predicted vanilla held (MiB) [vanilla: measured − predicted, held / fwd]"


def op_vram_table(calls: pd.DataFrame) -> pd.DataFrame:
    """Isolated-replay op memory per batch size and backend: each cell's recorded call of the largest shape.

    ``total`` is held + backward spike: the op's own footprint at its backward peak. The shape column
    names the query and document tokens of that call, which the vanilla prediction follows; a vanilla
    row adds, in brackets, how far its measured held and forward memory are from the prediction.
    Backend names and 'OOM in replay' may wrap, so the table fits a page beside the contents column.
    """
    if calls.empty:
        return pd.DataFrame()
    rows = []
    for (batch, backend), group in calls.reset_index(drop=True).groupby(["batch_size", "backend"]):
        ok = group[~group["oom_in_replay"]]
        if ok.empty:
            call = largest_call(group)
            rows.append({"batch": batch, "backend": str(backend), "tokens, query × doc": nowrap(call_tokens(call)),
                         "held (MiB)": "OOM in replay", "backward spike (MiB)": "", "forward transient (MiB)": "",
                         "total (MiB)": "", PREDICTED: mib(call["predicted_saved_for_backward_mib"])})  # fmt: skip
            continue
        call = largest_call(ok)
        predicted = mib(call["predicted_saved_for_backward_mib"])
        rows.append({
            "batch": batch, "backend": str(backend), "tokens, query × doc": nowrap(call_tokens(call)),
            "held (MiB)": mib(call["saved_for_backward_mib"]),
            "backward spike (MiB)": mib(call["backward_transient_peak_mib"]),
            "forward transient (MiB)": mib(call["forward_transient_peak_mib"]),
            "total (MiB)": mib(call["saved_for_backward_mib"] + call["backward_transient_peak_mib"]),
            PREDICTED: f"{predicted} {nowrap(f'[{_prediction_gap(call)}]')}" if backend == "vanilla" else predicted,
        })  # fmt: skip
    rank = {backend: k for k, backend in enumerate(style.in_order(calls["backend"]))}
    return pd.DataFrame(rows).sort_values(["batch", "backend"], key=lambda c: c.map(rank) if c.name == "backend" else c,
                                          kind="stable", ignore_index=True)  # fmt: skip


def largest_call(calls: pd.DataFrame) -> pd.Series:
    """The recorded call of the largest shape (the most vanilla grid bytes) among ``calls``; the first of equals."""
    return calls.iloc[int(calls["predicted_saved_for_backward_mib"].to_numpy().argmax())]


Shape = tuple[int, tuple[int, ...]]  # a call's tokens: per query, and per document slot


def call_shape(call: pd.Series) -> Shape:
    """A recorded call's tokens, whatever its batch: (44, (771,)); PyLate's (48, (2, 300))."""
    return int(list(call["query_shape"])[1]), tuple(int(n) for n in list(call["doc_shape"])[1:-1])


def shape_words(shape: Shape) -> str:
    """'56 × 778', '48 × 2·300' (PyLate: 2 documents of 300)."""
    return f"{shape[0]} × {'·'.join(str(n) for n in shape[1])}"


def call_tokens(call: pd.Series) -> str:
    """A recorded call's tokens per query and per document: '44 × 770', '48 × 2·300'."""
    return shape_words(call_shape(call))


def _prediction_gap(call: pd.Series) -> str:
    """Measured minus predicted vanilla bytes: tensor bytes are exact, the CUDA caching allocator
    may add up to 1 MiB per large block it does not split (allocations round up to 2 MiB segments)."""
    held = call["saved_for_backward_mib"] - call["predicted_saved_for_backward_mib"]
    forward = call["forward_transient_peak_mib"] - call["predicted_forward_transient_mib"]
    return f"{signed(held)} / {signed(forward)}"


def _by_batch_and_backend(cells: pd.DataFrame, describe: Callable[[pd.Series], str]) -> pd.DataFrame:
    """One text per cell (``describe(row)``), batches down and backends across."""
    table = cells.assign(cell=cells.apply(describe, axis=1)).pivot_table(
        index="batch_size", columns="backend", values="cell", aggfunc="first"
    )
    table = table[style.in_order(table.columns)].rename(columns=lambda backend: nowrap(str(backend)))
    return table.rename_axis(index="batch", columns=None).fillna("")


def ceiling_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Step peak allocated / reserved (GiB) per batch size and backend; an OOM shows its failed request."""
    if cells.empty:
        return pd.DataFrame()

    def describe(row: pd.Series) -> str:
        alloc, reserved = row["step_peak_alloc_mib"] * GIB_PER_MIB, row["step_peak_reserved_mib"] * GIB_PER_MIB
        if row["outcome"] == "ok":
            return f"{alloc:.2f} / {reserved:.2f}"
        if row["outcome"] == "oom":
            where = "in the MaxSim op" if row["oom_where"] == "maxsim" else "outside the op"
            return f"OOM {where} ({failed_request(row['oom_message'])}; pre-OOM {alloc:.2f} / {reserved:.2f})"
        return "crashed"

    return _by_batch_and_backend(cells, describe)


def fragmentation_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Reserved − allocated at the step peak (GiB) per batch and backend, and how the per-step
    difference moved from the first step to the last (MiB; cells that recorded per-step peaks). A cell
    that ran out of memory is marked: its figure is the pre-OOM one, not a trained step's."""
    if cells.empty:
        return pd.DataFrame()

    def describe(row: pd.Series) -> str:
        if missing(row["fragmentation_mib"]):
            return ""
        text = f"{row['fragmentation_mib'] * GIB_PER_MIB:.2f}"
        if row["outcome"] == "oom":
            text = f"{text} (OOM)"
        if not missing(row.get("fragmentation_growth_mib")):
            text += (f" ({row['fragmentation_first_step_mib']:.0f} → {row['fragmentation_last_step_mib']:.0f} MiB "
                     f"over {row['n_steps_done']} steps)")  # fmt: skip
        return text

    return _by_batch_and_backend(cells, describe)


def median_spread(median: object, p10: object, p90: object, dash: str = "–") -> str:
    """'0.456 (0.451–0.462)': a median with its p10–p90 spread, all three with :func:`sig`'s rounding, so
    the median printed is never outside the spread printed (rounding to significant digits keeps order)."""
    return f"{sig(median)} ({sig(p10)}{dash}{sig(p90)})"


def timed(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells that trained and whose step times may be published (the timing rule, :mod:`harness.host`)."""
    if cells.empty or "times_comparable" not in cells:
        return cells.iloc[0:0]
    return cells[(cells["outcome"] == "ok") & cells["times_comparable"].astype(bool) & (cells["n_steady_steps"] > 0)]


def step_time_table(cells: pd.DataFrame, noise: timing.RunNoise | None = None) -> pd.DataFrame:
    """Steady seconds per step of the cells timed under the timing rule: median with p10–p90,
    samples/s, the speed relative to vanilla at the same batch with its bootstrap 95% interval (with
    ``noise``, the run-to-run noise: no difference where the interval reaches into 1 ± the regime's
    noise, :meth:`harness.report.timing.Ratio.beyond`), and what
    autotuning cost (the first step, and later steps that tuned again). A speed compares times of one GPU; where a
    time is of a GPU other than the H200, every row names its GPU."""
    ok = timed(cells)
    if ok.empty:
        return pd.DataFrame()
    gpu = device_names(ok).to_dict()
    vanilla = {(row["batch_size"], gpu[i]): row["steady_times_sec"] for i, row in ok[ok["backend"] == "vanilla"].iterrows()}
    elsewhere = any(other_gpu(name) for name in gpu.values())  # a time of another GPU: every row names its GPU
    rows = []
    rank = {backend: k for k, backend in enumerate(style.in_order(ok["backend"]))}
    for i, row in ok.sort_values(["batch_size", "backend"], key=lambda c: c.map(rank) if c.name == "backend" else c).iterrows():
        base = vanilla.get((row["batch_size"], gpu[i]))  # a speed compares times of one GPU
        speed = "" if row["backend"] == "vanilla" or base is None else timing.ratio_words(
            timing.ratio(base, row["steady_times_sec"]),
            noise=None if noise is None else noise.of(str(row["stack"]), str(row["regime"])), compact=True)
        rows.append({
            "batch": row["batch_size"], "backend": nowrap(row["backend"]),
            **({"GPU": gpu_short(gpu[i]) if gpu[i] else "not recorded"} if elsewhere else {}),
            "s / step (p10–p90)": nowrap(median_spread(row["steady_step_time_sec"], row["steady_step_p10_sec"],
                                                       row["steady_step_p90_sec"], "-")),
            "samples / s": sig(row["samples_per_sec"]),
            "speed vs vanilla (95% interval)": speed,
            "steady steps": row["n_steady_steps"],
            "first step, s (re-tunes)": sig(row["first_step_sec"]) + (f" ({row['retune_steps']})" if row["retune_steps"] else ""),
        })  # fmt: skip
    return pd.DataFrame(rows)


def published_time_table(cells: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """The published step times (an H100 80 GB) beside ours (an H200 capped to that card) for the
    same cells, where both trained and ours were timed under the timing rule. A published time that the
    published text gives only as samples per second is said to be derived from it ('16.0 (128 ÷ the
    published 7.98 samples/s)'). Ours ÷ published carries our median's bootstrap 95% interval alone, since
    a published time is one figure with no spread to resample."""
    ok = timed(cells)
    if ok.empty:
        return pd.DataFrame()
    rows = []
    for _, ref in published.iterrows():
        seconds = ref["step_sec"]
        if missing(seconds):
            continue
        backend = backend_label(ref["variant"], ref["score_mini_batch_size"])
        ours = ok[(ok["batch_size"] == ref["batch_size"]) & (ok["backend"] == backend) & (ok["card"] == ref["card"])]
        mine = None if ours.empty else ours.iloc[0]["steady_times_sec"]
        theirs = sig(seconds)
        if missing(ref["steady_step_time_sec"]):  # derived: the batch over the published samples per second
            theirs += f" ({ref['batch_size']} ÷ the published {sig(ref['samples_per_sec'])} samples/s)"
        rows.append({
            "batch": ref["batch_size"], "backend": nowrap(backend),
            "published s / step (H100)": theirs,
            "ours s / step (H200 as the 80 GB card)": "not timed" if mine is None else sig(ours.iloc[0]["steady_step_time_sec"]),
            "ours ÷ published (95% interval)": "" if mine is None else nowrap(
                timing.interval_text(timing.ratio(mine, [seconds]))),
        })  # fmt: skip
    return pd.DataFrame(rows)


def repeat_table(pairs: Sequence[tuple[Any, Any]]) -> pd.DataFrame:
    """Each repeated cell's two runs (separate processes, the host to themselves): their medians and
    how far apart they are, against the 3% the timing rule asks of them."""
    rows = []
    for first, one, two, gap in timing.repeat_gaps(pairs):
        rows.append({
            "cell": first.cell_id,  # as typed: a reader copies it into --match
            "first run, s (p10–p90)": nowrap(median_spread(one.median, one.p10, one.p90)),
            "second run, s (p10–p90)": nowrap(median_spread(two.median, two.p10, two.p90)),
            "medians apart": f"{100 * gap:.1f}%",
            "within 3%": "yes" if gap <= timing.REPEAT_TOLERANCE else "no",
        })  # fmt: skip
    return pd.DataFrame(rows)


def pinned_table(checks: Sequence[timing.PinnedCheck]) -> pd.DataFrame:
    """Each pinned-check cell: its medians alone, its median pinned beside another cell, and how far
    that is from the alone medians' mean, against the 3% the timing rule asks."""
    return pd.DataFrame([{
        "cell": nowrap(check.cell_id),
        "alone, s (each run)": nowrap(" · ".join(sig(median) for median in check.alone)),
        "pinned beside another, s": sig(check.pinned),
        "apart": f"{100 * check.gap:.1f}%",
        "within 3%": "yes" if check.agrees else "no",
    } for check in checks])  # fmt: skip


def published_comparison(cells: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Our step peaks and times beside the published ones (:func:`harness.report.data.published`) for the same cells."""
    rows = []
    for _, ref in published.iterrows():
        backend = backend_label(ref["variant"], ref["score_mini_batch_size"])
        ours = cells[(cells["batch_size"] == ref["batch_size"]) & (cells["backend"] == backend)
                     & (cells["card"] == ref["card"])] if not cells.empty else cells  # fmt: skip
        mine = ours.iloc[0] if len(ours) else None
        rows.append({
            "batch": ref["batch_size"], "backend": nowrap(backend),
            "published": _published_text(ref),
            "ours": "not run" if mine is None else cell_words(mine),
            "Δ step peak": _peak_difference(ref, mine),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _peak_difference(ref: pd.Series, mine: pd.Series | None) -> str:
    """Our allocated step peak relative to the published one, when both cells trained."""
    if mine is None or mine["outcome"] != "ok" or ref["outcome"] != "ok" or pd.isna(ref["step_peak_alloc_gib"]):
        return "—"
    ours = mine["step_peak_alloc_mib"] * GIB_PER_MIB
    return percent(100 * (ours - ref["step_peak_alloc_gib"]) / ref["step_peak_alloc_gib"])


def _published_text(ref: pd.Series) -> str:
    """A published cell in brief: 'OOM (asked 1.81 GiB)', '29.54 GiB · 7.98 s/step', 'trained (no step peak published)'."""
    if ref["outcome"] == "oom":
        request = f" (asked {ref['oom_request_gib']} GiB)" if not pd.isna(ref["oom_request_gib"]) else ""
        return "OOM" + request
    if pd.isna(ref["step_peak_alloc_gib"]):
        return "trained (no step peak published)"
    text = f"{ref['step_peak_alloc_gib']:.2f} GiB"
    return text + (f" · {ref['steady_step_time_sec']:.2f} s/step" if not pd.isna(ref["steady_step_time_sec"]) else "")


def published_op_comparison(calls: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """The published op memory (:data:`harness.report.data.PUBLISHED_OP`) beside ours for the same cell, a row
    each: every figure the published text gives, in the published harness's format (GiB to two decimals from
    1 GiB up, whole MiB below), and the backward spike over the held memory.

    Ours is the isolated replay of the cell's largest recorded call (:func:`largest_call`), the call the
    op-memory table shows; its tokens name the shape, on which the vanilla grid depends."""
    chosen = published_op(published)
    figures = [column for column in PUBLISHED_OP if chosen[column].notna().any()] if not chosen.empty else []
    ratio = {"op_held_mib", "op_backward_spike_mib"} <= set(figures)
    rows = []
    for _, ref in chosen.iterrows():
        backend = backend_label(ref["variant"], ref["score_mini_batch_size"])
        mine = _calls_of(calls, ref, backend)
        call = None if mine.empty else largest_call(mine)
        ours = {} if call is None else _op_figures(call)
        for run, values, tokens in (("published", ref, "—"), ("ours", ours, "" if call is None else call_tokens(call))):
            row: dict[str, object] = {"batch": ref["batch_size"], "backend": nowrap(backend), "run": run,
                                      "query × doc tokens": nowrap(tokens)}  # fmt: skip
            for column in figures:
                row[PUBLISHED_OP[column]] = nowrap(as_published(values.get(column)))
            if ratio:
                row["spike ÷ held"] = _ratio(values.get("op_backward_spike_mib"), values.get("op_held_mib"))
            rows.append(row)
    return pd.DataFrame(rows)


def _calls_of(calls: pd.DataFrame, ref: pd.Series, backend: str) -> pd.DataFrame:
    """Our replayed calls of a published cell's batch, backend and card (none that ran out of memory in replay)."""
    if calls.empty:
        return calls
    mine = calls[(calls["batch_size"] == ref["batch_size"]) & (calls["backend"] == backend) & (calls["card"] == ref["card"])]
    return mine[~mine["oom_in_replay"].astype(bool)]


def _op_figures(call: pd.Series) -> dict[str, float]:
    """A replayed call's op memory under the published figures' names (MiB)."""
    held, spike = float(call["saved_for_backward_mib"]), float(call["backward_transient_peak_mib"])
    return {"op_forward_transient_mib": float(call["forward_transient_peak_mib"]), "op_held_mib": held,
            "op_backward_spike_mib": spike, "op_total_mib": held + spike}  # fmt: skip


def _ratio(numerator: object, denominator: object) -> str:
    if missing(numerator) or missing(denominator) or not float(denominator):  # type: ignore[arg-type]
        return "—"
    return f"{float(numerator) / float(denominator):.2f}×"  # type: ignore[arg-type]


# ---- the op-level page ---------------------------------------------------------------------------


def tuner_inside(row: pd.Series, tuned_from: int | None) -> bool:
    """Whether an op-level cell's memory was measured on a call during which Triton autotuned: a PyLate lik
    cell that trained, at a batch from ``tuned_from`` up (where the lik-spike record saw kernels autotune
    inside the first backward, :func:`harness.report.data.tuner_inside_from`), measured before the harness
    measured such a call again (a result migrated from before that)."""
    return (row["variant"] == "lik" and row["stack"] == "op-pylate" and tuned_from is not None
            and int(row["batch_size"]) >= tuned_from and bool(row.get("migrated", False))
            and row["outcome"] != "oom")  # fmt: skip


def tuned_lik_totals(calls: pd.DataFrame) -> dict[int, float]:
    """The op memory (held + backward spike, MiB) of each PyLate op-level lik call once its kernels were
    tuned, by the op cell's batch: as a PyLate training cell's isolated replay of exactly that query and
    document shape measured it (a replay runs after the training steps tuned the kernels; the lik-spike
    record shows that a tuned call reads what that replay reads). A batch no training cell replayed at
    the op cell's shapes is left out."""
    if calls.empty:
        return {}
    ok = calls[~calls["oom_in_replay"].astype(bool) & (calls["backend"] == "lik")]

    def shape(row: pd.Series) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(row["query_shape"]), tuple(row["doc_shape"])

    trained: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
    for _, row in ok[ok["stack"] == "pylate"].iterrows():
        total = float(row["saved_for_backward_mib"] + row["backward_transient_peak_mib"])
        trained[shape(row)] = min(trained.get(shape(row), total), total)
    return {int(row["batch_size"]): trained[shape(row)] for _, row in ok[ok["stack"] == "op-pylate"].iterrows()
            if shape(row) in trained}  # fmt: skip


SPEED = "speed vs vanilla (95% interval)"
TIME_COLUMNS = ("median (ms)", "p10–p90 (ms)", SPEED)


def op_speed_table(ops: pd.DataFrame, tuned_from: int | None = None, tuned: dict[int, float] | None = None,
                   noise: timing.RunNoise | None = None) -> pd.DataFrame:  # fmt: skip
    """Median forward + backward time per head, batch and negatives: each backend beside vanilla.
    Times, and the speed relative to vanilla with its bootstrap 95% interval (with ``noise``, no
    difference where that interval reaches into 1 ± the head's run-to-run noise), only from cells timed
    under the timing rule; the memory always. A cell measured on a call during which Triton autotuned
    (:func:`tuner_inside`) has its memory marked :data:`TUNER_MARK`, with the same call's memory once
    tuned beside it where ``tuned`` (:func:`tuned_lik_totals`) has its batch."""
    if ops.empty:
        return pd.DataFrame()
    rows = []
    for key, group in ops.groupby(["stack", "regime", "batch_size", "negatives"], dropna=False):
        stack, head, batch, negatives = cast(tuple[str, str, int, Any], key)
        by_variant = group.set_index("variant")
        comparable = by_variant["times_comparable"].astype(bool)
        base = by_variant["steady_times_sec"].get("vanilla") if comparable.get("vanilla", False) else None
        for variant in style.in_order(by_variant.index):
            row = cast(pd.Series, by_variant.loc[variant]).copy()
            row["variant"] = variant
            oom = row["outcome"] == "oom"
            memory = ("OOM" if oom else "") if missing(row.get("total_mib")) else mib(row["total_mib"])
            if tuner_inside(row, tuned_from):
                memory += TUNER_MARK + (f" ({mib((tuned or {})[batch])} tuned)" if batch in (tuned or {}) else "")
            timed = not oom and bool(comparable[variant])
            speed = ""
            if timed and base is not None and variant != "vanilla":
                speed = timing.ratio_words(timing.ratio(list(base), list(row["steady_times_sec"])), compact=True,
                                           noise=None if noise is None else noise.of(stack, head))  # fmt: skip
            rows.append({
                "head": f"{stack.removeprefix('op-')} · {head}", "batch": batch,
                "negatives": "" if pd.isna(negatives) else int(negatives), "backend": variant,
                "median (ms)": "OOM" if oom else (sig(1000 * row["steady_step_time_sec"]) if timed else ""),
                "p10–p90 (ms)": _spread_ms(row) if timed else "", SPEED: speed,
                "held + bwd spike (MiB)": memory,
            })  # fmt: skip
    return pd.DataFrame(rows)


def op_speed_tables(ops: pd.DataFrame, tuned_from: int | None = None, tuned: dict[int, float] | None = None,
                    noise: timing.RunNoise | None = None) -> dict[str, pd.DataFrame]:  # fmt: skip
    """:func:`op_speed_table` split by head (one table each, without the head column; without the
    negatives column for a head that has none; without the time columns where no cell of the head was
    timed under the timing rule). Heads whose tables are the same in every cell (colpali-engine's two
    explicit-negative losses hold the same memory) share one table, headed with both names."""
    table = op_speed_table(ops, tuned_from, tuned, noise)
    if table.empty:
        return {}
    split: dict[str, pd.DataFrame] = {}
    for head, group in table.groupby("head", sort=False):
        group = group.drop(columns="head")
        if (group["negatives"] == "").all():
            group = group.drop(columns="negatives")
        untimed = [column for column in TIME_COLUMNS if set(group[column]) <= {"", "OOM"}]
        if len(untimed) == len(TIME_COLUMNS):  # no cell of this head timed under the timing rule: memory only
            group = group.drop(columns=untimed)
        group = group.reset_index(drop=True)
        same = next((name for name, shown in split.items() if shown.equals(group)), None)
        if same is None:
            split[str(head)] = group
            continue
        stack = same.partition(" · ")[0]
        merged = f"{same} and {str(head).removeprefix(stack + ' · ')}"
        split = {(merged if name == same else name): shown for name, shown in split.items()}
    return split


def shared_heads(name: str) -> list[str]:
    """The heads a table of :func:`op_speed_tables` shows: 'colpali · negative-ce and pairwise-negative-ce'
    → ['colpali · negative-ce', 'colpali · pairwise-negative-ce']."""
    stack, _, heads = name.partition(" · ")
    return [f"{stack} · {head}" for head in heads.split(" and ")]


def _spread_ms(row: pd.Series) -> str:
    if missing(row["steady_step_p10_sec"]):
        return ""
    return f"{sig(1000 * row['steady_step_p10_sec'])}–{sig(1000 * row['steady_step_p90_sec'])}"


# ---- ceilings ------------------------------------------------------------------------------------


NO_SEARCH = "—"  # a card the grid plans no search on for that row


def ceiling_grid(searches: Sequence[SearchRow], allocator: str = "default", compact: bool = False) -> pd.DataFrame:
    """What fits on my card: the ceiling per stack/regime/backend (rows) and card (columns);
    :data:`NO_SEARCH` where the grid plans no search on that card. ``compact``: the columns headed '80 GB (H100)'
    (:func:`card_column`), for a page that gives the caps in words (:func:`caps_words`), not in each heading."""
    chosen = [row for row in searches if row.allocator == allocator]
    if not chosen:
        return pd.DataFrame()
    frame = pd.DataFrame([{"stack": row.stack, "regime": regime_words(row.stack, row.regime), "backend": row.backend,
                           "card": row.card, "ceiling": ceiling_entry(row)} for row in chosen])  # fmt: skip
    table = frame.pivot_table(index=["stack", "regime", "backend"], columns="card", values="ceiling", aggfunc="first")
    order = cards_in_order(frame["card"])
    heading = card_column if compact else card_label
    return table.reindex(columns=order).rename(columns=heading).rename_axis(columns=None).fillna(NO_SEARCH)


def ceiling_details(searches: Sequence[SearchRow]) -> pd.DataFrame:
    """Per search that ran: the ceiling, the headroom left at it, its fragmentation, and what failed above it."""
    binds = {"maxsim": "in the op", "elsewhere": "outside the op"}
    rows = []
    for row in (row for row in searches if row.probes > 0):
        peaks = "" if row.peak_alloc_gib is None else f"{row.peak_alloc_gib:.1f} / {row.peak_reserved_gib:.1f}"
        failed = binds.get(row.fails_where or "", "")
        if row.fails_message is not None:
            asked = nowrap(_asked(row.fails_message)).replace("asked\u00a0", "asked ")  # its size on one line, the rest wraps
            failed += f", {asked}" if failed else asked
        if not failed:  # no batch above has failed (yet): say why the cell is empty (the ceiling's mark says it runs)
            failed = ("none yet" if not row.done else "none: the search reached its limit") if row.fails is None \
                else f"B={row.fails}"  # fmt: skip
        growth = "" if missing(row.fragmentation_growth_mib) else f" ({signed(float(row.fragmentation_growth_mib or 0), '+.0f')})"
        rows.append({
            "stack · regime": regime_label(row.stack, row.regime), "backend": row.backend,
            "card · allocator": f"{card_short(row.card)} · {row.allocator}", "ceiling": ceiling_entry(row),
            "peak alloc / reserved (GiB)": peaks, "headroom (GiB)": number(row.headroom_gib, ".2f"),
            "reserved − alloc (GiB), growth over steps (MiB)": number(row.fragmentation_gib, ".2f") + growth,
            "next batch failed": failed,
        })  # fmt: skip
    return pd.DataFrame(rows)


def ceiling_details_by_stack(searches: Sequence[SearchRow]) -> dict[str, pd.DataFrame]:
    """:func:`ceiling_details` as one table per stack · regime (a narrower table, without that column)."""
    table = ceiling_details(searches)
    if table.empty:
        return {}
    return {str(key): group.drop(columns="stack · regime").reset_index(drop=True)
            for key, group in table.groupby("stack · regime", sort=False)}  # fmt: skip


def _asked(message: str) -> str:
    """An OOM message's failed request in brief: 'asked 3.52 GiB'."""
    request = failed_request(message)
    return request.replace("Tried to allocate", "asked") if request.startswith("Tried to allocate") else request


def sharing_check(checks: Sequence[SharedCheck]) -> pd.DataFrame:
    """Ceiling probes run again on a shared GPU beside the same probes run without ``--share-gpu``:
    outcome and peaks side by side, and whether every step's peaks are the same to the byte. Step times
    only where enough twins record that they owned their host (:func:`harness.report.data.timed_checks`),
    and only theirs: a twin with no such record has no time to compare."""
    timed = {check.probe for check in timed_checks(checks)}
    rows = []
    for check in checks:
        alone, shared = check.alone, check.shared
        row: dict[str, object] = {
            "probe": check.probe, "GiB given on the shared GPU": number(shared.gpu_share_gib, ".2f"),
            "outcome alone · shared": f"{alone.outcome} · {shared.outcome}",
            "peak alloc MiB alone · shared": _side_by_side(alone.step_peak_alloc_mib, shared.step_peak_alloc_mib, ".2f"),
            "peak reserved MiB alone · shared": _side_by_side(alone.step_peak_reserved_mib, shared.step_peak_reserved_mib, ".0f"),
            "steps compared": len(alone.step_peak_alloc_per_step_mib),
            "identical": "yes" if check.identical else "no",
        }  # fmt: skip
        if timed:
            row["s / step alone · shared"] = (_side_by_side(alone.steady_step_time_sec, shared.steady_step_time_sec, ".2f")
                                              if check.probe in timed else "no record of its host")  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def card_check(checks: Sequence[CardCheck]) -> pd.DataFrame:
    """Ceiling probes run again under the same cap on another GPU beside the same probes from an H200:
    outcome and peaks side by side, the largest gap at any step, and whether every step is the same to the byte
    or within what two runs of the same stack and backend on one GPU measured apart at steps of the same phase
    (MiB allocated · reserved; 'at tuning' where the gap is at a step that tuned a kernel).
    No step times: the probes shared their GPUs."""
    rows = []
    for check in checks:
        h200, other = check.h200, check.other
        gap = check.largest_gap_mib()
        rows.append({
            "probe": check.probe, "other GPU": gpu_words(check.device),
            "outcome H200 · other": f"{h200.outcome} · {other.outcome}",
            "peak alloc MiB H200 · other": _side_by_side(h200.step_peak_alloc_mib, other.step_peak_alloc_mib, ".2f"),
            "peak reserved MiB H200 · other": _side_by_side(h200.step_peak_reserved_mib, other.step_peak_reserved_mib, ".0f"),
            "largest gap at a step, MiB (alloc · reserved)":
                "no step both finished" if gap is None else f"{gap[0]:.0f} · {gap[1]:.0f}",
            "same as the H200": _same_as_h200(check),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _same_as_h200(check: CardCheck) -> str:
    """A check pair's verdict in a cell: 'to the byte', 'within a repeat (2.0 · 0)' (the repeat spreads its
    differing steps are held to, MiB allocated · reserved, 'at tuning' for a kernel's tuning step), or 'no'."""
    if check.identical:
        return "to the byte"
    if not (check.matches and check.bounding):
        return "no"
    spreads = [f"{spread.alloc_mib:.1f} · {spread.reserved_mib:.0f}" + (" at tuning" if spread.phase == AUTOTUNE else "")
               for spread in check.bounding]  # fmt: skip
    return f"within a repeat ({'; '.join(spreads)})"


def device_names(frame: pd.DataFrame) -> pd.Series:
    """Each row's GPU as its result names it ('NVIDIA H100 80GB HBM3'), '' where none is recorded."""
    if "device_name" not in frame:
        return pd.Series("", index=frame.index, dtype=object)
    return frame["device_name"].map(lambda name: name if isinstance(name, str) else "")


def _side_by_side(alone: float | None, shared: float | None, spec: str) -> str:
    """Two measurements of one probe, alone · shared."""
    return f"{number(alone, spec)} · {number(shared, spec)}"


# ---- the results page ----------------------------------------------------------------------------

def skipped_table(skipped: Sequence[Skipped], root: Path) -> pd.DataFrame:
    """Every file under the results folder the report could not use, and why."""
    def where(path: Path) -> str:
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    return pd.DataFrame([{"file": where(item.path), "why it was skipped": item.reason} for item in skipped])


# ---- the synthetic data ---------------------------------------------------------------------------

PUBLISHED_QUERY_RANGE = (42, 57)  # the published B=128 run's batches padded their queries to 42–57 tokens (spec §3)


@dataclasses.dataclass(frozen=True)
class QueryCalibration:
    """What the synthetic ColQwen2 queries (:mod:`harness.stacks.colpali_data`) are set to give: over
    ``batches`` independent batches of ``batch`` queries for each of ``seeds``, padded as colpali-engine's
    collator pads them (``augmentation`` tokens added to each query), the median batch pads to within
    ``median`` tokens, a share within ``inside`` of the batches to :data:`PUBLISHED_QUERY_RANGE` and a
    share within ``above`` past it. ``tests/test_colpali_stack.py`` measures each range with the offline
    tokenizer; the methodology page states them from here (:func:`harness.report.prose.query_calibration`)."""

    batch: int = 128
    batches: int = 200
    seeds: tuple[int, ...] = (42, 43, 44)
    augmentation: int = 10
    median: tuple[float, float] = (49.5, 50.0)
    inside: tuple[float, float] = (0.84, 0.90)
    above: tuple[float, float] = (0.08, 0.135)


QUERY_CALIBRATION = QueryCalibration()


def query_length_table(lengths: pd.DataFrame, draw: str = "stream") -> pd.DataFrame:
    """The padded query length per batch size, over the distinct batches one draw recorded (with one
    stream per seed, cells of one seed and batch size train the same batches, counted once): how
    many, the median and range, and the share inside and above the published B=128 range."""
    if lengths.empty:
        return pd.DataFrame()
    mine = lengths[lengths["draw"] == draw]
    if draw == "stream":
        mine = mine.drop_duplicates(["batch_size", "seed", "step"])
    low, high = PUBLISHED_QUERY_RANGE
    rows = []
    for batch, group in mine.groupby("batch_size"):
        tokens = group["query_tokens"]
        rows.append({
            "batch": batch, "distinct batches" if draw == "stream" else "batches recorded": len(tokens),
            "median tokens": f"{tokens.median():g}",
            "range": f"{tokens.min()}–{tokens.max()}",
            f"in {low}–{high}": f"{100 * ((tokens >= low) & (tokens <= high)).mean():.0f}%",
            f"above {high}": f"{100 * (tokens > high).mean():.0f}%",
        })  # fmt: skip
    return pd.DataFrame(rows)


def lik_spike_table(experiments: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The lik backward spike of an op cell's first call beside the same call once tuned."""
    rows = []
    for row in experiments:
        repeats = cast(list[float], row["repeat_bwd_mib"])
        rows.append({
            "experiment": str(row["experiment"]).removeprefix("op-cell ").replace(f"b{row['batch']}, ", ""),
            "batch": row["batch"],
            "first call": sig(cast(float, row["first_bwd_mib"])),
            "tuned": sig(repeats[0]) if repeats else "",
            "live + 256 MiB flush": sig(cast(float, row["predicted_first_mib"])),
            "autotuned inside the first call": ", ".join(str(k).strip("_") for k in cast(list[str], row["swept_in_bwd"]))
            or "none",
        })  # fmt: skip
    return pd.DataFrame(rows)
