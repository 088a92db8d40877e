"""One cell, launched: a fresh papermill kernel of its stack's notebook, and what came of it.

Every launch ends with a result file: the cell's own (``ok``/``oom``) or a crash marker written
here (outcome ``crashed``) whose ``failure`` says why, read from the executed notebook — papermill
records each cell's status and any error's name there — never grepped from log text:
``kernel_never_started`` (no code cell ran: started again, up to twice), ``device_out_of_memory``
(the cell raised :class:`harness.cell.DeviceOutOfMemory`: beside other cells the device, not the
card's cap, ran out), ``error`` (the notebook raised: its message, and the first exception of a chained
traceback, such as a dataloader worker's death) or ``kernel_died`` (it stopped mid-cell). Every
kernel runs with Python's fault handler on, so a kernel killed by a fatal signal (a segmentation
fault in a kernel library, an abort) leaves its report in the cell's log; a ``kernel_died`` marker's
message names the signal and the innermost Python frame from it, or says that the log holds none.
A process the host's out-of-memory killer killed while the cell ran (its control group's count,
:func:`harness.host.oom_kills`) is said in the marker's message: then the host's memory, not the
GPU's, ended the cell.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import nbformat
import yaml

from harness import allocator, host, provenance
from harness.grid import GridCell
from harness.orchestrate.pool import Gate, cell_environment
from harness.report.text import ANSI_COLOUR
from harness.results import CellResult, Failure, ResultError, load_result, write_result
from harness.spec import STACKS, differences, notebook_parameters

ROOT = Path(__file__).resolve().parent.parent.parent
KERNEL_START_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a grid's files go: results under ``results_dir``, executed notebooks under ``notebooks_dir``,
    each as ``<grid>/<stack>/<regime or head>/<cell id>``."""

    results_dir: Path
    notebooks_dir: Path

    def result_path(self, cell: GridCell) -> Path:
        return self.results_dir.joinpath(cell.grid, *cell.spec.folder, f"{cell.cell_id}.json")

    def notebook_path(self, cell: GridCell) -> Path:
        return self.notebooks_dir.joinpath(cell.grid, *cell.spec.folder, f"{cell.cell_id}.ipynb")

    def log_path(self, cell: GridCell) -> Path:
        return self.result_path(cell).with_suffix(".log")


@dataclasses.dataclass
class CellRun:
    """How one launch ended, for progress lines and summaries."""

    cell: GridCell
    outcome: str
    seconds: float
    slot: str
    detail: str = ""
    phases: str = ""  # where the time went: "wait 31s · device 3s · build 40s · train 86s · replay 2s"
    failure: Failure | None = None


State = Literal["done", "crashed", "missing", "broken"]


def state(cell: GridCell, layout: Layout) -> State:
    """``done`` (a valid ok/oom result of this cell), ``crashed`` (a crash marker), ``missing``, or
    ``broken`` (a file that is not a valid result of this cell: truncated, foreign, another spec)."""
    path = layout.result_path(cell)
    if not path.exists():
        return "missing"
    result = _own_result(path, cell)
    if result is None:
        return "broken"
    return "crashed" if result.outcome == "crashed" else "done"


def running_notebook(cell: GridCell, layout: Layout) -> Path:
    """Where papermill writes a cell's notebook while it runs (beside the result, out of the book)."""
    return layout.result_path(cell).with_suffix(".running.ipynb")


def finish_orphan(cell: GridCell, layout: Layout) -> bool:
    """Move into the book the notebook of a cell that ended while its driver was stopped (its result
    written, papermill killed before it moved the notebook); True if there was one."""
    running = running_notebook(cell, layout)
    if state(cell, layout) not in ("done", "crashed") or not running.exists():
        return False
    outcome = load_result(layout.result_path(cell)).outcome
    publish_notebook(running, layout.notebook_path(cell), f"{cell.spec.title} — {outcome}")
    return True


def set_aside(path: Path, why: str = "broken") -> Path:
    """Move a result out of the report's way, keeping it: ``<name>.json.broken[-N]`` for a broken one,
    ``<name>.json.<why>[-N]`` for another reason (``rows-draw``: a probe of an earlier draw of the data,
    run again on the current one)."""
    target = path.with_name(f"{path.name}.{why}")
    index = 1
    while target.exists():
        target, index = path.with_name(f"{path.name}.{why}-{index}"), index + 1
    os.replace(path, target)
    return target


def _jupyter_dirs() -> list[Path]:
    """The Jupyter data folders of this checkout's environments (``.venvs/<name>/share/jupyter``)."""
    return [share for share in sorted((ROOT / ".venvs").glob("*/share/jupyter")) if share.is_dir()]


