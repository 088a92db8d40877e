"""The result record of one cell: a typed, versioned schema, atomic writes, validated loads.

Results are the report's data. Every cell writes exactly one JSON file; the book reads them all
through :func:`load_results`, the only loader. Key names follow the published harness so readers
of the JSON recognise them (``batch_size``, ``variant``, ``step_peak_alloc_mib``,
``maxsim_calls_in_train``, ...). This module imports neither torch nor a stack library, so the
report builds anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.spec import OpSpec, TrainSpec

SCHEMA_VERSION: Literal[2] = 2

HOST_OUT_OF_MEMORY = "the host's memory, not the GPU's, ran out"  # ends a crash marker's message the host's OOM killer caused
Outcome = Literal["ok", "oom", "crashed"]
# Why a cell ended without a measurement of its own (a crash marker's ``failure``), as the
# launcher reads it from the executed notebook, never from log text: the kernel never ran a cell,
# the device (not the card cap) refused memory beside other cells, the notebook raised, or the
# kernel died mid-cell.
Failure = Literal["kernel_never_started", "device_out_of_memory", "error", "kernel_died"]
Spec = Annotated[TrainSpec | OpSpec, Field(discriminator="kind")]


class _Record(BaseModel):
    # A non-finite measurement (a loss or gradient norm that overflowed) is written as JSON's NaN /
    # Infinity constants, which Python's json reads back: pydantic's default writes null, which a
    # float field then refuses, so the whole result would be lost.
    model_config = ConfigDict(extra="forbid", frozen=False, ser_json_inf_nan="constants")


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


class Parity(_Record):
    """A traced cell against the vanilla cell of the same stack, regime, batch, seed and steps
    (:mod:`harness.trace`): the cosine, norm ratio and relative difference of the first step's
    gradients of the trainable parameters, and the final trainable weights' largest absolute and
    relative (‖Δ‖ / ‖θ_vanilla‖) difference. ``note`` says why a value is missing."""

    reference: str
    reference_cell_id: str | None = None
    first_grad_cosine: float | None = None
    first_grad_norm_ratio: float | None = None
    first_grad_rel_diff: float | None = None
    final_weight_max_abs_diff: float | None = None
    final_weight_rel_diff: float | None = None
    note: str | None = None


class Timing(_Record):
    """What the cell's times were taken beside (:mod:`harness.host`), and whether they may be published.

    ``gpu``: the physical GPU index; ``cpus``: the cores the cell could run on (``"0-7"``);
    ``pinned``: the launcher pinned them. ``neighbours``: the most other cell processes seen on the
    host while the cell trained; ``neighbours_on_own_cpus``: the most of them that could run on this
    cell's cores. ``gpu_shared``: the cell entered its GPU beside others (``--share-gpu``).
    ``sm_clock_mhz`` / ``temperature_c``: the GPU's at the start and end of training.
    ``comparable``: the times are the card's (GPU alone, and no neighbour on its cores); ``reason``
    says why not.
    """

    gpu: str | None = None
    cpus: str
    pinned: bool = False
    neighbours: int = 0
    neighbours_on_own_cpus: int = 0
    gpu_shared: bool = False
    sm_clock_mhz: list[float] = Field(default_factory=list)
    temperature_c: list[float] = Field(default_factory=list)
    comparable: bool
    reason: str | None = None


class RankResult(_Record):
    """One rank of a data-parallel cell (``spec.world_size`` > 1, :mod:`harness.ranks`): how it ended,
    its own device's step peaks (per step too), step times and MaxSim calls in training. ``outcome``
    ``stopped``: it wrote nothing because another rank failed first and torchrun stopped the rest."""

    rank: int
    device: str | None = None
    outcome: Literal["ok", "oom", "crashed", "stopped"]
    oom_message: str | None = None
    oom_where: Literal["maxsim", "elsewhere"] | None = None
    step_peak_alloc_mib: float | None = None
    step_peak_reserved_mib: float | None = None
    step_peak_alloc_per_step_mib: list[float] = Field(default_factory=list)
    step_peak_reserved_per_step_mib: list[float] = Field(default_factory=list)
    step_times_sec: list[float] = Field(default_factory=list)
    maxsim_calls_in_train: list[OpCall] = Field(default_factory=list)


class Provenance(_Record):
    """Which code produced a result: enough to find it again, even from a copied tree.

    ``commit``: the project commit of the checkout the cell ran from (None when the harness was not
    run from a git checkout of this project: a copied tree names no commit rather than the commit of
    whatever repository encloses it). ``dirty``: the checkout had uncommitted changes to tracked
    files. ``harness_sha256`` / ``notebook_sha256``: content hashes of the ``harness`` package's
    sources and of the notebook that ran, identical wherever the same code runs. ``lock_*``: the
    lock file the environment was created from and its hash (None: an environment not made by
    ``tools/envs.py``). ``migrated_from_schema``: set on results rewritten from an older schema;
    ``commit`` is then the commit that older file recorded.
    """

    commit: str | None = None
    dirty: bool | None = None
    harness_sha256: str | None = None
    notebook_sha256: str | None = None
    environment: str | None = None
    lock_file: str | None = None
    lock_sha256: str | None = None
    migrated_from_schema: int | None = None


class CellResult(_Record):
    """Everything measured for one cell, with the spec it ran (``spec``), its id and its grid.

    ``grid`` is None for a cell run by hand (a notebook, ``harness cell``) outside any grid: such a
    result is never part of the report. The spec's fields read through (``result.stack``,
    ``result.batch_size``, …).
    """

    schema_version: Literal[2] = SCHEMA_VERSION
    grid: str | None
    cell_id: str
    spec: Spec
    provenance: Provenance | None = None
    outcome: Outcome
    failure: Failure | None = None  # crash markers: why the cell has no measurement of its own
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
    # derived from the peaks above when a result is built or loaded: reserved − allocated at the
    # step peak, and per completed step
    fragmentation_mib: float | None = None
    fragmentation_per_step_mib: list[float] = Field(default_factory=list)
    autotune_steps: list[int] = Field(default_factory=list)
    steady_steps: list[int] = Field(default_factory=list)
    steady_step_time_sec: float | None = None
    samples_per_sec: float | None = None
    backend_entry_point_calls: int | None = None
    # the trainable parameters (their gradients take as many), and, where the trainer wrapped the model in
    # DistributedDataParallel, what its reducer keeps in allreduce buckets beside the gradients (0 when
    # the gradients are views into the buckets; None without DDP): a data-parallel rank's memory that a
    # one-process cell does not have (None on results older than these fields)
    trainable_parameter_mib: float | None = None
    ddp_bucket_mib: float | None = None
    maxsim_calls_in_train: list[OpCall] = Field(default_factory=list)
    maxsim_calls_isolated: list[OpCall] = Field(default_factory=list)
    env: Environment | None = None
    wall_sec: float | None = None
    gpu_wait_sec: float | None = None  # under the launcher's GPU gate: how long the cell waited for its GPU
    # set when the cell measured beside others on a shared GPU (harness ceiling --share-gpu): the GiB
    # it was given there (card cap + context margin). Its memory is its own; its step times are not the card's.
    gpu_share_gib: float | None = None
    # where wall_sec went: "device" (context, card cap), "build" (model, data, trainer), "train"
    # (every step, up to an OOM), "replay" (the isolated replays)
    phase_sec: dict[str, float] = Field(default_factory=dict)
    # the timing rule (harness.host): what the times were taken beside; None on results older than it,
    # whose times are therefore never published as the card's
    timing: Timing | None = None
    # traced cells (spec.trace): per step, the loss the trainer's training_step returned and the
    # trainable parameters' gradient norm before clipping; the comparison with vanilla's cell
    loss_per_step: list[float] = Field(default_factory=list)
    grad_norm_per_step: list[float] = Field(default_factory=list)
    parity: Parity | None = None
    # data-parallel cells (spec.world_size > 1): every rank's own record. The fields above are then the
    # cell's: the worst outcome, the largest peaks over the ranks, the slowest rank's step times, and
    # rank 0's MaxSim calls and replays
    ranks: list[RankResult] = Field(default_factory=list)

    @property
    def data_draw(self) -> str | None:
        """Which draw of the synthetic data the cell trained on: ``stream`` (one stream per seed) or
        ``rows`` (batch × steps rows per cell, before the stream); None for real data."""
        source = self.env.data_source if self.env is not None else None
        if not source or not source.startswith("synthetic:"):
            return None
        return "stream" if ":stream=" in source else "rows"

    @property
    def times_comparable(self) -> bool:
        """Whether this result's step times are the card's (the timing rule held while it trained)."""
        return self.timing is not None and self.timing.comparable

    @property
    def ran_beside_others(self) -> bool:
        """Whether other cells ran on the host while it was timed (on other cores: a neighbour on its
        own cores already makes its times not comparable), pinned by the launcher or not."""
        return self.timing is not None and self.timing.neighbours > 0

    @property
    def timed_alone(self) -> bool:
        """Comparable times taken with the host to itself (no pinned check needed to publish them)."""
        return self.times_comparable and not self.ran_beside_others

    @model_validator(mode="after")
    def _identity_and_fragmentation(self) -> CellResult:
        if self.cell_id != self.spec.cell_id:
            raise ValueError(f"cell_id {self.cell_id!r} is not its spec's id {self.spec.cell_id!r}")
        alloc, reserved = self.step_peak_alloc_mib, self.step_peak_reserved_mib
        self.fragmentation_mib = None if alloc is None or reserved is None else reserved - alloc
        pairs = zip(self.step_peak_reserved_per_step_mib, self.step_peak_alloc_per_step_mib, strict=False)
        self.fragmentation_per_step_mib = [step_reserved - step_alloc for step_reserved, step_alloc in pairs]
        return self

    # the spec's fields, read through: what the cell was
    kind = property(lambda self: self.spec.kind)
    stack = property(lambda self: self.spec.stack)
    regime = property(lambda self: self.spec.regime)
    batch_size = property(lambda self: self.spec.batch_size)
    variant = property(lambda self: self.spec.variant)
    score_mini_batch_size = property(lambda self: self.spec.score_mini_batch_size)
    mini_batch_size = property(lambda self: self.spec.mini_batch_size)
    negatives = property(lambda self: self.spec.negatives)
    card = property(lambda self: self.spec.card)
    allocator = property(lambda self: self.spec.allocator)
    steps = property(lambda self: self.spec.steps)
    seed = property(lambda self: self.spec.seed)
    preset = property(lambda self: self.spec.preset)
    world_size = property(lambda self: getattr(self.spec, "world_size", 1))  # op cells run in one process
    gather = property(lambda self: getattr(self.spec, "gather", False))
    ranks_share_gpu = property(lambda self: getattr(self.spec, "ranks_share_gpu", False))

    @classmethod
    def crashed(cls, spec: TrainSpec | OpSpec, grid: str | None, failure: Failure, log_tail: str | None,
                wall_sec: float, message: str | None = None) -> CellResult:  # fmt: skip
        """The crash marker the launcher writes for a cell that ended without a result of its own."""
        return cls(grid=grid, cell_id=spec.cell_id, spec=spec, outcome="crashed", failure=failure,
                   oom_message=message, crash_log_tail=log_tail, wall_sec=wall_sec)  # fmt: skip


class ResultError(ValueError):
    """A result file that is missing, not JSON, or not a valid CellResult."""


def write_result(result: CellResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result`` to ``path`` atomically: readers see the old file or the new one, never half."""
    return write_text_atomic(path, result.model_dump_json(indent=2) + "\n")


