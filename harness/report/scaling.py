"""Where MaxSim decides the batch: GradCache (PyLate's ``CachedContrastive``) and negatives gathered
across GPUs — the two pages' measurements, the predictions beside them, and their sentences.

A *measured* figure comes from a committed result. A *predicted* one is the exact op formula of the
replays (:mod:`harness.op_bytes`, which every vanilla replay matches to the MiB) evaluated at a
recorded call's shapes with the batch or the world size changed; the pages label every predicted
figure as such.

GradCache: the loss scores one chunk of ``score_mini_batch_size`` queries (default: the encoder's
mini-batch) against all B documents at a time, so vanilla's score call — the grid of that chunk
against every document — grows linearly with B while the encoder's memory does not.

Gathering: each rank scores its B local queries against the B·W documents of all ranks, so its
vanilla grid grows with W. The per-rank step peak at W is predicted as the measured W = 1 peak plus
what the op needs beyond W = 1: for vanilla the growth of its forward peak; for a fused backend,
which never builds the grid, the other ranks' documents and their gradient.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from harness import op_bytes
from harness.grid import load_grid
from harness.report import data, style, tables, timing
from harness.report.decision import PREDICTED_BREAK, regime_name
from harness.report.text import (
    STACK_NAMES,
    a_gpu,
    as_published,
    card_short,
    cards_in_order,
    counted,
    joined,
    nowrap,
    other_gpu,
    seed_words,
    signed,
)
from harness.results import CellResult
from harness.search import MIN_STEPS, REFERENCE_GPU
from harness.spec import CARDS, GRADCACHE, GRADCACHE_MINI_BATCH, TrainSpec

MIB = 1024 * 1024
GIB_MIB = 1024.0
WORLDS = (1, 2, 4, 8)
PREDICTED_BATCHES = (1024, 4096, 16384)
GATHER_CARD = "h100-80gb"
MULTI_GPU_GRID = Path(__file__).resolve().parents[2] / "grids" / "multi-gpu.yaml"
GRADCACHE_GRID = Path(__file__).resolve().parents[2] / "grids" / "gradcache.yaml"


def _gib(mib: float) -> str:
    return f"{mib / GIB_MIB:.2f}"


def _card(name: str) -> str:
    """A card as a narrow table cell: '141 GB', '80 GB'."""
    return nowrap(card_short(name).split(" (")[0])


# ---- GradCache -----------------------------------------------------------------------------------


def score_chunk(row: pd.Series) -> int:
    """The queries one GradCache score call takes: ``score_mini_batch_size``, else the mini-batch."""
    for column in ("score_mini_batch_size", "mini_batch_size"):
        value = row.get(column)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            return int(value)
    return GRADCACHE_MINI_BATCH


def largest_calls(calls: pd.DataFrame, stack: str, regime: str) -> pd.DataFrame:
    """Per cell of a regime, its isolated replay with the largest forward peak (one row per cell)."""
    chosen = data.select(calls, stack, regime) if not calls.empty else calls
    if chosen.empty:
        return chosen
    chosen = chosen[chosen["forward_transient_peak_mib"].notna()]
    return chosen.sort_values("forward_transient_peak_mib").groupby("path", sort=False).tail(1)


def predicted_call_mib(call: pd.Series, chunk: int, batch: int) -> float:
    """Vanilla's GradCache score call (forward peak above its inputs, MiB) for ``chunk`` queries
    against ``batch`` documents, at the recorded call's lengths, slots, width and dtype."""
    query = [chunk, *list(call["query_shape"])[1:]]
    docs = [batch, *list(call["doc_shape"])[1:]]
    return op_bytes.pylate_scores(query, docs, op_bytes.ITEMSIZE[str(call["dtype"])]).forward_transient / MIB


def batch_over(call: pd.Series, chunk: int, usable_gib: float) -> int:
    """The smallest batch at which vanilla's score call alone needs more than ``usable_gib``: every
    term of the formula is proportional to the documents, so it is the usable bytes over one
    document's share, rounded up."""
    per_document = predicted_call_mib(call, chunk, 1)
    return math.floor(usable_gib * GIB_MIB / per_document) + 1


@dataclasses.dataclass(frozen=True)
class Reach:
    """A fused GradCache cell's proof that its backend ran inside the cached loss: the backend's
    entry-point calls beside the score calls recorded in training."""

    cell_id: str
    backend: str
    entry_point_calls: int
    score_calls: int


def gradcache_cells(cells: pd.DataFrame) -> pd.DataFrame:
    return data.select(cells, "pylate", GRADCACHE) if not cells.empty else cells


def reaches(cells: pd.DataFrame) -> list[Reach]:
    """The fused cells of the GradCache regime that trained, each with its entry-point count."""
    chosen = gradcache_cells(cells)
    out = []
    for _, row in chosen[(chosen["variant"] != "vanilla") & (chosen["outcome"] == "ok")].iterrows():
        calls = row["backend_entry_point_calls"]
        out.append(Reach(str(row["cell_id"]), str(row["backend"]), 0 if pd.isna(calls) else int(calls),
                         int(row["n_calls_in_train"])))  # fmt: skip
    return out


def peak_table(cells: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Measured, per GradCache cell: the step peak, the largest score call's forward peak (its
    isolated replay) and that call's share of the step peak, and what the fused kernels' entry
    points counted."""
    chosen = gradcache_cells(cells)
    if chosen.empty:
        return pd.DataFrame()
    largest = largest_calls(calls, "pylate", GRADCACHE).set_index("path") if not calls.empty else pd.DataFrame()
    rows = []
    order = {card: k for k, card in enumerate(cards_in_order(chosen["card"]))}
    chosen = chosen.assign(_card=chosen["card"].map(order),
                           _backend=chosen["backend"].map(lambda b: style.in_order(chosen["backend"]).index(b)))  # fmt: skip
    for _, row in chosen.sort_values(["_card", "batch_size", "_backend"]).iterrows():
        call = largest.loc[row["path"]] if row["path"] in largest.index else None
        peak = row["step_peak_alloc_mib"] if row["outcome"] == "ok" else row["pre_oom_alloc_mib"]
        forward = None if call is None else float(call["forward_transient_peak_mib"])
        rows.append({
            "card": _card(str(row["card"])),
            "B": int(row["batch_size"]),
            "backend": row["backend"],
            "chunk": score_chunk(row),
            "step peak alloc / reserved (GiB)": nowrap(f"{_gib(peak)} / {_gib(row['step_peak_reserved_mib'])}")
            if row["outcome"] == "ok" else f"OOM (at {_gib(peak)})",
            "score call (GiB)": "—" if forward is None else _gib(forward),
            "share of peak": "—" if forward is None or not peak else f"{forward / peak:.0%}",
            "kernel entries / calls": "—" if row["variant"] == "vanilla"
            else f"{int(row['backend_entry_point_calls'] or 0)} / {int(row['n_calls_in_train'])}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def vanilla_replays(calls: pd.DataFrame) -> pd.DataFrame:
    """Per vanilla GradCache cell, its largest isolated replay that did not run out of memory."""
    largest = largest_calls(calls, "pylate", GRADCACHE)
    if largest.empty:
        return largest
    return largest[(largest["variant"] == "vanilla") & ~largest["oom_in_replay"].astype(bool)]


def vanilla_reference(cells: pd.DataFrame, calls: pd.DataFrame) -> tuple[pd.Series, int] | None:
    """The vanilla GradCache replay with the largest forward on the whole H200, and its score chunk:
    the recorded shape the predictions scale."""
    vanilla = vanilla_replays(calls)
    if vanilla.empty:
        return None
    call = vanilla.sort_values(["batch_size", "forward_transient_peak_mib"]).iloc[-1]
    return call, score_chunk(call)


def chunks_of(cells: pd.DataFrame) -> list[int]:
    """The score chunks the committed vanilla GradCache cells used, largest first."""
    chosen = gradcache_cells(cells)
    if chosen.empty:
        return []
    vanilla = chosen[chosen["variant"] == "vanilla"]
    return sorted({score_chunk(row) for _, row in vanilla.iterrows()}, reverse=True)


def prediction_table(cells: pd.DataFrame, calls: pd.DataFrame,
                     batches: Sequence[int] = PREDICTED_BATCHES) -> pd.DataFrame:  # fmt: skip
    """Predicted: vanilla's score call (GiB) per score chunk and batch, and the first batch at which
    that call alone needs more than each card's usable memory — a lower bound on where vanilla stops,
    since the call sits on top of the cached embeddings, the weights and the optimizer's state."""
    found = vanilla_reference(cells, calls)
    if found is None:
        return pd.DataFrame()
    call, _ = found
    rows = []
    for chunk in chunks_of(cells):
        row: dict[str, Any] = {"chunk (queries)": chunk}
        row |= {f"GiB at B={batch}": _gib(predicted_call_mib(call, chunk, batch)) for batch in batches}
        row |= {f"over {_card(name)} from B": f"{batch_over(call, chunk, card.usable_gib):,}"
                for name, card in CARDS.items() if card.usable_gib is not None}  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def formula_gap_mib(calls: pd.DataFrame) -> float | None:
    """The largest gap between a vanilla GradCache replay's forward peak and the formula (MiB)."""
    vanilla = vanilla_replays(calls)
    if vanilla.empty:
        return None
    gaps = [abs(float(r["forward_transient_peak_mib"]) - predicted_call_mib(r, int(r["query_shape"][0]), int(r["doc_shape"][0])))
            for _, r in vanilla.iterrows()]  # fmt: skip
    return max(gaps)


