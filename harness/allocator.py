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

VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
ALLOCATORS: dict[str, str | None] = {"default": None, "expandable": "expandable_segments:True"}


def check(name: str) -> str:
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r}; choose one of {sorted(ALLOCATORS)}")
    return name


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
