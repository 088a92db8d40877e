"""One worker pool for sweeps and ceiling searches: tasks taken in order by workers bound to GPUs.

A cell always sees exactly one GPU (``CUDA_VISIBLE_DEVICES``): with two visible, transformers'
Trainer would train with DataParallel, another cell than the one asked for — except a
data-parallel cell (``world_size`` W > 1), which sees its W GPUs and holds all their gates
(:func:`gpu_set_gate`; its ranks are started by torchrun, :mod:`harness.ranks`). Each GPU has a gate
(:mod:`harness.gpu_gate`), a lock file its cells enter before creating a CUDA context, so several
workers per GPU overlap their cells' start-up while measuring one at a time — or, given a share
budget, as many at once as their card caps fit.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness import gpu_gate


@dataclasses.dataclass(frozen=True)
class Gate:
    """A GPU's gate: its lock file, the GiB its cells may share (None: each cell measures alone),
    and the CPU cores its cells are pinned to (None: not pinned)."""

    path: Path
    share_gib: float | None = None
    cpus: tuple[int, ...] | None = None
    also: tuple[Path, ...] = ()  # a data-parallel cell's other GPUs' gates, entered after this one

    def environment(self) -> dict[str, str]:
        env = {gpu_gate.LOCK_VARIABLE: os.pathsep.join(str(path) for path in (self.path, *self.also))}
        if self.share_gib is not None:
            env[gpu_gate.SHARE_VARIABLE] = f"{self.share_gib:.2f}"
        return env


def cell_environment(gpu: str | None, base: Mapping[str, str]) -> dict[str, str]:
    """The cell's environment, pinned to exactly one GPU: ``gpu``, or else the first visible one."""
    env = dict(base)
    if gpu is None:
        visible = [part for part in base.get("CUDA_VISIBLE_DEVICES", "0").split(",") if part.strip()]
        gpu = visible[0].strip() if visible else "0"
    env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


GATE_DIR_VARIABLE = "MAXSIM_GATE_DIR"


def gate_path(gpu: str | None) -> Path:
    """The lock file one GPU's cells take before measuring, shared by every sweep on this host (in
    the temporary directory, or ``$MAXSIM_GATE_DIR``: tests use their own)."""
    gpu = cell_environment(gpu, os.environ)["CUDA_VISIBLE_DEVICES"]
    folder = Path(os.environ.get(GATE_DIR_VARIABLE) or tempfile.gettempdir())
    return folder / f"maxsim-gpu-{gpu}.gate"


def split_cpus(cpus: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """``cpus`` in ``parts`` disjoint contiguous shares, as equal as they divide (the first ones
    larger); ValueError when there are fewer cores than shares."""
    cpus = sorted(cpus)
    if parts > len(cpus):
        raise ValueError(f"cannot pin {parts} GPUs' cells to disjoint CPU cores: this process may use {len(cpus)}")
    size, extra = divmod(len(cpus), parts)
    shares, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        shares.append(tuple(cpus[start:end]))
        start = end
    return shares


def run_on_gpus(count: int, task: Callable[[int, str | None, Gate], None], gpus: Sequence[str] | None,
                cells_per_gpu: int = 1, share_gib: Mapping[str | None, float] | None = None,
                pin_cpus: bool = False) -> None:  # fmt: skip
    """Call ``task(index, gpu, gate)`` once for every index below ``count``, taken in order by
    ``cells_per_gpu`` workers per GPU (without GPUs: that many workers on the default one). A GPU's
    workers share its gate, so their cells measure one at a time — or, where ``share_gib`` gives
    that GPU's memory, as many at once as their card caps fit in it. With ``pin_cpus`` each GPU's
    cells run on their own share of this process's CPU cores (:func:`split_cpus`), so cells on
    different GPUs never compete for a core (the timing rule, :mod:`harness.host`)."""
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
    shares = split_cpus(sorted(os.sched_getaffinity(0)), len(slots)) if pin_cpus else [None] * len(slots)
    gates = {slot: Gate(gate_path(slot), (share_gib or {}).get(slot), cpus) for slot, cpus in zip(slots, shares, strict=True)}
    threads = [threading.Thread(target=worker, args=(slot, gates[slot])) for slot in slots for _ in range(cells_per_gpu)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def gpu_set_gate(gpus: Sequence[str]) -> Gate:
    """The gates of a data-parallel cell's GPUs, in order: it measures once it holds every one."""
    first, *rest = gpus
    return Gate(gate_path(first), also=tuple(gate_path(gpu) for gpu in rest))


def gpu_set(need: int, gpus: Sequence[str] | None) -> tuple[str, Gate] | None:
    """Where a data-parallel cell of world size ``need`` runs: the first ``need`` GPUs of ``gpus``
    as one slot ('0,1') and the gate of all of them; None when ``gpus`` has fewer."""
    if gpus is None or len(gpus) < need:
        return None
    chosen = list(gpus[:need])
    return ",".join(chosen), gpu_set_gate(chosen)


def visible_gpus(spec: str) -> list[str]:
    """``--gpus``: '0,1' as given, or 'all' as many as ``nvidia-smi`` lists (no CUDA context here)."""
    if spec != "all":
        return [part.strip() for part in spec.split(",") if part.strip()]
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                                text=True, check=True, timeout=60).stdout.split()  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        raise ValueError(f"--gpus all: cannot list the GPUs with nvidia-smi ({error}); name them, e.g. --gpus 0,1") from None
    return listed