def gradcache_reading(cells: pd.DataFrame, calls: pd.DataFrame, noise: float | None = None) -> list[str]:
    """The page's first screen: what ran, whether the fused kernels reached the cached loss, whether
    the MaxSim grid sets the step peak at the measured batches, what they cost in time, and where
    vanilla's score call alone would fill each card (predicted)."""
    chosen = gradcache_cells(cells)
    if chosen.empty:
        return ["No GradCache cell has been committed yet."]
    lines = []
    ran = chosen[chosen["outcome"].isin(["ok", "oom"])]
    per_card = []
    for card in cards_in_order(ran["card"]):
        mine = ran[ran["card"] == card]
        batches = ", ".join(str(b) for b in sorted(mine["batch_size"].unique()))
        per_card.append(f"{card_short(card)}: B = {batches} ({', '.join(style.in_order(mine['backend'].unique()))})")
    oom = ran[ran["outcome"] == "oom"]
    lines.append(f"Measured: {len(ran)} cells — " + "; ".join(per_card) + ". "
                 + ("Every one trained." if oom.empty else f"{len(oom)} ran out of memory: "
                    + ", ".join(oom["cell_id"]) + "."))  # fmt: skip
    fused = reaches(cells)
    if fused:
        missed = [r for r in fused if r.entry_point_calls == 0]
        counts = joined([f"{r.backend} {r.entry_point_calls} for {r.score_calls}" for r in fused
                        if r.cell_id.endswith("-native")] or [f"{r.backend} {r.entry_point_calls}" for r in fused])  # fmt: skip
        lines.append("The fused kernels run inside the cached loss: "
                     + ("every fused cell's kernel entry points counted calls in training (" + counts
                        + " score calls recorded, on the whole H200)." if not missed else
                        "**not** in " + ", ".join(r.cell_id for r in missed) + "."))  # fmt: skip
    lines += _peak_sentences(ran, calls)
    lines += _time_sentences(chosen, noise)
    found = vanilla_reference(cells, calls)
    if found is not None:
        call, _ = found
        gap = formula_gap_mib(calls)
        parts = []
        for chunk in chunks_of(cells):
            over = [f"{card_short(name)} from B = {batch_over(call, chunk, card.usable_gib):,}"
                    for name, card in CARDS.items() if card.usable_gib is not None]  # fmt: skip
            parts.append(f"with {chunk} queries per score call, " + joined(over))
        agree = "to the MiB" if gap is not None and gap < 1 else f"within {gap:.1f} MiB"
        lines.append("Predicted (the op formula at the recorded shapes, which every vanilla GradCache replay matches "
                     f"{agree}): vanilla's score call grows linearly with B and alone needs more than a "
                     "card's usable memory " + "; ".join(parts) + ". Vanilla stops at or before these batches (the call "
                     "sits on top of the cached embeddings, the weights and the optimizer); the fused backends never "
                     "build that grid.")  # fmt: skip
    fused_words = fused_reach_words(fused_reach(cells))
    if fused_words:
        lines.append(fused_words)
    return lines


@dataclasses.dataclass(frozen=True)
class FusedReach:
    """A fused backend's GradCache step peak as a line through its measured batches, and where that line
    (plus what the allocator reserved above the peak at the largest batch) passes each capped card."""

    backend: str
    batches: tuple[int, ...]  # the measured batches the line goes through
    per_sample_mib: float  # its slope
    reserved_above_mib: float  # reserved less allocated at the largest measured batch
    over: dict[str, int]  # card: the first batch predicted not to fit (rounded to 100)


def fused_reach(cells: pd.DataFrame) -> list[FusedReach]:
    """Per fused backend with GradCache cells that trained at two batches or more: a least-squares line through
    its step peaks (allocated, the mean per batch) and the first batch whose peak plus the reserved-above-allocated
    of its largest batch passes each capped card's usable memory. An extrapolation, labelled as one."""
    chosen = gradcache_cells(cells)
    if chosen.empty:
        return []
    chosen = chosen[(chosen["variant"] != "vanilla") & (chosen["outcome"] == "ok")]
    out = []
    for backend in style.in_order(chosen["backend"].unique()):
        mine = chosen[chosen["backend"] == backend]
        by_batch = mine.groupby("batch_size")[["step_peak_alloc_mib", "step_peak_reserved_mib"]].mean()
        if len(by_batch) < 2:
            continue
        batches = by_batch.index.to_numpy(dtype=float)
        slope, intercept = np.polyfit(batches, by_batch["step_peak_alloc_mib"].to_numpy(), 1)
        if slope <= 0:
            continue
        largest = by_batch.iloc[-1]
        above = float(largest["step_peak_reserved_mib"] - largest["step_peak_alloc_mib"])
        over = {name: int(round((card.usable_gib * 1024 - above - intercept) / slope, -2))
                for name, card in CARDS.items() if card.usable_gib is not None}  # fmt: skip
        out.append(FusedReach(backend, tuple(int(b) for b in by_batch.index), float(slope), above, over))
    return out


def fused_reach_words(reach: Sequence[FusedReach]) -> str:
    """The fused backends' predicted reach in words (empty where none has two measured batches)."""
    if not reach:
        return ""
    batches = joined([f"{batch:,}" for batch in sorted({b for r in reach for b in r.batches})])
    slopes = joined([f"{r.backend} {r.per_sample_mib:.2f} MiB a sample" for r in reach])
    parts = [f"{r.backend} would fill " + joined([f"{card_short(name)} at B ≈ {batch:,}" for name, batch in r.over.items()])
             + f" ({r.reserved_above_mib:.0f} MiB reserved above its peak)" for r in reach]  # fmt: skip
    return (f"Predicted for the fused backends, extrapolated from the measured batches (B = {batches}): a straight "
            f"line through each one's step peaks ({slopes}) plus what the allocator reserved above the peak at the "
            f"largest batch — {'; '.join(parts)}. A line through "
            f"{'two batches' if max(len(r.batches) for r in reach) == 2 else 'few batches'}, not a measurement: the "
            "ceiling searches decide.")  # fmt: skip


