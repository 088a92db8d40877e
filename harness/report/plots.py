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
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from harness.report import style, timing
from harness.report.data import GIB_PER_MIB, SearchRow
from harness.report.text import LONG_RUN_MARK, card_label, card_short, cards_in_order, missing
from harness.spec import CARDS


def doubling_factors(batches: np.ndarray, values: np.ndarray) -> float:
    """Measured growth per batch doubling: the log-log slope fitted through the points, as a factor."""
    slope = np.polyfit(np.log2(batches), np.log2(values), 1)[0]
    return float(2**slope)


def plot_op_vram(calls: pd.DataFrame, title: str) -> Figure:
    """Log-log op memory (held + backward spike) vs batch per backend, each with its measured factor.
    Each backend has its fixed colour and marker and a small sideways offset, so equal points all show."""
    figure, axis = plt.subplots(figsize=(8.4, 4.2))
    ok = calls[~calls["oom_in_replay"]]
    backends = style.in_order(ok["backend"].unique())
    for k, backend in enumerate(backends):
        group = ok[ok["backend"] == backend]
        per_batch = group.groupby("batch_size")[["saved_for_backward_mib", "backward_transient_peak_mib"]].max()
        total = per_batch.sum(axis=1).sort_index()
        if total.empty:
            continue
        label = str(backend)
        if len(total) >= 2:
            label += f" (×{doubling_factors(total.index.to_numpy(float), total.to_numpy(float)):.1f} per doubling)"
        shift = 2 ** (0.04 * (k - (len(backends) - 1) / 2))  # a few per cent sideways on the log axis
        look = style.look(str(backend))
        axis.plot(total.index.to_numpy() * shift, total.to_numpy(), marker=look.marker, markersize=look.size,
                  color=look.colour, label=label, zorder=3 + k)  # fmt: skip
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    _batch_ticks(axis, ok["batch_size"].unique())
    axis.set_xlabel("batch size")
    axis.set_ylabel("op memory: held + backward spike (MiB)")
    axis.set_title(title)
    axis.grid(True, which="both", alpha=0.3)
    style.ticks(axis)
    style.legend(axis)
    figure.tight_layout()
    return figure


