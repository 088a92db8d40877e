"""Tables a cell notebook shows: what one cell measured, as pandas DataFrames of readable text.

Every value is formatted here, once, so a notebook reads as a record: memory in MiB to one decimal
(with GiB beside the step peaks), seconds to three significant digits, counts as integers, and
nothing that does not apply shown as "None" or "[]" (a row that does not apply is left out; an
empty list reads "none"; a missing value is an empty cell). No table names a local path.

:func:`header` is what the cell was (its spec) and how it ended; :func:`summary` its peaks and
times; :func:`calls_table`, :func:`step_times` and :func:`op_timing` the detail. The executed
notebooks under ``book/cells/`` are rendered again from their result files by these same functions
(``python -m harness.cellbook refresh``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from harness.report import text
from harness.results import CellResult, OpCall

NONE = "none"  # an empty list, in words


def significant(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, never in exponent form (``0.452``, ``2.65``, ``71.2``, ``1,234``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return text.significant(value, digits, whole=True, thousands=True)


def mib(value: float | None) -> str:
    """MiB to one decimal: ``52,343.3``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:,.1f}"


def mib_gib(value: float | None) -> str:
    """A peak: ``52,343.3 MiB (51.1 GiB)``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{mib(value)} MiB ({significant(value / 1024)} GiB)"


def seconds(value: float | None) -> str:
    return significant(value)


def integers(values: Iterable[int]) -> str:
    """``0, 2–49``: runs of consecutive integers as ranges; an empty list reads ``none``."""
    runs: list[list[int]] = []
    for value in sorted({int(v) for v in values}):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    text = ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}–{b}" for a, b in runs)
    return text or NONE


def first_line(message: str | None) -> str:
    """An error's gist: its first line, cut after its second sentence (CUDA's OOM message runs on
    with the process table of the device)."""
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    sentences = re.split(r"(?<=\.) ", line)
    return " ".join(sentences[:2])


def shape(dims: list[int] | None) -> str:
    return "" if not dims else "×".join(str(int(d)) for d in dims)


def yes_no(value: bool | None) -> str:
    return "" if value is None else ("yes" if value else "no")


def nothing(note: str) -> pd.DataFrame:
    """A table with nothing to show: one row saying why (never pandas' "Empty DataFrame … []")."""
    return pd.DataFrame({"value": {"note": note}})


def _table(rows: Mapping[str, Any]) -> pd.DataFrame:
    """A one-column table of text (rows whose value is None are left out)."""
    kept = {name: str(value) for name, value in rows.items() if value is not None}
    return pd.DataFrame({"value": pd.Series(kept, dtype=object)})


def backend(result: CellResult) -> str:
    chunk = f" + chunk {result.score_mini_batch_size}" if result.score_mini_batch_size else ""
    return f"{result.variant}{chunk}"


def header(result: CellResult) -> pd.DataFrame:
    """What the cell was and how it ended: stack, regime or head, batch, backend, card, allocator, seed,
    steps as trained (:func:`steps_done`), the GPU it ran on, outcome, grid and cell id — from the
    result, one row each."""
    return _table(header_fields(result))


def header_fields(result: CellResult) -> dict[str, str]:
    """The header's rows as text, those that do not apply (negatives of a training cell) left out."""
    spec = result.spec
    outcome = result.outcome + (f" ({result.failure.replace('_', ' ')})" if result.failure else "")
    rows: dict[str, Any] = {
        "stack": spec.stack,
        "head" if spec.kind == "op" else "regime": spec.regime,
        "batch": spec.batch_size,
        "negatives per query": spec.negatives,
        "backend": backend(result),
        "card": result.card,
        "allocator": result.allocator,
        "seed": spec.seed,
        "steps trained" if spec.kind == "train" else "timed repetitions": steps_done(result),
        "preset": getattr(spec, "preset", None) if spec.kind == "train" else None,
        "device": getattr(spec, "device", None),
        "GPU": text.gpu_words(result.env.device_name) if result.env is not None and result.env.device_name else None,
        "outcome": outcome,
        "grid": result.grid or "none (run by hand)",
        "cell id": result.cell_id,
    }
    return {name: str(value) for name, value in rows.items() if value is not None}


def steps_done(result: CellResult) -> str:
    """What the cell ran, beside what it was to run: ``8`` (all it was asked for), ``10 (of at least 9:
    a timed cell trains on until 8 steady steps are timed)`` for a timed cell, which trains past its ``steps`` until it has timed
    ``min_steady_steps``, and ``26 of 100, then out of memory in step 27`` for one that stopped short.
    Never the spec's ``steps`` alone, which for a timed cell is not what it trained."""
    spec, done = result.spec, len(result.step_times_sec)
    steady = getattr(spec, "min_steady_steps", 0) or 0
    least = max(spec.steps, getattr(spec, "warmup_steps", 0) + steady) if steady else spec.steps
    planned = f"at least {least}" if steady else str(least)
    if result.outcome == "crashed":
        return f"none recorded of {planned} (it crashed)" if not done else f"{done} of {planned}, then it crashed"
    if result.outcome != "ok":
        return f"{done} of {planned}, then out of memory in step {done + 1}"
    if steady:
        return f"{done} (of {planned}: a timed cell trains on until {steady} steady steps are timed)"
    return str(done) if done == least else f"{done} of {planned}"


NOT_ALONE = "not timed alone (shared host/GPU)"  # a time of a cell that did not have its GPU and host to itself
NOT_RECORDED = "not timed alone (no record that it had its host and GPU to itself)"  # measured before the timing rule


def alone_mark(result: CellResult) -> str:
    """'' for a cell timed alone (its times are the card's: the timing rule); otherwise the mark its
    times carry wherever a notebook shows them: :data:`NOT_ALONE`, or :data:`NOT_RECORDED` for a cell
    measured before the timing rule."""
    if result.timed_alone:
        return ""
    return NOT_RECORDED if result.timing is None else NOT_ALONE


def _marked(value: str, result: CellResult) -> str | None:
    """A time as a notebook shows it: with its :func:`alone_mark` after it; None for no value."""
    if not value:
        return None
    mark = alone_mark(result)
    return f"{value} — {mark}" if mark else value


def timed_alone(result: CellResult) -> str:
    """Whether the cell's times are the card's (the timing rule: its GPU and host to itself), in words."""
    if result.timing is None:
        return "no: measured before the timing rule (no record of what ran beside it)"
    if not result.timing.comparable:
        return f"no: {result.timing.reason}"
    if result.ran_beside_others:
        return f"beside {result.timing.neighbours} other cell(s) on other cores (counted only where the pinned check vouches)"
    return "yes"


def summary(result: CellResult) -> pd.DataFrame:
    """The cell's outcome, step peaks and steady step time as a one-column table, with the GPU it ran on
    (its times are that GPU's, whatever card it was capped to)."""
    failed = result.outcome != "ok"
    where = None if result.oom_where is None else ("yes" if result.oom_where == "maxsim" else "no")
    rows: dict[str, Any] = {
        "cell": f"{result.stack} / {result.regime} / B={result.batch_size} / {backend(result)}"
        + (f" / {result.negatives} negatives" if result.negatives else ""),
        "card": result.card,
        "GPU": text.gpu_words(result.env.device_name) if result.env is not None and result.env.device_name else None,
        "outcome": result.outcome,
        "OOM": first_line(result.oom_message) if failed and result.oom_message else None,
        "OOM inside the MaxSim op": where,
        "step peak allocated": mib_gib(result.step_peak_alloc_mib) or None,
        "step peak reserved": mib_gib(result.step_peak_reserved_mib) or None,
        "reserved − allocated at peak (MiB)": mib(result.fragmentation_mib) or None,
        "steady step time (s)": _marked(seconds(result.steady_step_time_sec), result),
        "timed alone": timed_alone(result) if result.step_times_sec else None,
        "samples / s": _marked(significant(result.samples_per_sec), result),
        "steady steps": integers(result.steady_steps) if result.step_times_sec else None,
        "steps that autotuned": integers(result.autotune_steps) if result.step_times_sec else None,
        "calls into the fused kernel": result.backend_entry_point_calls,
        "data-parallel ranks": (f"{result.world_size} (torchrun" + (", all on one GPU, gloo)" if result.ranks_share_gpu else ")")
                                if result.world_size > 1 else None),
        "negatives gathered across ranks": "yes" if result.gather else None,
        "per rank: outcome, step peak allocated": "; ".join(
            f"rank {rank.rank} {rank.outcome}" + (f", {mib_gib(rank.step_peak_alloc_mib)}" if rank.step_peak_alloc_mib else "")
            for rank in result.ranks) or None,
        "trainable parameters": mib_gib(result.trainable_parameter_mib) or None,
        "DDP's allreduce buckets (per rank)": mib_gib(result.ddp_bucket_mib) or None,
        "model": result.env.model_source if result.env else None,
        "data": result.env.data_source if result.env else None,
    }
    return _table(rows)


_CALL_COLUMNS: dict[str, str] = {
    "call_index": "call", "step": "step", "query_shape": "queries", "doc_shape": "documents", "dtype": "dtype",
    "forward_transient_peak_mib": "forward MiB", "saved_for_backward_mib": "held MiB",
    "backward_transient_peak_mib": "backward MiB",
    "predicted_forward_transient_mib": "predicted forward MiB", "predicted_saved_for_backward_mib": "predicted held MiB",
    "oom_in_forward": "OOM in forward", "oom_in_replay": "OOM in replay", "oom_message": "OOM",
    "entry_point_calls": "kernel calls",
}  # fmt: skip


def _call_value(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column.endswith("_shape"):
        return shape(value)
    if column.endswith("_mib"):
        return mib(value)
    if column.startswith("oom_in_"):
        return yes_no(value)
    if column == "oom_message":
        return first_line(str(value))
    return str(value)


def calls_table(result: CellResult, kind: str) -> pd.DataFrame:
    """The MaxSim calls recorded ``"in_train"`` or replayed ``"isolated"``, one row each, in MiB:
    ``forward`` the call's forward transient peak, ``held`` what it saved for backward, ``backward``
    its backward transient peak (replay only), ``predicted`` the analytic vanilla bytes. A column with
    nothing in any row (an OOM flag never raised, a measure this kind does not take) is left out."""
    calls: list[OpCall] = result.maxsim_calls_in_train if kind == "in_train" else result.maxsim_calls_isolated
    records = [call.model_dump() for call in calls]
    columns = [c for c in _CALL_COLUMNS if any(r.get(c) not in (None, False, "", []) for r in records)]
    if all(first_line(r.get("oom_message")) == first_line(result.oom_message) for r in records) and "oom_message" in columns:
        columns.remove("oom_message")  # the summary's OOM line says it once
    if records and "call_index" not in columns:
        columns.insert(0, "call_index")
    frame = pd.DataFrame(
        [[_call_value(c, r.get(c)) for c in columns] for r in records], columns=[_CALL_COLUMNS[c] for c in columns]
    )
    if not records:
        what = "recorded in training" if kind == "in_train" else "replayed in isolation"
        return nothing(
            f"no MaxSim call was {what}"
            + (" (an op-level cell has no training)" if result.kind == "op" and kind == "in_train" else "")
        )
    return frame.set_index(_CALL_COLUMNS["call_index"])


def step_times(result: CellResult) -> pd.DataFrame:
    """One row per step: its time, whether it counts as steady, and (newer results) its own peaks. The
    time column of a cell not timed alone says so in its header (:func:`alone_mark`)."""
    count = len(result.step_times_sec)
    steady, tuned = set(result.steady_steps), set(result.autotune_steps)
    mark = alone_mark(result)
    frame = pd.DataFrame(
        {
            "step": range(count),
            f"seconds — {mark}" if mark else "seconds": [seconds(t) for t in result.step_times_sec],
            "steady": [yes_no(i in steady) for i in range(count)],
            "autotuned": [yes_no(i in tuned) for i in range(count)],
        }
    )
    if count and len(result.step_peak_alloc_per_step_mib) == count == len(result.step_peak_reserved_per_step_mib):
        allocated, reserved = result.step_peak_alloc_per_step_mib, result.step_peak_reserved_per_step_mib
        frame["peak allocated MiB"] = [mib(a) for a in allocated]
        frame["peak reserved MiB"] = [mib(r) for r in reserved]
        frame["reserved − allocated MiB"] = [mib(r - a) for a, r in zip(allocated, reserved, strict=True)]
    if not count:
        return nothing("no step completed" + (" (the cell ran out of memory)" if result.outcome == "oom" else ""))
    return frame.set_index("step")


def op_timing(result: CellResult) -> pd.DataFrame:
    """An op-level cell's forward + backward time: median, spread and extremes over its repetitions;
    the column of a cell not timed alone says so in its header (:func:`alone_mark`), and why in a row."""
    times = pd.Series(result.step_times_sec, dtype=float)
    if times.empty:
        return nothing("no repetition was timed" + (" (the cell ran out of memory)" if result.outcome == "oom" else ""))
    quantile = {name: float(times.quantile(q)) for name, q in (("p10", 0.1), ("p90", 0.9))}
    table = _table({
        "repetitions": len(times), "median (s)": seconds(float(times.median())), "p10 (s)": seconds(quantile["p10"]),
        "p90 (s)": seconds(quantile["p90"]), "min (s)": seconds(float(times.min())), "max (s)": seconds(float(times.max())),
        "queries / s": significant(result.samples_per_sec) or None,
        "timed alone": None if result.timed_alone else timed_alone(result),
    })  # fmt: skip
    mark = alone_mark(result)
    return table.rename(columns={"value": f"value — {mark}"}) if mark else table