def _peak_sentences(ran: pd.DataFrame, calls: pd.DataFrame) -> list[str]:
    lines = []
    largest = largest_calls(calls, "pylate", GRADCACHE)
    for card in cards_in_order(ran["card"]):
        for batch in sorted(ran[ran["card"] == card]["batch_size"].unique()):
            mine = ran[(ran["card"] == card) & (ran["batch_size"] == batch) & (ran["outcome"] == "ok")]
            vanilla = mine[mine["backend"] == "vanilla"]
            if vanilla.empty or len(mine) < 2:
                continue
            base = float(vanilla["step_peak_alloc_mib"].iloc[0])
            spread = max(abs(float(p) - base) for p in mine["step_peak_alloc_mib"])
            call = largest[largest["path"] == vanilla["path"].iloc[0]] if not largest.empty else largest
            forward = None if call.empty else float(call["forward_transient_peak_mib"].iloc[0])
            share = "" if forward is None else (
                f"; vanilla's largest score call needs {_gib(forward)} GiB above its inputs ({forward / base:.0%} of "
                "that peak) and still does not raise it")
            same = spread <= max(0.01 * base, 64)
            if same:
                lines.append(f"At B = {batch} on the {card_short(card)} card, every backend's step peak is within "
                             f"{spread:.0f} MiB of vanilla's {_gib(base)} GiB: the step's peak is set outside the MaxSim op"
                             + share + ".")  # fmt: skip
                continue
            # the backends differ in the MaxSim op alone: a peak apart from vanilla's by more than 1% is the op's
            others = mine[mine["backend"] != "vanilla"]
            their = zip(others["backend"], others["step_peak_alloc_mib"].astype(float), strict=True)
            peaks = joined([f"{backend}'s {_gib(peak)} GiB ({base / peak:.2f}× less)" for backend, peak in their])
            call_words = "" if forward is None else (
                f"; its largest score call alone needs {_gib(forward)} GiB above its inputs, {forward / base:.0%} of that peak")
            reserved = float(vanilla["step_peak_reserved_mib"].iloc[0])
            held = zip(others["backend"], others["step_peak_reserved_mib"].astype(float), strict=True)
            reserved_words = joined([f"{backend}'s {_gib(peak)} GiB ({reserved / peak:.2f}× less)" for backend, peak in held])
            lines.append(f"At B = {batch} on the {card_short(card)} card, the MaxSim op sets the step's peak: vanilla's is "
                         f"{_gib(base)} GiB{call_words}; the other backends peak at {peaks}. The most the allocator reserved "
                         f"from the card in a step, which is what must fit it: vanilla {_gib(reserved)} GiB "
                         f"({_gib(reserved - base)} GiB above its allocated peak), {reserved_words}.")  # fmt: skip
    return lines


def _time_sentences(chosen: pd.DataFrame, noise: float | None = None) -> list[str]:
    """Each timed batch's speed against vanilla, read against ``noise`` (the regime's run-to-run noise,
    :meth:`harness.report.timing.RunNoise.of`): a ratio inside 1 ± noise reads no difference."""
    lines: list[str] = []
    timed = tables.timed(chosen)
    if timed.empty:
        return lines
    timed = timed.assign(gpu=tables.device_names(timed))
    for (card, batch, gpu), group in timed.groupby(["card", "batch_size", "gpu"], sort=True):  # times of one GPU
        vanilla = group[group["backend"] == "vanilla"]
        if vanilla.empty or len(group) < 2:
            continue
        reference = list(vanilla["steady_times_sec"].iloc[0])
        parts = [f"{row['backend']}: {timing.ratio_words(timing.ratio(reference, list(row['steady_times_sec'])), noise=noise)}"
                 for _, row in group.iterrows() if row["backend"] != "vanilla"]  # fmt: skip
        on = f" on {a_gpu(str(gpu))}" if other_gpu(gpu) else ""
        lines.append(f"Step time at B = {batch} on the {card_short(str(card))} card, each cell timed alone{on}, against "
                     f"vanilla's median {np.median(reference):.2f} s per step (bootstrap 95% intervals): "
                     + "; ".join(parts) + ".")
    return lines


def plot_gradcache(cells: pd.DataFrame, calls: pd.DataFrame) -> Figure | None:
    """Vanilla's score call with B per score chunk (predicted lines, replays as points), the measured
    step peaks of every backend, and each card's usable memory."""
    found = vanilla_reference(cells, calls)
    chosen = gradcache_cells(cells)
    if found is None or chosen.empty:
        return None
    call, _ = found
    figure, axis = plt.subplots(figsize=(8.4, 4.4))
    batches = np.geomspace(512, 65536, 64)
    labels = {score_chunk(row): str(row["backend"]) for _, row in chosen[chosen["variant"] == "vanilla"].iterrows()}
    for chunk in chunks_of(cells):
        backend = labels[chunk]
        axis.plot(batches, [predicted_call_mib(call, chunk, int(b)) / GIB_MIB for b in batches], linestyle="--",
                  color=style.colour(backend), label=f"{backend}: score call, predicted")  # fmt: skip
    largest = largest_calls(calls, "pylate", GRADCACHE)
    replays = largest[largest["variant"] == "vanilla"] if not largest.empty else largest
    for _, row in replays.iterrows():
        axis.plot(row["batch_size"], row["forward_transient_peak_mib"] / GIB_MIB, marker="o", fillstyle="none",
                  color=style.colour(str(row["backend"])), markersize=9, linestyle="none")  # fmt: skip
    ok = chosen[chosen["outcome"] == "ok"]
    measured = style.in_order(ok["backend"].unique())
    peaks = ok.groupby(["backend", "batch_size"])["step_peak_alloc_mib"].max() / GIB_MIB
    for batch in sorted(ok["batch_size"].unique()):  # a thin guide at the batch the markers beside it measured
        here = peaks.xs(batch, level="batch_size")
        axis.plot([batch, batch], [here.min() / 1.12, here.max() * 1.12], color="grey", linewidth=0.8, zorder=2)
    for k, backend in enumerate(measured):  # equal peaks at one batch: side by side, centred on that batch
        mine = peaks.xs(backend, level="backend")
        look = style.look(backend)
        axis.plot(mine.index.to_numpy(), mine.to_numpy(), marker=look.marker, markersize=look.size, color=look.colour,
                  linestyle="none", label=f"{backend}: step peak, measured", transform=style.dodge(axis, k, len(measured)),
                  zorder=3)  # fmt: skip
    for name, card in CARDS.items():
        if card.usable_gib is None or name in ("a100-40gb", "l40s-48gb"):
            continue
        axis.axhline(card.usable_gib, color="grey", linestyle=":", linewidth=1)
        axis.text(600, card.usable_gib * 1.04, f"{card_short(name)}: {card.usable_gib} GiB", fontsize=8, color="dimgrey")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    axis.set_xticks([512, 1024, 4096, 16384, 65536], ["512", "1024", "4096", "16384", "65536"])
    axis.set_yticks([1, 4, 16, 64, 256], ["1", "4", "16", "64", "256"])
    axis.minorticks_off()
    axis.set_xlabel("batch size B")
    axis.set_ylabel("GiB")
    axis.set_title("GradCache: vanilla's score call (predicted, lines) and step peaks (measured)", fontsize=10)
    axis.grid(True, which="major", alpha=0.3)
    style.ticks(axis)
    backends = style.in_order(set(measured) | set(labels.values()))
    keys = [Line2D([], [], color="black", linestyle="--"), Line2D([], [], color="black", marker="o", fillstyle="none",
            markersize=9, linestyle="none"), Line2D([], [], color="black", marker="o", linestyle="none")]  # fmt: skip
    words = ["score call, predicted", "score call, replay (measured)",
             "step peak, measured\n(side by side around its B)"]  # fmt: skip
    axis.legend([style.handle(b) for b in backends] + keys, backends + words, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                fontsize=style.LEGEND_PT, frameon=False)  # fmt: skip
    figure.tight_layout()
    return figure


