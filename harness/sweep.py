"""The sweep driver: run a grid of cells, each one papermill run of its stack's notebook in a fresh kernel.

A grid is a YAML file (``grids/``): ``defaults`` for every cell and ``cells`` entries whose
list-valued fields expand as a product. Every cell ends with a result file beside its executed
notebook: the cell's own (``ok``/``oom``), or a crash marker this driver writes when the kernel
died or the notebook failed (outcome ``crashed``, the cell's parameters and the tail of its log).
A sweep resumes: cells with a valid ``ok``/``oom`` result are skipped; crashed ones are re-run on
request (``--rerun-crashed``). Cells run one after another on one GPU, or one per GPU with
``--gpus``; a cell always sees exactly one GPU.

    harness-sweep grids/ours.yaml --dry-run
    harness-sweep grids/ours.yaml --gpus 0,1
    harness-sweep grids/ours.yaml --skypilot sky/ours.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import itertools
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import nbformat
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness import allocator, backends, cards, gpu_gate
from harness.results import CellResult, ResultError, load_result, write_result
from harness.stacks import STACK_INFO, check_cell

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
EXPANDABLE = ("batch_size", "variant", "regime", "score_mini_batch_size", "negatives", "card", "allocator", "seed")
DEFAULT_SEED = 42


class GridError(ValueError):
    """A grid that cannot run; raised before any cell starts."""


class CellPlan(BaseModel):
    """One planned cell: its notebook parameters and where its files go."""

    model_config = ConfigDict(extra="forbid")

    grid: str
    stack: str
    regime: str
    batch_size: int = Field(gt=0)
    variant: str
    score_mini_batch_size: int | None = Field(default=None, gt=0)
    negatives: int | None = Field(default=None, gt=0)  # op-level heads with explicit negatives
    card: str = "native"
    allocator: str = "default"  # harness.allocator: set in the cell process's environment
    steps: int = Field(default=4, gt=0)
    seed: int = DEFAULT_SEED
    preset: str = "full"
    device: str = "cuda"
    model_source: str | None = None
    data_source: str | None = None
    notebook: str | None = None  # default: the stack's notebook
    kernel: str | None = None  # default: the stack's kernel

    @property
    def setting_id(self) -> str:
        """Backend, card and allocator: ``vanilla-chunk64-h100-80gb``, ``lik-native-expandable``."""
        chunk = f"-chunk{self.score_mini_batch_size}" if self.score_mini_batch_size else ""
        # the allocator and seed name a cell only where they differ from the defaults, so the ids
        # of cells run before those dimensions existed stay what they were
        allocator = f"-{self.allocator}" if self.allocator != "default" else ""
        return f"{self.variant}{chunk}-{self.card}{allocator}"

    @property
    def cell_id(self) -> str:
        negatives = f"-n{self.negatives}" if self.negatives else ""
        seed = f"-s{self.seed}" if self.seed != DEFAULT_SEED else ""
        return f"{self.stack}-{self.regime}-b{self.batch_size}{negatives}-{self.setting_id}{seed}"

    @property
    def title(self) -> str:
        chunk = f" + chunk {self.score_mini_batch_size}" if self.score_mini_batch_size else ""
        negatives = f" · {self.negatives} negatives" if self.negatives else ""
        allocator = f" · {self.allocator} allocator" if self.allocator != "default" else ""
        seed = f" · seed {self.seed}" if self.seed != DEFAULT_SEED else ""
        return f"{self.stack} · {self.regime} · B={self.batch_size}{negatives} · {self.variant}{chunk} · {self.card}{allocator}{seed}"

    def result_path(self, results_dir: Path) -> Path:
        return results_dir / self.grid / self.stack / self.regime / f"{self.cell_id}.json"

    def notebook_path(self, notebooks_dir: Path) -> Path:
        return notebooks_dir / self.grid / self.stack / self.regime / f"{self.cell_id}.ipynb"

    def log_path(self, results_dir: Path) -> Path:
        return self.result_path(results_dir).with_suffix(".log")

    def source_notebook(self) -> Path:
        return ROOT / (self.notebook or STACK_INFO[self.stack].notebook)

    def notebook_parameters(self, output: Path) -> dict[str, Any]:
        parameters = {
            "batch": self.batch_size, "variant": self.variant, "regime": self.regime,
            "score_mini_batch_size": self.score_mini_batch_size, "steps": self.steps, "card": self.card,
            "seed": self.seed, "preset": self.preset, "model_source": self.model_source,
            "data_source": self.data_source, "device": self.device, "output": str(output),
        }  # fmt: skip
        if STACK_INFO[self.stack].op_level:  # a loss head alone: its repetitions, negatives; no model or data
            parameters = {key: parameters[key] for key in ("batch", "variant", "regime", "seed", "device", "output")}
            parameters.update(stack=self.stack, negatives=self.negatives, reps=self.steps)
        elif self.stack != "pylate":
            del parameters["score_mini_batch_size"]  # PyLate's chunking: no such parameter elsewhere
        return parameters


def read_grid(path: str | os.PathLike[str], key: str) -> tuple[str, dict[str, Any], list[Any]]:
    """A grid file's (name, defaults, entries under ``key``); :class:`GridError` if it cannot be read."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise GridError(f"cannot read grid {path}: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get(key), list):
        raise GridError(f"grid {path} needs a `{key}` list (and optional `name`, `defaults`).")
    return document.get("name", path.stem), document.get("defaults") or {}, document[key]


