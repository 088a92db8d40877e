"""The CUDA caching allocator's regime, as a dimension of a cell.

``default`` is PyTorch's allocator as shipped: fixed-size segments that a freed block can only be
reused from by requests that fit in it, so reserved memory can grow past what is allocated
(fragmentation). ``expandable`` sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: segments
grow and shrink in place by mapping pages, which PyTorch documents as the remedy for that
fragmentation. The setting must be in the environment before CUDA initialises, so the sweep puts it
into the cell process's environment and every result records what its process actually ran with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from harness import spec

VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
ALLOCATORS = spec.ALLOCATORS


def check(name: str) -> str:
    return spec.choose("allocator", name, ALLOCATORS)


def name_of(conf: str | None) -> str:
    """The allocator regime a ``PYTORCH_CUDA_ALLOC_CONF`` value selects (the raw value if neither)."""
    if not conf:
        return "default"
    for name, value in ALLOCATORS.items():
        if value == conf.strip():
            return name
    return conf.strip()


def current() -> str:
    """The regime this process runs with, from its environment."""
    return name_of(os.environ.get(VARIABLE))


def environment_for(name: str, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the allocator variable set for ``name`` (removed for ``default``)."""
    env = dict(base)
    value = ALLOCATORS[check(name)]
    if value is None:
        env.pop(VARIABLE, None)
    else:
        env[VARIABLE] = value
    return env


def apply(name: str, cuda_initialized: bool) -> None:
    """Make this process run with allocator ``name``: set the variable while CUDA has not started
    (the caching allocator reads it when it starts); once it has, the process must already run with
    it, or this raises — the cell would measure another allocator than its spec says."""
    value = ALLOCATORS[check(name)]
    if current() == name:
        return
    if cuda_initialized:
        raise ValueError(
            f"this process already started CUDA with allocator {current()!r}; allocator {name!r} must be set before "
            "CUDA starts: run the cell in a fresh process (the notebook's kernel, `harness cell`)."
        )
    if value is None:
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = value