def _batch_ticks(axis: Axes, batches: Iterable[int]) -> None:
    """Ticks at the measured batches only (at most 8, evenly thinned), as plain numbers."""
    shown = sorted({int(b) for b in batches})
    if not shown:
        return
    step = -(-len(shown) // 8)
    axis.set_xticks(shown[::step], [str(b) for b in shown[::step]])
    axis.minorticks_off()


def plot_ceilings(cells: pd.DataFrame, title: str) -> Figure:
    """Step peak allocated per batch and backend; OOM cells hatched at their pre-OOM peak."""
    figure, axis = plt.subplots(figsize=(8.4, 4.2))
    done = cells[cells["outcome"].isin(["ok", "oom"])]
    batches = sorted(done["batch_size"].unique())
    backends = style.in_order(done["backend"].unique())
    width = 0.8 / max(len(backends), 1)
    for i, backend in enumerate(backends):
        labelled = False
        for j, batch in enumerate(batches):
            row = done[(done["backend"] == backend) & (done["batch_size"] == batch)]
            if row.empty:
                continue
            row = row.iloc[0]
            oom = row["outcome"] == "oom"
            axis.bar(j + i * width, row["step_peak_alloc_mib"] * GIB_PER_MIB, width, color=style.colour(backend),
                     hatch="//" if oom else None, edgecolor="black" if oom else None, alpha=0.6 if oom else 1.0,
                     label=None if labelled else backend)  # fmt: skip
            labelled = True
    for cap in _caps(done["card"].unique()):
        axis.axhline(cap, color="grey", linestyle="--", linewidth=1)
        axis.text(len(batches) - 0.3, cap, f"usable: {cap} GiB", va="bottom", ha="right", fontsize=9)
    axis.set_xticks([j + width * (len(backends) - 1) / 2 for j in range(len(batches))], [str(b) for b in batches])
    axis.set_xlabel("batch size (hatched: out of memory, bar at the pre-OOM peak)")
    axis.set_ylabel("step peak allocated (GiB)")
    axis.set_title(title)
    style.ticks(axis)
    style.legend(axis)
    figure.tight_layout()
    return figure


def _caps(cards: Iterable[str]) -> set[float]:
    """The usable memory of each capped card among ``cards`` (GiB)."""
    return {cap for card in cards if (cap := CARDS[card].usable_gib)}


def probe_figures(probes: pd.DataFrame) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
    """The probes per stack, regime and card, as :func:`plot_probe_peaks` draws them one figure each: stacks
    and regimes in the order the results list them, each one's cards smallest first."""
    if probes.empty:
        return []
    groups = {(str(stack), str(regime), str(card)): group
              for (stack, regime, card), group in probes.groupby(["stack", "regime", "card"], sort=False)}  # fmt: skip
    regimes = list(dict.fromkeys((stack, regime) for stack, regime, _ in groups))
    cards = cards_in_order(card for _, _, card in groups)
    cards += sorted({card for _, _, card in groups} - set(cards))  # a card the spec does not know: last
    return [((stack, regime, card), groups[(stack, regime, card)]) for stack, regime in regimes for card in cards
            if (stack, regime, card) in groups]  # fmt: skip


def plot_probe_peaks(probes: pd.DataFrame, title: str) -> Figure:
    """One card's probes, a panel per allocator: each probe's step peak allocated (filled) and
    reserved (open) against its batch, a probe that ran out of memory at its pre-OOM reserved peak
    (open, × inside), and the card's usable memory. The gap between a probe's two markers is its fragmentation.
    Every marker sits at its probe's own batch: backends that probed the same batch are told apart by
    their marker's shape and size, the larger drawn first, so equal peaks all stay visible."""
    done = probes[probes["outcome"].isin(["ok", "oom"])]
    allocators = [name for name in ("default", "expandable") if (done["allocator"] == name).any()]
    panels = max(len(allocators), 1)
    figure, axes = plt.subplots(1, panels, figsize=(8.4, 4.8), sharex=True, sharey=True, squeeze=False)
    backends = style.in_order(done["backend"].unique())
    caps: list[Line2D] = []
    for axis, allocator_name in zip(axes[0], allocators, strict=False):
        mine = done[done["allocator"] == allocator_name]
        for backend in backends:
            _probe_markers(axis, mine[mine["backend"] == backend], backend)
        cap = mine["memory_limit_mib"].max() * GIB_PER_MIB
        if not missing(cap):
            axis.axhline(cap, color="grey", linestyle="--", linewidth=1)
            caps = caps or [Line2D([], [], color="grey", linestyle="--", linewidth=1, label=f"usable {cap:.2f} GiB")]
        axis.set_title(f"{allocator_name} allocator")
        axis.set_xlabel("batch size")
        axis.grid(True, alpha=0.3)
        style.ticks(axis)
    axes[0][0].set_ylabel("step peak (GiB)")
    keys: list[Artist | tuple[Artist, ...]] = [
        Line2D([], [], color="black", marker="o", linestyle="none"),
        Line2D([], [], color="black", marker="o", markerfacecolor="white", linestyle="none"),
        (
            Line2D([], [], color="black", marker="o", markersize=8, markerfacecolor="none", linestyle="none"),
            Line2D([], [], color="black", marker="x", markersize=4, linestyle="none"),
        ),
        *caps,
    ]
    words = ["allocated (filled)", "reserved (open)", "out of memory: reserved before it", *[str(c.get_label()) for c in caps]]
    style.legend_rows(figure, [[style.handle(b) for b in backends], keys], [backends, words])
    figure.suptitle(title, fontsize=11)
    figure.tight_layout(rect=(0, 0.55 / 4.8, 1, 1))  # the legend's two rows below the panels
    return figure


def _probe_markers(axis: Axes, rows: pd.DataFrame, backend: str) -> None:
    """One backend's probes on one panel, each at its own batch: allocated (filled), reserved (open), and a
    probe that ran out of memory at the reserved memory it held before (open, with a × inside: the backend's
    own shape, so two backends' failures at one batch both show)."""
    ok, oom = rows[rows["outcome"] == "ok"], rows[rows["outcome"] == "oom"]
    look, zorder = style.look(backend), style.layer(backend)  # a larger marker under a smaller one
    area = look.size**2  # ``scatter`` sizes are areas (points²); ``plot``'s are widths
    axis.scatter(ok["batch_size"], ok["step_peak_alloc_mib"] * GIB_PER_MIB, color=look.colour, marker=look.marker, s=area,
                 zorder=zorder)  # fmt: skip
    axis.scatter(ok["batch_size"], ok["step_peak_reserved_mib"] * GIB_PER_MIB, facecolors="none", edgecolors=look.colour,
                 marker=look.marker, s=area, zorder=zorder)  # fmt: skip
    failed = oom["pre_oom_reserved_mib"] * GIB_PER_MIB
    axis.scatter(oom["batch_size"], failed, color=look.colour, marker="x", s=area / 2, linewidths=1.1, zorder=zorder)
    axis.scatter(oom["batch_size"], failed, facecolors="none", edgecolors=look.colour, marker=look.marker, s=area * 2,
                 zorder=zorder)  # fmt: skip


def plot_ceiling_bars(searches: Sequence[SearchRow], title: str) -> Figure:
    """Ceiling per card and backend (default allocator) on a log₂ axis, as dots and ranges, never bars
    (:func:`draw_ceilings`), with the legend off the data."""
    figure, axis = plt.subplots(figsize=(9.6, 4.6))
    if draw_ceilings(axis, searches):
        handles, labels = _legend_entries(axis, searches)
        axis.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=style.LEGEND_PT, frameon=False)
    axis.set_title(title)
    figure.tight_layout()
    return figure


