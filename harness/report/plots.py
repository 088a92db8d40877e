"""Figures the pages show (matplotlib), computed from the frames and rows of :mod:`harness.report.data`.

Figures annotate slopes measured from the data, so a figure can never assert a scaling its points
do not show.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.report.data import GIB_PER_MIB, SearchRow, finished
from harness.report.text import card_label, cards_in_order, missing
from harness.spec import CARDS


def doubling_factors(batches: np.ndarray, values: np.ndarray) -> float:
    """Measured growth per batch doubling: the log-log slope fitted through the points, as a factor."""
    slope = np.polyfit(np.log2(batches), np.log2(values), 1)[0]
    return float(2**slope)


def plot_op_vram(calls: pd.DataFrame, title: str) -> Figure:
    """Log-log op memory (held + backward spike) vs batch per backend, each with its measured factor."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for backend, group in calls[~calls["oom_in_replay"]].groupby("backend"):
        per_batch = group.groupby("batch_size")[["saved_for_backward_mib", "backward_transient_peak_mib"]].max()
        total = per_batch.sum(axis=1).sort_index()
        if total.empty:
            continue
        label = str(backend)
        if len(total) >= 2:
            label += f" (×{doubling_factors(total.index.to_numpy(float), total.to_numpy(float)):.1f} per doubling)"
        axis.plot(total.index.to_numpy(), total.to_numpy(), marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("batch size")
    axis.set_ylabel("MaxSim op memory, held + backward spike (MiB)")
    axis.set_title(title)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return figure


def plot_ceilings(cells: pd.DataFrame, title: str) -> Figure:
    """Step peak allocated per batch and backend; OOM cells hatched at their pre-OOM peak."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    done = cells[cells["outcome"].isin(["ok", "oom"])]
    batches = sorted(done["batch_size"].unique())
    backends = sorted(done["backend"].unique())
    width = 0.8 / max(len(backends), 1)
    for i, backend in enumerate(backends):
        labelled = False
        for j, batch in enumerate(batches):
            row = done[(done["backend"] == backend) & (done["batch_size"] == batch)]
            if row.empty:
                continue
            row = row.iloc[0]
            oom = row["outcome"] == "oom"
            axis.bar(j + i * width, row["step_peak_alloc_mib"] * GIB_PER_MIB, width, color=f"C{i}",
                     hatch="//" if oom else None, edgecolor="black" if oom else None, alpha=0.6 if oom else 1.0,
                     label=None if labelled else backend)  # fmt: skip
            labelled = True
    for cap in _caps(done["card"].unique()):
        axis.axhline(cap, color="grey", linestyle="--", linewidth=1)
        axis.text(len(batches) - 0.5, cap, f"card: {cap} GiB", va="bottom", ha="right", fontsize=8)
    axis.set_xticks([j + width * (len(backends) - 1) / 2 for j in range(len(batches))], [str(b) for b in batches])
    axis.set_xlabel("batch size (hatched: out of memory, bar at the pre-OOM peak)")
    axis.set_ylabel("step peak allocated (GiB)")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    return figure


def _caps(cards: Iterable[str]) -> set[float]:
    """The usable memory of each capped card among ``cards`` (GiB)."""
    return {cap for card in cards if (cap := CARDS[card].usable_gib)}


def plot_probe_peaks(probes: pd.DataFrame, title: str) -> Figure:
    """One card's probes, a panel per allocator: each probe's step peak allocated (filled) and
    reserved (open) against its batch, a probe that ran out of memory at its pre-OOM reserved peak
    (×), and the card's usable memory. The gap between a probe's two markers is its fragmentation.
    Each backend has its own marker and a small sideways offset, so equal peaks stay visible."""
    done = probes[probes["outcome"].isin(["ok", "oom"])]
    allocators = [name for name in ("default", "expandable") if (done["allocator"] == name).any()]
    panels = max(len(allocators), 1)
    figure, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 4.6), sharex=True, sharey=True, squeeze=False)
    backends = sorted(done["backend"].unique())
    spread = 0.012 * (done["batch_size"].max() if not done.empty else 1)
    for axis, allocator_name in zip(axes[0], allocators, strict=False):
        mine = done[done["allocator"] == allocator_name]
        for i, backend in enumerate(backends):
            _probe_markers(axis, mine[mine["backend"] == backend], backend, i, (i - (len(backends) - 1) / 2) * spread)
        cap = mine["memory_limit_mib"].max() * GIB_PER_MIB
        if not missing(cap):
            axis.axhline(cap, color="grey", linestyle="--", linewidth=1, label=f"usable {cap:.2f} GiB")
        axis.set_title(f"{allocator_name} allocator")
        axis.set_xlabel("batch size")
        axis.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("step peak (GiB)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8, frameon=False)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.06 * (1 + len(labels) // 4), 1, 1))
    return figure


def _probe_markers(axis: plt.Axes, rows: pd.DataFrame, backend: str, index: int, shift: float) -> None:
    """One backend's probes on one panel: allocated (filled), reserved (open), out of memory (×)."""
    markers = ["o", "s", "^", "D"]
    ok, oom = rows[rows["outcome"] == "ok"], rows[rows["outcome"] == "oom"]
    colour, marker = f"C{index}", markers[index % len(markers)]
    axis.scatter(ok["batch_size"] + shift, ok["step_peak_alloc_mib"] * GIB_PER_MIB, color=colour, marker=marker,
                 label=f"{backend}: allocated")  # fmt: skip
    axis.scatter(ok["batch_size"] + shift, ok["step_peak_reserved_mib"] * GIB_PER_MIB, facecolors="none",
                 edgecolors=colour, marker=marker, label=f"{backend}: reserved")  # fmt: skip
    axis.scatter(oom["batch_size"] + shift, oom["pre_oom_reserved_mib"] * GIB_PER_MIB, color=colour, marker="x",
                 label=f"{backend}: out of memory (reserved before it)")  # fmt: skip


def plot_ceiling_bars(searches: Sequence[SearchRow], title: str) -> Figure:
    """Ceiling per card and backend (default allocator); a whisker up to the first batch that failed."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    if not searches:
        return figure
    done = finished(searches, "default")
    cards = cards_in_order(row.card for row in done)
    backends = sorted({row.backend for row in done})
    width = 0.8 / max(len(backends), 1)
    for i, backend in enumerate(backends):
        mine = {row.card: row for row in done if row.backend == backend}
        shown = [(k, mine[card]) for k, card in enumerate(cards) if card in mine]
        above = [0 if row.fails is None else row.fails - row.fits for _, row in shown]
        axis.bar([k + i * width for k, _ in shown], [row.fits for _, row in shown], width, label=backend,
                 yerr=[[0] * len(above), above], capsize=3)  # fmt: skip
    axis.set_xticks([k + width * (len(backends) - 1) / 2 for k in range(len(cards))], [card_label(c) for c in cards])
    axis.set_yscale("log", base=2)
    axis.set_ylabel("largest batch that trains (log₂)")
    axis.set_title(title)
    axis.grid(True, axis="y", alpha=0.3)
    if backends:
        axis.legend()
    figure.tight_layout()
    return figure


def plot_op_speedup(ops: pd.DataFrame, title: str) -> Figure:
    """Fused speedup over vanilla vs batch size, one line per head × negatives × backend."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    done = ops[ops["outcome"] == "ok"]
    for key, group in done.groupby(["stack", "regime", "negatives", "variant"], dropna=False):
        stack, head, negatives, variant = cast(tuple[str, str, Any, str], key)
        if variant == "vanilla":
            continue
        vanilla = done[(done["stack"] == stack) & (done["regime"] == head) & (done["variant"] == "vanilla")
                       & (done["negatives"].fillna(-1) == (-1 if pd.isna(negatives) else negatives))]  # fmt: skip
        joined = group.merge(vanilla[["batch_size", "steady_step_time_sec"]], on="batch_size", suffixes=("", "_vanilla"))
        if joined.empty:
            continue
        joined = joined.sort_values("batch_size")
        label = f"{stack.removeprefix('op-')} {head}" + ("" if pd.isna(negatives) else f" N={int(negatives)}") + f" · {variant}"
        speedup = joined["steady_step_time_sec_vanilla"] / joined["steady_step_time_sec"]
        axis.plot(joined["batch_size"], speedup, marker="o", label=label)
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("batch size")
    axis.set_ylabel("speedup over vanilla (forward + backward)")
    axis.set_title(title)
    if axis.lines[1:]:
        axis.legend(fontsize=7)
    figure.tight_layout()
    return figure
