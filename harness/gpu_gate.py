"""Who measures on a GPU when several cells run on one host: one at a time, or as many as their caps fit.

A cell spends its first seconds importing its stack (on a slow file system, half of an op-level
cell's time), none of it on the GPU. ``harness sweep --cells-per-gpu 2`` therefore starts two cells
per GPU; each enters its GPU's gate (the lock file named by ``MAXSIM_GPU_LOCK``) once its parameters
are validated — having at most asked the driver how many devices there are — and before it creates
a CUDA context, and stays in until its process ends. Staying in on purpose: the CUDA context and
cached blocks of a finished cell are gone before the next cell measures.

By default a cell has its GPU alone, so its step times are the card's. A ceiling probe only asks
whether a batch trains under its card's cap, and the cap (:mod:`harness.cards`) is per process: the
caching allocator refuses to reserve past it whatever else runs on the device. So when
``MAXSIM_GPU_SHARE_GIB`` gives the GPU's memory in GiB (``harness ceiling --share-gpu``), capped
cells enter side by side as long as their caps, each plus ``CONTEXT_MARGIN_GIB`` for its CUDA context,
add up to no more than that; a native (uncapped) cell still waits for the GPU alone. Nothing can then
run out of physical memory below its cap, so a probe's outcome and peaks are those it would have
alone; its step times are not (:attr:`CellResult.gpu_share_gib` marks it). Cells enter in the order
they asked, so a large cell is not starved by a stream of small ones.

The gate is a folder beside the lock file holding one small file per waiting or admitted process,
each kept locked (``flock``) by its owner for the owner's lifetime. The kernel drops those locks
when a process ends, however it ends, so a file nobody holds locked belongs to a process that has
gone and is removed. Every look at the folder happens under the lock file itself. The gate needs a local file system
(``flock``); it lives in the temporary directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

LOCK_VARIABLE = "MAXSIM_GPU_LOCK"
SHARE_VARIABLE = "MAXSIM_GPU_SHARE_GIB"
# What a process holds on the device outside its caching allocator, so outside its card cap: the
# CUDA context and the loaded kernels (about 0.5 GiB on an H200), with room to spare.
CONTEXT_MARGIN_GIB = 2.0
POLL_SEC = 0.25
EXCLUSIVE = "all"

_held: IO[str] | None = None
_also_held: list[IO[str]] = []  # a data-parallel cell's other GPUs' gates
_share_gib: float | None = None


def hold(cap_gib: float | None = None) -> float:
    """Enter this process's GPU gate (if the sweep set one) and stay in until exit; return seconds waited.

    ``cap_gib`` is the card cap the cell will run under (None: uncapped); with a share budget set,
    the cell enters beside others that fit, otherwise it waits for the GPU alone. A data-parallel
    cell is given the gates of all its GPUs (``os.pathsep``-separated) and enters them in the order
    given, which the sweep keeps sorted, so two such cells never wait on each other in a circle.
    """
    global _held, _share_gib
    path = os.environ.get(LOCK_VARIABLE)
    if not path or _held is not None:
        return 0.0
    budget = share_budget()
    need = share_needed(cap_gib, budget)
    began = time.perf_counter()
    held = [_enter_gate(Path(part), need, budget) for part in path.split(os.pathsep) if part]
    _held, _share_gib = held[0], need
    _also_held.extend(held[1:])
    return time.perf_counter() - began


def _enter_gate(gate: Path, need: float | None, budget: float | None) -> IO[str]:
    """Wait in ``gate``'s queue until this process is first and fits; its held entry, kept open."""
    entries = gate.with_name(gate.name + ".d")
    entries.mkdir(parents=True, exist_ok=True)
    tag = f"{time.monotonic_ns():020d}-{os.getpid()}"  # CLOCK_MONOTONIC: one clock for the whole host
    waiting = entries / f"wait-{tag}"
    with _locked(gate):
        ticket = enter(waiting, "")
    try:
        while True:
            with _locked(gate):
                live = live_entries(entries, tag)
                queue = sorted(name for name in live if name.startswith("wait-"))
                admitted = [text for name, text in live.items() if name.startswith("hold-")]
                if queue[0] == waiting.name and fits(need, admitted, budget):
                    return enter(entries / f"hold-{tag}", EXCLUSIVE if need is None else f"{need:.3f}")
            time.sleep(POLL_SEC)
    finally:  # admitted or interrupted: this process no longer waits, and must not hold up the queue
        ticket.close()
        waiting.unlink(missing_ok=True)


