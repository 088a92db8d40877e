"""The small phrases and number formats that tables, figures and sentences share."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.report.data import GIB_PER_MIB, SearchRow
from harness.spec import CARDS


def missing(value: Any) -> bool:
    """None or NaN: a measurement the cell does not have."""
    return value is None or bool(pd.isna(value))


def number(value: object, spec: str) -> str:
    """A table number, or a dash where the cell has none (e.g. every step was warm-up)."""
    return "—" if missing(value) else format(value, spec)


def failed_request(message: object) -> str:
    """The failed request of an OOM message: "CUDA out of memory. Tried to allocate X GiB. ..." → its 2nd sentence."""
    sentences = str(message).split(". ")
    return sentences[1] if len(sentences) > 1 else str(message)


def card_label(name: str) -> str:
    """A card as '80 GB (78.43 GiB)': its marketed size and what PyTorch may use on it."""
    profile = CARDS.get(name)
    if profile is None or profile.nominal_gb is None:
        return name
    usable = f"{profile.usable_gib:.2f} GiB" if profile.usable_gib is not None else "whole device"
    return f"{profile.nominal_gb} GB ({usable})"


def cards_in_order(names: object) -> list[str]:
    """The known cards among ``names``, smallest first."""
    present = set(names)  # type: ignore[call-overload]
    return [name for name in sorted(CARDS, key=lambda n: CARDS[n].nominal_gb or 0) if name in present]


def cell_words(row: pd.Series) -> str:
    """One cell's result in brief: '54.38 GiB · 7.98 s/step', 'OOM (Tried to allocate …)', 'crashed'."""
    if row["outcome"] == "oom":
        return f"OOM ({failed_request(row['oom_message'])})"
    if row["outcome"] != "ok":
        return row["outcome"]
    return f"{row['step_peak_alloc_mib'] * GIB_PER_MIB:.2f} GiB · {row['steady_step_time_sec']:.2f} s/step"


def ceiling_text(row: SearchRow) -> str:
    """A search's answer in words: '672' (the next probe, 704, failed), '≥ 8192', '< 32', 'running'."""
    if row.stopped:
        return f"stopped ({row.stopped})"
    if row.probes == 0:
        return "not run"
    if not row.done:
        if row.fits and row.fails:
            return f"{row.fits}–{row.fails - 1} (searching)"
        if row.fits or row.fails:
            return f"≥ {row.fits} (searching)" if row.fits else f"< {row.fails} (searching)"
        return "searching"
    if row.fails is None:
        return f"≥ {row.fits}"
    if row.fits is None:
        return f"< {row.fails}"
    return f"{row.fits}"
