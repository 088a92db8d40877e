"""What fits on my card: a memory model fitted to the committed measurements, checked against the ceilings.

A training step's peak *allocated* memory, per (stack, regime, backend), is modelled as

    peak(B) = fixed + per_token · B · (Lq + slots · Ld) + maxsim(B)

- ``fixed``: what does not grow with the batch (weights, optimizer state, LoRA, workspaces);
- ``per_token``: the encoder's activations, per token of a sample (a query of Lq tokens and ``slots``
  documents of Ld tokens: ColQwen2 one page, PyLate a positive and a negative passage);
- ``maxsim``: the vanilla MaxSim bytes, analytic from the shapes (the formulas of
  :class:`harness.ops.VanillaPrediction`, re-expressed here without torch), at one of three places
  the data choose: ``none`` (the step peaks elsewhere: ColQwen2, whose encoder dwarfs the grid, and
  every fused backend, whose few MiB per sample fold into ``per_token``), ``transient`` (the op's
  forward peak: PyLate's grids) or ``held`` (what every call of a step keeps for backward: PyLate's
  query chunking, whose chunks each keep a copy of the documents).

``fixed`` and ``per_token`` are a least-squares fit over every completed optimizer step after the
first (the first has no optimizer state yet) of the committed training cells, each step with its own
recorded lengths (ColQwen2's query lengths differ from batch to batch).

Whether a batch *fits* a card is decided by the allocator, not by the allocated peak: the caching
allocator also needs reserved-but-unallocated memory (fragmentation) it cannot hand back. So a batch
is predicted to fit when ``peak(B) · (1 + margin) ≤ cap``; ``margin``, per (stack, regime, backend,
allocator), is the fraction of the peak that separates the committed cells that trained from those
that ran out of memory, on every card where they ran (each cell's peak predicted at the stack's
longest recorded lengths, the batch a ceiling search must survive). A probe that trained bounds the
margin from above, one that ran out of memory from below; the margin is the middle of the interval
that misclassifies the fewest.

Validation, leave-one-card-out: for each ceiling search, the model is fitted again without any
cell of the search's card, and predicts the largest multiple of the search's resolution that fits;
the goal is to be within one resolution or 5% of the measured ceiling, whichever is larger.

Nothing here is typed in: ``harness predict --validate`` derives every parameter from the
committed results (through :mod:`harness.report.data`, the report's loader) and writes
``results/predictions/validation.json``; ``predict`` and ``table`` answer for cards nobody measured.
Torch-free.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from harness import op_bytes
from harness.report import data
from harness.results import CellResult, OpCall, write_text_atomic
from harness.spec import CARDS, CONTEXT_GIB, SpecError, choose

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = ROOT / "results" / "predictions" / "validation.json"
# a validation row's state where the search ended on probes of the data's earlier draw, which run again
EARLIER_DRAW_STATE = "earlier draw"
MIB = 1 << 20
GOAL_FRACTION = 0.05  # a prediction within one search resolution or 5% of the ceiling, whichever is larger
# Re-runs of cells already in the data; and the traced and long-run cells, the grids' shapes again with
# 50 to 300 steps each, which a fit over every step would let outweigh all the other cells.
LEAVE_OUT_GRIDS = (data.REPEAT, data.SHARED_CHECK, data.CROSS_CARD, data.PARITY, data.LONG_RUN, data.MULTI_GPU,
                   data.MULTI_GPU_CEILINGS)
RECIPES = (("colpali", "plain"), ("pylate", "grad-checkpoint"), ("pylate", "plain"))
Placement = Literal["none", "transient", "held"]


class ModelError(ValueError):
    """A prediction that cannot be made as asked (one line, saying what to do)."""


# ---- the analytic MaxSim term (harness.ops.*.predict, without torch) ------------------------------


@dataclasses.dataclass(frozen=True)
class CallBytes:
    """The vanilla bytes of one MaxSim call: its forward peak above its inputs, and what it keeps."""

    transient: int
    held: int


def vanilla_call_bytes(stack: str, query_shape: Sequence[int], doc_shape: Sequence[int], dtype: str = "float32") -> CallBytes:
    """The analytic vanilla bytes of one call (:mod:`harness.op_bytes`, as the replays are predicted)."""
    bytes_ = op_bytes.formula(stack)(query_shape, doc_shape, op_bytes.ITEMSIZE[dtype])
    return CallBytes(bytes_.forward_transient, bytes_.held)


def step_maxsim_mib(calls: Sequence[CallBytes]) -> dict[str, float]:
    """A step's MaxSim bytes at each place it can sit on the step peak: ``held`` (everything its
    calls keep for backward) and ``transient`` (the worst call's forward peak on top of what the
    calls before it keep: PyLate's chunks run one after another)."""
    held, transient, kept = 0, 0, 0
    for call in calls:
        transient = max(transient, kept + call.transient)
        kept += call.held
        held += call.held
    return {"none": 0.0, "held": held / MIB, "transient": transient / MIB}


def planned_calls(stack: str, batch: int, query_tokens: int, doc_tokens: int, slots: int, dim: int,
                  chunk: int | None, world_size: int = 1) -> list[CallBytes]:  # fmt: skip
    """The calls of one step at ``batch`` per device: one, or PyLate's query chunks of ``chunk``.
    Documents are scored in-batch on each device (``world_size`` does not gather them)."""
    del world_size  # kept in the signature: the model has no multi-GPU measurement (see predict)
    sizes = [batch] if chunk is None else [min(chunk, batch - start) for start in range(0, batch, chunk)]
    doc_shape = [batch, doc_tokens, dim] if stack == "colpali" else [batch, slots, doc_tokens, dim]
    return [vanilla_call_bytes(stack, [bq, query_tokens, dim], doc_shape) for bq in sizes]


# ---- what the committed results say ---------------------------------------------------------------


Key = tuple[str, str, str]  # (stack, regime, backend)


@dataclasses.dataclass(frozen=True)
class StepPoint:
    """One completed optimizer step of a committed training cell: its peak and its shapes."""

    key: Key
    card: str
    cell_id: str
    batch: int
    query_tokens: int
    doc_tokens: int
    slots: int
    dim: int
    maxsim_mib: dict[str, float]
    peak_alloc_mib: float

    @property
    def tokens(self) -> int:
        return self.batch * (self.query_tokens + self.slots * self.doc_tokens)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A committed training cell as a verdict: did ``batch`` train under ``cap_mib``?"""

    key: Key
    allocator: str
    card: str
    cell_id: str
    batch: int
    cap_mib: float
    fits: bool


def key_of(result: CellResult) -> Key:
    return (result.stack, result.regime, data.backend_label(result.variant, result.score_mini_batch_size))


def training_results(results: data.Results) -> list[CellResult]:
    """The full-size training cells the model learns from (re-runs left out: their twins are in), of
    the recipes it models: GradCache scores per query chunk against every document, a MaxSim term
    the model's planned calls do not describe, so its cells are left out rather than fitted wrong."""
    return [result for _, result in results.excluding(*LEAVE_OUT_GRIDS)
            if result.kind == "train" and result.preset == "full" and result.outcome in ("ok", "oom")
            and (result.stack, result.regime) in RECIPES
            and result.env is not None and result.env.device_capacity_mib is not None]  # fmt: skip


def step_points(result: CellResult) -> list[StepPoint]:
    """Every completed step after the first (the first has no optimizer state yet), each with its
    own calls' shapes. A cell recorded before per-step peaks gives one point: its peak, with the
    step whose calls are the largest."""
    by_step: dict[int | None, list[OpCall]] = {}
    for call in result.maxsim_calls_in_train:
        by_step.setdefault(call.step, []).append(call)
    per_step = result.step_peak_alloc_per_step_mib
    if per_step and None not in by_step:
        steps = [(peak, by_step.get(index, [])) for index, peak in enumerate(per_step) if index > 0]
    elif result.outcome == "ok" and result.step_peak_alloc_mib is not None and by_step:
        largest = max(by_step.values(), key=lambda calls: (_sample_shape(calls), _bytes(result.stack, calls)["transient"]))
        steps = [(result.step_peak_alloc_mib, largest)]
    else:
        return []
    points = []
    for peak, calls in steps:
        if not calls:
            continue
        query_tokens, doc_tokens, slots, dim = _sample_shape(calls)
        points.append(StepPoint(key_of(result), result.card, result.cell_id, result.batch_size, query_tokens, doc_tokens,
                                slots, dim, _bytes(result.stack, calls), peak))  # fmt: skip
    return points


def _sample_shape(calls: Sequence[OpCall]) -> tuple[int, int, int, int]:
    """(query tokens, document tokens, documents per query, width) of a step's calls."""
    doc = calls[0].doc_shape
    return (max(c.query_shape[1] for c in calls), max(c.doc_shape[-2] for c in calls), 1 if len(doc) == 3 else doc[1], doc[-1])


def _bytes(stack: str, calls: Sequence[OpCall]) -> dict[str, float]:
    return step_maxsim_mib([vanilla_call_bytes(stack, c.query_shape, c.doc_shape, c.dtype) for c in calls])


def outcome_of(result: CellResult) -> Outcome:
    assert result.env is not None
    cap = result.env.card_cap_mib or result.env.device_capacity_mib
    assert cap is not None
    return Outcome(key_of(result), result.allocator, result.card, result.cell_id, result.batch_size, cap, result.outcome == "ok")


# ---- the model ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Lengths:
    """A sample's shape: query tokens, document tokens, documents per query, embedding width."""

    query_tokens: int
    doc_tokens: int
    slots: int
    dim: int


@dataclasses.dataclass(frozen=True)
class PeakModel:
    """The step peak of one (stack, regime, backend): ``fixed + per_token·tokens + maxsim``."""

    key: Key
    fixed_mib: float
    per_token_mib: float
    maxsim_placement: Placement
    points: int
    batches: tuple[int, ...]
    rms_residual_mib: float  # root mean square of measured − fitted over the steps it was fitted to
    worst_residual_mib: float  # the largest |measured − fitted| among them
    chunk: int | None = None

    def peak_mib(self, batch: int, lengths: Lengths, world_size: int = 1) -> float:
        stack = self.key[0]
        maxsim = 0.0
        if self.maxsim_placement != "none":
            calls = planned_calls(stack, batch, lengths.query_tokens, lengths.doc_tokens, lengths.slots, lengths.dim,
                                  self.chunk, world_size)  # fmt: skip
            maxsim = step_maxsim_mib(calls)[self.maxsim_placement]
        tokens = batch * (lengths.query_tokens + lengths.slots * lengths.doc_tokens)
        return self.fixed_mib + self.per_token_mib * tokens + maxsim


@dataclasses.dataclass(frozen=True)
class Margin:
    """The allocator's margin for one (stack, regime, backend, allocator): a batch fits when
    ``peak · (1 + fraction) ≤ cap``. ``allowed``: the interval of fractions that classifies
    the fewest committed cells wrongly (``misclassified`` of ``cells``)."""

    key: Key
    allocator: str
    fraction: float
    allowed: tuple[float | None, float | None]
    cells: int
    misclassified: int
    cards: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    peaks: dict[Key, PeakModel]
    margins: dict[tuple[Key, str], Margin]
    lengths: dict[str, Lengths]  # per stack: the longest recorded lengths (the batch a ceiling must survive)
    excluded_card: str | None = None

    def peak_model(self, key: Key) -> PeakModel:
        if key not in self.peaks:
            known = ", ".join("/".join(k) for k in sorted(self.peaks))
            raise ModelError(f"no committed training cell of {'/'.join(key)} to fit a step peak to; known: {known}.")
        return self.peaks[key]

    def margin(self, key: Key, allocator: str) -> Margin:
        margin = self.margins.get((key, allocator))
        if margin is None:
            raise ModelError(f"no committed cell of {'/'.join(key)} ran under the {allocator!r} allocator "
                             f"(with a cap it could hit), so its margin is unknown; measure a ceiling there first.")  # fmt: skip
        return margin

    def predict_peak(self, key: Key, batch: int, lengths: Lengths | None = None, world_size: int = 1) -> float:
        """Predicted step peak allocated (MiB) at ``batch`` per device."""
        return self.peak_model(key).peak_mib(batch, lengths or self.lengths[key[0]], world_size)

    def predict_ceiling(self, key: Key, allocator: str, cap_mib: float, lengths: Lengths | None = None,
                        resolution: int = 1, limit: int = 1 << 20, world_size: int = 1) -> int:  # fmt: skip
        """The largest multiple of ``resolution`` (≤ ``limit``) whose predicted peak plus margin fits
        ``cap_mib``; 0 when not even ``resolution`` does."""
        factor = 1 + self.margin(key, allocator).fraction

        def fits(batch: int) -> bool:
            return self.predict_peak(key, batch * resolution, lengths, world_size) * factor <= cap_mib

        low, high = 0, limit // resolution  # fits(low) holds by convention; find the largest that fits
        if fits(high):
            return high * resolution
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low * resolution


def fit_peak(key: Key, points: Sequence[StepPoint], chunk: int | None) -> PeakModel:
    """Least squares of ``peak − maxsim = fixed + per_token · tokens``, for each place the MaxSim term
    may sit (fused backends: none); the place with the smallest residual (root mean square) wins."""
    tokens = np.array([p.tokens for p in points], dtype=float)
    peaks = np.array([p.peak_alloc_mib for p in points], dtype=float)
    design = np.column_stack([np.ones_like(tokens), tokens])
    placements: tuple[Placement, ...] = ("none", "transient", "held") if key[2].startswith("vanilla") else ("none",)
    best: PeakModel | None = None
    for placement in placements:
        maxsim = np.array([p.maxsim_mib[placement] for p in points])
        (fixed, per_token), *_ = np.linalg.lstsq(design, peaks - maxsim, rcond=None)
        residuals = design @ np.array([fixed, per_token]) + maxsim - peaks
        rms, worst = float(np.sqrt(np.mean(residuals**2))), float(np.max(np.abs(residuals)))
        model = PeakModel(key, float(fixed), float(per_token), placement, len(points),
                          tuple(sorted({p.batch for p in points})), rms, worst, chunk)  # fmt: skip
        if best is None or rms < best.rms_residual_mib:
            best = model
    assert best is not None
    return best


def fit_margin(key: Key, allocator: str, outcomes: Sequence[Outcome], peak: PeakModel, lengths: Lengths) -> Margin | None:
    """The margin that best separates the cells that trained from those that did not: each cell's
    ``cap / predicted peak − 1`` is an upper bound (it trained) or a strict lower bound (it ran out of
    memory); the margin is the middle of the gap, between two neighbouring bounds, that
    misclassifies the fewest cells (the widest such gap; above the largest bound when every cell
    failed, at the smallest when every cell trained)."""
    if not outcomes:
        return None
    ratios = sorted((o.cap_mib / peak.peak_mib(o.batch, lengths) - 1, o.fits) for o in outcomes)
    values = [r for r, _ in ratios]
    bounds = [None, *values, None]  # gap i lies between bounds[i] and bounds[i + 1]
    best: tuple[int, float, int] | None = None  # (misclassified, -width, gap)
    for gap in range(len(values) + 1):
        # a margin inside gap: cells whose ratio is below it fail, at or above it fit
        wrong = sum(1 for r, fits in ratios[:gap] if fits) + sum(1 for r, fits in ratios[gap:] if not fits)
        low, high = bounds[gap], bounds[gap + 1]
        width = math.inf if low is None or high is None else high - low
        candidate = (wrong, -width, gap)
        if best is None or candidate < best:
            best = candidate
    assert best is not None
    wrong, _, gap = best
    low, high = bounds[gap], bounds[gap + 1]
    if low is None:
        fraction = max(0.0, high or 0.0)  # every cell at or above trained: the tightest bound they allow
    elif high is None:
        fraction = low + 1e-3  # every cell failed: just above the largest bound
    else:
        fraction = (low + high) / 2
    return Margin(key, allocator, fraction, (low, high), len(outcomes), wrong, tuple(sorted({o.card for o in outcomes})))


def fit(results: data.Results, exclude_card: str | None = None) -> MemoryModel:
    """The model from every committed training cell, leaving out ``exclude_card``'s."""
    chosen = [r for r in training_results(results) if r.card != exclude_card]
    points = [p for result in chosen for p in step_points(result)]
    if not points:
        raise ModelError(f"no committed training step under {results.root} to fit (left out: card {exclude_card}).")
    lengths = {}
    for stack in sorted({p.key[0] for p in points}):
        mine = [p for p in points if p.key[0] == stack]
        lengths[stack] = Lengths(max(p.query_tokens for p in mine), max(p.doc_tokens for p in mine),
                                 max(p.slots for p in mine), max(p.dim for p in mine))  # fmt: skip
    chunks = {key_of(r): r.score_mini_batch_size for r in chosen}
    peaks = {}
    for key in sorted({p.key for p in points}):
        mine = [p for p in points if p.key == key]
        if len({p.batch for p in mine}) < 2:  # one batch cannot tell a fixed cost from a per-token one
            continue
        peaks[key] = fit_peak(key, mine, chunks[key])
    outcomes = [outcome_of(r) for r in chosen]
    margins = {}
    for key, allocator in sorted({(o.key, o.allocator) for o in outcomes}):
        if key not in peaks:
            continue
        verdicts = [o for o in outcomes if o.key == key and o.allocator == allocator]
        margin = fit_margin(key, allocator, verdicts, peaks[key], lengths[key[0]])
        if margin is not None:
            margins[(key, allocator)] = margin
    return MemoryModel(peaks, margins, lengths, exclude_card)


# ---- validation: leave one card out ---------------------------------------------------------------


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(float(value), digits)


def validation_row(row: data.SearchRow, model: MemoryModel) -> dict[str, Any]:
    """One ceiling search: its measured state, the ceiling predicted without its card's cells, the
    error, and where the prediction misses the goal, which term is wrong."""
    search = row.search
    key: Key = (search.stack, search.regime, row.backend)
    measured = row.settled if row.fails is not None else None
    state = (EARLIER_DRAW_STATE if row.ceiling.earlier_draw  # its deciding probes run again on the current draw
             else "finished" if measured is not None else "at the limit" if row.settled is not None
             else "bracketed, unconfirmed" if row.fits is not None and row.fails is not None
             else "lower bound only" if row.fits is not None else "not run")  # fmt: skip
    cap_mib = row.usable_gib * 1024 if row.usable_gib is not None else None
    out: dict[str, Any] = {
        "search_id": search.search_id, "stack": search.stack, "regime": search.regime, "backend": row.backend,
        "card": search.card, "allocator": search.allocator, "cap_mib": _round(cap_mib), "resolution": search.resolution,
        "state": state, "measured_fits": row.fits, "measured_fails": row.fails, "measured_ceiling": measured,
        "predicted_ceiling": None, "error_batch": None, "error_fraction": None, "tolerance_batch": None,
        "within_goal": None, "margin_fraction": None, "margin_from_cards": None,
        "predicted_peak_at_measured_mib": None, "measured_peak_at_measured_mib": None, "wrong_term": None, "note": None,
    }  # fmt: skip
    if cap_mib is None:
        out["note"] = "no cap known for this card"
        return out
    assert model.excluded_card == search.card, "the model must be fitted without the search's card"
    try:
        margin = model.margin(key, search.allocator)
        predicted = model.predict_ceiling(key, search.allocator, cap_mib, resolution=search.resolution, limit=search.limit)
    except ModelError as error:
        out["note"] = f"not predictable without {search.card}: {error}"
        return out
    out.update(predicted_ceiling=predicted, margin_fraction=round(margin.fraction, 4), margin_from_cards=list(margin.cards))
    if measured is None:
        return out
    tolerance = max(search.resolution, GOAL_FRACTION * measured)
    miss = predicted - measured
    peak_predicted = model.predict_peak(key, measured)
    peak_measured = (row.peak_alloc_gib or 0.0) * 1024
    out.update(error_batch=miss, error_fraction=round(miss / measured, 4), tolerance_batch=_round(tolerance, 2),
               within_goal=abs(miss) <= tolerance, predicted_peak_at_measured_mib=_round(peak_predicted),
               measured_peak_at_measured_mib=_round(peak_measured))  # fmt: skip
    if not out["within_goal"]:
        out["wrong_term"], out["note"] = _blame(model, key, row, margin, peak_predicted, peak_measured, cap_mib)
    return out


def _blame(model: MemoryModel, key: Key, row: data.SearchRow, margin: Margin, peak_predicted: float,
           peak_measured: float, cap_mib: float) -> tuple[str, str]:  # fmt: skip
    """Which term misses. This card's own verdicts bound the margin: the measured peak at its
    ceiling fitted (``cap / peak − 1`` is the most it can be), the predicted peak one resolution
    above did not (the least). A fitted margin outside those bounds is the wrong term; inside
    them, the step peak is."""
    assert row.fits is not None and row.fails is not None
    most = cap_mib / peak_measured - 1
    least = cap_mib / model.predict_peak(key, row.fails) - 1
    peak_note = f"step peak at B={row.fits}: predicted {peak_predicted:.0f} MiB, measured {peak_measured:.0f} MiB"
    if least < margin.fraction <= most:
        return "peak", f"{peak_note} (MaxSim term placed: {model.peaks[key].maxsim_placement})"
    return "margin", (f"fragmentation margin: fitted {margin.fraction:.3f} of the peak on {', '.join(margin.cards)} "
                      f"({margin.misclassified} of {margin.cells} cells misclassified), this card's verdicts "
                      f"need ({least:.3f}, {most:.3f}]; {peak_note}")  # fmt: skip


def parameters(model: MemoryModel) -> dict[str, Any]:
    """The fitted parameters, as plain data."""
    return {
        "lengths": {stack: dataclasses.asdict(lengths) for stack, lengths in model.lengths.items()},
        "peaks": [{"stack": p.key[0], "regime": p.key[1], "backend": p.key[2], "fixed_mib": _round(p.fixed_mib),
                   "per_token_mib": round(p.per_token_mib, 6), "per_sample_mib_at_lengths": _round(
                       p.per_token_mib * _sample_tokens(model.lengths[p.key[0]]), 2),
                   "maxsim_placement": p.maxsim_placement, "steps_fitted": p.points, "batches": list(p.batches),
                   "rms_residual_mib": _round(p.rms_residual_mib),
                   "worst_residual_mib": _round(p.worst_residual_mib)} for p in model.peaks.values()],
        "margins": [{"stack": m.key[0], "regime": m.key[1], "backend": m.key[2], "allocator": m.allocator,
                     "fraction": round(m.fraction, 4), "allowed": [_round(b, 4) for b in m.allowed], "cells": m.cells,
                     "misclassified": m.misclassified, "cards": list(m.cards)} for m in model.margins.values()],
    }  # fmt: skip


def _sample_tokens(lengths: Lengths) -> int:
    return lengths.query_tokens + lengths.slots * lengths.doc_tokens


def results_sha256(results: data.Results) -> str:
    """A hash of the result files the model read (relative path and bytes, in path order)."""
    digest = hashlib.sha256()
    for path, _ in sorted(results.found, key=lambda item: str(item[0])):
        name = path.relative_to(results.root).as_posix() if path.is_relative_to(results.root) else path.name
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def validation_document(source: data.Source = None) -> dict[str, Any]:
    """Everything ``validate`` writes: the model fitted on every card, one row per ceiling search
    predicted without its card, a summary, and what it was computed from."""
    results = data.results_of(source)
    searches = data.ceilings(results)
    models = {card: fit(results, exclude_card=card) for card in sorted({row.card for row in searches})}
    rows = [validation_row(row, models[row.card]) for row in searches]
    judged = [row for row in rows if row["within_goal"] is not None]
    worst = max(judged, key=lambda row: abs(row["error_fraction"]), default=None)
    from harness.provenance import checkout, tree_sha256  # provenance reads git; only the writer needs it

    commit, dirty = checkout()
    return {
        "what": "predicted vs measured batch ceilings, leave-one-card-out (harness/memmodel.py)",
        "goal": f"|predicted - measured| <= max(resolution, {GOAL_FRACTION:.0%} of measured)",
        "provenance": {"command": "harness predict --validate", "commit": commit, "dirty": dirty,
                       "harness_sha256": tree_sha256(ROOT / "harness"), "results_sha256": results_sha256(results),
                       "results_read": len(results.found)},  # fmt: skip
        "summary": {"searches": len(rows), "judged": len(judged), "within_goal": sum(1 for r in judged if r["within_goal"]),
                    "worst": None if worst is None else {k: worst[k] for k in (
                        "search_id", "measured_ceiling", "predicted_ceiling", "error_fraction", "wrong_term", "note")}},
        "model": parameters(fit(results)),
        "validation": rows,
    }  # fmt: skip


def write_validation(path: Path = VALIDATION, source: data.Source = None) -> dict[str, Any]:
    document = validation_document(source)
    write_text_atomic(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return document


# ---- cards nobody measured ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NamedCard:
    """A card by the capacity PyTorch reports for it (its out-of-memory messages' "total capacity");
    usable: that less the CUDA context, as :data:`harness.spec.CARDS` derives its caps."""

    name: str
    reported_gib: float
    label: str

    @property
    def usable_gib(self) -> float:
        return round(self.reported_gib - CONTEXT_GIB, 2)


# Reported capacities quoted from public out-of-memory messages ("GPU 0 has a total capacity of X GiB").
# They vary a little with driver and board; pass --memory-gib for your own card's figure.
OTHER_CARDS = {card.name: card for card in (
    NamedCard("l4-24gb", 22.05, "L4 / A10 24 GB"),
    NamedCard("a100-80gb", 79.15, "A100 80 GB"),
    NamedCard("h100-nvl-94gb", 93.00, "H100 NVL 94 GB"),
    NamedCard("b200-180gb", 178.35, "B200 180 GB"),
    NamedCard("mi300x-192gb", 191.98, "MI300X 192 GB (ROCm: its allocator is not the one measured)"),
)}  # fmt: skip
H200_REPORTED_GIB = 139.80  # the committed 'native' card: the H200 these results ran on


def card_usable_gib(name: str) -> tuple[float, str]:
    """(usable GiB, label) of a measured card (``harness.spec.CARDS``) or a named one."""
    names = [*CARDS, *OTHER_CARDS]
    name = choose("card", name, names)
    if name in OTHER_CARDS:
        return OTHER_CARDS[name].usable_gib, OTHER_CARDS[name].label
    card = CARDS[name]
    return (card.usable_gib if card.usable_gib is not None else H200_REPORTED_GIB), card.description


def parse_key(stack: str, regime: str, backend: str) -> Key:
    """``vanilla``, ``lik``, ``flash`` or ``vanilla + chunk 64`` (also ``chunk64``)."""
    if backend.replace(" ", "").startswith("vanilla+chunk") or backend.startswith("chunk"):
        backend = f"vanilla + chunk {int(''.join(ch for ch in backend if ch.isdigit()))}"
    return (stack, regime, backend)


def table(model: MemoryModel, allocator: str = "default") -> list[dict[str, Any]]:
    """Predicted largest batch for every recipe × backend × card (measured and named cards)."""
    cards = [(name, *card_usable_gib(name)) for name in [*CARDS, *OTHER_CARDS]]
    rows = []
    for key in sorted(model.peaks):
        if (key[0], key[1]) not in RECIPES or (key, allocator) not in model.margins:
            continue
        for name, usable, _ in sorted(cards, key=lambda card: card[1]):
            ceiling = model.predict_ceiling(key, allocator, usable * 1024)
            rows.append({"stack": key[0], "regime": key[1], "backend": key[2], "card": name, "usable_gib": usable,
                         "predicted_largest_batch": ceiling,
                         "margin_misclassifies": model.margins[(key, allocator)].misclassified})  # fmt: skip
    return rows


# ---- the command ----------------------------------------------------------------------------------


def _predict(args: argparse.Namespace, model: MemoryModel) -> str:
    key = parse_key(args.stack, args.regime, args.backend)
    peak = model.peak_model(key)
    if args.memory_gib is not None:
        if args.memory_gib <= 0:
            raise ModelError(f"--memory-gib must be positive, got {args.memory_gib}.")
        usable, label = args.memory_gib, "a card"
    else:
        usable, label = card_usable_gib(args.card)[0], args.card
    reference = model.lengths[key[0]]
    lengths = Lengths(args.query_length or reference.query_tokens, args.doc_length or reference.doc_tokens,
                      reference.slots, reference.dim)  # fmt: skip
    margin = model.margin(key, args.allocator)
    lines = [f"{'/'.join(key)} on {label} ({usable:.2f} GiB usable), allocator {args.allocator}, "
             f"query {lengths.query_tokens} / document {lengths.doc_tokens} tokens, world size {args.world_size}:"]  # fmt: skip
    if args.batch:
        at = model.predict_peak(key, args.batch, lengths, args.world_size)
        lines.append(f"  predicted step peak at B={args.batch} per device: {at / 1024:.2f} GiB allocated, "
                     f"{at * (1 + margin.fraction) / 1024:.2f} GiB with the allocator's margin")  # fmt: skip
    ceiling = model.predict_ceiling(key, args.allocator, usable * 1024, lengths, world_size=args.world_size)
    lines.append(f"  predicted largest batch per device: {ceiling}")
    per_sample = peak.per_token_mib * _sample_tokens(lengths)
    lines.append(f"  (fixed {peak.fixed_mib:.0f} MiB + {per_sample:.1f} MiB per sample, MaxSim {peak.maxsim_placement}, "
                 f"margin {margin.fraction:.1%} of the peak from {', '.join(margin.cards)})")  # fmt: skip
    if args.world_size > 1:
        lines.append("  world size > 1: per-device figures of one-GPU training; DDP's gradient buckets and documents "
                     "gathered across devices are not in this model (the page *Negatives gathered across GPUs* adds "
                     "them to the multi-GPU grid's W = 1 cells).")  # fmt: skip
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``harness predict``'s flags: a prediction for a card (the default), ``--table`` for common
    cards, or ``--validate`` to fit, validate leave-one-card-out and write the validation file."""
    parser.add_argument("--results", default=None, help="results folder (default: the committed results/)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--validate", action="store_true",
                      help=f"fit, validate leave-one-card-out, write {VALIDATION.relative_to(ROOT)}")  # fmt: skip
    mode.add_argument("--table", action="store_true", help="predicted largest batch: recipes × backends × cards")
    parser.add_argument("--check", action="store_true",
                        help="with --validate: compare with the file, write nothing (exit 1: it differs)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=VALIDATION, help="with --validate: where (default: the committed file)")
    parser.add_argument("--stack", choices=["colpali", "pylate"], help="whose recipe (required for a prediction)")
    parser.add_argument("--regime", default=None, help="plain | grad-checkpoint (default: the stack's recipe)")
    parser.add_argument("--backend", default="vanilla", help="vanilla | lik | flash | 'vanilla + chunk 64'")
    parser.add_argument("--card", help=f"a card: {', '.join([*CARDS, *OTHER_CARDS])}")
    parser.add_argument("--memory-gib", type=float, help="usable GiB (the card's reported capacity less ~0.7 GiB of context)")
    parser.add_argument("--allocator", default="default", choices=["default", "expandable"],
                        help="the caching allocator setting the margin was fitted for (default: PyTorch's default)")  # fmt: skip
    parser.add_argument("--query-length", type=int, default=None, help="query tokens (default: the longest recorded)")
    parser.add_argument("--doc-length", type=int, default=None, help="document tokens (default: the longest recorded)")
    parser.add_argument("--world-size", type=int, default=1, help="data-parallel ranks (labels per-device figures; default 1)")
    parser.add_argument("--batch", type=int, default=None, help="also predict the step peak at this per-device batch")


def command(args: argparse.Namespace) -> int:
    """Run ``harness predict`` (exit 2 with a one-line reason on bad input)."""
    try:
        return _run(args)
    except (ModelError, SpecError) as error:
        print(f"harness predict: {error}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.memmodel", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return command(parser.parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    results = data.read(args.results)
    if args.validate:
        if args.check:
            fresh = validation_document(results)
            on_disk = json.loads(args.out.read_text()) if args.out.exists() else None
            same = on_disk is not None and comparable(on_disk) == comparable(fresh)
            stale = "differs from what the results give now; run harness predict --validate"
            print(f"{args.out}: {'up to date' if same else stale}")
            return 0 if same else 1
        document = write_validation(args.out, results)
        _print_rows(document["validation"])
        summary = document["summary"]
        print(f"{summary['within_goal']} of {summary['judged']} finished searches within the goal; wrote {args.out}")
        return 0
    if not args.table:
        if args.stack is None or (args.card is None) == (args.memory_gib is None):
            raise ModelError("a prediction needs --stack and one of --card or --memory-gib (or use --table / --validate).")
        for name in ("query_length", "doc_length", "world_size", "batch"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ModelError(f"--{name.replace('_', '-')} must be at least 1, got {value}.")
    model = fit(results)
    if not args.table:
        if args.regime is None:
            args.regime = "plain" if args.stack == "colpali" else "grad-checkpoint"
        print(_predict(args, model))
        return 0
    rows = table(model, args.allocator)
    print("predicted largest batch per device (from the committed results; see results/predictions/validation.json)")
    for row in rows:
        wrong = row["margin_misclassifies"]
        flag = f"  * its margin misclassifies {wrong} committed cells" if wrong else ""
        print(f"  {row['stack']:8} {row['regime']:16} {row['backend']:18} {row['card']:14} "
              f"{row['usable_gib']:7.2f} GiB  {row['predicted_largest_batch']:6}{flag}")  # fmt: skip
    return 0


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The document less what names the code or checkout (commit, dirty flag, source hash): what
    the committed results alone decide."""
    provenance = {k: v for k, v in document.get("provenance", {}).items() if k not in ("commit", "dirty", "harness_sha256")}
    return document | {"provenance": provenance}


def _print_rows(rows: Iterable[dict[str, Any]]) -> None:
    for row in rows:
        if row["state"] == "not run":
            continue
        measured = row["measured_ceiling"]
        if measured is None:
            measured = f"[{row['measured_fits']}, {row['measured_fails']})"
        verdict = "" if row["within_goal"] is None else ("ok" if row["within_goal"] else f"MISS ({row['wrong_term']})")
        print(f"{row['search_id']:55} measured {measured!s:>12} predicted {row['predicted_ceiling']!s:>6} {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