def plot_decision(panels: Sequence[tuple[str, Sequence[SearchRow]]]) -> Figure:
    """The front page's figure: one ceilings panel (:func:`draw_ceilings`) per stack and regime that
    has probes, side by side, sharing one legend below them."""
    shown = [(title, rows) for title, rows in panels if any(row.fits or row.fails for row in rows)]
    figure, axes = plt.subplots(1, max(len(shown), 1), figsize=(4.6 * max(len(shown), 1) + 0.6, 4.4), squeeze=False)
    for axis, (title, rows) in zip(axes[0], shown, strict=False):
        draw_ceilings(axis, rows, short_cards=True)
        axis.set_title(title, fontsize=10)
    if shown:
        handles, labels = _legend_entries(axes[0][0], [row for _, rows in shown for row in rows])
        figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=style.LEGEND_PT, frameon=False)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    return figure


def _legend_entries(axis: Axes, rows: Sequence[SearchRow]) -> tuple[list[Any], list[str]]:
    """Legend handles for every backend in ``rows`` (fixed order) and the two search states."""
    handles: list[Any] = []
    labels: list[str] = []
    for backend in style.in_order({row.backend for row in rows if row.allocator == "default"}):
        look = style.look(backend)
        (handle,) = axis.plot([], [], marker=look.marker, markersize=look.size + 1, color=look.colour, linestyle="none")
        handles.append(handle)
        labels.append(backend)
    for label, face, line in (("search finished", "black", "-"), ("search still running", "white", "--")):
        (handle,) = axis.plot([], [], color="black", marker="o", markerfacecolor=face, linestyle=line)
        handles.append(handle)
        labels.append(label)
    if any(row.long_run is not None and row.long_run.ran_out for row in rows if row.allocator == "default"):
        (handle,) = axis.plot([], [], color="black", marker=f"${LONG_RUN_MARK}$", linestyle="none")
        handles.append(handle)
        labels.append("a long run at it ran out of memory")
    return handles, labels


