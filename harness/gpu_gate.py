"""One measurement per GPU at a time, while the next cell's start-up already runs beside it.

A cell spends its first seconds importing its stack (on a slow file system, half of an op-level
cell's time), none of it on the GPU. ``harness-sweep --cells-per-gpu 2`` therefore starts two
cells per GPU; each takes its GPU's lock (a file named by ``MAXSIM_GPU_LOCK``) once its parameters
are validated — having at most asked the driver how many devices there are — and before it creates
a CUDA context, and holds it until its process ends. The lock outlives the measurement on purpose: the
CUDA context and cached blocks of a finished cell are gone before the next cell measures, so a cell
never sees memory another process holds.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import IO

LOCK_VARIABLE = "MAXSIM_GPU_LOCK"
_held: IO[bytes] | None = None


def hold() -> float:
    """Take this process's GPU lock (if the sweep set one), keep it until exit; return seconds waited."""
    global _held
    path = os.environ.get(LOCK_VARIABLE)
    if not path or _held is not None:
        return 0.0
    began = time.perf_counter()
    handle = open(path, "ab")  # noqa: SIM115 — held open for the life of the process
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    _held = handle
    return time.perf_counter() - began
