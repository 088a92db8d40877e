"""One look for every figure: a fixed colour and marker per backend (by its name, never by plot
order), legend and tick sizes, and the helpers that keep labels from overlapping."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.transforms import ScaledTranslation, Transform

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
# One colour per chunk size, none a shade of another: 64 (PyLate's published knob) red, 16 (GradCache's score
# chunk) purple, 32 brown, 128 olive, 256 cyan (pink is left out: beside red it reads as the same backend).
CHUNKED: dict[int, Look] = {
    64: Look("#d62728", "D", 6),
    16: Look("#9467bd", "v", 7),
    32: Look("#8c564b", "P", 7),
    128: Look("#bcbd22", "p", 7),
    256: Look("#17becf", "h", 7),
}
OTHER = Look("#7f7f7f", "X", 6)  # a backend none of the above names (another chunk size included)
ORDER = ["vanilla", "lik", "flash"]  # the one backend order of every figure, legend and table; chunked vanilla follows


def look(backend: str) -> Look:
    """The colour and marker of ``backend``: fixed by its name ('vanilla + chunk 64' → chunk 64's red)."""
    if backend in BACKENDS:
        return BACKENDS[backend]
    return CHUNKED.get(chunk_size(backend) or 0, OTHER)


def layer(backend: str) -> float:
    """The z-order of ``backend``'s markers: a larger marker under a smaller one, so equal points all show."""
    return 3 + 1 / look(backend).size


def colour(backend: str) -> str:
    return look(backend).colour


def chunk_size(backend: str) -> int | None:
    """N of 'vanilla + chunk N', else None."""
    found = re.fullmatch(r".* \+ chunk (\d+)", backend)
    return int(found.group(1)) if found else None


def in_order(backends: object) -> list[str]:
    """Backends in the legend's fixed order: vanilla, lik, flash, then chunked vanilla by chunk size, then the rest."""
    names = sorted(set(backends))  # type: ignore[call-overload]

    def rank(backend: str) -> tuple[int, int, str]:
        chunk = chunk_size(backend)
        place = ORDER.index(backend) if backend in ORDER else len(ORDER) + (chunk is None)
        return place, chunk or 0, backend

    return sorted(names, key=rank)


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


def handle(backend: str, **kwargs: Any) -> Line2D:
    """A legend entry for ``backend``: its marker in its colour, no line (``kwargs`` override)."""
    fixed = look(backend)
    drawn: dict[str, Any] = {"color": fixed.colour, "marker": fixed.marker, "markersize": fixed.size, "linestyle": "none",
                             "label": backend} | kwargs  # fmt: skip
    return Line2D([], [], **drawn)


def legend_rows(figure: Figure, rows: Sequence[Sequence[Artist | tuple[Artist, ...]]], labels: Sequence[Sequence[str]] = (),
                **kwargs: Any) -> Legend | None:  # fmt: skip
    """One figure legend whose every row is one of ``rows`` (e.g. the backends in their fixed order, then what
    the marker styles mean), padded with blank entries: matplotlib fills a legend column by column. An entry
    is an artist labelled by its own label, or a tuple of artists drawn over each other, labelled by
    ``labels`` (one list per row, where given)."""
    named = [(list(row), list(labels[k]) if k < len(labels) else [str(cast(Artist, e).get_label()) for e in row])
             for k, row in enumerate(rows)]  # fmt: skip
    named = [(row, names) for row, names in named if row]
    if not named:
        return None
    columns = max(len(row) for row, _ in named)
    blank: Artist | tuple[Artist, ...] = Line2D([], [], linestyle="none")
    entries = [(row[c], names[c]) if c < len(row) else (blank, " ") for c in range(columns) for row, names in named]
    options: dict[str, Any] = {"loc": "lower center", "fontsize": LEGEND_PT, "frameon": False} | kwargs
    handles = cast(list[Artist], [entry for entry, _ in entries])  # a tuple is drawn by matplotlib's HandlerTuple
    return figure.legend(handles, [name for _, name in entries], ncol=columns, **options)


def dodge(axis: Axes, index: int, count: int, step_pt: float = 9.0) -> Transform:
    """Data coordinates moved ``step_pt`` points sideways per place, ``count`` places centred on the true x:
    markers that would hide each other at one x (equal values) stand side by side around it, the same
    distance apart whatever the axis's scale or range, and the group stays centred on its x."""
    shift = (index - (count - 1) / 2) * step_pt / 72
    return axis.transData + ScaledTranslation(shift, 0, axis.figure.dpi_scale_trans)