def draw_ceilings(axis: Axes, searches: Sequence[SearchRow], short_cards: bool = False) -> bool:
    """Draw each default-allocator search as a dot and range on a log₂ axis: a finished search is a
    filled dot at the largest batch that trained with a line up to the first batch that failed; a
    search still under way is an open dot with a dashed line over the range it has not settled yet (up
    to the smallest batch that failed, or an arrow where none failed yet). ``short_cards``: ticks name
    the card's size only, for narrow panels. False when nothing to draw."""
    shown = [row for row in searches if row.allocator == "default" and (row.fits or row.fails)]
    if not shown:
        return False
    cards = cards_in_order(row.card for row in shown)
    backends = style.in_order({row.backend for row in shown})
    width = 0.7 / max(len(backends), 1)
    for i, backend in enumerate(backends):
        look = style.look(backend)
        for k, card in enumerate(cards):
            row = next((r for r in shown if r.backend == backend and r.card == card), None)
            if row is None:
                continue
            x = k + (i - (len(backends) - 1) / 2) * width
            low = float(row.fits or (row.fails or 2) / 2)  # no batch fitted yet: the range starts below the failure
            high = float(row.fails or 1.5 * low)  # none failed yet: an arrow up from the largest that fitted
            axis.plot([x, x], [low, high], color=look.colour, linestyle="-" if row.done else "--", linewidth=1.6)
            if row.fails is not None:  # a bar across the range's top: the first batch that failed
                axis.plot([x], [row.fails], marker="_", markersize=10, markeredgewidth=1.6, color=look.colour)
            if row.fails is None:
                axis.annotate("", (x, high), (x, high / 1.1), arrowprops={"arrowstyle": "->", "color": look.colour})
            if row.fits:
                axis.plot([x], [row.fits], marker=look.marker, markersize=look.size + 1, color=look.colour,
                          markerfacecolor=look.colour if row.done else "white", linestyle="none")  # fmt: skip
            if row.fits and row.long_run is not None and row.long_run.ran_out:  # a long run at it ran out of memory
                axis.annotate(LONG_RUN_MARK, (x, row.fits), textcoords="offset points", xytext=(-14, -4),
                              color=look.colour, fontsize=11, fontweight="bold")  # fmt: skip
    labels = [card_short(c).replace(" (whole H200)", "\nwhole H200") if short_cards else card_label(c, lines=True) for c in cards]
    axis.set_xticks(range(len(cards)), labels)
    axis.set_xlim(-0.6, len(cards) - 0.4)
    axis.set_yscale("log", base=2)
    lowest = min(float(row.fits or (row.fails or 2) / 2) for row in shown)
    axis.set_ylim(bottom=lowest / 1.25)
    axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_ylabel("largest batch that trains (log₂)")
    axis.grid(True, axis="y", alpha=0.3)
    style.ticks(axis)
    return True


