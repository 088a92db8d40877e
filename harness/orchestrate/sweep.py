"""Run a grid: every cell that has no result yet, one fresh papermill kernel each.

A sweep resumes: cells with a valid ``ok``/``oom`` result of their own spec are skipped; crashed
ones run again on request (``--rerun-crashed``); a file at a cell's path that is not a valid result
of that cell (truncated, foreign, another spec) is set aside as ``*.broken`` — and said — before
the cell runs again. Cells run one after another on one GPU, or one per GPU with ``--gpus`` (with
``--share-gpu``, capped cells side by side on a GPU, their bytes measured and their times never
published, as for ceiling probes; one the device starved is run again alone); a
data-parallel cell (``world_size`` W > 1) runs after them, on the first W GPUs of ``--gpus`` (the
first alone where its ranks share one, ``ranks_share_gpu``), once it holds every one's gate.

Traced cells (``trace: true``, :mod:`harness.trace`) compare with the vanilla cell of their batch
and seed, which must have finished first: the sweep runs such reference cells before the others
and holds a traced cell back until its reference, if it runs in this sweep, has ended — however
many workers start cells side by side. A reference about to run first removes the reference file an
earlier run left (so nothing compares with a stale one), and a traced cell whose reference did not
end ``ok`` — in this sweep, or in the result it already has when it is not run again — is not run (it
is said, and stays missing for the next sweep).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.grid import GridCell
from harness.orchestrate.launcher import ROOT, CellRun, Gate, Layout, finish_orphan, launch, set_aside, state
from harness.orchestrate.pool import gpu_set, run_on_gpus
from harness.results import load_result
from harness.spec import STACKS, TrainSpec, is_trace_reference, trace_reference_key, trace_reference_path


def _traced(cell: GridCell) -> TrainSpec | None:
    return cell.spec if isinstance(cell.spec, TrainSpec) and cell.spec.trace else None


@dataclass
class Reference:
    """A traced reference cell of this sweep: set when it has ended, with how it ended."""

    ended: threading.Event = field(default_factory=threading.Event)
    outcome: str | None = None


def reference_first(todo: Sequence[GridCell]) -> tuple[list[GridCell], dict[str, Reference]]:
    """``todo`` with the traced reference cells first (otherwise in order), and a :class:`Reference`
    per reference key that its cell sets when it ends; a traced cell whose key has one waits for it."""
    references = [cell for cell in todo if (spec := _traced(cell)) is not None and is_trace_reference(spec)]
    ordered = references + [cell for cell in todo if cell not in references]
    return ordered, {trace_reference_key(cell.spec): Reference() for cell in references}  # type: ignore[arg-type]


def run_sweep(cells: Sequence[GridCell], layout: Layout, gpus: Sequence[str] | None = None, rerun_crashed: bool = False,
              echo: Callable[[str], None] = print, cells_per_gpu: int = 1, pin_cpus: bool = False,
              share_gib: Mapping[str | None, float] | None = None) -> list[CellRun]:  # fmt: skip
    """Run every cell that needs it: ``cells_per_gpu`` workers per GPU (or on the default one),
    whose cells start up together but measure one at a time (:mod:`harness.gpu_gate`) — or, where
    ``share_gib`` gives a GPU's memory, as many capped cells at once as their caps fit (for cells
    whose bytes, not times, are the measurement: a shared cell's times are never published)."""
    todo = []
    for cell in cells:
        if finish_orphan(cell, layout):
            echo(f"  {cell.cell_id}: ended while its sweep was stopped; its notebook moved into the book")
        current = state(cell, layout)
        if current == "broken":
            moved = set_aside(layout.result_path(cell))
            echo(f"  {cell.cell_id}: its result file was not a valid result of this cell; kept aside as {moved.name}")
        if current in ("missing", "broken") or (rerun_crashed and current == "crashed"):
            todo.append(cell)
    echo(f"{len(cells)} cells in the grid: {len(cells) - len(todo)} already have a result, {len(todo)} to run"
         + (f" on GPUs {', '.join(gpus)}" if gpus else " one after another"))  # fmt: skip
    todo, references = reference_first(todo)
    for cell in cells:  # a reference that is not run again here stands as its result says
        spec = _traced(cell)
        if spec is not None and is_trace_reference(spec) and trace_reference_key(spec) not in references:
            references[trace_reference_key(spec)] = Reference(outcome=standing(cell, layout))
            references[trace_reference_key(spec)].ended.set()
    runs: list[CellRun] = []
    lock = threading.Lock()
    started = time.perf_counter()

    def run(index: int, slot: str | None, gate: Gate) -> None:
        cell = todo[index]
        traced = _traced(cell)
        reference = references.get(trace_reference_key(traced)) if traced is not None else None
        is_reference = traced is not None and is_trace_reference(traced)
        if reference is not None and not is_reference:
            reference.ended.wait()  # its vanilla cell leaves the reference it compares with
            if reference.outcome != "ok":
                with lock:
                    runs.append(CellRun(cell, "skipped", 0.0, slot or "", detail=f"its reference ended {reference.outcome}"))
                    echo(f"[{len(runs)}/{len(todo)}] {cell.cell_id}: not run — its vanilla reference ended"
                         f" {reference.outcome}, so there is nothing to compare with")  # fmt: skip
                return
        if reference is not None and is_reference and traced.preset != "auto" and traced.device != "auto":  # type: ignore[union-attr]
            # the file its run will write (grids name preset and device; an `auto` one resolves in the cell)
            trace_reference_path(traced).unlink(missing_ok=True)  # type: ignore[arg-type]
        with lock:
            echo(f"  start {cell.cell_id}" + (f" on GPU {slot}" if slot is not None else ""))
        done = None
        try:
            done = launch(cell, layout, slot, gate)
            if gate.share_gib is not None and done.failure == "device_out_of_memory":
                with lock:
                    echo(f"  {cell.cell_id}: the device, not the card's cap, ran out beside other cells; running it alone")
                done = launch(cell, layout, slot, replace(gate, share_gib=None))
        finally:
            if reference is not None and is_reference:
                reference.outcome = done.outcome if done is not None else "crashed"
                reference.ended.set()
        with lock:
            runs.append(done)
            phases = f"; {done.phases}" if done.phases else ""
            detail = f" — {done.detail}" if done.detail else ""
            echo(f"[{len(runs)}/{len(todo)}] {cell.cell_id}: {done.outcome} in {done.seconds:.0f}s"
                 f" (elapsed {time.perf_counter() - started:.0f}s{phases}){detail}")  # fmt: skip

    single = [cell for cell in todo if _world(cell) == 1]
    multi = [cell for cell in todo if _world(cell) > 1]
    todo = single + multi  # the indices run() takes: one-GPU cells first, through the pool
    run_on_gpus(len(single), run, gpus, cells_per_gpu, share_gib, pin_cpus)
    for index, cell in enumerate(multi, start=len(single)):  # then each data-parallel cell on its GPU set
        need = _gpus(cell)
        placed = gpu_set(need, gpus)
        if placed is None:
            with lock:
                runs.append(CellRun(cell, "skipped", 0.0, "", detail=f"needs {need} GPUs"))
                per = "GPUs, one per rank" if need > 1 else "GPU, its ranks share it"
                given = len(gpus) if gpus else "none (--gpus)"
                echo(f"[{len(runs)}/{len(todo)}] {cell.cell_id}: not run — world size {_world(cell)} needs {need} "
                     f"{per}; this sweep was given {given}")  # fmt: skip
            continue
        run(index, *placed)
    echo(summary(cells, layout, time.perf_counter() - started))
    return runs