# ---- negatives gathered across GPUs --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Recipe:
    stack: str
    regime: str
    batch: int
    backend: str


@dataclasses.dataclass
class Scaling:
    """One recipe's per-rank step peak with the world size: the W = 1 measurement it grows from (and
    where it came from), the prediction per W, and the multi-GPU cells' measurements by W."""

    recipe: Recipe
    base_mib: float | None
    base_from: str | None
    predicted_mib: dict[int, float]
    measured: dict[int, tuple[str, float | None]]  # W → (outcome, per-rank peak MiB: the largest rank's)
    # W → the same, measured with every rank on one GPU (ranks_share_gpu: gloo, on a host that lends one)
    one_gpu: dict[int, tuple[str, float | None]] = dataclasses.field(default_factory=dict)
    # DDP's allreduce buckets one rank holds above W = 1 (MiB): the base cell's trainable parameters, which
    # transformers' Trainer hands to DistributedDataParallel with gradient_as_bucket_view=False, so the
    # buckets are a second copy of the gradients. None: the base recorded no trainable parameters.
    bucket_mib: float | None = None
    # W → the op's part of the prediction above W = 1 (MiB): :func:`rank_growth_mib`
    op_growth_mib: dict[int, float] = dataclasses.field(default_factory=dict)
    base_gpu: str | None = None  # the GPU the grid's own W = 1 cell ran on, as nvidia-smi names it


def planned_recipes(path: Path = MULTI_GPU_GRID) -> list[tuple[Recipe, int]]:
    """The (recipe, world size) pairs ``grids/multi-gpu.yaml`` plans (its cells whose ranks share one
    GPU measure some of these pairs another way, and plan none of their own)."""
    out = []
    for cell in load_grid(path):
        spec = cell.spec
        if isinstance(spec, TrainSpec) and not spec.ranks_share_gpu:
            backend = data.backend_label(spec.variant, spec.score_mini_batch_size)
            out.append((Recipe(spec.stack, spec.regime, spec.batch_size, backend), spec.world_size))
    return out


def _one_gpu_peak(cells: pd.DataFrame, recipe: Recipe) -> tuple[float, str] | None:
    """A one-GPU cell of the recipe on the 80 GB profile (default allocator) that trained: its step
    peak and its grid (the multi-gpu grid's own W = 1 cell is preferred, by the caller)."""
    if cells.empty:
        return None
    mine = data.matching(cells, stack=recipe.stack, regime=recipe.regime, batch_size=recipe.batch, backend=recipe.backend,
                         card=GATHER_CARD, allocator="default", outcome="ok")  # fmt: skip
    if mine.empty:
        return None
    row = mine.sort_values("grid").iloc[0]
    return float(row["step_peak_alloc_mib"]), str(row["grid"])


def _vanilla_call(calls: pd.DataFrame, recipe: Recipe) -> pd.Series | None:
    if calls.empty:
        return None
    mine = data.matching(calls, stack=recipe.stack, regime=recipe.regime, batch_size=recipe.batch, variant="vanilla")
    mine = mine[mine["score_mini_batch_size"].isna() & mine["forward_transient_peak_mib"].notna()]
    mine = mine[~mine["oom_in_replay"].astype(bool)]
    return None if mine.empty else mine.sort_values("forward_transient_peak_mib").iloc[-1]


def rank_growth_mib(call: pd.Series, backend: str, world: int) -> float:
    """Predicted: what one rank's op needs at ``world`` beyond W = 1 (MiB) — vanilla: the growth of
    its forward peak (the gathered grid); a fused backend: the other ranks' documents and their
    gradient."""
    stack, itemsize = str(call["stack"]), op_bytes.ITEMSIZE[str(call["dtype"])]
    query, docs = list(call["query_shape"]), list(call["doc_shape"])
    if backend == "vanilla":
        return (op_bytes.gathered(stack, query, docs, itemsize, world).forward_transient
                - op_bytes.gathered(stack, query, docs, itemsize, 1).forward_transient) / MIB  # fmt: skip
    return 2 * (world - 1) * float(np.prod(docs)) * itemsize / MIB


def scalings(results: data.Results, cells: pd.DataFrame, calls: pd.DataFrame,
             planned: Sequence[tuple[Recipe, int]] | None = None) -> list[Scaling]:  # fmt: skip
    """Per recipe of the multi-GPU grid: its W = 1 base (the grid's own W = 1 cell, else a one-GPU
    cell of the same recipe and card), the predicted per-rank peak at every W, and what the
    multi-GPU cells measured."""
    planned = planned_recipes() if planned is None else planned
    measured: dict[Recipe, dict[int, tuple[str, float | None]]] = {}
    one_gpu: dict[Recipe, dict[int, tuple[str, float | None]]] = {}
    trainable: dict[Recipe, float | None] = {}
    gpu: dict[Recipe, str | None] = {}
    for _, result in results.of(data.MULTI_GPU):
        spec = result.spec
        if not isinstance(spec, TrainSpec) or spec.card != GATHER_CARD:
            continue
        recipe = Recipe(spec.stack, spec.regime, spec.batch_size, data.backend_label(spec.variant, spec.score_mini_batch_size))
        into = one_gpu if spec.ranks_share_gpu else measured
        into.setdefault(recipe, {})[result.world_size] = (result.outcome, _rank_peak(result))
        if result.world_size == 1 and not spec.ranks_share_gpu:
            trainable[recipe] = result.trainable_parameter_mib
            gpu[recipe] = result.env.device_name if result.env is not None else None
    out = []
    for recipe in dict.fromkeys(recipe for recipe, _ in planned):
        own = measured.get(recipe, {})
        base: tuple[float, str] | None = None
        bucket: float | None = None
        base_gpu: str | None = None
        if 1 in own and own[1][0] == "ok" and own[1][1] is not None:
            base, bucket, base_gpu = (float(own[1][1]), data.MULTI_GPU), trainable.get(recipe), gpu.get(recipe)
        else:
            base = _one_gpu_peak(cells, recipe)
        call = _vanilla_call(calls, recipe)
        growth = {} if base is None or call is None else {
            world: rank_growth_mib(call, recipe.backend, world) for world in WORLDS}
        predicted = {world: base[0] + mib + (bucket or 0.0) * (world > 1)
                     for world, mib in growth.items()} if base is not None else {}  # fmt: skip
        out.append(Scaling(recipe, None if base is None else base[0], None if base is None else base[1], predicted, own,
                           one_gpu.get(recipe, {}), bucket, growth, base_gpu))  # fmt: skip
    return out


def trained_above_one_peaks(row: Scaling) -> list[tuple[int, bool, float]]:
    """(W, whether its ranks shared one GPU, per-rank peak MiB) of each W > 1 the recipe trained at: on W
    GPUs where such a cell ran, else with its ranks on one GPU."""
    out = []
    for world in sorted(set(row.measured) | set(row.one_gpu)):
        own = world in row.measured
        outcome, mib = row.measured[world] if own else row.one_gpu[world]
        if world > 1 and outcome == "ok" and mib is not None:
            out.append((world, not own, mib))
    return out


@dataclasses.dataclass(frozen=True)
class Rise:
    """What one rank's step peak gained from W = 1 to a measured W, beside the model's two terms."""

    scaling: Scaling
    world: int
    one_gpu: bool  # the W cell's ranks shared one GPU
    measured_mib: float  # the W cell's per-rank peak less the W = 1 base
    bucket_mib: float  # DDP's buckets (the model's)
    op_mib: float  # the op's growth (the model's)

    @property
    def residual_mib(self) -> float:
        return self.measured_mib - self.bucket_mib - self.op_mib

    @property
    def setting(self) -> tuple[str, str, int, int]:
        """(stack, regime, batch per rank, W): the rise's recipe less its backend."""
        recipe = self.scaling.recipe
        return recipe.stack, recipe.regime, recipe.batch, self.world