def write_text_atomic(path: str | os.PathLike[str], payload: str) -> Path:
    """Write ``payload`` to ``path`` atomically.

    The text goes to a temporary file in the same directory, is flushed to disk, then renamed over
    the target (``os.replace`` is atomic on POSIX within one filesystem). The temporary file is
    created private (0600); the file is made readable by all (0644) before the rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


# ---- progress of a long cell ----------------------------------------------------------------------
# A cell planned for many steps (the long runs) may outlast the host it runs on: a leased GPU is given
# back at the lease's end, killing the run before it writes its result. So such a cell writes, every
# few steps, what it has measured so far to ``<cell id>.progress`` beside its result (not ``*.json``:
# never read as a result). The result, once written, supersedes it and the file is removed.
PROGRESS_SUFFIX = ".progress"


class Progress(_Record):
    """What a long cell had measured at its last checkpoint: its completed steps' peaks and times.
    It says nothing of how the run ended (a cut host, a kill): only that it trained ``steps_done``
    steps without running out of memory."""

    cell_id: str
    spec: Spec
    steps_done: int
    step_peak_alloc_per_step_mib: list[float]
    step_peak_reserved_per_step_mib: list[float]
    step_times_sec: list[float]
    gpu_share_gib: float | None = None
    device_name: str | None = None  # the GPU it ran on ("NVIDIA H200"); None in records written before it was kept
    written_at: str


def progress_path(result_path: str | os.PathLike[str]) -> Path:
    """Where the progress of the cell whose result goes to ``result_path`` is kept."""
    return Path(result_path).with_suffix(PROGRESS_SUFFIX)


def load_progress(path: str | os.PathLike[str]) -> Progress | None:
    """The progress record at ``path`` (a result path or a progress path); None when there is none
    or it cannot be read as one."""
    path = progress_path(path)
    try:
        return Progress.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError, ValueError):
        return None


def write_progress(progress: Progress, result_path: str | os.PathLike[str]) -> bool:
    """Write ``progress`` beside ``result_path`` atomically, unless the file there already holds a
    longer run of the same spec (a re-run keeps an earlier, longer record until it passes it). True
    when written."""
    earlier = load_progress(result_path)
    if earlier is not None and earlier.spec == progress.spec and earlier.steps_done > progress.steps_done:
        return False
    write_text_atomic(progress_path(result_path), progress.model_dump_json(indent=2) + "\n")
    return True


def load_result(path: str | os.PathLike[str]) -> CellResult:
    """Load and validate one result file; :class:`ResultError` says in one line why it cannot be used."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultError(f"no result file at {path}") from None
    except OSError as error:
        raise ResultError(f"{path}: cannot be read ({error.strerror})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ResultError(f"{path}: not JSON ({error.msg} at line {error.lineno}; a truncated write?)") from None
    if not isinstance(document, dict) or "schema_version" not in document:
        raise ResultError(f"{path}: not a cell result (no schema_version)")
    if document["schema_version"] != SCHEMA_VERSION:
        hint = "; run `harness migrate` to rewrite it" if document["schema_version"] == 1 else ""
        raise ResultError(f"{path}: schema {document['schema_version']!r}, this harness reads {SCHEMA_VERSION}{hint}")
    try:
        return CellResult.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        problems = f"{error.error_count()} problems; first: {where}: {first['msg']}"
        raise ResultError(f"{path}: not a valid cell result ({problems})") from None


RESULTS_DIR_VARIABLE = "MAXSIM_RESULTS_DIR"


def default_results_dir() -> Path:
    """Where the report reads results: ``$MAXSIM_RESULTS_DIR`` if set, else ``results/`` of this checkout."""
    override = os.environ.get(RESULTS_DIR_VARIABLE)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "results"


# Folders of the results directory that hold other records than cell results, each read by its own
# module: they are neither cells nor foreign files.
OTHER_RECORDS = {
    "predictions": "the memory model's validation (harness.memmodel)",
    "op-parity": "op parity against an fp64 reference (harness.parity)",
    "host-memory": "host memory of collating a ColQwen2 batch (harness.host_memory)",
}


def result_paths(root: str | os.PathLike[str]) -> list[Path]:
    """Every ``*.json`` result under ``root`` (hidden temporaries and the :data:`OTHER_RECORDS`
    folders of ``root`` excluded), sorted."""
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.json")
                  if not p.name.startswith(".") and p.relative_to(root).parts[0] not in OTHER_RECORDS)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A file under the results that the report cannot use, and why (one line)."""

    path: Path
    reason: str


def read_results(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], grids: Collection[str] | None = None
) -> tuple[list[tuple[Path, CellResult]], list[Skipped]]:
    """Every valid result under ``sources`` (of ``grids`` only, if given), and every file skipped
    with its reason: unreadable, not a result, an older schema, or a cell of no known grid (a
    notebook's or ``harness cell``'s own output)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    results, skipped = [], []
    for path in (path for source in sources for path in result_paths(source)):
        try:
            result = load_result(path)
        except ResultError as error:
            skipped.append(Skipped(path, str(error).removeprefix(f"{path}: ")))
            continue
        if grids is not None and result.grid not in grids:
            known = ", ".join(sorted(grids))
            reason = f"cell of grid {result.grid!r}, not one of the report's grids ({known})" if result.grid else (
                "a cell run outside any grid (a notebook's or `harness cell`'s own output)")
            skipped.append(Skipped(path, reason))
            continue
        results.append((path, result))
    return results, skipped


