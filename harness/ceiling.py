"""Batch-size ceilings: the largest batch that trains on a card, found by bracketing then bisecting.

A ceiling answers "how large a batch can I train on my card with this backend", which a fixed grid
cannot: whether a batch fits can hang on the allocator's fragmentation, so it is decided by running
it. One search is a (stack, regime, variant[, chunk], card, allocator) and a list of seeds. Its
probes are ordinary cells (grid ``ceilings``, a fresh papermill kernel each, results and notebooks
where every other cell's go) of ``steps`` ≥ 8 real optimizer steps. A batch *fits* when every seed
trains all its steps without running out of memory.

The search runs on the first seed: it doubles from ``start`` until a batch does not fit (halving
instead if ``start`` already does not) — or, given a ``step``, gallops from ``start`` by
``step``, 2·``step``, 4·``step``… (a start that is already a good estimate brackets the ceiling in
two probes) — then bisects between the largest batch that fits and the smallest that does not, in
multiples of ``resolution``, until they are ``resolution`` apart. The batch it ends on is then run
with every other seed; if one runs out of memory, that batch fails and the search goes on below
it. Every decision is read back from the probes' result files, so a search stopped at any point
resumes where it was, re-running nothing; a crashed probe stops its search (``--rerun-crashed``
runs it once more), and a probe off the search's walk (its start, step, resolution or limit edited
after it ran) stops the search rather than being silently ignored.

    harness-ceiling grids/ceilings.yaml --dry-run
    harness-ceiling grids/ceilings.yaml --gpus 0,1 --cells-per-gpu 2
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness import gpu_gate
from harness.results import load_result
from harness.sweep import (
    ROOT, CellPlan, Gate, GridError, build_grid, cell_environment, check_plan, log_tail, positive_int,
    run_on_gpus, run_one, status, visible_gpus,
)  # fmt: skip

MIN_STEPS = 8
SEARCH_FIELDS = ("stack", "regime", "variant", "score_mini_batch_size", "card", "allocator")
EXPANDABLE = ("variant", "regime", "score_mini_batch_size", "card", "allocator")


class CeilingSearch(BaseModel):
    """One ceiling search: what is searched, over which seeds and batch range."""

    model_config = ConfigDict(extra="forbid")

    grid: str = "ceilings"
    stack: str
    regime: str
    variant: str
    score_mini_batch_size: int | None = Field(default=None, gt=0)
    card: str
    allocator: str = "default"
    seeds: list[int] = Field(min_length=1)
    steps: int = Field(default=MIN_STEPS, ge=MIN_STEPS)
    start: int = Field(gt=0)
    limit: int = Field(gt=0)  # the largest batch probed: a search that reaches it reports "≥ limit"
    resolution: int = Field(gt=0)
    step: int | None = Field(default=None, gt=0)  # the first step of a galloping bracket; None: double / halve
    preset: str = "full"
    device: str = "cuda"
    model_source: str | None = None
    data_source: str | None = None
    kernel: str | None = None
    notebook: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> CeilingSearch:
        if self.start > self.limit:
            raise ValueError(f"start {self.start} is above limit {self.limit}")
        if self.start % self.resolution or self.limit % self.resolution:
            raise ValueError(f"start {self.start} and limit {self.limit} must be multiples of resolution {self.resolution}")
        if self.step is not None and self.step % self.resolution:
            raise ValueError(f"step {self.step} must be a multiple of resolution {self.resolution}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds repeat: {self.seeds}")
        return self

    @property
    def search_id(self) -> str:
        """Its probes' cell id without batch size and seed: ``pylate-grad-checkpoint-lik-a100-40gb``."""
        return f"{self.stack}-{self.regime}-{self.probe(self.start, self.seeds[0]).setting_id}"

    def probe(self, batch_size: int, seed: int) -> CellPlan:
        fields = {name: getattr(self, name) for name in CellPlan.model_fields if name in type(self).model_fields}
        return CellPlan(**fields | {"batch_size": batch_size, "seed": seed})


@dataclasses.dataclass
class Ceiling:
    """Where a search stands: the largest batch that fits, the smallest that does not."""

    fits: int | None = None  # largest batch where every seed trained
    fails: int | None = None  # smallest batch where a seed ran out of memory
    next_batch: int | None = None  # the batch still to decide (None: the search is over)
    stopped: str | None = None  # why it stopped early (a crashed probe)

    @property
    def done(self) -> bool:
        return self.next_batch is None


def walk(search: CeilingSearch, decide: Callable[[int], bool | None]) -> Ceiling:
    """Walk the bracket-and-bisect search; ``decide(batch)`` says whether a batch fits (None:
    undecided yet — the walk stops there and names it as the next batch to run)."""
    ceiling = Ceiling()
    batch: int | None = search.start
    while batch is not None:
        verdict = decide(batch)
        if verdict is None:
            ceiling.next_batch = batch
            return ceiling
        if verdict:
            ceiling.fits = batch
        else:
            ceiling.fails = batch
        batch = _next_batch(search, ceiling)
    return ceiling


