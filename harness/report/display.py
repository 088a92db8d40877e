"""Showing tables and figures in a page (IPython display): the one layer that writes output."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from pandas.io.formats.style_render import CSSDict

from harness.report.text import a_gpu, card_gpu, gpu_words
from harness.search import REFERENCE_GPU
from harness.spec import CARDS

PADDED: list[CSSDict] = [{"selector": "td, th", "props": "padding: 0.25em 0.7em;"}]  # columns never run into each other


def show(item: pd.DataFrame | Figure | None) -> None:
    """Display a table (full cell text, no row numbers) or a figure (then close it) in a page; nothing for
    None (a figure with nothing to draw) or an empty table, as :func:`markdown` shows nothing for an empty
    text: a page calls ``show`` unconditioned and the report function decides whether there is anything."""
    from IPython.display import display

    if item is None or (isinstance(item, pd.DataFrame) and item.empty):
        return
    if isinstance(item, pd.DataFrame):
        with pd.option_context("display.max_colwidth", None):
            plain = item.index.name is None and item.index.nlevels == 1
            display(item.style.hide(axis="index").set_table_styles(PADDED) if plain else item)
        return
    display(item)
    plt.close(item)


def markdown(text: str) -> None:
    """Display ``text`` as Markdown in a page (nothing for an empty text)."""
    from IPython.display import Markdown, display

    if text:
        display(Markdown(text))


def parts(items: Sequence[str | pd.DataFrame | Figure]) -> None:
    """Display a page's pieces in order: text as markdown, tables and figures with :func:`show`."""
    for item in items:
        if isinstance(item, str):
            markdown(item)
        else:
            show(item)


def bullets(lines: list[str]) -> None:
    """Display ``lines`` as a Markdown list (nothing for no lines)."""
    markdown("\n".join(f"- {line}" for line in lines))


def card_heading(card: str, allocator: str = "default", gpus: Sequence[str] = ()) -> str:
    """The heading of one card's tables, saying where the numbers were measured (an emulated card is a capped
    GPU: ``gpus``, the GPUs its rows name, an H200 where they name none): '**80 GB card (H100 profile)** —
    measured on an H200 whose allocator is capped at 78.43 GiB, …'."""
    profile = CARDS.get(card)
    named = [a_gpu(gpu) for gpu in sorted(set(gpus), key=lambda gpu: (gpu_words(gpu) != REFERENCE_GPU, gpu))]
    on = " or ".join(named) if named else a_gpu(REFERENCE_GPU)
    allocated = "" if allocator == "default" else f" · allocator: {allocator}"
    if profile is None or profile.nominal_gb is None:
        return f"**Card: {card}**{allocated}"
    if profile.usable_gib is None:
        return f"**{profile.nominal_gb} GB card: the whole {REFERENCE_GPU}**, uncapped{allocated}"
    return (f"**{profile.nominal_gb} GB card ({card_gpu(card)} profile)** — measured on {on} whose allocator is capped at "
            f"{profile.usable_gib:.2f} GiB, what PyTorch can use on such a card (see the methodology){allocated}")  # fmt: skip


def per_card(frame: pd.DataFrame, *renderers: Callable[[pd.DataFrame], pd.DataFrame | Figure]) -> None:
    """For each card in ``frame``: a heading, then every renderer's table or figure for that card."""
    keys = ["card", "allocator"] if "allocator" in frame.columns else ["card"]
    for key, group in frame.groupby(keys):
        values = key if isinstance(key, tuple) else (key,)
        gpus = [str(gpu) for gpu in group["device_name"].dropna().unique()] if "device_name" in group.columns else []
        markdown(card_heading(str(values[0]), str(values[1]) if len(values) > 1 else "default", gpus))
        for render in renderers:
            show(render(group))
