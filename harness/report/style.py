"""One look for every figure: a fixed colour and marker per backend (by its name, never by plot
order), legend and tick sizes, and the helpers that keep labels from overlapping."""

from __future__ import annotations

import re
from dataclasses import dataclass

from matplotlib.axes import Axes

LEGEND_PT = 9
TICK_PT = 9


@dataclass(frozen=True)
class Look:
    """How one backend is drawn in every figure."""

    colour: str
    marker: str
    size: float  # marker size (points, for ``plot``)


# matplotlib's first colours, fixed to a backend: vanilla blue, lik orange, flash green, chunked vanilla red.
# lik and flash often measure the same: flash gets a smaller marker of another shape, drawn on top.
BACKENDS: dict[str, Look] = {
    "vanilla": Look("#1f77b4", "o", 7),
    "lik": Look("#ff7f0e", "s", 8),
    "flash": Look("#2ca02c", "^", 5),
}
# chunk sizes: 32 and 64 (PyLate's published knob) red, 128 purple, 256 brown, 16 (GradCache's score chunk) pink
CHUNKED = [Look("#d62728", "D", 6), Look("#9467bd", "v", 6), Look("#8c564b", "P", 6), Look("#e377c2", "d", 7)]
OTHER = Look("#7f7f7f", "X", 6)
ORDER = ["vanilla", "lik", "flash"]  # legend order


def look(backend: str) -> Look:
    """The colour and marker of ``backend``: fixed by its name ('vanilla + chunk 64' → the first chunk colour)."""
    if backend in BACKENDS:
        return BACKENDS[backend]
    chunk = chunk_size(backend)
    if chunk is not None:
        return CHUNKED[min(_CHUNK_RANK.get(chunk, len(CHUNKED) - 1), len(CHUNKED) - 1)]
    return OTHER


_CHUNK_RANK = {16: 3, 32: 0, 64: 0, 128: 1, 256: 2}


def colour(backend: str) -> str:
    return look(backend).colour


def chunk_size(backend: str) -> int | None:
    """N of 'vanilla + chunk N', else None."""
    found = re.fullmatch(r".* \+ chunk (\d+)", backend)
    return int(found.group(1)) if found else None


def in_order(backends: object) -> list[str]:
    """Backends in the legend's fixed order: vanilla, lik, flash, then chunked vanilla by chunk size, then the rest."""
    names = sorted(set(backends))  # type: ignore[call-overload]
    return sorted(names, key=lambda b: (ORDER.index(b) if b in ORDER else len(ORDER), chunk_size(b) or 0, b))


def short(backend: str) -> str:
    """A backend as a short label for a narrow table column or a tick: 'vanilla + chunk 64' → 'chunk 64'."""
    chunk = chunk_size(backend)
    return f"chunk {chunk}" if chunk is not None else backend


def legend(axis: Axes, **kwargs: object) -> None:
    """A legend outside the axes, on the right, at a readable size (nothing where there is nothing to label)."""
    handles, labels = axis.get_legend_handles_labels()
    if handles:
        axis.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=LEGEND_PT, frameon=False,
                    **kwargs)  # fmt: skip


def ticks(axis: Axes) -> None:
    """Readable tick labels."""
    axis.tick_params(labelsize=TICK_PT)