def rises(rows: Sequence[Scaling]) -> list[Rise]:
    """Per recipe and measured W > 1 that trained (on W GPUs, else with its ranks on one GPU), with a
    W = 1 base that recorded its trainable parameters: the measured rise and the model's terms."""
    out = []
    for row in rows:
        if row.base_mib is None or row.bucket_mib is None:
            continue
        out += [Rise(row, world, shared, mib - row.base_mib, row.bucket_mib, row.op_growth_mib[world])
                for world, shared, mib in trained_above_one_peaks(row) if world in row.op_growth_mib]  # fmt: skip
    return out


def rise_table(found: Sequence[Rise]) -> pd.DataFrame:
    """:func:`rises` as a table, in MiB: measured, the model's buckets and op growth, and what is left."""
    return pd.DataFrame([{
        "stack · regime": f"{nowrap(STACK_NAMES[r.scaling.recipe.stack])} · {nowrap(r.scaling.recipe.regime)}",
        "B per rank": r.scaling.recipe.batch, "backend": r.scaling.recipe.backend,
        "W": nowrap(f"{r.world} ({'m1' if r.one_gpu else 'm'})"),
        "measured rise": signed(r.measured_mib, "+,.0f"), "DDP buckets": f"{r.bucket_mib:,.0f}",
        "op growth": f"{r.op_mib:,.0f}", "measured − model": signed(r.residual_mib, "+,.0f")} for r in found])  # fmt: skip


def _lengths(calls: Sequence[Any]) -> list[tuple[int, int]]:
    """Per call in training: (query tokens, document tokens), in step order."""
    return [(int(call.query_shape[1]), int(call.doc_shape[-2])) for call in calls]