_CELL_COLUMNS = [
    "grid", "cell_id", "kind", "stack", "regime", "batch_size", "variant", "score_mini_batch_size", "mini_batch_size",
    "negatives", "card",
    "allocator", "steps", "seed", "preset",
    "outcome", "failure", "oom_message", "oom_where", "pre_oom_alloc_mib", "pre_oom_reserved_mib",
    "step_peak_alloc_mib", "step_peak_reserved_mib", "steady_step_time_sec", "samples_per_sec",
    "backend_entry_point_calls", "gpu_share_gib",
]  # fmt: skip


def load_results(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    level: Literal["cells", "calls"] = "cells",
    grids: Collection[str] | None = None,
    strict: bool = True,
) -> pd.DataFrame:
    """All results under ``sources`` as a DataFrame — the one loader the report uses.

    ``level="cells"``: one row per cell with its identity (grid, cell id, the spec's fields), its
    scalar measurements, ``fragmentation_mib`` (reserved − allocated at the step peak) and its
    growth across steps, the largest isolated op total and a ``path`` column.
    ``level="calls"``: one row per recorded MaxSim call, in train and isolated (column ``kind``
    becomes ``call_kind``), with the cell's identifying fields and GPU (``device_name``) repeated. ``strict``: a file that
    cannot be used raises :class:`ResultError` naming it; otherwise it is left out (see
    :func:`read_results` for the list).
    """
    results, skipped = read_results(sources, grids)
    if strict and skipped:
        raise ResultError(f"{skipped[0].path}: {skipped[0].reason}")
    return frame_of(results, level)