def share_gib() -> float | None:
    """GiB of the GPU this process entered with beside others; None if it entered alone (or ungated)."""
    return _share_gib


def share_budget() -> float | None:
    """The share budget the sweep set for this process's GPU (``MAXSIM_GPU_SHARE_GIB``); None: none."""
    text = os.environ.get(SHARE_VARIABLE)
    return parse_budget(text, f"{SHARE_VARIABLE} must be the GPU's memory in GiB, e.g. 139.5") if text else None


def parse_budget(text: str, usage: str) -> float:
    """A share budget in GiB from ``text``; ValueError saying ``usage`` if it is not a positive number."""
    try:
        budget = float(text)
    except ValueError:
        raise ValueError(f"{usage}, got {text!r}") from None
    if budget <= 0:
        raise ValueError(f"{usage}; it must be positive, got {text!r}")
    return budget


def share_needed(cap_gib: float | None, budget: float | None) -> float | None:
    """The GiB a cell capped at ``cap_gib`` takes from a shared GPU; None: it needs the GPU alone."""
    if budget is None or cap_gib is None or cap_gib + CONTEXT_MARGIN_GIB > budget:
        return None
    return cap_gib + CONTEXT_MARGIN_GIB


def fits(need: float | None, admitted: list[str], budget: float | None) -> bool:
    """Whether a cell needing ``need`` GiB (None: the GPU alone) may enter beside the ``admitted`` ones."""
    if need is None or EXCLUSIVE in admitted:
        return not admitted
    return budget is not None and sum(float(text) for text in admitted) + need <= budget


@contextlib.contextmanager
def _locked(gate: Path) -> Iterator[None]:
    with open(gate, "a", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _close_in_child() -> None:
    """A forked child (a DataLoader worker, say) must not keep this process's entry alive."""
    global _held
    if _held is not None:
        _held.close()
        _held = None
    for handle in _also_held:
        handle.close()
    _also_held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def enter(path: Path, text: str) -> IO[str]:
    handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 — kept open (and locked) while it counts
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    handle.write(text)
    handle.flush()
    return handle


def live_entries(entries: Path, own_tag: str) -> dict[str, str]:
    """Every entry whose owner still runs, by name; the others are removed. This process's own
    entries are live without asking: where ``flock`` is emulated with POSIX locks (NFS), a second
    handle of the same process would get the lock, and closing it would drop the real one."""
    live = {}
    for path in sorted(entries.iterdir()):
        if path.name.endswith(f"-{own_tag}"):
            live[path.name] = path.read_text(encoding="utf-8")
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    live[path.name] = handle.read()
                    continue
            path.unlink(missing_ok=True)  # nobody holds it: its process has ended
        except FileNotFoundError:
            continue
    return live


def _query(gpu: str, field: str) -> str:
    """One ``nvidia-smi --query-gpu`` field of ``gpu``, asked of ``nvidia-smi`` so that the asking
    process creates no CUDA context of its own; raises OSError or SubprocessError where it cannot."""
    import subprocess

    completed = subprocess.run(
        ["nvidia-smi", "-i", gpu, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return completed.stdout.strip()


def device_name(gpu: str) -> str | None:
    """The name ``nvidia-smi`` gives ``gpu`` ("NVIDIA H200"), or None where it cannot say."""
    import subprocess

    try:
        return _query(gpu, "name") or None
    except (OSError, subprocess.SubprocessError):
        return None


def free_memory_gib(gpu: str) -> float:
    """What the driver reports free on ``gpu`` (an index as CUDA_VISIBLE_DEVICES names it), in GiB,
    asked of ``nvidia-smi`` so that the asking process creates no CUDA context of its own."""
    import subprocess

    try:
        return float(_query(gpu, "memory.free").split()[0]) / 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        raise ValueError(f"cannot read GPU {gpu}'s free memory with nvidia-smi ({error}); pass --share-gpu GIB") from None