def drawn_lengths(results: data.Results) -> dict[tuple[str, int], tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Per (stack, batch) whose W = 1 cell and a W = 2 cell of one backend both trained: the lengths
    every call of the W = 1 cell scored, and those of the W = 2 cell's ranks, where they differ
    (a rank of W = 2 draws other samples than the one rank of W = 1)."""
    ones: dict[tuple[str, str, int, str], list[tuple[int, int]]] = {}
    twos: dict[tuple[str, str, int, str], list[tuple[int, int]]] = {}
    for _, result in results.of(data.MULTI_GPU):
        spec = result.spec
        if not isinstance(spec, TrainSpec) or spec.card != GATHER_CARD or result.outcome != "ok":
            continue
        key = (spec.stack, spec.regime, spec.batch_size, spec.variant)
        if result.world_size == 1:
            ones[key] = _lengths(result.maxsim_calls_in_train)
        elif result.world_size == 2:
            twos[key] = [length for rank in result.ranks for length in _lengths(rank.maxsim_calls_in_train)]
    out = {}
    for key in sorted(set(ones) & set(twos)):
        if sorted(set(ones[key])) != sorted(set(twos[key])) and (key[0], key[2]) not in out:
            out[(key[0], key[2])] = (ones[key], twos[key])
    return out


def drawn_lengths_words(results: data.Results) -> str:
    """:func:`drawn_lengths` in words (empty where every W = 2 rank scored the W = 1 cell's lengths)."""
    found = drawn_lengths(results)
    if not found:
        return ""

    def span(values: Sequence[int]) -> str:
        return f"{min(values)}–{max(values)}" if min(values) != max(values) else f"{min(values)}"

    parts = [f"{STACK_NAMES[stack]} B = {batch}: query tokens {span([q for q, _ in one])} and document tokens "
             f"{span([d for _, d in one])} at W = 1, {span([q for q, _ in two])} and {span([d for _, d in two])} at W = 2"
             for (stack, batch), (one, two) in found.items()]  # fmt: skip
    stacks = joined(sorted({STACK_NAMES[stack] for stack, _ in found}))
    return (f"The ranks of W = 2 scored other lengths than the W = 1 cell ({'; '.join(parts)}): a rank draws other samples "
            f"than one process does, so {stacks}'s rises mix the data drawn with W.")  # fmt: skip


RISE_TOLERANCE_MIB = 64.0  # two rises this close are the same rise (the step-peak tolerance of the pages)


def alike_rises(found: Sequence[Rise]) -> list[tuple[Rise, Rise]]:
    """(vanilla, fused) pairs of one recipe and W whose rises lie within :data:`RISE_TOLERANCE_MIB`:
    where the grid vanilla builds and the fused backend never does made no difference to the rise."""
    vanilla = {r.setting: r for r in found if r.scaling.recipe.backend == "vanilla"}
    out: dict[tuple[str, str, int, int], tuple[Rise, Rise]] = {}
    for r in found:
        if (r.scaling.recipe.backend != "vanilla" and r.setting in vanilla and r.setting not in out
                and abs(vanilla[r.setting].measured_mib - r.measured_mib) <= RISE_TOLERANCE_MIB):  # fmt: skip
            out[r.setting] = (vanilla[r.setting], r)
    return list(out.values())


def rise_words(found: Sequence[Rise]) -> list[str]:
    """The rises in words: which recipes rose by less than DDP's buckets alone (where the model, adding
    the op's growth on top, must lie above the measurement), and which by more than both terms."""
    if not found:
        return []
    below = [r for r in found if r.measured_mib < r.bucket_mib]
    above = [r for r in found if r.residual_mib > 0]

    def names(group: Sequence[Rise]) -> str:
        by: dict[tuple[str, str, int, int], list[str]] = {}
        for r in group:
            by.setdefault(r.setting, []).append(r.scaling.recipe.backend)
        return "; ".join(f"{STACK_NAMES[stack]} · {regime} B = {batch} at W = {world}: {joined(backends)}"
                         for (stack, regime, batch, world), backends in by.items())  # fmt: skip

    words = [f"From W = 1 to the measured W, the {counted(len(found), 'cell')} rose by "
             f"{as_published(min(r.measured_mib for r in found))} to {as_published(max(r.measured_mib for r in found))} "
             "per rank."]  # fmt: skip
    if below:
        words.append(f"{counted(len(below), 'cell')} rose by less than DDP's buckets alone ({names(below)}), so the model, "
                     "which adds the op's growth on top, lies above them.")  # fmt: skip
    if above:
        words.append(f"{counted(len(above), 'cell')} rose by more than both terms ({names(above)}).")
    alike = alike_rises(found)
    if alike:
        words.append("Vanilla rose as the fused backend did, within " + as_published(RISE_TOLERANCE_MIB) + ", for "
                     + joined([f"{STACK_NAMES[v.scaling.recipe.stack]} · {v.scaling.recipe.regime} B = {v.scaling.recipe.batch} "
                               f"at W = {v.world} ({as_published(v.measured_mib)} and {as_published(f.measured_mib)})"
                               for v, f in alike])
                     + ": vanilla's gathered grid did not set those step peaks.")  # fmt: skip
    return words


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """The model against the cells measured above W = 1 that trained: per-rank peak, measured less predicted."""

    worlds: tuple[int, ...]
    gaps_mib: tuple[tuple[Scaling, int, float], ...]  # (recipe row, W, measured − predicted MiB)
    one_gpu: bool  # every measurement had its ranks on one GPU

    @property
    def largest(self) -> tuple[Scaling, int, float]:
        return max(self.gaps_mib, key=lambda gap: abs(gap[2]))


def model_check(rows: Sequence[Scaling]) -> ModelCheck | None:
    """Measured (on W GPUs, else with the ranks on one GPU) against predicted, where both exist and the
    cell trained; None when no such cell has run."""
    gaps, shared = [], []
    for row in rows:
        for world, on_one_gpu, mib in trained_above_one_peaks(row):
            if world in row.predicted_mib:
                gaps.append((row, world, mib - row.predicted_mib[world]))
                shared.append(on_one_gpu)
    if not gaps:
        return None
    return ModelCheck(tuple(sorted({world for _, world, _ in gaps})), tuple(gaps), all(shared))


def model_check_words(check: ModelCheck | None) -> str:
    """The model's check in words: how many cells, how far measured and predicted lie apart."""
    if check is None:
        return "No cell above W = 1 has trained yet, so the model is not yet checked on one."
    row, world, gap = check.largest
    worlds = ", ".join(str(world) for world in check.worlds)
    how = " (every one with its ranks on one GPU)" if check.one_gpu else ""
    within = [abs(g) for _, _, g in check.gaps_mib]
    return (f"Checked on {counted(len(check.gaps_mib), 'cell')} that trained at W = {worlds}{how}: the measured per-rank "
            f"step peak lies within {as_published(max(within))} of the predicted (median {as_published(median(within))}); "
            f"the largest gap, {'+' if gap >= 0 else '−'}{as_published(abs(gap))} (measured {'above' if gap >= 0 else 'below'} "
            f"predicted), is {recipe_name(row.recipe)}, {row.recipe.backend}, at W = {world}.")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class GatheredOps:
    """Inside the steps of the data-parallel cells that trained: whether every rank's MaxSim call scored
    its queries against all W ranks' documents, how far vanilla's replayed calls lie from the op formula,
    and whether the fused kernels were reached."""

    cells: int
    calls: int  # in training, over every rank
    gathered: int  # of them, with W × B documents
    replays: int  # vanilla's isolated replays
    formula_gap_mib: float | None  # the largest |measured − formula| forward peak among them
    fused_cells: int
    fused_reached: int  # fused cells whose kernel entry points counted calls
    gpus: tuple[str, ...] = ()  # the GPUs they ran on, as nvidia-smi names them


def trained_above_one(results: data.Results) -> list[CellResult]:
    """The committed multi-GPU cells of world size above 1 that trained every step."""
    return [result for _, result in results.of(data.MULTI_GPU)
            if isinstance(result.spec, TrainSpec) and result.world_size > 1 and result.outcome == "ok"]  # fmt: skip


def gathered_ops(results: data.Results) -> GatheredOps | None:
    """:class:`GatheredOps` over the committed multi-GPU cells above W = 1 that trained (None: none has)."""
    cells = calls = gathered = replays = fused = reached = 0
    gaps: list[float] = []
    gpus: set[str] = set()
    for result in trained_above_one(results):
        spec = result.spec
        assert isinstance(spec, TrainSpec)
        cells += 1
        if result.env is not None and result.env.device_name:
            gpus.add(result.env.device_name)
        for rank in result.ranks:
            for call in rank.maxsim_calls_in_train:
                calls += 1
                gathered += call.doc_shape[0] == spec.world_size * spec.batch_size
        if spec.variant == "vanilla":
            for call in result.maxsim_calls_isolated:
                if call.forward_transient_peak_mib is not None and call.predicted_forward_transient_mib is not None:
                    replays += 1
                    gaps.append(abs(call.forward_transient_peak_mib - call.predicted_forward_transient_mib))
        else:
            fused += 1
            reached += bool(result.backend_entry_point_calls)
    if not cells:
        return None
    return GatheredOps(cells, calls, gathered, replays, max(gaps) if gaps else None, fused, reached, tuple(sorted(gpus)))


def gathered_ops_words(ops: GatheredOps | None) -> str:
    """:class:`GatheredOps` in words (empty where no multi-GPU cell has trained)."""
    if ops is None:
        return ""
    every = "every one" if ops.gathered == ops.calls else f"{ops.gathered}"
    where = f" (on {joined([a_gpu(gpu) for gpu in ops.gpus])})" if ops.gpus else ""
    words = [f"Inside the steps of these {counted(ops.cells, 'cell')}{where}: {every} of the {ops.calls} MaxSim calls their "
             "ranks made in training scored the rank's B queries against W × B gathered documents"]  # fmt: skip
    if ops.formula_gap_mib is not None:
        words.append(f"vanilla's {counted(ops.replays, 'call')} replayed alone needed the op formula's forward bytes "
                     f"within {ops.formula_gap_mib:.2f} MiB")  # fmt: skip
    if ops.fused_cells:
        words.append(f"the fused kernels' entry points counted calls in {ops.fused_reached} of the {ops.fused_cells} "
                     "fused cells" + (", so gathering reaches them" if ops.fused_reached == ops.fused_cells else ""))
    return "; ".join(words) + "."


def multi_gpu_words(results: data.Results) -> str:
    """For the predictions page: how many cells of ``grids/multi-gpu.yaml`` have results (and how many
    put their ranks on one GPU), and what their op calls show."""
    multi_gpu = [result for _, result in results.of(data.MULTI_GPU)]
    if not multi_gpu:
        return "`grids/multi-gpu.yaml` measures W = 1 and 2 (and 4 and 8 where a host lends that many GPUs): not run yet."
    one_gpu = sum(1 for result in multi_gpu if result.ranks_share_gpu)
    return ("`grids/multi-gpu.yaml` measures W = 1 and 2 (and 4 and 8 where a host lends that many GPUs): "
            f"{len(multi_gpu)} of its cells have results" + (f", {one_gpu} of them with both ranks on one GPU" if one_gpu else "")
            + ". " + gathered_ops_words(gathered_ops(results))
            + " The page *Negatives gathered across GPUs* sets their step peaks beside the model's.")  # fmt: skip


def score_share_words(rows: Sequence[Scaling], results: data.Results, calls: pd.DataFrame) -> str:
    """Vanilla's score call (its forward peak, replayed alone) as a share of one rank's step peak, at
    W = 1 (the base cell's largest call) and at each W a cell above 1 trained (its own calls); empty
    where no vanilla cell above W = 1 has trained."""
    largest: dict[tuple[Recipe, int], float] = {}
    for result in trained_above_one(results):
        peaks = [c.forward_transient_peak_mib for c in result.maxsim_calls_isolated if c.forward_transient_peak_mib]
        if result.variant == "vanilla" and peaks:
            largest[(Recipe(result.stack, result.regime, result.batch_size, "vanilla"), result.world_size)] = max(peaks)
    parts = []
    for row in rows:
        worlds = sorted(world for recipe, world in largest if recipe == row.recipe)
        call = _vanilla_call(calls, row.recipe)
        if not worlds or call is None or row.base_mib is None:
            continue
        shares = [(float(call["forward_transient_peak_mib"]), row.base_mib, 1)]
        for world in worlds:
            _, mib = row.measured.get(world) or row.one_gpu[world]
            if mib is not None:
                shares.append((largest[(row.recipe, world)], mib, world))
        parts.append(f"{recipe_name(row.recipe)}: " + ", ".join(
            f"{_gib(op)} of {_gib(step)} GiB ({100 * op / step:.0f}%) at W = {world}" for op, step, world in shares))
    if not parts:
        return ""
    return "Vanilla's score call (its forward peak, replayed alone) as a share of one rank's step peak: " + "; ".join(parts) + "."


def _rank_peak(result: CellResult) -> float | None:
    if result.outcome == "ok":
        return result.step_peak_alloc_mib
    return result.pre_oom_alloc_mib


def recipe_name(recipe: Recipe) -> str:
    return f"{STACK_NAMES[recipe.stack]} · {recipe.regime} · B = {recipe.batch} per rank"


def first_over(scaling: Scaling, usable_gib: float) -> int | None:
    """The first planned W at which the predicted per-rank peak passes ``usable_gib``."""
    over = [world for world, mib in sorted(scaling.predicted_mib.items()) if mib / GIB_MIB > usable_gib]
    return over[0] if over else None


def scaling_table(rows: Sequence[Scaling]) -> pd.DataFrame:
    """Per recipe and backend: the W = 1 base (measured), and per W the per-rank peak — measured
    where a multi-GPU cell ran (m), or where one ran with its ranks on one GPU (m1), otherwise
    predicted (p)."""
    table = []
    for row in rows:
        entry: dict[str, Any] = {"stack · regime": nowrap(f"{STACK_NAMES[row.recipe.stack]} · {row.recipe.regime}"),
                                 "B per rank": row.recipe.batch, "backend": row.recipe.backend,
                                 "W = 1": "—" if row.base_mib is None else f"{_gib(row.base_mib)}\u00a0(m)"}  # fmt: skip
        for world in WORLDS[1:]:
            measured, mark = row.measured.get(world), "m"
            if measured is None and world in row.one_gpu:
                measured, mark = row.one_gpu[world], "m1"
            if measured is not None:
                outcome, mib = measured
                shown = (f"{_gib(mib)} ({mark})" if outcome == "ok" and mib is not None
                         else f"{outcome.upper() if outcome == 'oom' else outcome} ({mark})")  # fmt: skip
                if world in row.predicted_mib:  # under it, what the model said
                    shown = f"{nowrap(shown)}{PREDICTED_BREAK}{nowrap(f'{_gib(row.predicted_mib[world])} (p)')}"
                entry[f"W = {world}"] = nowrap(shown)
            else:
                entry[f"W = {world}"] = nowrap(f"{_gib(row.predicted_mib[world])} (p)") if world in row.predicted_mib else "—"
        table.append(entry)
    return pd.DataFrame(table)


def scaling_reading(rows: Sequence[Scaling], card: str = GATHER_CARD, ops: str = "") -> list[str]:
    """In words: how many multi-GPU cells have run, how near the model they came (and ``ops``: what
    their op calls show, :func:`gathered_ops_words`), where vanilla's predicted per-rank peak passes
    the card, and how far the fused backends' peaks move by W = 8."""
    usable = CARDS[card].usable_gib or 0.0
    lines = []
    measured = sum(1 for row in rows for world in row.measured if world > 1)
    shared = sum(1 for row in rows for world in row.one_gpu if world not in row.measured)
    at_one = sum(1 for row in rows if row.base_from == data.MULTI_GPU)
    gpus = sorted({row.base_gpu for row in rows if row.base_from == data.MULTI_GPU and row.base_gpu})
    base_on = f", run on {joined([a_gpu(gpu) for gpu in gpus])}" if gpus else ""
    lines.append(f"Measured on several GPUs so far: {measured} cells at W > 1"
                 + (f" (and {at_one} at W = 1)" if at_one else "")
                 + (f"; with every rank on one GPU: {counted(shared, 'cell')} at W = "
                    + ", ".join(str(w) for w in sorted({w for row in rows for w in row.one_gpu})) if shared else "")
                 + ("; every other W ≥ 2 figure below is predicted." if measured or shared else
                    "; every W ≥ 2 figure below is predicted.")
                 + (f" Each W = 1 base is the grid's own W = 1 cell (torchrun, one rank) on the 80 GB profile{base_on}."
                    if at_one == len(rows) else " Each W = 1 base is a measured step peak on the 80 GB profile: the "
                    f"grid's own W = 1 cell (torchrun, one rank{base_on}) where it ran, else a one-GPU cell of the same "
                    "recipe."))  # fmt: skip
    if measured or shared:
        lines.append(model_check_words(model_check(rows)))
        if ops:
            lines.append(ops)
    for recipe_rows in _by_recipe(rows).values():
        name = recipe_name(recipe_rows[0].recipe)
        parts = []
        for row in recipe_rows:
            if not row.predicted_mib:
                parts.append(f"{row.recipe.backend}: no W = 1 base yet")
                continue
            over = first_over(row, usable)
            last = row.predicted_mib[max(row.predicted_mib)]
            top = max(row.predicted_mib)
            parts.append(f"{row.recipe.backend} " + (f"passes the card's {usable} GiB from W = {over}" if over else
                                                     f"stays below {usable} GiB ({_gib(last)} GiB at W = {top})"))  # fmt: skip
        lines.append(f"{name} (predicted per-rank step peak): " + "; ".join(parts) + ".")
    return lines


def _by_recipe(rows: Sequence[Scaling]) -> dict[tuple[str, str, int], list[Scaling]]:
    grouped: dict[tuple[str, str, int], list[Scaling]] = {}
    for row in rows:
        grouped.setdefault((row.recipe.stack, row.recipe.regime, row.recipe.batch), []).append(row)
    return grouped


def plot_scaling(rows: Sequence[Scaling], card: str = GATHER_CARD) -> Figure | None:
    """Per recipe, the per-rank step peak against W: predicted (dashed, open markers) beside what
    was measured (filled: the W = 1 base and any multi-GPU cell; a cross for one that ran out of
    memory), with the card's usable memory."""
    groups = _by_recipe([row for row in rows if row.predicted_mib or row.measured])
    if not groups:
        return None
    columns = 2
    lines = -(-len(groups) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(10.5, 3.8 * lines), squeeze=False, sharex=True)
    usable = CARDS[card].usable_gib
    for axis, recipe_rows in zip(axes.flat, groups.values(), strict=False):
        for row in recipe_rows:
            look = style.look(row.recipe.backend)
            worlds = sorted(row.predicted_mib)
            axis.plot(worlds, [row.predicted_mib[w] / GIB_MIB for w in worlds], linestyle="--", marker=look.marker,
                      fillstyle="none", color=look.colour, markersize=look.size,
                      label=f"{row.recipe.backend}, predicted")  # fmt: skip
            points = ({1: ("ok", row.base_mib)} if row.base_mib is not None else {}) | row.measured
            for world, (outcome, mib) in sorted(points.items()):
                if mib is None:
                    continue
                axis.plot(world, mib / GIB_MIB, marker="X" if outcome == "oom" else look.marker, color=look.colour,
                          markersize=look.size + 1, linestyle="none", zorder=style.layer(row.recipe.backend),
                          label=f"{row.recipe.backend}, measured" if world == 1 else None)  # fmt: skip
            for world, (outcome, mib) in sorted(row.one_gpu.items()):  # half-filled: its ranks shared one GPU
                if mib is None or world in row.measured:
                    continue
                axis.plot(world, mib / GIB_MIB, marker="X" if outcome == "oom" else look.marker, color=look.colour,
                          fillstyle="bottom", markersize=look.size + 1, linestyle="none",
                          zorder=style.layer(row.recipe.backend) + 0.5,
                          label=f"{row.recipe.backend}, measured, ranks on one GPU")  # fmt: skip
        if usable:  # named in the legend, not on the axes, where a line could run through its words
            axis.axhline(usable, color="grey", linestyle=":", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.set_ylim(0, None)
        axis.set_xticks(list(WORLDS), [str(w) for w in WORLDS])
        axis.minorticks_off()
        recipe = recipe_rows[0].recipe
        axis.set_title(f"{regime_name(recipe.stack, recipe.regime)}\nB = {recipe.batch} per rank", fontsize=10)
        axis.set_xlabel("GPUs W")
        axis.set_ylabel("per-rank step peak (GiB)")
        axis.grid(True, which="major", alpha=0.3)
        style.ticks(axis)
    for axis in list(axes.flat)[len(groups):]:
        axis.set_visible(False)
    handles: dict[str, Any] = {}
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    backends = style.in_order({label.split(",")[0] for label in handles})
    kinds = [[handles[f"{b}, {kind}"] for b in backends if f"{b}, {kind}" in handles]
             for kind in ("measured", "measured, ranks on one GPU", "predicted")]  # fmt: skip
    if usable:
        kinds[0].append(Line2D([], [], color="grey", linestyle=":", linewidth=1,
                               label=f"{card_short(card)} usable: {usable} GiB"))  # fmt: skip
    style.legend_rows(figure, kinds, loc="upper center", bbox_to_anchor=(0.5, 1.0))
    figure.tight_layout(rect=(0, 0, 1, 1 - (0.25 + 0.15 * sum(1 for kind in kinds if kind)) / (3.8 * lines)))
    return figure


def ceiling_table(searches: Sequence[data.SearchRow]) -> pd.DataFrame:
    """The per-rank ceiling searches with gathered negatives (``grids/multi-gpu-ceilings.yaml``): per
    search its recipe, world size, the batch per rank it found (or how far it got), beside the
    same backend's one-GPU ceiling on that card from the ceilings grid where it settled (a search still
    running marked as on every page: 'A–B*')."""
    from harness.report.text import ceiling_entry

    def key(row: data.SearchRow) -> tuple[str, str, str]:
        return row.search.stack, row.search.regime, data.backend_label(row.search.variant, row.search.score_mini_batch_size)

    one_gpu = {key(row): row for row in data.ceilings()
               if (row.search.card, row.search.allocator, row.search.world_size) == (GATHER_CARD, "default", 1)}  # fmt: skip
    rows = []
    for row in searches:
        search = row.search
        backend = key(row)[2]
        alone = one_gpu.get(key(row))
        rows.append({"stack · regime": nowrap(f"{STACK_NAMES[search.stack]} · {search.regime}"), "backend": backend,
                     "card": _card(search.card), f"per rank, W = {search.world_size}": ceiling_entry(row),
                     "probes": row.probes, "one GPU": "—" if alone is None else ceiling_entry(alone)})  # fmt: skip
    return pd.DataFrame(rows)


def gradcache_unmeasured(cells: pd.DataFrame, path: Path = GRADCACHE_GRID) -> str:
    """Which cells of the GradCache grid (``grids/gradcache.yaml``) have no committed result yet, per batch
    with the cards they are planned on, in words; what the page lists as still to measure, so it never
    names a batch that has been measured (or misses one that has not)."""
    planned = [cell for cell in load_grid(path) if isinstance(cell.spec, TrainSpec)]
    ran = set() if cells.empty else set(cells.loc[cells["grid"] == path.stem, "cell_id"])
    left = [cell for cell in planned if cell.cell_id not in ran]
    name = f"`grids/{path.name}`"
    if not left:
        return f"Every one of the {len(planned)} cells {name} plans has a committed result."
    parts = []
    for batch in sorted({cell.spec.batch_size for cell in left}):
        mine = [cell for cell in left if cell.spec.batch_size == batch]
        of = sum(cell.spec.batch_size == batch for cell in planned)
        cards = cards_in_order({cell.spec.card for cell in mine})
        on = f"on the {joined([f'{CARDS[card].nominal_gb} GB' for card in cards])} card{'s' if len(cards) > 1 else ''}"
        parts.append(f"{f'all {of}' if len(mine) == of else f'{len(mine)} of the {of}'} at B = {batch:,} ({on})")
    return (f"Of the {len(planned)} cells {name} plans, {len(left)} {'has' if len(left) == 1 else 'have'} no committed "
            f"result yet: {joined(parts)}.")


def gradcache_cost_words(cells: pd.DataFrame, searches: Sequence[data.SearchRow], probe_steps: int | None = None,
                         batch: int = 16384) -> str:  # fmt: skip
    """What is not measured yet of the GradCache regime and what it costs, from the measured steps:
    the ceiling searches of the regime by state, and a lower bound on one probe's time at ``batch``
    (the encoder's work grows linearly with B, vanilla's scoring quadratically)."""
    from harness.report.text import ceiling_text

    mine = [row for row in searches if (row.search.stack, row.search.regime) == ("pylate", GRADCACHE)]
    states = pd.Series([ceiling_text(row) for row in mine]).value_counts() if mine else pd.Series(dtype=int)
    text = (f"The ceilings grid holds {len(mine)} GradCache searches; "
            + (", ".join(f"{count} {state}" for state, count in states.items()) if mine else "none yet") + ".")
    if mine:
        plans = Counter((row.search.steps, row.search.seeds) for row in mine).most_common()
        said = [seed_words(steps, seeds) + ("" if count == len(mine) else f" in {counted(count, 'search', 'searches')}")
                for (steps, seeds), count in plans]  # fmt: skip
        why = " (the ceilings page says why one seed answers)" if any(len(seeds) == 1 for (_, seeds), _ in plans) else ""
        text += f" A probe trains {'; '.join(said)}{why}."
    chosen = gradcache_cells(cells)
    if chosen.empty:
        return text
    timed = tables.timed(chosen)
    timed = timed[(timed["variant"] == "vanilla") & timed["score_mini_batch_size"].isna()]
    if timed.empty:
        return text
    if probe_steps is None:  # what the regime's searches train a probe (the grid's least where none)
        probe_steps = max((row.search.steps for row in mine), default=MIN_STEPS)
    # per GPU (a capped profile times its GPU, whatever the cap), its largest timed batch (the tightest bound), and
    # of several cells there the fastest (the safest)
    gpus = tables.device_names(timed).replace("", REFERENCE_GPU)  # (a time that names no GPU is the H200's)
    steps, bounds = [], []
    for gpu in sorted(set(gpus), key=lambda name: (other_gpu(name), name)):
        row = timed[gpus == gpu].sort_values(["batch_size", "steady_step_time_sec"], ascending=[False, True]).iloc[0]
        seconds, measured = float(row["steady_step_time_sec"]), int(row["batch_size"])
        name = a_gpu(gpu) if other_gpu(gpu) else "the H200"
        steps.append(f"{seconds:.2f} s at B = {measured:,} on {name}")
        bounds.append(f"{probe_steps * seconds * batch / measured / 60:.0f} minutes of {name}")
    text += (f" A vanilla GradCache step took {joined(steps)} (each timed alone); the encoder's work grows linearly "
             f"with B and vanilla's scoring quadratically, so one probe of {probe_steps} steps at B = {batch:,} takes "
             f"at least {joined(bounds)}.")  # fmt: skip
    return text


def against_checkpointing(cells: pd.DataFrame, noise: timing.RunNoise | None = None) -> str:
    """GradCache's step time beside gradient checkpointing's at the same batch, backend, card and GPU,
    for every pair timed alone, in words (empty where none is); a ratio inside the wider of the two
    regimes' run-to-run noise (``noise``) reads no difference."""
    if cells.empty:
        return ""
    band = None if noise is None else max((noise.of("pylate", regime) or 0.0 for regime in (GRADCACHE, "grad-checkpoint")),
                                          default=0.0) or None  # fmt: skip
    timed = tables.timed(cells)
    timed = timed[(timed["stack"] == "pylate") & (timed["allocator"] == "default")]
    cached = timed[timed["regime"] == GRADCACHE]
    checkpointed = timed[timed["regime"] == "grad-checkpoint"].set_index(["batch_size", "backend", "card", "device_name"])
    parts = []
    for _, row in cached.iterrows():
        key = (row["batch_size"], row["backend"], row["card"], row["device_name"])  # times of one GPU
        if key not in checkpointed.index:
            continue
        other = checkpointed.loc[[key]].iloc[0]
        ratio = timing.ratio(list(row["steady_times_sec"]), list(other["steady_times_sec"]))
        parts.append(f"{row['backend']} at B = {row['batch_size']} on the {card_short(str(row['card']))} card: "
                     f"{row['steady_step_time_sec']:.2f} s against {other['steady_step_time_sec']:.2f} s, "
                     f"{timing.ratio_words(ratio, faster='longer', slower='shorter', noise=band)}")  # fmt: skip
    if not parts:
        return ""
    return ("A GradCache step beside a gradient-checkpointing step of the same batch and backend (both timed "
            "alone): " + "; ".join(parts) + ".")
