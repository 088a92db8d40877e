"""The result record of one cell: a typed, versioned schema, atomic writes, validated loads.

Results are the report's data. Every cell writes exactly one JSON file; the book reads them all
through :func:`load_results`, the only loader. Key names follow the published harness so readers
of the JSON recognise them (``batch_size``, ``variant``, ``step_peak_alloc_mib``,
``maxsim_calls_in_train``, ...). This module imports neither torch nor a stack library, so the
report builds anywhere.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 1

Outcome = Literal["ok", "oom", "crashed"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class OpCall(_Record):
    """One MaxSim call: measured in train (forward brackets) or in isolated replay (all three).

    ``forward_transient_peak_mib``: peak allocated during the call above what was live before it.
    ``saved_for_backward_mib``: what the call left alive (graph-saved tensors + output).
    ``backward_transient_peak_mib``: peak during the op's own backward above what was live before
    it — replay only, since in train the op's backward is interleaved with the encoder's.
    ``predicted_*``: the analytic vanilla bytes for this shape (see ``harness.ops``).
    """

    call_index: int = Field(ge=0)
    variant: str
    query_shape: list[int]
    doc_shape: list[int]
    query_mask_shape: list[int] | None = None
    doc_mask_shape: list[int] | None = None
    dtype: str
    forward_transient_peak_mib: float | None = None
    saved_for_backward_mib: float | None = None
    backward_transient_peak_mib: float | None = None
    predicted_grid_mib: float
    predicted_forward_transient_mib: float | None = None  # None: no exact model for this op (grids only)
    predicted_saved_for_backward_mib: float | None = None
    oom_in_forward: bool = False
    oom_in_replay: bool = False
    oom_message: str | None = None
    entry_point_calls: int | None = None
    step: int | None = None


class Environment(_Record):
    """Where and with what a cell ran: enough to reproduce it and to explain a difference."""

    packages: dict[str, str | None]
    python: str
    platform: str
    device: str
    device_name: str | None = None
    device_capacity_mib: float | None = None
    card: str
    card_cap_mib: float | None = None
    pytorch_cuda_alloc_conf: str | None = None
    model_source: str | None = None
    data_source: str | None = None
    seed: int
    git_commit: str | None = None


class CellResult(_Record):
    """Everything measured for one cell (stack, regime, batch size, variant, ...)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    stack: str
    regime: str
    batch_size: int = Field(gt=0)
    variant: str
    score_mini_batch_size: int | None = None
    negatives: int | None = None  # op-level cells of heads with explicit negatives: negatives per query
    card: str
    allocator: str = "default"  # harness.allocator: the CUDA caching allocator regime the process ran with
    steps: int = Field(gt=0)
    seed: int
    preset: str | None = None
    outcome: Outcome
    oom_message: str | None = None
    oom_where: Literal["maxsim", "elsewhere"] | None = None
    pre_oom_alloc_mib: float | None = None
    pre_oom_reserved_mib: float | None = None
    crash_log_tail: str | None = None
    step_peak_alloc_mib: float | None = None
    step_peak_reserved_mib: float | None = None
    step_times_sec: list[float] = Field(default_factory=list)
    # per completed step: its own peak allocated / reserved (fragmentation = reserved - allocated)
    step_peak_alloc_per_step_mib: list[float] = Field(default_factory=list)
    step_peak_reserved_per_step_mib: list[float] = Field(default_factory=list)
    # derived from the peaks above when a result is built or loaded (files from before they existed
    # get them on load): reserved − allocated at the step peak, and per completed step
    fragmentation_mib: float | None = None
    fragmentation_per_step_mib: list[float] = Field(default_factory=list)
    autotune_steps: list[int] = Field(default_factory=list)
    steady_steps: list[int] = Field(default_factory=list)
    steady_step_time_sec: float | None = None
    samples_per_sec: float | None = None
    backend_entry_point_calls: int | None = None
    maxsim_calls_in_train: list[OpCall] = Field(default_factory=list)
    maxsim_calls_isolated: list[OpCall] = Field(default_factory=list)
    env: Environment | None = None
    wall_sec: float | None = None
    gpu_wait_sec: float | None = None  # under harness-sweep's GPU lock: how long the cell waited for its GPU
    # set when the cell measured beside others on a shared GPU (harness-ceiling --share-gpu): the GiB
    # it was given there (card cap + context margin). Its memory is its own; its step times are not the card's.
    gpu_share_gib: float | None = None
    # where wall_sec went: "device" (context, card cap), "build" (model, data, trainer), "train"
    # (every step, up to an OOM), "replay" (the isolated replays)
    phase_sec: dict[str, float] = Field(default_factory=dict)


    @model_validator(mode="after")
    def _derive_fragmentation(self) -> CellResult:
        alloc, reserved = self.step_peak_alloc_mib, self.step_peak_reserved_mib
        self.fragmentation_mib = None if alloc is None or reserved is None else reserved - alloc
        pairs = zip(self.step_peak_reserved_per_step_mib, self.step_peak_alloc_per_step_mib)
        self.fragmentation_per_step_mib = [step_reserved - step_alloc for step_reserved, step_alloc in pairs]
        return self


