"""Who else ran on the host while a cell was timed: the timing rule, recorded in every result.

A cell's step times are the card's only if nothing else competed for what a training step uses:
the GPU, and the host's CPU cores (the Python loop, the kernel launches, the dataloader workers
that decode and collate the next batch). So a result's times are published only if, while the cell
trained, it

* had its GPU alone (never admitted beside others by ``harness ceiling --share-gpu``), and
* either owned its host — no other cell process ran on it — or ran pinned to CPU cores that no
  other cell on the host could use (``harness sweep`` pins each GPU's cells to their own share
  of the cores; dataloader workers inherit the pinning).

Every cell process enters a host registry — a folder (``$MAXSIM_HOST_DIR``, else
``maxsim-host.d`` in the temporary directory) holding one small file per running cell, kept locked
(``flock``) by its owner for its lifetime and naming its CPU cores and GPU — as soon as it starts,
before it imports its stack, so a neighbour that is still starting up counts too. While training
the cell looks at the registry at every step (:class:`HostWatch`) and keeps the most neighbours it
saw and how many of them could run on its own cores. It also reads its GPU's SM clock and
temperature when training starts and ends (``nvidia-smi``: throttling shows there).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from harness import gpu_gate
from harness.results import HOST_OUT_OF_MEMORY

HOST_DIR_VARIABLE = "MAXSIM_HOST_DIR"
PINNED_VARIABLE = "MAXSIM_PINNED_CPUS"  # set by the launcher when it pinned the cell's cores

_entry: IO[str] | None = None
_tag: str | None = None
_cell: str | None = None  # the cell this process measures: its other ranks and their launcher are no neighbours


CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills(root: Path = CGROUP_ROOT, membership: Path = Path("/proc/self/cgroup")) -> int | None:
    """How many processes of this process's control group (with its descendants) the kernel's
    out-of-memory killer has killed so far, the group's own limit or the whole host's run out: the
    ``oom_kill`` count of cgroup v2's ``memory.events`` or of v1's ``memory.oom_control``, in the group
    ``membership`` names or, inside a container whose cgroup namespace makes its group the root, at the
    root. None where none can be read (no memory controller, another OS)."""
    try:
        entries = [line.split(":", 2) for line in membership.read_text().splitlines() if line.count(":") >= 2]
    except OSError:
        entries = []
    unified = [path for number, controllers, path in entries if number == "0" and not controllers]
    memory = [path for _, controllers, path in entries if "memory" in controllers.split(",")]
    candidates = [*(root / path.lstrip("/") / "memory.events" for path in unified), root / "memory.events",
                  *(root / "memory" / path.lstrip("/") / "memory.oom_control" for path in memory),
                  root / "memory" / "memory.oom_control"]  # fmt: skip
    for path in candidates:
        try:
            counts = dict(line.split() for line in path.read_text().splitlines() if len(line.split()) == 2)
        except OSError:
            continue
        if counts.get("oom_kill", "").isdigit():
            return int(counts["oom_kill"])
    return None


def oom_kill_words(before: int | None, after: int | None) -> str:
    """A crash's note on the host's memory: '; the host's out-of-memory killer killed 1 process of this
    cell's control group while it ran (oom_kill 0 → 1): the host's memory, not the GPU's, ran out' — ''
    where it killed none or the count cannot be read. Cells beside it share the group."""
    if before is None or after is None or after <= before:
        return ""
    killed = after - before
    return (f"; the host's out-of-memory killer killed {killed} process{'es' if killed > 1 else ''} of this cell's "
            f"control group while it ran (oom_kill {before} → {after}): {HOST_OUT_OF_MEMORY}")  # fmt: skip


def registry() -> Path:
    return Path(os.environ.get(HOST_DIR_VARIABLE) or Path(tempfile.gettempdir()) / "maxsim-host.d")


def own_cpus() -> list[int]:
    """The CPU cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def cpu_ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def parse_cpus(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``; ValueError with the reason on anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"CPU list {text!r}: {part!r} is not a core or a range like 0-7") from None
        if first < 0 or last < first:
            raise ValueError(f"CPU list {text!r}: {part!r} is not an increasing range of cores")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"CPU list {text!r} names no core")
    return sorted(cpus)


