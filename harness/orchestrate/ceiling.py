"""Run ceiling searches: the probes each search (:mod:`harness.search`) names next, until it ends.

A search's probes run one after another, since each decides the next; searches run side by side,
``cells_per_gpu`` per GPU. A probe that crashed because the device, not its card's cap, ran out
beside other probes (its marker's ``failure`` says ``device_out_of_memory``) runs again alone.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from harness import gpu_gate
from harness.grid import GridCell
from harness.orchestrate.launcher import Gate, Layout, launch, set_aside, state
from harness.orchestrate.pool import cell_environment, gpu_set, run_on_gpus
from harness.results import default_results_dir, load_result
from harness.search import (
    CROSS_CARD_GRID,
    Ceiling,
    CeilingSearch,
    Probes,
    describe,
    device_mismatch,
    search_state,
    vouched_devices,
)


def run_search(search: CeilingSearch, layout: Layout, gpu: str | None, gate: Gate | None,
               echo: Callable[[str], None] = print, rerun_crashed: bool = False) -> Ceiling:  # fmt: skip
    """Run the probes a search still needs, one at a time, and return where it ends."""
    rerun = set()  # crashed probes run again once each, not again and again
    redrawn = set()  # probes of an earlier draw of the data run again, once each
    # the GPU the pages name: uncapped, the device is the card (one kind per search); capped, another
    # GPU only where the cross-card check has shown it measures an H200's bytes under a cap
    here = gpu_gate.device_name(cell_environment(gpu, os.environ)["CUDA_VISIBLE_DEVICES"])
    probes = Probes.read(search, layout.results_dir)
    reason = device_mismatch(probes, here)
    if reason is not None and search.card != "native":  # (reads every result: only where it could matter)
        # the committed results hold the runs that say how one GPU repeats itself (not seeded onto a device)
        vouched = vouched_devices(layout.results_dir, CROSS_CARD_GRID, repeats_dir=default_results_dir())
        reason = device_mismatch(probes, here, vouched)
    if reason is not None:
        return dataclasses.replace(search_state(search, probes)[0], stopped=reason)
    while True:
        ceiling, spec = search_state(search, layout.results_dir, rerun_crashed)
        if spec is None:
            return ceiling
        cell = GridCell(search.grid, spec, search.kernel, search.notebook)
        if cell.cell_id in rerun:
            return search_state(search, layout.results_dir)[0]  # it crashed again: stop there
        current = state(cell, layout)
        if current == "crashed":
            rerun.add(cell.cell_id)
        if current == "broken":
            moved = set_aside(layout.result_path(cell))
            echo(f"  {cell.cell_id}: its result file was not a valid result of this probe; kept aside as {moved.name}")
        if ceiling.earlier_draw and layout.result_path(cell).exists():  # its earlier run kept beside the new one
            draw = load_result(layout.result_path(cell)).data_draw
            if cell.cell_id in redrawn:
                return dataclasses.replace(ceiling, stopped=f"probe {cell.cell_id} ran again on the {draw} draw of the data")
            redrawn.add(cell.cell_id)
            kept = [set_aside(path, f"{draw}-draw").name
                    for path in (layout.result_path(cell), layout.notebook_path(cell), layout.log_path(cell)) if path.exists()]
            echo(f"  {cell.cell_id}: trained on the {draw} draw of the data; runs again on the current one "
                 f"(the earlier run kept as {', '.join(kept)})")
        run = launch(cell, layout, gpu, gate)
        if run.failure == "device_out_of_memory" and gate is not None and gate.share_gib is not None:
            echo(f"  {cell.cell_id}: the device, not the card's cap, ran out beside other probes; running it alone")
            run = launch(cell, layout, gpu, dataclasses.replace(gate, share_gib=None))
        where = f" on GPU {gpu}" if gpu is not None else ""
        echo(f"  {cell.cell_id}: {run.outcome} in {run.seconds:.0f}s{where}" + (f" ({run.phases})" if run.phases else ""))


def run_searches(searches: Sequence[CeilingSearch], layout: Layout, gpus: Sequence[str] | None = None,
                 cells_per_gpu: int = 1, echo: Callable[[str], None] = print, rerun_crashed: bool = False,
                 share_gib: Mapping[str | None, float] | None = None, pin_cpus: bool = False) -> list[Ceiling]:  # fmt: skip
    """Run searches side by side: ``cells_per_gpu`` searches per GPU (one without GPUs). Where
    ``share_gib`` gives a GPU's memory, as many probes measure on it at once as their card caps fit
    (:mod:`harness.gpu_gate`). A data-parallel search (world size W > 1) runs after the others, its
    probes on the first W GPUs of ``gpus`` holding every one's gate; without W GPUs it is stopped
    with the reason. Returns one Ceiling per search, in order; a search that raised is
    returned stopped, with the error, and the others go on."""
    ceilings: list[Ceiling | None] = [None] * len(searches)
    lock = threading.Lock()
    started = time.perf_counter()

    def say(line: str) -> None:
        with lock:
            echo(line)

    def run(index: int, slot: str | None, gate: Gate) -> None:
        try:
            ceilings[index] = run_search(searches[index], layout, slot, gate, say, rerun_crashed)
        except Exception as error:  # noqa: BLE001 — one broken search must not silently end the others
            ceilings[index] = Ceiling(stopped=f"{type(error).__name__}: {error}")
        say(f"[{time.perf_counter() - started:.0f}s] {describe(searches[index], ceilings[index] or Ceiling())}")

    single = [index for index, search in enumerate(searches) if search.world_size == 1]
    multi = [index for index, search in enumerate(searches) if search.world_size > 1]
    run_on_gpus(len(single), lambda k, slot, gate: run(single[k], slot, gate), gpus, cells_per_gpu, share_gib, pin_cpus)
    for index in multi:  # then each data-parallel search, its probes on the first W GPUs, one probe at a time
        need = searches[index].world_size
        placed = gpu_set(need, gpus)
        if placed is None:
            stopped = Ceiling(stopped=f"world size {need} needs {need} GPUs, one per rank; this search was given "
                                      f"{len(gpus) if gpus else 'none (--gpus)'}")  # fmt: skip
            ceilings[index] = stopped
            say(describe(searches[index], stopped))
            continue
        run(index, *placed)
    return [ceiling or Ceiling(stopped="never started") for ceiling in ceilings]


def share_budgets(spec: str, gpus: Sequence[str] | None) -> dict[str | None, float]:
    """``--share-gpu``'s budget per GPU: ``free`` (nvidia-smi's free memory less 1 GiB) or GiB for each."""
    slots: list[str | None] = list(gpus) if gpus else [None]
    if spec != "free":
        budgets = dict.fromkeys(slots, gpu_gate.parse_budget(spec, "--share-gpu takes GiB or nothing"))
    else:
        visible = {slot: cell_environment(slot, os.environ)["CUDA_VISIBLE_DEVICES"] for slot in slots}
        budgets = {slot: gpu_gate.free_memory_gib(gpu) - 1.0 for slot, gpu in visible.items()}
    for slot, budget in budgets.items():
        if budget <= gpu_gate.CONTEXT_MARGIN_GIB:
            raise ValueError(f"GPU {slot or 'default'} has {budget:.1f} GiB to share, too little for any capped probe; "
                             "is another process using it?")  # fmt: skip
    return budgets
