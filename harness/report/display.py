"""Showing tables and figures in a page (IPython display): the one layer that writes output."""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from pandas.io.formats.style_render import CSSDict

from harness.spec import CARDS

PADDED: list[CSSDict] = [{"selector": "td, th", "props": "padding: 0.25em 0.7em;"}]  # columns never run into each other


def show(item: pd.DataFrame | Figure) -> None:
    """Display a table (full cell text, no row numbers) or a figure (then close it) in a page."""
    from IPython.display import display

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


def bullets(lines: list[str]) -> None:
    """Display ``lines`` as a Markdown list (nothing for no lines)."""
    markdown("\n".join(f"- {line}" for line in lines))


def card_heading(card: str, allocator: str = "default") -> str:
    """The heading of one card's tables: '**Card: h100-80gb** — NVIDIA H100 …', with a non-default allocator."""
    described = f" — {CARDS[card].description}" if card in CARDS else ""
    allocated = "" if allocator == "default" else f" · allocator: {allocator}"
    return f"**Card: {card}**{described}{allocated}"


def per_card(frame: pd.DataFrame, *renderers: Callable[[pd.DataFrame], pd.DataFrame | Figure]) -> None:
    """For each card in ``frame``: a heading, then every renderer's table or figure for that card."""
    keys = ["card", "allocator"] if "allocator" in frame.columns else ["card"]
    for key, group in frame.groupby(keys):
        values = key if isinstance(key, tuple) else (key,)
        markdown(card_heading(str(values[0]), str(values[1]) if len(values) > 1 else "default"))
        for render in renderers:
            item = render(group)
            if not (isinstance(item, pd.DataFrame) and item.empty):
                show(item)