def frame_of(results: Iterable[tuple[Path, CellResult]], level: Literal["cells", "calls"] = "cells") -> pd.DataFrame:
    """Results as a DataFrame (see :func:`load_results`)."""
    rows: list[dict[str, object]] = []
    for path, result in results:
        cell = {column: getattr(result, column) for column in _CELL_COLUMNS}
        cell["path"] = str(path)
        if level == "cells":
            rows.append(cell | _cell_summary(result))
            continue
        device = None if result.env is None else result.env.device_name  # the GPU its cell ran on, for a card's heading
        for kind, calls in (("in_train", result.maxsim_calls_in_train), ("isolated", result.maxsim_calls_isolated)):
            for call in calls:
                rows.append(cell | {"call_kind": kind, "device_name": device} | call.model_dump())
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=_CELL_COLUMNS + ["path"])
    return frame


def largest_isolated_call(result: CellResult) -> OpCall | None:
    """The isolated replay that held the most for backward (replays that ran out of memory left out)."""
    isolated = [c for c in result.maxsim_calls_isolated if not c.oom_in_replay]
    return max(isolated, key=lambda c: c.saved_for_backward_mib or 0.0, default=None)


def _cell_summary(result: CellResult) -> dict[str, object]:
    largest = largest_isolated_call(result)
    steady = [result.step_times_sec[i] for i in result.steady_steps]
    per_step = result.fragmentation_per_step_mib
    return {
        # measured before results were schema 2 (and before a replay that autotuned was measured again)
        "migrated": result.provenance is not None and result.provenance.migrated_from_schema is not None,
        "fragmentation_mib": result.fragmentation_mib,
        "fragmentation_first_step_mib": per_step[0] if per_step else None,
        "fragmentation_last_step_mib": per_step[-1] if per_step else None,
        "fragmentation_growth_mib": per_step[-1] - per_step[0] if len(per_step) > 1 else None,
        "n_steps_done": len(result.step_times_sec),
        # the GPU it ran on, as nvidia-smi names it ("NVIDIA H200"); None in records written before it was kept
        "device_name": None if result.env is None else result.env.device_name,
        # what the allocator could use: the emulated card's cap, else the whole device
        "memory_limit_mib": None if result.env is None else (result.env.card_cap_mib or result.env.device_capacity_mib),
        "n_calls_in_train": len(result.maxsim_calls_in_train),
        "n_steady_steps": len(result.steady_steps),
        "steady_step_min_sec": min(steady, default=None),
        "steady_step_max_sec": max(steady, default=None),
        "steady_step_p10_sec": _quantile(steady, 0.1),
        "steady_step_p90_sec": _quantile(steady, 0.9),
        "steady_times_sec": steady,
        "first_step_sec": result.step_times_sec[0] if result.step_times_sec else None,
        "retune_steps": sum(1 for step in result.autotune_steps if step > 0),
        # the timing rule (harness.host): whether these times are the card's, and why not
        "times_comparable": result.times_comparable,
        # which draw of the synthetic data: "stream" (one stream per seed) or "rows" (batch x steps
        # rows per cell, before it); None for real data
        "data_draw": result.data_draw,
        "timing_reason": (result.timing.reason if result.timing is not None
                          else "measured before the timing rule, with no record of what ran beside it"),  # fmt: skip
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