def expand(fields: Mapping[str, Any], expandable: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Every combination of ``fields``' list-valued ``expandable`` keys, one dict each (a product)."""
    lists = {key: value for key, value in fields.items() if key in expandable and isinstance(value, list)}
    for combination in itertools.product(*lists.values()):
        yield {**fields, **dict(zip(lists, combination))}


def repeats(ids: Sequence[str]) -> list[str]:
    return sorted({i for i in ids if ids.count(i) > 1})


def build_grid(path: str | os.PathLike[str], key: str, expandable: Sequence[str], build: Callable[[dict[str, Any]], T],
               identify: Callable[[T], str], describe: Callable[[dict[str, Any], dict[str, Any]], str],
               keep: Callable[[dict[str, Any]], bool] = lambda fields: True, title: str = "grid") -> list[T]:  # fmt: skip
    """The items of a grid file: each entry under ``key`` (over the file's ``defaults``, those ``keep``
    accepts) expanded over its list-valued ``expandable`` keys, one ``build(fields)`` per combination.
    Raises :class:`GridError` naming every combination ``build`` refused and every repeated id."""
    name, defaults, entries = read_grid(path, key)
    items, problems = [], []
    for index, entry in enumerate(entries):
        merged = {**defaults, **(entry or {}), "grid": name}
        if not keep(merged):
            continue
        for fields in expand(merged, expandable):
            try:
                items.append(build(fields))
            except (ValidationError, ValueError) as error:
                problems.append(f"{key}[{index}] ({describe(fields, defaults)}): {error}")
    repeated = repeats([identify(item) for item in items])
    if repeated:
        problems.append(f"{key} repeat: {', '.join(repeated)}")
    if problems:
        raise GridError(f"{title} {path} is invalid:\n  " + "\n  ".join(problems))
    return items


def load_grid(path: str | os.PathLike[str], stacks: Sequence[str] | None = None) -> list[CellPlan]:
    """Expand and validate a grid file (only ``stacks``' cells, if given); raise :class:`GridError`
    naming every problem."""

    def build(fields: dict[str, Any]) -> CellPlan:
        plan = CellPlan(**fields)
        check_plan(plan)
        return plan

    def describe(fields: dict[str, Any], defaults: dict[str, Any]) -> str:
        return " ".join(f"{k}={v}" for k, v in fields.items() if k not in defaults or k == "stack")

    return build_grid(path, "cells", EXPANDABLE, build, lambda plan: plan.cell_id, describe,
                      keep=lambda fields: not stacks or fields.get("stack") in stacks)  # fmt: skip


def check_plan(plan: CellPlan) -> None:
    """Raise ValueError if ``plan`` cannot run (unknown stack, regime, variant, card, allocator, ...)."""
    if plan.stack not in STACK_INFO:
        raise ValueError(f"unknown stack {plan.stack!r}; choose one of {sorted(STACK_INFO)}")
    info = STACK_INFO[plan.stack]
    if info.op_level:
        from harness.opbench import check_op

        check_op(plan.stack, plan.regime, plan.negatives)
        if plan.card != "native" or plan.score_mini_batch_size:
            raise ValueError("op-level cells run on the native card without chunking.")
    else:
        check_cell(plan.stack, info.regimes, plan.regime, plan.score_mini_batch_size)
        if plan.negatives:
            raise ValueError(f"negatives are for op-level heads; the {plan.stack} stack trains without explicit negatives.")
    backends.check_supported(plan.variant, info.library)
    cards.card(plan.card)
    allocator.check(plan.allocator)
    if not plan.source_notebook().exists():
        raise ValueError(f"the {plan.stack} notebook {plan.source_notebook()} does not exist yet")


def status(plan: CellPlan, results_dir: Path) -> str:
    """``done`` (valid ok/oom result), ``crashed`` (a crash marker) or ``missing``."""
    path = plan.result_path(results_dir)
    if not path.exists():
        return "missing"
    try:
        result = load_result(path)
    except ResultError:
        return "missing"  # unreadable: run it again
    return "crashed" if result.outcome == "crashed" else "done"


@dataclasses.dataclass
class CellRun:
    plan: CellPlan
    outcome: str
    seconds: float
    slot: str
    detail: str = ""
    phases: str = ""  # where the time went: "wait 31s · device 3s · build 40s · train 86s · replay 2s"


@dataclasses.dataclass(frozen=True)
class Gate:
    """A GPU's gate (:mod:`harness.gpu_gate`): its lock file, and the GiB its cells may share (None:
    each cell measures with the GPU alone)."""

    path: Path
    share_gib: float | None = None

    def environment(self) -> dict[str, str]:
        env = {gpu_gate.LOCK_VARIABLE: str(self.path)}
        if self.share_gib is not None:
            env[gpu_gate.SHARE_VARIABLE] = f"{self.share_gib:.2f}"
        return env


def run_one(plan: CellPlan, results_dir: Path, notebooks_dir: Path, gpu: str | None, gate: Gate | None = None) -> CellRun:
    """One fresh-kernel papermill run; a crash marker if it ends without a valid result."""
    result_path, notebook_path, log_path = (
        plan.result_path(results_dir), plan.notebook_path(notebooks_dir), plan.log_path(results_dir)
    )  # fmt: skip
    # papermill writes as it goes; the notebook reaches the book only once the cell has ended, so a
    # sweep stopped mid-cell leaves no half-run notebook there (the cell simply runs again on resume).
    running_path = result_path.with_suffix(".running.ipynb")
    for path in (result_path, notebook_path, log_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "papermill", str(plan.source_notebook()), str(running_path),
               "-k", plan.kernel or STACK_INFO[plan.stack].kernel, "--cwd", str(ROOT), "--no-progress-bar"]  # fmt: skip
    for key, value in plan.notebook_parameters(result_path.resolve()).items():
        command += ["-y", yaml.safe_dump({key: value}, default_flow_style=True).strip()]
    env = allocator.environment_for(plan.allocator, cell_environment(gpu, os.environ))
    if gate is not None:
        env.update(gate.environment())
    result_path.unlink(missing_ok=True)  # a stale crash marker must not pass for this run's result
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            attempt_starts = log.tell()
            completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            if completed.returncode == 0 or attempt == KERNEL_START_ATTEMPTS or not _kernel_never_started(log_path, attempt_starts):
                break
            log.write(f"\nharness-sweep: the kernel died before it started (attempt {attempt}); starting the cell again\n")
            log.flush()
            time.sleep(attempt)
    seconds = time.perf_counter() - started
    try:
        result = load_result(result_path)
    except ResultError:
        result = None
    if result is None or completed.returncode != 0 and result.outcome == "ok":
        tail = log_tail(log_path, lines=40)
        marker = CellResult(
            stack=plan.stack, regime=plan.regime, batch_size=plan.batch_size, variant=plan.variant,
            score_mini_batch_size=plan.score_mini_batch_size, card=plan.card, allocator=plan.allocator, steps=plan.steps, seed=plan.seed,
            negatives=plan.negatives, preset=plan.preset, outcome="crashed", crash_log_tail=tail, wall_sec=seconds,
        )  # fmt: skip
        write_result(marker, result_path)
        _publish_notebook(running_path, notebook_path, f"{plan.title} — crashed")
        return CellRun(plan, "crashed", seconds, gpu or "-", f"exit {completed.returncode}; log {log_path}")
    _publish_notebook(running_path, notebook_path, f"{plan.title} — {result.outcome}")
    return CellRun(plan, result.outcome, seconds, gpu or "-", result.oom_message or "", describe_phases(result))


# Seen once with a dozen cells starting at the same moment: a kernel that dies before it answers
# papermill has run no cell code, so it measured nothing and the cell simply starts again.
KERNEL_START_FAILURES = ("Kernel died before replying to kernel_info", "Kernel didn't respond in")
KERNEL_START_ATTEMPTS = 3


def _kernel_never_started(log_path: Path, offset: int) -> bool:
    """Whether the attempt logged from byte ``offset`` on ended with its kernel dying before it started."""
    tail = log_tail(log_path, lines=20, offset=offset)
    return any(marker in tail for marker in KERNEL_START_FAILURES)


def log_tail(log_path: Path, lines: int | None = None, offset: int = 0) -> str:
    """A cell log's last ``lines`` lines (all of them: None), read from byte ``offset`` on."""
    with open(log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode("utf-8", errors="replace")
    return text if lines is None else "".join(text.splitlines(keepends=True)[-lines:])


def describe_phases(result: CellResult) -> str:
    """Where a cell's time went, for the progress line: the GPU lock's wait, then each phase."""
    parts = [(name, seconds) for name, seconds in [("wait", result.gpu_wait_sec or 0.0), *result.phase_sec.items()] if seconds >= 0.5]
    return " · ".join(f"{name} {seconds:.0f}s" for name, seconds in parts)


def _publish_notebook(running_path: Path, notebook_path: Path, title: str) -> None:
    """Title the executed notebook and move it into the book in one step (same file system)."""
    if not running_path.exists():
        return
    _retitle(running_path, title)
    os.replace(running_path, notebook_path)


def cell_environment(gpu: str | None, base: Mapping[str, str]) -> dict[str, str]:
    """The cell's environment, pinned to exactly one GPU: ``gpu``, or else the first visible one.

    A cell that saw two GPUs would be trained by transformers' Trainer with DataParallel over both.
    """
    env = dict(base)
    if gpu is None:
        visible = [part for part in base.get("CUDA_VISIBLE_DEVICES", "0").split(",") if part.strip()]
        gpu = visible[0].strip() if visible else "0"
    env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _retitle(notebook_path: Path, title: str) -> None:
    """Give the executed notebook a readable title (its first heading) for the book; outputs untouched."""
    if not notebook_path.exists():
        return
    notebook = nbformat.read(notebook_path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
            first, _, rest = cell.source.lstrip().partition("\n")
            cell.source = f"# {title}\n{rest}"
            break
    else:
        notebook.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {title}"))
    nbformat.write(notebook, notebook_path)


def run_sweep(
    plans: Sequence[CellPlan],
    results_dir: Path,
    notebooks_dir: Path,
    gpus: Sequence[str] | None = None,
    rerun_crashed: bool = False,
    echo=print,  # type: ignore[no-untyped-def]
    cells_per_gpu: int = 1,
) -> list[CellRun]:
    """Run every cell that needs it: one worker per GPU (or one without GPUs), or ``cells_per_gpu``
    workers per GPU whose cells start up together but measure one at a time (:mod:`harness.gpu_gate`)."""
    todo = [p for p in plans if status(p, results_dir) == "missing" or (rerun_crashed and status(p, results_dir) == "crashed")]
    skipped = len(plans) - len(todo)
    echo(f"{len(plans)} cells in the grid: {skipped} already have a result, {len(todo)} to run"
         + (f" on GPUs {', '.join(gpus)}" if gpus else " one after another"))  # fmt: skip
    runs: list[CellRun] = []
    lock = threading.Lock()
    started = time.perf_counter()

    def run(index: int, slot: str | None, gate: Gate) -> None:
        plan = todo[index]
        with lock:
            echo(f"  start {plan.cell_id}" + (f" on GPU {slot}" if slot is not None else ""))
        cell = run_one(plan, results_dir, notebooks_dir, slot, gate)
        with lock:
            runs.append(cell)
            elapsed = time.perf_counter() - started
            phases = f"; {cell.phases}" if cell.phases else ""
            echo(f"[{len(runs)}/{len(todo)}] {plan.cell_id}: {cell.outcome} in {cell.seconds:.0f}s"
                 f" (elapsed {elapsed:.0f}s{phases}){' — ' + cell.detail if cell.detail else ''}")  # fmt: skip

    run_on_gpus(len(todo), run, gpus, cells_per_gpu)
    echo(summary(plans, results_dir, time.perf_counter() - started))
    return runs


def run_on_gpus(count: int, task: Callable[[int, str | None, Gate], None], gpus: Sequence[str] | None,
                cells_per_gpu: int = 1, share_gib: Mapping[str | None, float] | None = None) -> None:  # fmt: skip
    """Call ``task(index, gpu, gate)`` once for every index below ``count``, taken in order by
    ``cells_per_gpu`` workers per GPU (without GPUs: that many workers on the default one). A GPU's
    workers share its gate, so their cells measure one at a time — or, where ``share_gib`` gives
    that GPU's memory, as many at once as their card caps fit in it."""
    if cells_per_gpu < 1:
        raise ValueError(f"cells_per_gpu must be at least 1, got {cells_per_gpu}")
    work: queue.Queue[int] = queue.Queue()
    for index in range(count):
        work.put(index)

    def worker(slot: str | None, gate: Gate) -> None:
        while True:
            try:
                index = work.get_nowait()
            except queue.Empty:
                return
            task(index, slot, gate)

    slots: list[str | None] = list(gpus) if gpus else [None]
    gates = {slot: Gate(gate_path(slot), (share_gib or {}).get(slot)) for slot in slots}
    threads = [threading.Thread(target=worker, args=(slot, gates[slot])) for slot in slots for _ in range(cells_per_gpu)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def gate_path(gpu: str | None) -> Path:
    """The lock file one GPU's cells take before measuring (shared by every sweep on this host)."""
    gpu = cell_environment(gpu, os.environ)["CUDA_VISIBLE_DEVICES"]
    return Path(tempfile.gettempdir()) / f"maxsim-gpu-{gpu}.gate"


def summary(plans: Sequence[CellPlan], results_dir: Path, seconds: float) -> str:
    lines = [f"sweep finished in {seconds:.0f}s"]
    counts: dict[str, int] = {}
    for plan in plans:
        state = status(plan, results_dir)
        outcome = load_result(plan.result_path(results_dir)).outcome if state != "missing" else "missing"
        counts[outcome] = counts.get(outcome, 0) + 1
        lines.append(f"  {outcome:8s} {plan.cell_id}")
    lines.insert(1, "  " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    return "\n".join(lines)


def skypilot_task(grid_path: Path, plans: Sequence[CellPlan]) -> dict[str, Any]:
    """A SkyPilot task that creates the environments its stacks need and runs this grid."""
    stacks = sorted({p.stack for p in plans})
    environments = sorted({STACK_INFO[s].environment for s in stacks})
    setup = [f"python3 tools/envs.py create {environment} --torch system" for environment in environments]
    relative = grid_path.resolve().relative_to(ROOT)
    return {
        "name": f"maxsim-{plans[0].grid}" if plans else "maxsim-sweep",
        "workdir": ".",
        "resources": {"accelerators": "H100:1", "disk_size": 200},
        "setup": "set -e\n" + "\n".join(setup) + "\n",
        "run": f"set -e\n.venvs/{STACK_INFO[stacks[0]].environment}/bin/harness-sweep {relative} --gpus all\n",
    }


def visible_gpus(spec: str) -> list[str]:
    if spec != "all":
        return [part.strip() for part in spec.split(",") if part.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness-sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path)
    parser.add_argument("--gpus", help="run one cell per GPU: '0,1' or 'all' (default: one after another)")
    parser.add_argument("--cells-per-gpu", type=positive_int, default=1, metavar="N",
                        help="start N cells per GPU: the next cell's imports overlap the running cell's "
                             "measurement, which still has the GPU alone (default 1)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="list the cells and their state, run nothing")
    parser.add_argument("--rerun-crashed", action="store_true", help="run crashed cells again")
    parser.add_argument("--stack", action="append", help="only cells of this stack (repeatable)")
    parser.add_argument("--match", action="append", metavar="GLOB",
                        help="only cells whose id matches this shell pattern, e.g. '*-native' (repeatable)")  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=ROOT / "results")
    parser.add_argument("--notebooks-dir", type=Path, default=ROOT / "book" / "cells")
    parser.add_argument("--skypilot", type=Path, help="write a SkyPilot task file for this grid and exit")
    args = parser.parse_args(argv)
    try:
        plans = load_grid(args.grid, args.stack)
    except GridError as error:
        print(error, file=sys.stderr)
        return 2
    if args.match:
        plans = [p for p in plans if any(fnmatch.fnmatchcase(p.cell_id, pattern) for pattern in args.match)]
        if not plans:
            print(f"no cell of {args.grid} matches {' or '.join(args.match)}", file=sys.stderr)
            return 2
    if args.skypilot:
        args.skypilot.parent.mkdir(parents=True, exist_ok=True)
        args.skypilot.write_text(yaml.safe_dump(skypilot_task(args.grid, plans), sort_keys=False))
        print(f"wrote {args.skypilot}")
        return 0
    if args.dry_run:
        for plan in plans:
            print(f"{status(plan, args.results_dir):8s} {plan.cell_id}")
        print(f"{len(plans)} cells")
        return 0
    run_sweep(plans, args.results_dir, args.notebooks_dir, visible_gpus(args.gpus) if args.gpus else None,
              args.rerun_crashed, cells_per_gpu=args.cells_per_gpu)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