def _world(cell: GridCell) -> int:
    return cell.spec.world_size if isinstance(cell.spec, TrainSpec) else 1


def _gpus(cell: GridCell) -> int:
    return cell.spec.gpus if isinstance(cell.spec, TrainSpec) else 1


def standing(cell: GridCell, layout: Layout) -> str:
    """How a cell stands: its result's outcome (ok, oom, crashed), else ``missing`` or ``broken``."""
    current = state(cell, layout)
    return load_result(layout.result_path(cell)).outcome if current in ("done", "crashed") else current


def summary(cells: Sequence[GridCell], layout: Layout, seconds: float) -> str:
    lines = [f"sweep finished in {seconds:.0f}s"]
    counts: dict[str, int] = {}
    for cell in cells:
        outcome = standing(cell, layout)
        counts[outcome] = counts.get(outcome, 0) + 1
        lines.append(f"  {outcome:8s} {cell.cell_id}")
    lines.insert(1, "  " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    return "\n".join(lines)


def skypilot_task(grid_path: Path, cells: Sequence[GridCell]) -> dict[str, Any]:
    """A SkyPilot task that creates the environments its stacks need and runs this grid."""
    environments = sorted({STACKS[cell.spec.stack].environment for cell in cells})
    setup = [f"python3 tools/envs.py create {environment} --torch system" for environment in environments]
    relative = grid_path.resolve().relative_to(ROOT)
    return {
        "name": f"maxsim-{cells[0].grid}" if cells else "maxsim-sweep",
        "workdir": ".",
        "resources": {"accelerators": "H100:1", "disk_size": 200},
        "setup": "set -e\n" + "\n".join(setup) + "\n",
        "run": f"set -e\n.venvs/{environments[0] if environments else 'pylate'}/bin/harness sweep {relative} --gpus all\n",
    }