def enter(cell_id: str) -> None:
    """Pin this process to the cores the launcher gave it (``MAXSIM_PINNED_CPUS``), then enter the
    host registry for its lifetime (once; later calls do nothing)."""
    global _entry, _tag, _cell
    if _entry is not None:
        return
    _cell = cell_id
    pinned = os.environ.get(PINNED_VARIABLE)
    if pinned:
        os.sched_setaffinity(0, parse_cpus(pinned))
    folder = registry()
    folder.mkdir(parents=True, exist_ok=True)
    _tag = f"{time.monotonic_ns():020d}-{os.getpid()}"
    payload = {"cell": cell_id, "pid": os.getpid(), "cpus": own_cpus(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}
    path = folder / f"cell-{_tag}"
    # written and locked beside the registry, then moved in: a neighbour never reads a half-written entry
    staging = folder.parent / f".{folder.name}-staging-{_tag}"
    _entry = gpu_gate.enter(staging, json.dumps(payload))
    os.replace(staging, path)
    atexit.register(_leave, path, os.getpid())


def _leave(path: Path, owner: int) -> None:
    """Remove this process's entry, and the registry folder once it is empty (a process that dies
    without this leaves an unlocked entry, which the next look removes)."""
    if os.getpid() != owner:
        return
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


def _close_in_child() -> None:
    """A forked child (a DataLoader worker) must not keep this process's entry alive."""
    global _entry
    if _entry is not None:
        _entry.close()
        _entry = None


os.register_at_fork(after_in_child=_close_in_child)


def neighbours() -> list[dict[str, Any]]:
    """The other cells running on this host now: their registry payloads (a data-parallel cell's
    ranks and its launcher are one cell, not neighbours of each other)."""
    folder = registry()
    if _tag is None or not folder.is_dir():
        return []
    found = []
    for name, text in gpu_gate.live_entries(folder, _tag).items():
        if name.endswith(f"-{_tag}"):
            continue
        try:
            payload = json.loads(text)
        except ValueError:  # an entry being written: its owner runs, its cores are unknown
            payload = {"cpus": None}
        if payload.get("cell") != _cell:  # the same cell's other ranks (harness.ranks) train with it
            found.append(payload)
    return found


class HostWatch:
    """The most neighbours seen while training, how many of them could run on this cell's cores, and
    the GPU's clock and temperature where the measurement began and ended."""

    def __init__(self) -> None:
        self.cpus = own_cpus()
        self.most_neighbours = 0
        self.most_sharing_cpus = 0
        self.gpu_states: list[dict[str, float]] = []

    def mark(self, device_type: str) -> None:
        """Where the measurement begins or ends: look at the neighbours and (on CUDA) read the GPU."""
        self.look()
        state = gpu_state(visible_gpu()) if device_type == "cuda" else None
        if state is not None:
            self.gpu_states.append(state)

    def look(self) -> None:
        seen = neighbours()
        mine = set(self.cpus)
        sharing = sum(1 for other in seen if other.get("cpus") is None or mine & set(other["cpus"]))
        self.most_neighbours = max(self.most_neighbours, len(seen))
        self.most_sharing_cpus = max(self.most_sharing_cpus, sharing)


def gpu_state(gpu: str | None) -> dict[str, float] | None:
    """The GPU's SM clock (MHz) and temperature (°C) now, from ``nvidia-smi``; None if unreadable."""
    if gpu is None:
        return None
    try:
        completed = subprocess.run(
            ["nvidia-smi", "-i", gpu, "--query-gpu=clocks.sm,temperature.gpu", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        clock, temperature = (float(value) for value in completed.stdout.strip().split(","))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return {"sm_clock_mhz": clock, "temperature_c": temperature}


def visible_gpu() -> str | None:
    """The physical GPU index this process was pinned to (``CUDA_VISIBLE_DEVICES``), if one; in a
    rank of a data-parallel cell (torchrun sets ``LOCAL_RANK``), that rank's GPU of the list."""
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    local = os.environ.get("LOCAL_RANK", "")
    if len(visible) > 1 and local.isdigit() and int(local) < len(visible):
        return visible[int(local)]
    return visible[0] if len(visible) == 1 else None