def _next_batch(search: CeilingSearch, ceiling: Ceiling) -> int | None:
    """Bracket, then bisect between the two bounds on multiples of the resolution; None once the
    search is decided. The bracket doubles while everything fits and halves while everything fails;
    with a ``step`` it moves away from ``start`` by ``step``, then twice as far each time
    (start, start + step, start + 2·step, start + 4·step, … and the same downwards)."""
    fits, fails, resolution, step = ceiling.fits, ceiling.fails, search.resolution, search.step
    if fits is not None and fails is not None:
        return None if fails - fits <= resolution else fits + (fails - fits) // (2 * resolution) * resolution
    if fits is not None:
        if fits >= search.limit:
            return None
        return min(fits * 2 if step is None else fits + max(step, fits - search.start), search.limit)
    assert fails is not None
    if fails <= resolution:
        return None
    lower = fails // 2 if step is None else fails - max(step, search.start - fails)
    return max(resolution, lower // resolution * resolution)


def plan_search(search: CeilingSearch, screen: Callable[[int], bool | None], confirm: Callable[[int], bool | None]) -> Ceiling:
    """The whole search: walk on the first seed (``screen``), then confirm the batch it ends on with
    every seed (``confirm``). A seed that runs out of memory there makes that batch a failing one —
    ``screen`` must say so from then on — and the walk goes on below it. Under the assumption a
    ceiling rests on (what fits for a seed at B fits at any smaller B), this is the answer of
    running every seed at every probed batch, at a fraction of the probes."""
    while True:
        ceiling = walk(search, screen)
        if not ceiling.done or ceiling.fits is None:
            return ceiling
        verdict = confirm(ceiling.fits)
        if verdict is None:
            ceiling.next_batch = ceiling.fits
            return ceiling
        if verdict:
            return ceiling


class ProbeMismatch(ValueError):
    """A result at a probe's path that was run with other settings than the search's."""


def probe_outcome(plan: CellPlan, results_dir: Path) -> str:
    """``missing``, ``crashed``, ``ok`` or ``oom`` for one probe, from its result file. A result run
    with other steps, preset, card or allocator than the probe (a smoke test into the same folder, a
    grid edited since) is refused rather than taken for this probe's verdict."""
    if status(plan, results_dir) == "missing":
        return "missing"
    result = load_result(plan.result_path(results_dir))
    if result.outcome != "crashed":
        ran = (result.steps, result.preset, result.card, result.allocator)
        if ran != (plan.steps, plan.preset, plan.card, plan.allocator):
            raise ProbeMismatch(
                f"{plan.result_path(results_dir)} ran with steps, preset, card, allocator = {ran}, but the probe asks "
                f"{(plan.steps, plan.preset, plan.card, plan.allocator)}; move that result away to run the probe."
            )
    return result.outcome


def batch_verdict(search: CeilingSearch, batch_size: int, results_dir: Path, seeds: Sequence[int] | None = None,
                  rerun_crashed: bool = False) -> tuple[bool | None, CellPlan | None, str | None]:  # fmt: skip
    """Whether ``batch_size`` fits for ``seeds`` (default: all), from the results on disk, seed by
    seed: (verdict, the probe to run next, a crashed probe's id). A failure recorded for any seed
    of the search at this batch decides it. A crashed probe stops the search, or with
    ``rerun_crashed`` is the probe to run again."""
    outcomes = {seed: probe_outcome(search.probe(batch_size, seed), results_dir) for seed in search.seeds}
    if "oom" in outcomes.values():
        return False, None, None
    for seed in search.seeds if seeds is None else seeds:
        plan = search.probe(batch_size, seed)
        if outcomes[seed] == "missing" or (outcomes[seed] == "crashed" and rerun_crashed):
            return None, plan, None
        if outcomes[seed] == "crashed":
            return None, None, plan.cell_id
    return True, None, None


def probed_batches(search: CeilingSearch, results_dir: Path) -> set[int]:
    """Every batch size with a result file of this search, for any of its seeds."""
    folder = search.probe(search.start, search.seeds[0]).result_path(results_dir).parent
    prefix = re.compile(rf"{re.escape(search.stack)}-{re.escape(search.regime)}-b(\d+)-")
    batches = set()
    for path in folder.glob("*.json"):
        match = prefix.match(path.name)
        if match and any(search.probe(int(match[1]), seed).result_path(results_dir) == path for seed in search.seeds):
            batches.add(int(match[1]))
    return batches


def search_state(search: CeilingSearch, results_dir: Path, rerun_crashed: bool = False) -> tuple[Ceiling, CellPlan | None]:
    """The search as far as its result files decide it, and the probe to run next (if any). Raises
    ProbeMismatch where a probe on disk lies off the walk: the search was edited after it ran."""
    pending: dict[str, Any] = {}
    visited: set[int] = set()

    def decider(seeds: Sequence[int] | None) -> Callable[[int], bool | None]:
        def decide(batch_size: int) -> bool | None:
            visited.add(batch_size)
            verdict, plan, crashed = batch_verdict(search, batch_size, results_dir, seeds, rerun_crashed)
            pending.update(plan=plan, crashed=crashed)
            return verdict

        return decide

    ceiling = plan_search(search, decider(search.seeds[:1]), decider(None))
    # A seed failing the confirmation drops the batches walked above it from the walk read back
    # now; those all failed, above the bound. Any other probe off the walk means an edited search.
    off_walk = sorted(
        batch for batch in probed_batches(search, results_dir) - visited
        if ceiling.fails is None or batch < ceiling.fails or batch_verdict(search, batch, results_dir)[0] is not False
    )
    if off_walk:
        raise ProbeMismatch(
            f"{search.search_id}: probes at B={off_walk} are not on this search's walk, so its start, step, "
            f"resolution or limit changed after they ran; restore them, or move those results away."
        )
    if pending.get("crashed"):
        ceiling.stopped = f"probe {pending['crashed']} crashed"
        return ceiling, None
    return ceiling, pending.get("plan") if not ceiling.done else None


def run_search(search: CeilingSearch, results_dir: Path, notebooks_dir: Path, gpu: str | None, gate: Gate | None,
               echo: Callable[[str], None] = print, rerun_crashed: bool = False) -> Ceiling:  # fmt: skip
    """Run the probes a search still needs, one at a time, and return where it ends."""
    rerun = set()  # crashed probes run again once each, not again and again
    while True:
        ceiling, plan = search_state(search, results_dir, rerun_crashed)
        if plan is None:
            return ceiling
        if plan.cell_id in rerun:
            return search_state(search, results_dir)[0]  # it crashed again: stop there
        if status(plan, results_dir) == "crashed":
            rerun.add(plan.cell_id)
        run = run_one(plan, results_dir, notebooks_dir, gpu, gate)
        if run.outcome == "crashed" and gate is not None and gate.share_gib is not None and starved(plan, results_dir):
            echo(f"  {plan.cell_id}: the device, not the card's cap, ran out beside other probes; running it alone")
            run = run_one(plan, results_dir, notebooks_dir, gpu, dataclasses.replace(gate, share_gib=None))
        where = f" on GPU {gpu}" if gpu is not None else ""
        echo(f"  {plan.cell_id}: {run.outcome} in {run.seconds:.0f}s{where}" + (f" ({run.phases})" if run.phases else ""))


def starved(plan: CellPlan, results_dir: Path) -> bool:
    """Whether a crashed probe died of :class:`harness.cell.DeviceOutOfMemory` (its log says so)."""
    log = plan.log_path(results_dir)
    return log.exists() and "DeviceOutOfMemory" in log_tail(log)


def describe(search: CeilingSearch, ceiling: Ceiling) -> str:
    if ceiling.stopped:
        return f"{search.search_id}: stopped, {ceiling.stopped}"
    if not ceiling.done:
        return f"{search.search_id}: next B={ceiling.next_batch} (fits {ceiling.fits}, fails {ceiling.fails})"
    if ceiling.fails is None:
        return f"{search.search_id}: ≥ {ceiling.fits} (the limit)"
    if ceiling.fits is None:
        return f"{search.search_id}: < {ceiling.fails} (nothing probed fits)"
    return f"{search.search_id}: {ceiling.fits} fits, {ceiling.fails} does not"


def load_searches(path: str | Path, match: Sequence[str] = ()) -> list[CeilingSearch]:
    """Expand and validate a ceiling grid (``defaults`` + ``searches``); raise GridError naming every problem."""

    def build(fields: dict[str, Any]) -> CeilingSearch:
        search = CeilingSearch(**fields)
        check_plan(search.probe(search.start, search.seeds[0]))
        return search

    def describe(fields: dict[str, Any], defaults: dict[str, Any]) -> str:
        return " ".join(f"{k}={fields[k]}" for k in SEARCH_FIELDS if fields.get(k) is not None)

    searches = build_grid(path, "searches", EXPANDABLE, build, lambda search: search.search_id, describe, title="ceiling grid")
    if match:
        searches = [s for s in searches if any(fnmatch.fnmatchcase(s.search_id, pattern) for pattern in match)]
    return searches


def run_searches(
    searches: Sequence[CeilingSearch],
    results_dir: Path,
    notebooks_dir: Path,
    gpus: Sequence[str] | None = None,
    cells_per_gpu: int = 1,
    echo: Callable[[str], None] = print,
    rerun_crashed: bool = False,
    share_gib: Mapping[str | None, float] | None = None,
) -> list[Ceiling]:
    """Run searches side by side: ``cells_per_gpu`` searches per GPU (one without GPUs); a search's
    own probes run in order, since each decides the next. Where ``share_gib`` gives a GPU's memory,
    as many probes measure on it at once as their card caps fit (:mod:`harness.gpu_gate`). Returns
    one Ceiling per search, in order; a search that raised is returned stopped, with the error, and
    the others go on."""
    ceilings: list[Ceiling | None] = [None] * len(searches)
    lock = threading.Lock()
    started = time.perf_counter()

    def say(line: str) -> None:
        with lock:
            echo(line)

    def run(index: int, slot: str | None, gate: Gate) -> None:
        try:
            ceilings[index] = run_search(searches[index], results_dir, notebooks_dir, slot, gate, say, rerun_crashed)
        except Exception as error:  # noqa: BLE001 — one broken search must not silently end the others
            ceilings[index] = Ceiling(stopped=f"{type(error).__name__}: {error}")
        say(f"[{time.perf_counter() - started:.0f}s] {describe(searches[index], ceilings[index])}")

    run_on_gpus(len(searches), run, gpus, cells_per_gpu, share_gib)
    return [ceiling or Ceiling(stopped="never started") for ceiling in ceilings]


def share_budgets(spec: str, gpus: Sequence[str] | None) -> dict[str | None, float]:
    """``--share-gpu``'s budget per GPU: ``free`` (nvidia-smi's free memory less 1 GiB) or GiB for each."""
    slots: list[str | None] = list(gpus) if gpus else [None]
    if spec != "free":
        budgets = dict.fromkeys(slots, gpu_gate.parse_budget(spec, "--share-gpu takes GiB or nothing"))
    else:
        budgets = {slot: gpu_gate.free_memory_gib(cell_environment(slot, os.environ)["CUDA_VISIBLE_DEVICES"]) - 1.0 for slot in slots}
    for slot, budget in budgets.items():
        if budget <= gpu_gate.CONTEXT_MARGIN_GIB:
            raise ValueError(f"GPU {slot or 'default'} has {budget:.1f} GiB to share, too little for any capped probe; "
                             "is another process using it?")  # fmt: skip
    return budgets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness-ceiling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path)
    parser.add_argument("--gpus", help="run searches side by side, one GPU each: '0,1' or 'all'")
    parser.add_argument("--cells-per-gpu", type=positive_int, default=1, metavar="N",
                        help="N searches per GPU, their probes starting up together and measuring one at a time "
                             "(with --share-gpu: as many at once as their card caps fit)")  # fmt: skip
    parser.add_argument("--share-gpu", nargs="?", const="free", metavar="GIB",
                        help="let capped probes measure side by side on a GPU, within GIB of its memory "
                             "(default: what nvidia-smi reports free now, less 1 GiB); outcomes and peaks "
                             "are unchanged, step times are not the card's")  # fmt: skip
    parser.add_argument("--match", action="append", default=[], metavar="GLOB", help="only searches whose id matches")
    parser.add_argument("--dry-run", action="store_true", help="say where each search stands, run nothing")
    parser.add_argument("--rerun-crashed", action="store_true", help="run crashed probes again (once each)")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "results")
    parser.add_argument("--notebooks-dir", type=Path, default=ROOT / "book" / "cells")
    args = parser.parse_args(argv)
    try:
        searches = load_searches(args.grid, args.match)
    except GridError as error:
        print(error, file=sys.stderr)
        return 2
    if not searches:
        print(f"no search of {args.grid} matches {' or '.join(args.match)}", file=sys.stderr)
        return 2
    gpus = visible_gpus(args.gpus) if args.gpus else None
    try:
        share = None if args.share_gpu is None or args.dry_run else share_budgets(args.share_gpu, gpus)
    except ValueError as error:
        print(f"harness-ceiling: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        refused = 0
        for search in searches:
            try:
                print(describe(search, search_state(search, args.results_dir)[0]))
            except ProbeMismatch as error:
                refused += 1
                print(describe(search, Ceiling(stopped=str(error))), file=sys.stderr)
        print(f"{len(searches)} searches")
        return 1 if refused else 0
    if share:
        print("sharing GPUs: " + ", ".join(f"{gpu or 'default'} {gib:.1f} GiB" for gpu, gib in share.items()))
    ceilings = run_searches(searches, args.results_dir, args.notebooks_dir, gpus, args.cells_per_gpu,
                            rerun_crashed=args.rerun_crashed, share_gib=share)  # fmt: skip
    stopped = [describe(search, c) for search, c in zip(searches, ceilings) if c.stopped]
    for line in stopped:
        print(line, file=sys.stderr)
    return 1 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