class ResultError(ValueError):
    """A result file that is missing, not JSON, or not a valid CellResult."""


def write_result(result: CellResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result`` to ``path`` atomically: readers see the old file or the new one, never half.

    The JSON goes to a temporary file in the same directory, is flushed to disk, then renamed over
    the target (``os.replace`` is atomic on POSIX within one filesystem).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = result.model_dump_json(indent=2)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def load_result(path: str | os.PathLike[str]) -> CellResult:
    """Load and validate one result file."""
    path = Path(path)
    try:
        return CellResult.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultError(f"no result file at {path}") from None
    except ValidationError as error:
        raise ResultError(f"{path} is not a valid cell result (schema {SCHEMA_VERSION}):\n{error}") from None


RESULTS_DIR_VARIABLE = "MAXSIM_RESULTS_DIR"


def default_results_dir() -> Path:
    """Where the report reads results: ``$MAXSIM_RESULTS_DIR`` if set, else ``results/`` of this checkout."""
    override = os.environ.get(RESULTS_DIR_VARIABLE)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "results"


def result_paths(root: str | os.PathLike[str]) -> list[Path]:
    """Every ``*.json`` result under ``root`` (hidden temporaries excluded), sorted."""
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.json") if not p.name.startswith("."))


_CELL_COLUMNS = [
    "stack", "regime", "batch_size", "variant", "score_mini_batch_size", "negatives", "card", "allocator", "steps",
    "seed", "preset",
    "outcome", "oom_message", "oom_where", "pre_oom_alloc_mib", "pre_oom_reserved_mib",
    "step_peak_alloc_mib", "step_peak_reserved_mib", "steady_step_time_sec", "samples_per_sec",
    "backend_entry_point_calls", "gpu_share_gib",
]  # fmt: skip


def load_results(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    level: Literal["cells", "calls"] = "cells",
) -> pd.DataFrame:
    """All results under ``sources`` as a DataFrame — the one loader the report uses.

    ``level="cells"``: one row per cell with its scalar fields, ``fragmentation_mib``
    (reserved − allocated at the step peak) and its growth across steps, the largest isolated op
    total and a ``path`` column.
    ``level="calls"``: one row per recorded MaxSim call, in train and isolated (column ``kind``),
    with the cell's identifying fields repeated. An invalid file raises :class:`ResultError`
    naming it: a report silently missing a cell is worse than a failed build.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    paths = [path for source in sources for path in result_paths(source)]
    rows: list[dict[str, object]] = []
    for path in paths:
        result = load_result(path)
        cell = {column: getattr(result, column) for column in _CELL_COLUMNS}
        cell["path"] = str(path)
        if level == "cells":
            rows.append(cell | _cell_summary(result))
            continue
        for kind, calls in (("in_train", result.maxsim_calls_in_train), ("isolated", result.maxsim_calls_isolated)):
            for call in calls:
                rows.append(cell | {"kind": kind} | call.model_dump())
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=_CELL_COLUMNS + ["path"])
    return frame


def _cell_summary(result: CellResult) -> dict[str, object]:
    isolated = [c for c in result.maxsim_calls_isolated if not c.oom_in_replay]
    largest = max(isolated, key=lambda c: c.saved_for_backward_mib or 0.0, default=None)
    steady = [result.step_times_sec[i] for i in result.steady_steps]
    per_step = result.fragmentation_per_step_mib
    return {
        "fragmentation_mib": result.fragmentation_mib,
        "fragmentation_first_step_mib": per_step[0] if per_step else None,
        "fragmentation_last_step_mib": per_step[-1] if per_step else None,
        "fragmentation_growth_mib": per_step[-1] - per_step[0] if len(per_step) > 1 else None,
        "n_steps_done": len(result.step_times_sec),
        # what the allocator could use: the emulated card's cap, else the whole device
        "memory_limit_mib": None if result.env is None else (result.env.card_cap_mib or result.env.device_capacity_mib),
        "n_calls_in_train": len(result.maxsim_calls_in_train),
        "n_steady_steps": len(result.steady_steps),
        "steady_step_min_sec": min(steady, default=None),
        "steady_step_max_sec": max(steady, default=None),
        "steady_step_p10_sec": _quantile(steady, 0.1),
        "steady_step_p90_sec": _quantile(steady, 0.9),
        "op_saved_for_backward_mib": None if largest is None else largest.saved_for_backward_mib,
        "op_backward_transient_peak_mib": None if largest is None else largest.backward_transient_peak_mib,
        "op_forward_transient_peak_mib": None if largest is None else largest.forward_transient_peak_mib,
        "op_predicted_saved_for_backward_mib": None if largest is None else largest.predicted_saved_for_backward_mib,
    }


def _quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile with linear interpolation (pandas' default), None for no values."""
    return None if not values else float(pd.Series(values).quantile(q))


def schema() -> dict[str, object]:
    """JSON Schema of a cell result, for readers of the published files."""
    return CellResult.model_json_schema()


def dumps_schema() -> str:
    return json.dumps(schema(), indent=2)