def plot_op_speedup(ops: pd.DataFrame, title: str) -> Figure | None:
    """Fused speedup over vanilla vs batch size, with its bootstrap 95% interval as an error bar: one panel
    per head, a line per backend × negatives (the backend's colour, a line style per number of negatives);
    None where no op cell was timed under the timing rule (no time to draw)."""
    if ops.empty or "times_comparable" not in ops:  # no op cell committed: no column to read
        return None
    done = ops[(ops["outcome"] == "ok") & ops["times_comparable"].astype(bool)]  # times under the timing rule only
    heads = list(dict.fromkeys(zip(done["stack"], done["regime"], strict=True)))
    if not heads:
        return None
    columns = min(len(heads), 2)
    rows = -(-len(heads) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.1 * columns, 3.1 * rows), squeeze=False, sharey=True)
    dashes = ["-", "--", ":", "-."]
    negatives_seen = sorted({int(n) for n in done["negatives"].dropna()})
    for axis, (stack, head) in zip(axes.flat, heads, strict=False):
        mine = done[(done["stack"] == stack) & (done["regime"] == head)]
        for key, group in mine.groupby(["negatives", "variant"], dropna=False):
            negatives, variant = cast(tuple[Any, str], key)
            if variant == "vanilla":
                continue
            same = mine["negatives"].fillna(-1) == (-1 if pd.isna(negatives) else negatives)
            vanilla = mine[same & (mine["variant"] == "vanilla")]
            joined = group.merge(vanilla[["batch_size", "steady_times_sec"]], on="batch_size", suffixes=("", "_vanilla"))
            if joined.empty:
                continue
            joined = joined.sort_values("batch_size")
            look = style.look(variant)
            line = "-" if pd.isna(negatives) else dashes[negatives_seen.index(int(negatives)) % len(dashes)]
            label = variant + ("" if pd.isna(negatives) else f", N={int(negatives)}")
            speedups = [timing.ratio(list(base), list(mine))  # the table's ratio: vanilla's median over the backend's
                        for base, mine in zip(joined["steady_times_sec_vanilla"], joined["steady_times_sec"], strict=True)]
            value = np.array([speedup.value for speedup in speedups])
            spread = np.array([[speedup.value - speedup.low for speedup in speedups],
                               [speedup.high - speedup.value for speedup in speedups]])  # its bootstrap 95% interval
            axis.errorbar(joined["batch_size"], value, yerr=spread, marker=look.marker, markersize=look.size - 1,
                          color=look.colour, linestyle=line, capsize=3, label=label)  # fmt: skip
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_xscale("log", base=2)
        _batch_ticks(axis, mine["batch_size"].unique())
        axis.set_title(f"{stack.removeprefix('op-')} · {head}", fontsize=10)
        axis.set_xlabel("batch size")
        axis.grid(True, alpha=0.3)
        style.ticks(axis)
        if len(axis.get_legend_handles_labels()[1]) > 0:
            axis.legend(fontsize=style.LEGEND_PT, frameon=False, loc="upper left")  # speedups grow with the batch
    for axis in axes.flat[len(heads) :]:
        axis.set_visible(False)
    for axis in axes[:, 0]:
        axis.set_ylabel("speedup over vanilla (×)")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_loss_curves(panels: Sequence[tuple[str, dict[str, list[float]]]]) -> Figure:
    """Training parity: one row per stack, regime and batch, titled across the row; every backend's loss per step
    (left) and its |Δloss| against vanilla's at the same step (right, log scale; vanilla has none)."""
    rows = max(len(panels), 1)
    figure = plt.figure(figsize=(10, 2.9 * rows + 0.5), layout="constrained")
    shown: dict[str, Any] = {}
    for subfigure, (title, curves) in zip(figure.subfigures(rows, 1, squeeze=False)[:, 0], panels, strict=False):
        left, right = subfigure.subplots(1, 2)
        base = curves.get("vanilla")
        for backend in style.in_order(curves):
            look, losses = style.look(backend), curves[backend]
            steps = np.arange(1, len(losses) + 1)
            (line,) = left.plot(steps, losses, color=look.colour, linestyle="-" if backend == "vanilla" else "--",
                                linewidth=1.6 if backend == "vanilla" else 1.3)  # fmt: skip
            shown.setdefault(backend, line)
            if base is not None and backend != "vanilla":
                n = min(len(base), len(losses))
                gaps = np.abs(np.asarray(losses[:n]) - np.asarray(base[:n]))
                right.plot(steps[:n], np.maximum(gaps, 1e-6), color=look.colour, linewidth=1.3)
        subfigure.suptitle(title, fontsize=10)  # one title per row: two long titles side by side overlap
        right.set_yscale("log")
        left.set_ylabel("training loss")
        right.set_ylabel("|loss − vanilla's|")
        for axis in (left, right):
            axis.set_xlabel("optimizer step")
            style.ticks(axis)
            axis.grid(alpha=0.3)
    if shown:
        order = style.in_order(shown)
        figure.legend([shown[b] for b in order], order, loc="outside lower center", ncol=len(order),
                      fontsize=style.LEGEND_PT + 1, frameon=False)  # fmt: skip
    return figure
