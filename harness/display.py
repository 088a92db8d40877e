"""Tables a cell notebook shows: what one cell measured, as pandas DataFrames."""

from __future__ import annotations

import pandas as pd

from harness.results import CellResult

_CALL_COLUMNS = [
    "call_index", "step", "query_shape", "doc_shape", "dtype", "forward_transient_peak_mib", "saved_for_backward_mib",
    "backward_transient_peak_mib", "predicted_forward_transient_mib", "predicted_saved_for_backward_mib",
    "oom_in_forward", "oom_in_replay", "oom_message", "entry_point_calls",
]  # fmt: skip


def calls_table(result: CellResult, kind: str) -> pd.DataFrame:
    """The MaxSim calls recorded ``"in_train"`` or replayed ``"isolated"``, one row each."""
    calls = result.maxsim_calls_in_train if kind == "in_train" else result.maxsim_calls_isolated
    frame = pd.DataFrame([call.model_dump() for call in calls], columns=_CALL_COLUMNS)
    return frame.dropna(axis="columns", how="all")


def summary(result: CellResult) -> pd.DataFrame:
    """The cell's outcome, step peaks and steady step time as a one-column table."""
    rows = {
        "cell": f"{result.stack} / {result.regime} / B={result.batch_size} / {result.variant}"
        + (f" / chunk {result.score_mini_batch_size}" if result.score_mini_batch_size else "")
        + (f" / {result.negatives} negatives" if result.negatives else ""),
        "card": result.card,
        "outcome": result.outcome,
        "OOM (first line)": result.oom_message,
        "OOM inside the MaxSim op": None if result.oom_where is None else result.oom_where == "maxsim",
        "step peak allocated (MiB)": result.step_peak_alloc_mib,
        "step peak reserved (MiB)": result.step_peak_reserved_mib,
        "reserved − allocated at peak (MiB)": result.fragmentation_mib,
        "steady step time (s)": result.steady_step_time_sec,
        "samples / s": result.samples_per_sec,
        "steady steps": result.steady_steps,
        "steps that autotuned": result.autotune_steps,
        "calls into the fused kernel": result.backend_entry_point_calls,
        "model": result.env.model_source if result.env else None,
        "data": result.env.data_source if result.env else None,
    }
    return pd.DataFrame({"value": rows})


def step_times(result: CellResult) -> pd.DataFrame:
    """One row per step: its time, whether it counts as steady, and (newer results) its own peaks."""
    steady = set(result.steady_steps)
    frame = pd.DataFrame(
        {
            "step": range(len(result.step_times_sec)),
            "seconds": result.step_times_sec,
            "steady": [i in steady for i in range(len(result.step_times_sec))],
            "autotuned": [i in result.autotune_steps for i in range(len(result.step_times_sec))],
        }
    )
    if len(result.step_peak_alloc_per_step_mib) == len(frame):
        frame["peak allocated MiB"] = result.step_peak_alloc_per_step_mib
        frame["peak reserved MiB"] = result.step_peak_reserved_per_step_mib
        frame["reserved − allocated MiB"] = frame["peak reserved MiB"] - frame["peak allocated MiB"]
    return frame


def op_timing(result: CellResult) -> pd.DataFrame:
    """An op-level cell's forward + backward time: median, spread and extremes over its repetitions."""
    times = pd.Series(result.step_times_sec, dtype=float)
    if times.empty:
        return pd.DataFrame({"value": {"repetitions": 0}})
    return pd.DataFrame({"value": {
        "repetitions": len(times), "median (s)": times.median(), "p10 (s)": times.quantile(0.1),
        "p90 (s)": times.quantile(0.9), "min (s)": times.min(), "max (s)": times.max(),
        "queries / s": result.samples_per_sec,
    }})  # fmt: skip