def kernel_prefix(kernel: str) -> Path | None:
    """The environment of this checkout that holds Jupyter kernel ``kernel`` (None: none of them)."""
    return next((share.parent.parent for share in _jupyter_dirs() if (share / "kernels" / kernel).is_dir()), None)


def jupyter_path(base: Mapping[str, str]) -> str:
    """JUPYTER_PATH with this checkout's environments first: their kernels live inside them, so
    two checkouts on one machine never run each other's environments."""
    own = [str(share) for share in _jupyter_dirs()]
    return os.pathsep.join([*own, *[part for part in base.get("JUPYTER_PATH", "").split(os.pathsep) if part]])


def launch(cell: GridCell, layout: Layout, gpu: str | None, gate: Gate | None = None) -> CellRun:
    """One fresh-kernel papermill run of ``cell``; a crash marker if it ends without its own result."""
    result_path, notebook_path, log_path = layout.result_path(cell), layout.notebook_path(cell), layout.log_path(cell)
    # papermill writes as it goes; the notebook reaches the book only once the cell has ended, so a
    # sweep stopped mid-cell leaves no half-run notebook there (the cell simply runs again on resume).
    running_path = running_notebook(cell, layout)
    for path in (result_path, notebook_path, log_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    spec = cell.spec
    notebook, kernel = ROOT / (cell.notebook or STACKS[spec.stack].notebook), cell.kernel or STACKS[spec.stack].kernel
    command = [sys.executable, "-m", "papermill", str(notebook), str(running_path),
               "-k", kernel, "--cwd", str(ROOT), "--no-progress-bar"]  # fmt: skip
    parameters = notebook_parameters(spec) | {"output": str(result_path.resolve()), "grid": cell.grid}
    for key, value in parameters.items():
        command += ["-y", yaml.safe_dump({key: value}, default_flow_style=True).strip()]
    env = allocator.environment_for(spec.allocator, cell_environment(gpu, os.environ))
    env["JUPYTER_PATH"] = jupyter_path(env)
    env["PYTHONFAULTHANDLER"] = "1"  # a fatal signal in the kernel dumps its Python stack into the log
    pinned = gate.cpus if gate is not None else None
    if gate is not None:
        env.update(gate.environment())
    if pinned:  # the cell pins itself as it starts (harness.host.enter); its dataloader workers inherit the cores
        env[host.PINNED_VARIABLE] = host.cpu_ranges(list(pinned))
        env["OMP_NUM_THREADS"] = str(len(pinned))
    result_path.unlink(missing_ok=True)  # a stale crash marker must not pass for this run's result
    kills = host.oom_kills()  # the host's OOM killer's count, to tell a cell it killed from one that crashed
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            running_path.unlink(missing_ok=True)
            completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            failure = None if completed.returncode == 0 else notebook_failure(running_path)
            if failure is not None and failure[0] == "kernel_died":
                failure = ("kernel_died", f"{failure[1]}: {fatal_report(log_path)}")
            if failure is None or failure[0] != "kernel_never_started" or attempt == KERNEL_START_ATTEMPTS:
                break
            log.write(f"\nharness: the kernel died before it ran a cell (attempt {attempt}); starting the cell again\n")
            log.flush()
            time.sleep(attempt)
    seconds = time.perf_counter() - started
    result, why = _own_result_or_why(result_path, cell)
    if result is None or (completed.returncode != 0 and result.outcome == "ok"):
        kind, message = failure or ("error", f"the notebook ended without writing a valid result of this cell: {why}")
        message = (message or "") + host.oom_kill_words(kills, host.oom_kills())
        marker = CellResult.crashed(spec, cell.grid, kind, log_tail(log_path, lines=40), seconds, message)
        marker.provenance = provenance.collect(notebook, kernel_prefix(kernel))  # the code that crashed
        write_result(marker, result_path)
        publish_notebook(running_path, notebook_path, f"{spec.title} — crashed")
        return CellRun(cell, "crashed", seconds, gpu or "-", f"{kind}: {message}; log {log_path}", failure=kind)
    publish_notebook(running_path, notebook_path, f"{spec.title} — {result.outcome}")
    return CellRun(cell, result.outcome, seconds, gpu or "-", result.oom_message or "", describe_phases(result))


def _own_result(path: Path, cell: GridCell) -> CellResult | None:
    """The result at ``path`` if it is a valid result of ``cell`` (its grid, its spec)."""
    return _own_result_or_why(path, cell)[0]


def _own_result_or_why(path: Path, cell: GridCell) -> tuple[CellResult | None, str]:
    """:func:`_own_result`, and when there is none, why in one line."""
    try:
        result = load_result(path)
    except ResultError as error:
        return None, str(error)
    if result.grid != cell.grid:
        return None, f"{path} is a result of grid {result.grid!r}, not {cell.grid!r}"
    differ = differences(cell.spec, result.spec)
    if differ:
        return None, f"{path} is a result of another spec (it differs in {', '.join(differ)})"
    return result, ""


def notebook_failure(path: Path) -> tuple[Failure, str | None]:
    """Why an executed notebook failed, from papermill's record in it: no code cell started (or no
    notebook at all) → ``kernel_never_started``; a cell's error output → ``error`` with its name and
    value (``device_out_of_memory`` for :class:`harness.cell.DeviceOutOfMemory`); else ``kernel_died``."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return "kernel_never_started", "no executed notebook was written"
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    # papermill stamps a cell's start_time as it starts it; its final save marks every cell still pending
    # "completed", so the status alone cannot tell a kernel that never started from one that ran every cell
    if not any(cell.get("metadata", {}).get("papermill", {}).get("start_time") for cell in code):
        return "kernel_never_started", "no code cell of the notebook ran"
    for cell in code:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                kind: Failure = "device_out_of_memory" if output.get("ename") == "DeviceOutOfMemory" else "error"
                cause = root_cause(output.get("traceback", []))
                return kind, f"{output.get('ename')}: {output.get('evalue')}" + (f", caused by {cause}" if cause else "")
    return "kernel_died", "the kernel stopped in the middle of a cell"


_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")  # fmt: skip
_RAISED = re.compile(r"^[A-Za-z_][\w.]*: \S")  # 'RuntimeError: …' at the start of a line


def root_cause(traceback: list[str]) -> str | None:
    """The first exception of a chained traceback, as its last line reads ('RuntimeError: DataLoader
    worker (pid 1357) is killed by signal: Killed.'): what the error a notebook shows was raised from.
    None for a traceback without a chain."""
    lines = ANSI_COLOUR.sub("", "\n".join(traceback)).splitlines()
    first = next((index for index, line in enumerate(lines) if line.strip() in _CHAINED), None)
    if first is None:
        return None
    raised = [line.strip() for line in lines[:first] if _RAISED.match(line)]
    return raised[-1] if raised else None


def fatal_report(log_path: Path) -> str:
    """What Python's fault handler wrote to a cell's log when its kernel died: the last report's
    first line and the innermost frame of the thread it names (``Fatal Python error: Segmentation
    fault, in File "…/forward.py", line 88 in launch``), or that the log holds none (the kernel
    exited, or was killed by a signal no handler sees, such as SIGKILL)."""
    lines = log_tail(log_path).splitlines()
    starts = [index for index, line in enumerate(lines) if line.startswith("Fatal Python error:")]
    if not starts:
        return "no fatal-signal report in its log (it exited, or was killed outright, as by SIGKILL)"
    report = lines[starts[-1]:]
    # every thread's stack is dumped, the faulting one headed "Current thread" (its innermost frame first)
    current = next((index for index, line in enumerate(report) if line.startswith("Current thread")), 0)
    frame = next((line.strip() for line in report[current + 1:] if line.lstrip().startswith("File ")), None)
    return report[0] if frame is None else f"{report[0]}, in {frame}"


def log_tail(log_path: Path, lines: int | None = None, offset: int = 0) -> str:
    """A cell log's last ``lines`` lines (all of them: None), read from byte ``offset`` on."""
    with open(log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode("utf-8", errors="replace")
    return text if lines is None else "".join(text.splitlines(keepends=True)[-lines:])


def describe_phases(result: CellResult) -> str:
    """Where a cell's time went, for the progress line: the GPU gate's wait, then each phase."""
    phases = [("wait", result.gpu_wait_sec or 0.0), *result.phase_sec.items()]
    return " · ".join(f"{name} {seconds:.0f}s" for name, seconds in phases if seconds >= 0.5)


def publish_notebook(running_path: Path, notebook_path: Path, title: str) -> None:
    """Title the executed notebook and move it into the book in one step (same file system)."""
    if not running_path.exists():
        return
    _retitle(running_path, title)
    notebook_path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(running_path, notebook_path)


def _retitle(notebook_path: Path, title: str) -> None:
    """Give the executed notebook a readable title (its first heading) for the book; outputs untouched."""
    notebook = nbformat.read(notebook_path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
            _, _, rest = cell.source.lstrip().partition("\n")
            cell.source = f"# {title}\n{rest}"
            break
    else:
        notebook.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {title}"))
    nbformat.write(notebook, notebook_path)
