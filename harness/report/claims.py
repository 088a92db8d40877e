"""Published claims, re-tested: every quantitative claim of the published work beside our number and a verdict.

The claims are data (``book/data/published_claims.csv``), one row each: the claim in brief, its source
(which table or sentence of the seed PR, or of a PR it cites), the published value as written, and a
key naming the one quantity of ours it compares to — stack, regime, batch(es), backend(s), card and
``quantity`` (one of :data:`QUANTITIES`) — with a tolerance class (:data:`TOLERANCES`, each with the
argument for it). Here each claim is re-tested against the committed results read through
:mod:`harness.report.data`: pure functions from a claim and the evidence to a :class:`Verdict`
("holds", "differs", "does not hold", or "not re-tested" with the reason). Torch-free.

The verdicts mean:

- **holds** — our number is within the claim's tolerance (or the outcome, bound or ceiling is the same);
- **differs** — a figure outside the tolerance, with why it may differ where the claim's row knows;
- **does not hold** — an outcome, bound or ceiling our data contradicts;
- **not re-tested** — why: step times not yet trustworthy (issue 16), a ceiling search unfinished or
  not run (issue 18), no cell of ours, or a claim nothing of ours can test.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import pandas as pd

from harness.grid import ROOT
from harness.report import data, timing
from harness.report.data import GIB_PER_MIB, SearchRow, find_search
from harness.report.tables import Shape, call_shape, call_tokens, shape_words
from harness.report.text import card_label, ceiling_text, counted, failed_request, joined, missing, percent, signed, significant

CLAIMS = ROOT / "book" / "data" / "published_claims.csv"
FIELDS = ["id", "section", "claim", "source", "published", "unit", "quantity", "stack", "regime", "batch", "backend",
          "versus", "card", "tolerance", "not_retestable", "if_differs"]  # fmt: skip

Status = Literal["holds", "differs", "does not hold", "not re-tested"]
STATUSES: tuple[Status, ...] = ("holds", "differs", "does not hold", "not re-tested")

SECTIONS = {
    "colpali": "ColQwen2 + LoRA on an 80 GB card",
    "pylate-plain": "PyLate, canonical recipe (no gradient checkpointing)",
    "pylate-gc": "PyLate with gradient checkpointing",
    "ceilings": "Batch-size ceilings",
    "times": "Step times and speed",
}

# Why a claim waits, in the summary's words (Verdict.waits_on): (one, several, why).
WAITS = {
    "times": ("step-time claim", "step-time claims", ", whose times are being re-measured (issue 16: trustworthy step times)"),
    "search": ("ceiling claim", "ceiling claims", ", whose searches are unfinished or not run (issue 18)"),
    "absolute": ("absolute time", "absolute times", " of an H100, which an H200 cannot re-test (the speed ratios are re-tested "
                 "instead)"),
    "no cell": ("claim", "claims", " with no cell of ours to compare"),
    "untestable": ("claim", "claims", " that nothing of ours can test"),
}
TIMES_WAIT = "not yet re-tested: step times are being re-measured (issue 16: trustworthy step times)"

# spec §1: a cell whose times are published owns its host (or is pinned to its own cores) and has at
# least 8 steady steps. The timing rule (issue 16, harness.host) records in each result whether its times
# are the card's (CellResult.times_comparable); a cells frame without that column has no such record.
MIN_STEADY_STEPS = 8
COMPARABLE = "times_comparable"


# ---- tolerances ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """How close our number must be to the published one for a claim to hold, and why that close."""

    reads: str  # in a table cell: '±2% or 64 MiB'
    why: str  # the argument, in a sentence or two
    relative: float = 0.0  # of the published value
    absolute_mib: float = 0.0  # a floor for memory figures, MiB


TOLERANCES: dict[str, Tolerance] = {
    "memory": Tolerance(
        "±2.5% or 16 MiB",
        "Whichever of the two is larger. Memory is exact for given shapes: our vanilla replays agree with the "
        "analytic grid to under 1 MiB, and PyLate pads every query to 48 tokens and every document to 300, so its "
        "figures do not depend on the data at all. ColQwen2's grid and activations follow the longest query and "
        "page a batch draws, and ours are drawn from calibrated lengths, not the real set: one token more in a "
        "longest query of about 50 is 2% more grid. 2.5% is that token and the published figure's rounding (two "
        "decimals of a GiB); 16 MiB covers whole-MiB figures and the allocator's block rounding on the smallest. "
        "What the claims are about is far outside: a materialised score grid is GiBs.",
        relative=0.025, absolute_mib=16.0),
    "fused-memory": Tolerance(
        "±10% or 4 MiB",
        "Whichever of the two is larger. A fused kernel keeps its scores and an argmax buffer, exact from the "
        "shapes, plus scratch whose size follows the kernel configuration Triton picks on the card and the "
        "late-interaction-kernels release (ours is newer than the published run's). A few MiB, or a tenth, is that; "
        "a materialised grid at these batches is tens to thousands of MiB.",
        relative=0.10, absolute_mib=4.0),
    "memory-ratio": Tolerance(
        "±12%",
        "A ratio of a vanilla figure (±2.5%) to a fused one (±10%) is good to about the sum of the two. Ours sets "
        "both backends on one call shape, as the published op table does; the published shape is the published "
        "run's, which it does not name, and the vanilla figure follows it (the verdict says how far).",
        relative=0.12),
    "growth": Tolerance(
        "±10%",
        "Ours is read at one call shape both batches replayed (the same tokens per query and per page), so only the "
        "batch moves it: a B² grid then grows exactly ×4 per batch doubling and a per-pair buffer ×2, up to the "
        "allocator's block rounding and a fused kernel's scratch, whose configuration may change with the batch. "
        "The published factors are of the published run's batches, whose longest queries and pages it does not "
        "name. ±10% still tells ×4 from ×2, which is the claim.",
        relative=0.10),
    "rounded": Tolerance(
        "half a unit of the published figure's last digit",
        "The published figure is itself rounded ('25 GiB'): any value that rounds to it agrees with it."),
    "exact": Tolerance(
        "the same outcome",
        "Running out of memory or not is an outcome: it is the same or it is not (and, where the claim says, "
        "in the same place: inside the MaxSim op or outside it)."),
    "search": Tolerance(
        "the search's resolution",
        "A ceiling is searched (grids/ceilings.yaml: 8 steps, 3 seeds, the allocator's default setting) and is "
        "known between the largest batch that trained every seed and the next probed batch that did not. A claim "
        "holds if it holds everywhere in that range, does not hold if it fails everywhere in it; an unfinished "
        "search decides nothing."),
    "time": Tolerance(
        "not compared",
        "Our card is an H200 capped to an H100's usable memory: its memory behaves as the H100's, its speed does "
        "not. Absolute seconds per step and samples per second are never compared; speed claims are re-tested as "
        "ratios between backends on the same card."),
    "time-ratio": Tolerance(
        "±5%",
        "A speed ratio between two backends on one card carries over to another card only roughly (the op's share "
        "of a step changes with the card). Only cells timed under the timing rule (their GPU and CPU cores to "
        f"themselves, at least {MIN_STEADY_STEPS} steady steps) are compared, each ratio named with its batch and card "
        "and carried with its bootstrap 95% interval. A second run of a cell moves its median by up to its recipe's "
        "run-to-run noise (the methodology gives it), so a ratio whose interval reaches into 1 ± that noise is no "
        "difference: a claimed speedup holds where every ratio is a difference and its interval reaches the band, a "
        "claimed parity where every ratio is no difference or reaches the band.",
        relative=0.05),
}


def within(published: float, ours: float, relative: float, absolute: float = 0.0) -> bool:
    """``ours`` within ``relative`` of ``published``, or within ``absolute`` of it, whichever is wider."""
    return abs(ours - published) <= max(relative * abs(published), absolute)


def last_digit_half(text: str) -> float:
    """Half a unit of a written figure's last digit: '25' → 0.5, '1.81' → 0.005."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0**-decimals


def digits_of(text: str) -> int:
    """The significant digits of a written figure: '54.10' → 4, '2.40' → 3, '61' → 2, '0.0596' → 3."""
    figures = text.replace(".", "").lstrip("0")
    return max(1, len(figures))


# ---- the claims ----------------------------------------------------------------------------------

QUANTITIES = {
    # one cell (stack, regime, batch, backend, card); memory in the claim's unit (GiB or MiB)
    "op_held": "the MaxSim op's memory held for backward (isolated replay of the call that held the most)",
    "op_backward": "the MaxSim op's backward spike on top of what it holds (isolated replay)",
    "op_forward": "the MaxSim op's forward transient (isolated replay)",
    "op_total": "the MaxSim op's held + backward spike (isolated replay)",
    "step_peak_alloc": "the step peak allocated of a cell that trained",
    "step_peak_reserved": "the step peak reserved of a cell that trained",
    "pre_oom_alloc": "allocated memory at the peak before a cell ran out of memory",
    "pre_oom_reserved": "reserved memory at the peak before a cell ran out of memory",
    "oom_request": "the failed request of a cell's out-of-memory error",
    "oom_unallocated": "memory reserved but unallocated when a cell ran out of memory (its error message)",
    "outcome": "trains ('ok'), runs out of memory ('oom'), inside the op or outside it ('oom in maxsim' / 'oom elsewhere')",
    "samples_per_sec": "samples per second (steady steps)",
    "step_time": "seconds per step (steady median)",
    # several cells
    "op_reduction": "versus's op total over backend's, same batch",
    "op_growth": "op total growth per batch doubling between two batches",
    "same_oom": "every backend (|-separated) runs out of memory with the same allocated memory",
    "speedup": "versus's steady step time over backend's, per batch (a range over the batches)",
    # ceiling searches (grids/ceilings.yaml, default allocator)
    "ceiling_below": "the backend's searched ceiling is below the batch (it cannot train it)",
    "ceiling_at_least": "the backend's searched ceiling is at least the batch",
    "ceiling_gain": "the backend's ceiling over versus's is at least the published factor",
    "ceiling_same": "the backend's ceiling equals versus's",
    # nothing of ours
    "untestable": "a claim nothing of ours can test (its row says why)",
}
CEILING_QUANTITIES = {"ceiling_below", "ceiling_at_least", "ceiling_gain", "ceiling_same"}


@dataclass(frozen=True)
class Claim:
    """One published claim (a row of ``published_claims.csv``)."""

    id: str
    section: str
    claim: str
    source: str
    published: str  # as written in the source: '2.40', 'oom', '1.07–1.12'
    unit: str
    quantity: str
    stack: str
    regime: str
    batches: tuple[int, ...]
    backends: tuple[str, ...]
    versus: str
    card: str
    tolerance: str
    not_retestable: str = ""  # why no number of ours can test it (empty: it can)
    if_differs: str = ""  # why our number may differ, said when it does

    @property
    def batch(self) -> int:
        return self.batches[-1]

    @property
    def backend(self) -> str:
        return self.backends[0]

    @property
    def value(self) -> float:
        """The published figure as a number (the lower end of a range)."""
        return float(self.published.split("–")[0])


def parse_claim(row: dict[str, str]) -> Claim:
    """A CSV row as a :class:`Claim`; a ValueError naming the row and field for anything it cannot use."""
    where = f"published claim {row.get('id') or '(no id)'}"
    missing_fields = [field for field in FIELDS if field not in row]
    if missing_fields:
        raise ValueError(f"{where}: no column {', '.join(missing_fields)} in {CLAIMS.name}")
    if row["quantity"] not in QUANTITIES:
        raise ValueError(f"{where}: quantity {row['quantity']!r} is not one of {', '.join(QUANTITIES)}")
    if row["section"] not in SECTIONS:
        raise ValueError(f"{where}: section {row['section']!r} is not one of {', '.join(SECTIONS)}")
    if row["quantity"] != "untestable" and row["tolerance"] not in TOLERANCES:
        raise ValueError(f"{where}: tolerance {row['tolerance']!r} is not one of {', '.join(TOLERANCES)}")
    if row["quantity"] == "untestable" and not row["not_retestable"]:
        raise ValueError(f"{where}: an untestable claim says why in not_retestable")
    try:
        batches = tuple(int(batch) for batch in row["batch"].split())
    except ValueError:
        raise ValueError(f"{where}: batch {row['batch']!r} is not whole numbers separated by spaces") from None
    claim = Claim(
        id=row["id"], section=row["section"], claim=row["claim"], source=row["source"], published=row["published"],
        unit=row["unit"], quantity=row["quantity"], stack=row["stack"], regime=row["regime"], batches=batches,
        backends=tuple(b.strip() for b in row["backend"].split("|") if b.strip()), versus=row["versus"],
        card=row["card"], tolerance=row["tolerance"], not_retestable=row["not_retestable"], if_differs=row["if_differs"],
    )  # fmt: skip
    if claim.quantity not in {"untestable", "outcome", "same_oom", "ceiling_below", "ceiling_at_least", "ceiling_same"}:
        try:
            claim.value  # noqa: B018 - a published figure must read as a number
        except ValueError:
            raise ValueError(f"{where}: published {claim.published!r} is not a number") from None
    return claim


def read_claims(path: Path = CLAIMS) -> list[Claim]:
    """Every published claim, in the file's order."""
    with open(path, newline="", encoding="utf-8") as handle:
        claims = [parse_claim(row) for row in csv.DictReader(handle)]
    ids = [claim.id for claim in claims]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ValueError(f"{path.name}: claim ids used twice: {', '.join(duplicated)}")
    return claims


# ---- the evidence --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """What the claims are tested against: the cells of the report's grids (ceiling probes and the
    shared-GPU check left out, :func:`harness.report.data.load`) and the ceiling searches."""

    cells: pd.DataFrame
    searches: Sequence[SearchRow]
    calls: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # the isolated replays, for their shapes
    probes: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)  # the ceiling probes, for their OOMs
    noise: timing.RunNoise | None = None  # the run-to-run noise of a step time (None: none measured)


def evidence(source: data.Source = None) -> Evidence:
    results = data.results_of(source)
    cells, calls = data.load(results)
    return Evidence(cells, data.ceilings(results), calls, data.ceiling_probes(results), data.run_noise(results))


def op_tokens(calls: pd.DataFrame, cell: pd.Series) -> str:
    """The tokens (query × document) of the replay a cell's op figures come from — the one that held the
    most (:func:`harness.results.largest_isolated_call`) — as '52 × 771'; '' where there is none."""
    if calls.empty or "path" not in calls:
        return ""
    mine = calls[(calls["path"] == cell["path"]) & ~calls["oom_in_replay"].astype(bool)]
    if mine.empty:
        return ""
    return call_tokens(mine.loc[mine["saved_for_backward_mib"].idxmax()])


def op_totals_by_shape(calls: pd.DataFrame, cell: pd.Series) -> dict[Shape, float]:
    """The op's memory (held + backward spike, MiB) of every call shape a cell replayed in isolation
    (the largest where it replayed one shape twice); empty where it has none."""
    if calls.empty or "path" not in calls:
        return {}
    mine = calls[(calls["path"] == cell["path"]) & ~calls["oom_in_replay"].astype(bool)]
    totals: dict[Shape, float] = {}
    for _, call in mine.iterrows():
        shape = call_shape(call)
        totals[shape] = max(totals.get(shape, 0.0), float(call["saved_for_backward_mib"] + call["backward_transient_peak_mib"]))
    return totals


def matched_totals(calls: pd.DataFrame, cells: Sequence[pd.Series]) -> tuple[Shape, list[float]] | None:
    """The op's memory of each of ``cells`` at one call shape all of them replayed — the largest such
    shape (most tokens per query × document) — so that a ratio between them is of the batch or the
    backend alone; None where they replayed no shape in common."""
    totals = [op_totals_by_shape(calls, cell) for cell in cells]
    shared = set.intersection(*(set(mine) for mine in totals)) if totals else set()
    if not shared:
        return None
    shape = max(shared, key=lambda s: (s[0] * math.prod(s[1]), s))
    return shape, [mine[shape] for mine in totals]


def published_op_total(claim: Claim, batch: int, backend: str) -> float | None:
    """The published op total (MiB, ``book/data/published.csv``) of one backend at one batch of the
    claim's stack, regime and card; None where the published work gives none."""
    variant, _, chunk = backend.partition(" + chunk ")
    rows = data.published(claim.stack, claim.regime)
    rows = rows[(rows["batch_size"] == batch) & (rows["variant"] == variant) & (rows["card"] == claim.card)
                & (rows["score_mini_batch_size"].fillna(0) == (int(chunk) if chunk else 0))]  # fmt: skip
    if rows.empty or missing(rows.iloc[0]["op_total_mib"]):
        return None
    return float(rows.iloc[0]["op_total_mib"])


def cell_of(cells: pd.DataFrame, claim: Claim, batch: int, backend: str) -> pd.Series | None:
    """Our one cell of the claim's stack, regime and card at ``batch`` and ``backend``; None where there is none."""
    if cells.empty or "backend" not in cells:
        return None
    found = data.matching(cells, stack=claim.stack, regime=claim.regime, batch_size=batch, backend=backend, card=claim.card)
    return None if found.empty else found.iloc[0]


def resolves(claim: Claim, evidence: Evidence) -> list[str]:
    """What the claim's key names and the evidence lacks (empty: every cell or search it names is there)."""
    if claim.not_retestable:
        return []
    if claim.quantity in CEILING_QUANTITIES:
        names = list(claim.backends) + ([claim.versus] if claim.versus else [])
        return [f"search {claim.stack} · {claim.regime} · {name} on {claim.card}" for name in names
                if find_search(evidence.searches, claim.stack, claim.regime, name, claim.card) is None]  # fmt: skip
    names = list(claim.backends) + ([claim.versus] if claim.versus else [])
    planned = planned_cells()
    return [f"cell {claim.stack} · {claim.regime} · B={batch} · {name} on {claim.card}" for batch in claim.batches
            for name in names if cell_of(evidence.cells, claim, batch, name) is None
            and (claim.stack, claim.regime, batch, name, claim.card) not in planned]  # fmt: skip


@functools.cache
def planned_cells() -> frozenset[tuple[str, str, int, str, str]]:
    """(stack, regime, batch, backend, card) of every training cell the published and our grids
    plan: a claim whose cell is planned but not run yet waits for it, and says so."""
    from harness.grid import load_grid

    cells = [cell.spec for name in (data.PUBLISHED_GRID, "ours") for cell in load_grid(ROOT / "grids" / f"{name}.yaml")]
    return frozenset((spec.stack, spec.regime, spec.batch_size, data.backend_label(spec.variant, spec.score_mini_batch_size),
                      spec.card) for spec in cells)  # fmt: skip


# ---- verdicts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A claim re-tested: its status, our number as text, and the reason (the difference against the
    tolerance, what contradicts it, or why it waits)."""

    status: Status
    ours: str
    reason: str = ""
    waits_on: str = ""  # a key of WAITS for a claim not re-tested

    @property
    def text(self) -> str:
        """'holds: +51.7 MiB (+2.1%), within ±2% or 64 MiB', 'not yet re-tested: …'."""
        if self.status == "not re-tested":
            return self.reason
        return f"{self.status}: {self.reason}" if self.reason else self.status


def waiting(ours: str, reason: str, waits_on: str) -> Verdict:
    return Verdict("not re-tested", ours, reason, waits_on)


def no_cell(claim: Claim, batch: int, backend: str) -> Verdict:
    planned = (claim.stack, claim.regime, batch, backend, claim.card) in planned_cells()
    return waiting("—", f"not yet re-tested: no cell of ours at B={batch} with {backend}"
                   + (" (our grid plans it; it has not run yet)" if planned else ""), "no cell")  # fmt: skip


def memory_words(value_mib: float, unit: str, digits: int = 3) -> str:
    """A memory figure in a claim's unit: '2.45 GiB', '60.3 MiB'."""
    value = value_mib * GIB_PER_MIB if unit == "GiB" else value_mib
    return f"{significant(value, digits, whole=True)} {unit}"


def to_mib(value: float, unit: str) -> float:
    return value * 1024 if unit == "GiB" else value


def signed_mib(delta_mib: float) -> str:
    """'+51.7 MiB', '−17.8 MiB', '0 MiB'."""
    if delta_mib == 0:
        return "0 MiB"
    sign = "+" if delta_mib > 0 else "−"
    return f"{sign}{significant(abs(delta_mib), 3, whole=True)} MiB"


def compare_memory(published_mib: float, ours_mib: float, tolerance: Tolerance, floor_mib: float | None = None,
                   if_differs: str = "") -> tuple[Status, str]:  # fmt: skip
    """A memory figure against the published one: 'holds' within the tolerance, else 'differs'; with the difference."""
    floor = tolerance.absolute_mib if floor_mib is None else floor_mib
    delta = ours_mib - published_mib
    difference = signed_mib(delta) + (f" ({share(delta, published_mib)})" if published_mib else "")
    if within(published_mib, ours_mib, tolerance.relative, floor):
        return "holds", f"{difference}, within {tolerance_words(tolerance, floor)}"
    reason = f"{difference}, outside {tolerance_words(tolerance, floor)}"
    return "differs", reason + (f"; {if_differs}" if if_differs else "")


def compare_ratio(published: float, ours: float, tolerance: Tolerance, if_differs: str = "") -> tuple[Status, str]:
    """A factor against the published one: 'holds' within the tolerance, else 'differs'; with the difference."""
    difference = share(ours - published, published)
    if within(published, ours, tolerance.relative):
        return "holds", f"{difference}, within {tolerance.reads}"
    return "differs", f"{difference}, outside {tolerance.reads}" + (f"; {if_differs}" if if_differs else "")


def above_or_below(value: float, reference: float) -> str:
    """How ``value`` stands to ``reference``, in words: '9.7% below', '0.5% above', 'the same as'."""
    text = percent(100 * abs(value - reference) / reference, ".1f")
    if text == "0%":
        return "the same as"
    return f"{text} {'above' if value > reference else 'below'}"


def share(delta: float, published: float) -> str:
    """A difference as a signed share of the published value: '+2.1%', '−28.8%', '< 0.1%'."""
    if delta == 0:
        return "0%"
    text = percent(100 * delta / published)
    return "< 0.1%" if text == "0%" else text.replace("-", "−")


def tolerance_words(tolerance: Tolerance, floor_mib: float) -> str:
    if floor_mib != tolerance.absolute_mib:  # a rounded figure: its own half unit
        return f"±{significant(floor_mib * GIB_PER_MIB, 1)} GiB (the published rounding)" if floor_mib >= 512 else (
            f"±{significant(floor_mib, 1)} MiB (the published rounding)")  # fmt: skip
    return tolerance.reads


def outcome_words(cell: pd.Series) -> str:
    """'trains', 'OOM in the MaxSim op', 'OOM outside the op', or the outcome as recorded."""
    if cell["outcome"] == "ok":
        return "trains"
    if cell["outcome"] == "oom":
        return {"maxsim": "OOM in the MaxSim op", "elsewhere": "OOM outside the op"}.get(str(cell["oom_where"]), "OOM")
    return str(cell["outcome"])


def message_mib(message: object, pattern: str) -> float | None:
    """A size named in an OOM message (``pattern`` has the number and unit as its two groups), in MiB."""
    if missing(message):
        return None
    found = re.search(pattern, str(message))
    if not found:
        return None
    return to_mib(float(found.group(1)), found.group(2))


REQUEST = r"Tried to allocate ([0-9.]+) (GiB|MiB)"
UNALLOCATED = r"([0-9.]+) (GiB|MiB) is reserved by PyTorch but unallocated"


def measured_mib(cell: pd.Series, quantity: str) -> float | None:
    """One cell's memory quantity in MiB (None where the cell has none)."""
    columns = {
        "op_held": ["op_saved_for_backward_mib"], "op_backward": ["op_backward_transient_peak_mib"],
        "op_forward": ["op_forward_transient_peak_mib"],
        "op_total": ["op_saved_for_backward_mib", "op_backward_transient_peak_mib"],
        "step_peak_alloc": ["step_peak_alloc_mib"], "step_peak_reserved": ["step_peak_reserved_mib"],
        "pre_oom_alloc": ["pre_oom_alloc_mib"], "pre_oom_reserved": ["pre_oom_reserved_mib"],
    }  # fmt: skip
    if quantity == "oom_request":
        return message_mib(cell["oom_message"], REQUEST)
    if quantity == "oom_unallocated":
        return message_mib(cell["oom_message"], UNALLOCATED)
    values = [cell.get(column) for column in columns[quantity]]
    return None if any(missing(value) for value in values) else float(sum(values))  # type: ignore[arg-type]


NEEDS = {"step_peak_alloc": "ok", "step_peak_reserved": "ok", "pre_oom_alloc": "oom", "pre_oom_reserved": "oom",
         "oom_request": "oom", "oom_unallocated": "oom"}  # fmt: skip


def check_memory(claim: Claim, evidence: Evidence) -> Verdict:
    """One cell's memory figure against the published one (the cell must have the outcome the figure presumes)."""
    cell = cell_of(evidence.cells, claim, claim.batch, claim.backend)
    if cell is None:
        return no_cell(claim, claim.batch, claim.backend)
    needed = NEEDS.get(claim.quantity)
    if needed is not None and cell["outcome"] != needed:
        said = "trained" if needed == "ok" else "ran out of memory"
        return Verdict("does not hold", outcome_words(cell), f"the published cell {said}; ours: {outcome_words(cell).lower()}")
    if claim.quantity in MESSAGE_QUANTITIES:
        return check_oom_figure(claim, evidence)
    ours = measured_mib(cell, claim.quantity)
    if ours is None:
        return waiting("—", f"not yet re-tested: our cell recorded no {QUANTITIES[claim.quantity]}", "no cell")
    tolerance = TOLERANCES[claim.tolerance]
    floor = to_mib(last_digit_half(claim.published), claim.unit) if claim.tolerance == "rounded" else None
    status, reason = compare_memory(to_mib(claim.value, claim.unit), ours, tolerance, floor, claim.if_differs)
    words = memory_words(ours, claim.unit, max(3, digits_of(claim.published)))
    tokens = op_tokens(evidence.calls, cell) if claim.quantity.startswith("op_") else ""
    return Verdict(status, f"{words} ({tokens} tokens)" if tokens else words, reason)


# ---- a run that ran out of memory, read at two moments -------------------------------------------

MESSAGE_QUANTITIES = ("oom_request", "oom_unallocated")  # read from an OOM's error message
FRAGMENTED = "more than it asked: no free block was large enough, fragmentation"


@dataclass(frozen=True)
class OomRun:
    """One run of ours that ran out of memory — a grid cell or a ceiling probe — and what it says of the
    memory reserved but not allocated, at two moments: at the peak of the step before the failure
    (reserved − allocated, the pre-OOM peak the harness records) and when the failing request was made
    (its error message). The two differ: between them the step freed and allocated memory."""

    what: str  # 'grid cell', 'ceiling probe'
    seed: int | None
    request_mib: float | None
    at_request_mib: float | None
    at_peak_mib: float | None

    @property
    def who(self) -> str:
        """'grid cell (seed 42)'."""
        return self.what if self.seed is None else f"{self.what} (seed {self.seed})"

    @property
    def tag(self) -> str:
        """'grid cell, seed 42': the same inside brackets."""
        return self.what if self.seed is None else f"{self.what}, seed {self.seed}"

    def value(self, quantity: str) -> float | None:
        """The figure a claim of ``quantity`` (one of :data:`MESSAGE_QUANTITIES`) reads."""
        return self.request_mib if quantity == "oom_request" else self.at_request_mib


def oom_run(row: pd.Series, what: str) -> OomRun:
    peak = (None if missing(row.get("pre_oom_reserved_mib")) or missing(row.get("pre_oom_alloc_mib"))
            else float(row["pre_oom_reserved_mib"]) - float(row["pre_oom_alloc_mib"]))  # fmt: skip
    seed = row.get("seed")
    return OomRun(what, None if missing(seed) else int(cast(float, seed)), message_mib(row["oom_message"], REQUEST),
                  message_mib(row["oom_message"], UNALLOCATED), peak)  # fmt: skip


def oom_runs(evidence: Evidence, stack: str, regime: str, batch: int, backend: str, card: str) -> list[OomRun]:
    """Every run of ours of one batch, backend and card that ran out of memory under the default
    allocator (the published run's): the grid cell, then the ceiling search's probes of that batch, by seed."""
    runs = []
    for what, frame in (("grid cell", evidence.cells), ("ceiling probe", evidence.probes)):
        if frame.empty or "backend" not in frame:
            continue
        chosen = data.matching(frame, stack=stack, regime=regime, batch_size=batch, backend=backend, card=card)
        if "allocator" in chosen:
            chosen = chosen[chosen["allocator"].fillna("default") == "default"]
        chosen = chosen[chosen["outcome"] == "oom"]
        if "seed" in chosen:
            chosen = chosen.sort_values("seed", kind="stable")
        runs += [oom_run(row, what) for _, row in chosen.iterrows()]
    return runs


def gib_words(value_mib: float) -> str:
    return f"{value_mib * GIB_PER_MIB:.2f} GiB"


def oom_floor(claim: Claim) -> float:
    """The absolute tolerance (MiB) of a claim's memory figure: half a unit of its last digit for a
    rounded figure, else its tolerance class's floor."""
    if claim.tolerance == "rounded":
        return to_mib(last_digit_half(claim.published), claim.unit)
    return TOLERANCES[claim.tolerance].absolute_mib


def compare_oom(claim: Claim, ours_mib: float, published_mib: float | None = None) -> tuple[Status, str]:
    """One OOM figure of ours against a claim's published one (or ``published_mib``, a figure derived from
    the claim's), under the claim's tolerance: a rounded figure to half a unit of its last digit."""
    published = to_mib(claim.value, claim.unit) if published_mib is None else published_mib
    return compare_memory(published, ours_mib, TOLERANCES[claim.tolerance], oom_floor(claim))


def check_oom_figure(claim: Claim, evidence: Evidence) -> Verdict:
    """The failed request of an out-of-memory error, or the memory reserved but unallocated when it failed,
    of every run of ours that ran out at the claim's batch (:func:`oom_runs`: the grid cell and the ceiling
    probes), each against the published figure. The verdict is per run: a failure is one run's, its figure
    follows the shapes that run drew, so the claim holds where a run of ours reproduces it (named first,
    with its seed), with the other runs' figures beside it; it differs where no run does."""
    runs = [run for run in oom_runs(evidence, claim.stack, claim.regime, claim.batch, claim.backend, claim.card)
            if run.value(claim.quantity) is not None]  # fmt: skip
    if not runs:
        return waiting("—", f"not yet re-tested: no run of ours recorded {QUANTITIES[claim.quantity]}", "no cell")
    digits = max(3, digits_of(claim.published))

    def figure(run: OomRun) -> str:
        return memory_words(cast(float, run.value(claim.quantity)), claim.unit, digits)

    compared = [(run, *compare_oom(claim, cast(float, run.value(claim.quantity)))) for run in runs]
    reproduced = [(run, why) for run, status, why in compared if status == "holds"]
    other = [(run, why) for run, status, why in compared if status != "holds"]
    words = []
    for run, _ in reproduced + other:  # the runs that reproduce it first
        at = ("" if claim.quantity == "oom_request" or run.request_mib is None
              else f", at its {gib_words(run.request_mib)} request")  # fmt: skip
        words.append(f"{figure(run)} ({run.tag}{at})")
    status: Status = "holds" if reproduced else "differs"
    if len(runs) == 1:
        reason = compared[0][2]
    elif not other:
        reason = "; ".join(f"{run.who}: {why}" for run, why in reproduced)
    elif reproduced:
        reason = ("reproduced by the " + "; the ".join(f"{run.who}: {why}" for run, why in reproduced) + "; beside it, "
                  + "; ".join(f"the {run.who} reads {figure(run)}: {why}" for run, why in other))  # fmt: skip
    else:
        reason = "; ".join(f"{run.who}: {why}" for run, why in other)
    if other and claim.if_differs:
        reason += f"; {claim.if_differs}"
    if claim.quantity == "oom_unallocated":  # a message figure is of the moment its request failed, not of the peak
        reason += ("; each read from its error message, written when its request failed, not at the step's peak "
                   "(both moments are read below the tables)")  # fmt: skip
    return Verdict(status, "; ".join(words), reason)


def oom_reading(evidence: Evidence, stack: str, regime: str, batch: int, backend: str, card: str,
                claims: Sequence[Claim] | None = None) -> str:  # fmt: skip
    """The memory reserved but not allocated when a published run ran out of memory, beside every run of
    ours that ran out at that batch (:func:`oom_runs`), read at both moments — at the peak before the
    failure and when the failing request was made — each moment against the published figure of that
    moment under its claim's tolerance. The one reading of these figures: the claims page and the
    ceilings page both show it. Empty where no claim or no run of ours reads them."""
    key = (stack, regime, batch, backend, card)
    by = {claim.quantity: claim for claim in (read_claims() if claims is None else claims)
          if (claim.stack, claim.regime, claim.batch if claim.batches else None, claim.backend if claim.backends else None,
              claim.card) == key}  # fmt: skip
    runs = oom_runs(evidence, *key)
    if not runs or not ({"pre_oom_alloc", "pre_oom_reserved"} <= set(by) or "oom_unallocated" in by):
        return ""
    text = (f"Memory reserved but not allocated when {backend} ran out of memory at B={batch}, read at two moments: at the "
            "peak of the step before the failure (reserved − allocated) and when the failing request was made (the "
            "error message's figure).")  # fmt: skip
    published = []
    reserved, allocated = by.get("pre_oom_reserved"), by.get("pre_oom_alloc")
    peak_mib = None
    if reserved is not None and allocated is not None:
        peak_mib = to_mib(reserved.value, reserved.unit) - to_mib(allocated.value, allocated.unit)
        published.append(f"{gib_words(peak_mib)} at the peak ({reserved.published} − {allocated.published} "
                         f"{reserved.unit})")  # fmt: skip
    unallocated, request = by.get("oom_unallocated"), by.get("oom_request")
    if unallocated is not None:
        asked = f" its {request.published} {request.unit}" if request is not None else " its"
        more = request is not None and to_mib(unallocated.value, unallocated.unit) > to_mib(request.value, request.unit)
        published.append(f"{unallocated.published} {unallocated.unit} when{asked} request failed"
                         + (f" ({FRAGMENTED})" if more else ""))  # fmt: skip
    text += f" Published: {', '.join(published)}."
    mine = []
    for run in runs:
        said = [] if run.at_peak_mib is None else [f"{gib_words(run.at_peak_mib)} at the peak"]
        if run.at_request_mib is not None:
            said.append(f"{gib_words(run.at_request_mib)} when its "
                        + ("" if run.request_mib is None else f"{gib_words(run.request_mib)} ") + "request failed"
                        + (f" ({FRAGMENTED})" if run.request_mib is not None and run.at_request_mib > run.request_mib
                           else ""))  # fmt: skip
        mine.append(f"the {run.who}: {', '.join(said)}")
    text += f" Ours: {'; '.join(mine)}."
    moments: list[tuple[str, Claim, float | None, list[tuple[OomRun, float | None]]]] = []
    if peak_mib is not None and reserved is not None:
        moments.append(("At the peak", reserved, peak_mib, [(run, run.at_peak_mib) for run in runs]))
    if unallocated is not None:
        moments.append(("When the request failed", unallocated, None, [(run, run.at_request_mib) for run in runs]))
    for lead, claim, derived, values in moments:
        published_mib = to_mib(claim.value, claim.unit) if derived is None else derived
        compared = [(run, value, compare_oom(claim, value, derived)[0]) for run, value in values if value is not None]
        if not compared:
            continue
        within_words = f"within {tolerance_words(TOLERANCES[claim.tolerance], oom_floor(claim))}"
        agree = [f"the {run.who}" for run, _, status in compared if status == "holds"]
        differ = [f"the {run.who} {signed(GIB_PER_MIB * (value - published_mib))} GiB" for run, value, status in compared
                  if status != "holds"]  # fmt: skip
        if not differ:
            found = ("every run of ours agrees with the published figure" if len(compared) > 1
                     else f"{agree[0]} agrees with the published figure") + f", {within_words}"  # fmt: skip
        elif agree:
            found = (f"{' and '.join(agree)} {'agree' if len(agree) > 1 else 'agrees'} with the published figure, "
                     f"{within_words}; {' and '.join(differ)} off it")  # fmt: skip
        else:
            found = f"no run of ours agrees with the published figure {within_words}: {' and '.join(differ)} off it"
        text += f" {lead}, {found}."
    return text


def oom_readings(evidence: Evidence, claims: Sequence[Claim] | None = None) -> list[str]:
    """:func:`oom_reading` of every published out-of-memory cell a claim reads reserved but unallocated memory of."""
    chosen = read_claims() if claims is None else claims
    keys = dict.fromkeys((claim.stack, claim.regime, claim.batch, claim.backend, claim.card) for claim in chosen
                         if claim.quantity == "oom_unallocated" and not claim.not_retestable)  # fmt: skip
    return [text for key in keys if (text := oom_reading(evidence, *key, claims=chosen))]


def check_outcome(claim: Claim, evidence: Evidence) -> Verdict:
    """Trains or runs out of memory (and where, if the claim says), as published."""
    cell = cell_of(evidence.cells, claim, claim.batch, claim.backend)
    if cell is None:
        return no_cell(claim, claim.batch, claim.backend)
    ours = outcome_words(cell)
    if cell["outcome"] == "oom" and not missing(cell["oom_message"]):
        ours += f" ({failed_request(cell['oom_message'])})"
    wanted = claim.published.split()
    same = cell["outcome"] == wanted[0] and (len(wanted) == 1 or str(cell["oom_where"]) == wanted[-1])
    return Verdict("holds" if same else "does not hold", ours)


def check_same_oom(claim: Claim, evidence: Evidence) -> Verdict:
    """Every named backend runs out of memory, with allocated memory equal within the memory tolerance."""
    cells = []
    for backend in claim.backends:
        cell = cell_of(evidence.cells, claim, claim.batch, backend)
        if cell is None:
            return no_cell(claim, claim.batch, backend)
        cells.append(cell)
    names = ", ".join(claim.backends)
    trained = [backend for backend, cell in zip(claim.backends, cells, strict=True) if cell["outcome"] != "oom"]
    if trained:
        return Verdict("does not hold", f"{', '.join(trained)} trains", "not every backend runs out of memory")
    allocated = [float(cell["pre_oom_alloc_mib"]) for cell in cells]
    spread = max(allocated) - min(allocated)
    where = sorted({outcome_words(cell) for cell in cells})
    same_place = len(where) == 1
    at = (f"{memory_words(allocated[0], 'GiB')} allocated each" if spread == 0
          else " / ".join(memory_words(value, "GiB") for value in allocated) + " allocated")  # fmt: skip
    ours = f"{names}: {' / '.join(where)} at {at}"
    tolerance = TOLERANCES[claim.tolerance]
    if within(max(allocated), min(allocated), tolerance.relative, tolerance.absolute_mib) and same_place:
        return Verdict("holds", ours, f"allocated memory apart by {signed_mib(spread).lstrip('+')}, within {tolerance.reads}")
    return Verdict("does not hold", ours, "they run out in different places or with different memory")


def op_totals(claim: Claim, evidence: Evidence, keys: Sequence[tuple[int, str]]) -> tuple[str, list[float]] | Verdict:
    """The op's memory (held + backward spike, MiB) of our cells at ``keys`` (batch, backend), at one call
    shape all of them replayed (:func:`matched_totals`), with that shape in words; where the evidence
    has no replays of theirs (a frame of cells alone), each cell's own op figures and no shape. A
    verdict instead where a cell or its replay is missing."""
    cells = []
    for batch, backend in keys:
        cell = cell_of(evidence.cells, claim, batch, backend)
        if cell is None:
            return no_cell(claim, batch, backend)
        cells.append(cell)
    matched = matched_totals(evidence.calls, cells)
    if matched is not None:
        return shape_words(matched[0]), matched[1]
    if any(op_totals_by_shape(evidence.calls, cell) for cell in cells):  # replays, but of no shape in common
        shapes = ", ".join(f"B={batch} {backend}: {op_tokens(evidence.calls, cell) or 'none'}"
                           for (batch, backend), cell in zip(keys, cells, strict=True))  # fmt: skip
        return waiting("—", f"not yet re-tested: our cells replayed no call shape in common ({shapes})", "no cell")
    totals = []
    for (batch, backend), cell in zip(keys, cells, strict=True):
        total = measured_mib(cell, "op_total")
        if total is None:
            return waiting("—", f"not yet re-tested: no op replay of {backend} at B={batch}", "no cell")
        totals.append(total)
    return "", totals


def check_op_reduction(claim: Claim, evidence: Evidence) -> Verdict:
    """The op's memory with ``versus`` over the op's memory with the backend, at one batch and at one
    call shape both replayed (the published op table measures both backends on the same call)."""
    found = op_totals(claim, evidence, [(claim.batch, claim.versus), (claim.batch, claim.backend)])
    if isinstance(found, Verdict):
        return found
    shape, totals = found
    ratio = totals[0] / totals[1]
    status, reason = compare_ratio(claim.value, ratio, TOLERANCES[claim.tolerance])
    at = f" at {shape} tokens" if shape else ""
    ours = f"{significant(ratio, 3, whole=True)}×{at} ({memory_words(totals[0], 'GiB')} / {memory_words(totals[1], 'MiB')})"
    if shape:
        reason += (f"; ours sets both backends on the same call, the largest both replayed at B={claim.batch} "
                   f"({shape} tokens); the published ratio is of the published run's own shapes, which it does not "
                   "name")  # fmt: skip
        theirs = [published_op_total(claim, claim.batch, backend) for backend in (claim.versus, claim.backend)]
        if None not in theirs:
            said = [f"its {backend} total ({memory_words(value, 'GiB' if value >= 1024 else 'MiB')}) is "
                    f"{above_or_below(value, mine)} ours at that shape"
                    for backend, value, mine in zip((claim.versus, claim.backend), cast(list[float], theirs), totals,
                                                    strict=True)]  # fmt: skip
            reason += (f": {' and '.join(said)}; {claim.versus}'s op memory is its score grid, which follows the "
                       "longest query × page a batch draws, so the ratio moves with it")  # fmt: skip
    elif status == "differs" and claim.if_differs:
        reason += f"; {claim.if_differs}"
    return Verdict(status, ours, reason)


def growth_per_doubling(batches: tuple[int, int], values: tuple[float, float]) -> float:
    """How much a quantity grows per batch doubling between two batches: (v1/v0)^(1/log2(b1/b0))."""
    return float((values[1] / values[0]) ** (1 / math.log2(batches[1] / batches[0])))


def check_op_growth(claim: Claim, evidence: Evidence) -> Verdict:
    """The op's memory growth per batch doubling between the claim's two batches, at one call shape
    both batches replayed, so that the batch alone moves it."""
    first, last = claim.batches[0], claim.batches[-1]
    found = op_totals(claim, evidence, [(first, claim.backend), (last, claim.backend)])
    if isinstance(found, Verdict):
        return found
    shape, totals = found
    factor = growth_per_doubling((first, last), (totals[0], totals[-1]))
    status, reason = compare_ratio(claim.value, factor, TOLERANCES[claim.tolerance])
    at = f" at {shape} tokens in both" if shape else ""
    ours = (f"{significant(factor, 3)}×{at} (B={first} → {last}: {memory_words(totals[0], 'MiB')} → "
            f"{memory_words(totals[-1], 'MiB')})")  # fmt: skip
    if shape:
        reason += (f"; ours at one call shape both batches replayed ({shape} tokens, the largest), so only the batch "
                   "moves it")  # fmt: skip
    elif status == "differs" and claim.if_differs:
        reason += f"; {claim.if_differs}"
    return Verdict(status, ours, reason)


def timing_doubt(cells: Sequence[pd.Series]) -> str:
    """Why the step times of ``cells`` cannot be re-tested yet ('' where they can): a result must record
    that its times are the card's (the timing rule, issue 16) and rest on at least 8 steady steps
    (spec §1); a probe measured beside others on a shared GPU never can."""
    reasons = []
    if any(not missing(cell.get("gpu_share_gib")) for cell in cells):
        reasons.append("measured on a shared GPU")
    steady = min(int(cell["n_steady_steps"]) for cell in cells)
    if steady < MIN_STEADY_STEPS:
        reasons.append(f"{steady} steady steps, not {MIN_STEADY_STEPS}")
    if any(missing(cell.get(COMPARABLE)) or not bool(cell.get(COMPARABLE)) for cell in cells):
        reasons.append("no timing-rule record")
    return "; ".join(reasons)


def check_time(claim: Claim, evidence: Evidence) -> Verdict:
    """An absolute time or throughput: never compared across cards; ours shown, and why it waits."""
    cell = cell_of(evidence.cells, claim, claim.batch, claim.backend)
    if cell is None:
        return no_cell(claim, claim.batch, claim.backend)
    if cell["outcome"] != "ok":
        return Verdict("does not hold", outcome_words(cell), f"the published cell trained; ours: {outcome_words(cell).lower()}")
    column = "steady_step_time_sec" if claim.quantity == "step_time" else "samples_per_sec"
    ours = "—" if missing(cell[column]) else f"{significant(float(cell[column]), 3)} {claim.unit}"
    doubt = timing_doubt([cell])
    if doubt:
        return waiting(ours, f"{TIMES_WAIT}; ours: {doubt}", "times")
    return waiting(ours, "not compared: an absolute time on our H200 is not one on an H100 (the speed ratios are "
                   "re-tested instead)", "absolute")  # fmt: skip


def steady_times(cell: pd.Series) -> list[float]:
    """A cell's steady step times (its median alone where a frame carries no list of them)."""
    times = cell.get("steady_times_sec")
    return list(times) if isinstance(times, list | tuple) and times else [float(cell["steady_step_time_sec"])]


def check_speedup(claim: Claim, evidence: Evidence) -> Verdict:
    """``versus``'s steady step time over the backend's, per batch, each ratio named with its batch and card
    and carried with its bootstrap 95% interval. With the run-to-run noise of the claim's regime
    (:class:`harness.report.timing.RunNoise`), a ratio whose interval reaches into 1 ± that noise is no
    difference (:meth:`harness.report.timing.Ratio.beyond`): a claimed speedup holds only where every
    ratio is a difference and its interval reaches the published value's tolerance band; a claimed parity
    (a band that holds 1) holds where every ratio is no difference or reaches the band."""
    ratios, cells, batches = [], [], []
    for batch in claim.batches:
        pair = [cell_of(evidence.cells, claim, batch, backend) for backend in (claim.versus, claim.backend)]
        for backend, cell in zip((claim.versus, claim.backend), pair, strict=True):
            if cell is None:
                return no_cell(claim, batch, backend)
        base, fused = pair[0], pair[1]
        assert base is not None and fused is not None
        if base["outcome"] != "ok" or fused["outcome"] != "ok":
            continue
        cells += [base, fused]
        batches.append(batch)
        ratios.append(float(base["steady_step_time_sec"]) / float(fused["steady_step_time_sec"]))
    if not ratios:
        return waiting("—", "not yet re-tested: no batch where both cells trained", "no cell")
    on = f"on {card_label(claim.card)}"
    doubt = timing_doubt(cells)
    if doubt:
        medians = "; ".join(f"B={batch}: {value:.2f}× (medians)" for batch, value in zip(batches, ratios, strict=True))
        return waiting(f"{on}: {medians}", f"{TIMES_WAIT}; ours: {doubt}", "times")
    # each batch's ratio with its bootstrap 95% interval (harness.report.timing)
    pairs = zip(cells[::2], cells[1::2], strict=True)
    intervals = [timing.ratio(steady_times(base), steady_times(fused)) for base, fused in pairs]
    noise = None if evidence.noise is None else evidence.noise.of(claim.stack, claim.regime)
    ours = f"{on}: " + "; ".join(f"B={batch}: {speed_words(r, noise)}" for batch, r in zip(batches, intervals, strict=True))
    published = [float(value) for value in claim.published.split("–")]
    tolerance = TOLERANCES[claim.tolerance]
    band = (min(published) * (1 - tolerance.relative), max(published) * (1 + tolerance.relative))
    reaches = {batch: r.high >= band[0] and r.low <= band[1] for batch, r in zip(batches, intervals, strict=True)}
    different = {batch: r.beyond(noise) for batch, r in zip(batches, intervals, strict=True)}
    of = f"{tolerance.reads} of the published {claim.published}×"
    noise_words = "" if noise is None else f" ±{100 * noise:.1f}%"  # the regime's run-to-run noise
    missed = [batch for batch in batches if not reaches[batch]]
    if band[0] <= 1.0 <= band[1]:  # a claimed parity: a ratio inside the noise agrees with it
        wrong = [batch for batch in missed if different[batch]]
        if not wrong:
            return Verdict("holds", ours, f"every ratio is no difference beyond the{noise_words} run-to-run noise or its "
                           f"95% interval reaches {of}")  # fmt: skip
        return Verdict("differs", ours, f"at {batch_list(wrong)} a difference beyond the{noise_words} run-to-run noise, "
                       f"its 95% interval outside {of}")  # fmt: skip
    inside = [batch for batch in batches if not different[batch]]
    if not missed and not inside:
        return Verdict("holds", ours, f"every ratio is a difference beyond the{noise_words} run-to-run noise and its "
                       f"95% interval reaches {of}")  # fmt: skip
    if not missed:  # every interval reaches the published band: agreement, though some are inside the noise
        verb = "is" if len(inside) == 1 else "are"
        return Verdict("holds", ours, f"every ratio's 95% interval reaches {of}; at {batch_list(inside)} ours {verb} "
                       f"also inside the{noise_words} run-to-run noise around 1, so those batches alone cannot "
                       "tell this speedup from none")  # fmt: skip
    said = [f"at {batch_list(missed)} the 95% interval lies outside {of}"]
    if inside:
        said.append(f"at {batch_list(inside)} ours is inside the{noise_words} run-to-run noise around 1, "
                    "where the published figure is a speedup")  # fmt: skip
    return Verdict("differs", ours, "; ".join(said))


def speed_words(value: timing.Ratio, noise: float | None) -> str:
    """A speed ratio with its 95% interval, in the words of :func:`harness.report.timing.ratio_words` (a
    table's), and its value kept where the interval holds 1: 'no measurable difference (0.90×, 0.76–1.95)'."""
    if not value.measurable:
        return f"no measurable difference ({value.value:.2f}×, {value.low:.2f}–{value.high:.2f})"
    return timing.ratio_words(value, noise=noise, compact=True)


def batch_list(batches: Sequence[int]) -> str:
    """'B=128', 'B=128 and 256', 'B=64, 128 and 256'."""
    return "B=" + joined([str(batch) for batch in batches])


def ceiling_range(row: SearchRow) -> tuple[int, float]:
    """Where a finished search puts the ceiling: (the largest batch that trained every seed, the largest
    it can be: one less than the smallest batch that failed, or infinity where none did)."""
    assert row.fits is not None
    return row.fits, (row.fails - 1 if row.fails is not None else math.inf)


def search_verdict(row: SearchRow | None, what: str) -> Verdict | None:
    """A 'not re-tested' verdict for a search that cannot decide anything yet (None: it can)."""
    if row is None:
        return waiting("—", f"not yet re-tested: grids/ceilings.yaml has no search of {what}", "search")
    if row.probes == 0:
        return waiting("not run", f"not yet re-tested: the ceiling search of {what} has not run (issue 18)", "search")
    if not row.done or row.stopped:
        return waiting(ceiling_text(row), f"not yet re-tested: the ceiling search of {what} is unfinished (issue 18)", "search")
    return None


def check_ceiling_bound(claim: Claim, evidence: Evidence) -> Verdict:
    """The backend's searched ceiling below the batch (``ceiling_below``) or at least it (``ceiling_at_least``)."""
    row = find_search(evidence.searches, claim.stack, claim.regime, claim.backend, claim.card)
    pending = search_verdict(row, claim.backend)
    if pending is not None:
        return pending
    assert row is not None
    batch, ours = claim.batch, f"ceiling {ceiling_text(row)}"
    low, high = (0, row.fails - 1) if row.fits is None and row.fails is not None else ceiling_range(row)
    below = claim.quantity == "ceiling_below"
    if (high < batch) if below else (low >= batch):
        if below:
            return Verdict("holds", ours, f"B={row.fails} failed on some seed" + (f"; {low} trained every seed" if low else ""))
        return Verdict("holds", ours, f"B={low} trained every seed")
    if (low >= batch) if below else (high < batch):
        return Verdict("does not hold", ours, f"B={low} trained every seed" if below else f"B={row.fails} failed on some seed")
    return waiting(ours, f"not yet re-tested: the search's resolution does not decide B={batch}", "search")


def check_ceiling_ratio(claim: Claim, evidence: Evidence) -> Verdict:
    """The backend's ceiling over ``versus``'s: at least the published factor (``ceiling_gain``), or the
    same (``ceiling_same``), anywhere in the range the two searches leave."""
    rows = {name: find_search(evidence.searches, claim.stack, claim.regime, name, claim.card)
            for name in (claim.backend, claim.versus)}  # fmt: skip
    for name, row in rows.items():
        pending = search_verdict(row, name)
        if pending is not None:
            return pending
    fused, base = rows[claim.backend], rows[claim.versus]
    assert fused is not None and base is not None
    if fused.fits is None or base.fits is None:
        return waiting("—", "not yet re-tested: a search found no batch that trains", "search")
    (fused_low, fused_high), (base_low, base_high) = ceiling_range(fused), ceiling_range(base)
    least, most = fused_low / base_high, fused_high / base_low
    ours = (f"{claim.backend} {ceiling_text(fused)} vs {claim.versus} {ceiling_text(base)} "
            f"({_factor_range(least, most)})" + _expandable_words(claim, evidence))  # fmt: skip
    if claim.quantity == "ceiling_same":
        if fused_low <= base_high and base_low <= fused_high:
            return Verdict("holds", ours, "the two ceilings are the same to the searches' resolution")
        return Verdict("does not hold", ours, f"{claim.backend}'s ceiling is {_factor_range(least, most)} {claim.versus}'s")
    if least >= claim.value:
        return Verdict("holds", ours, f"{claim.backend}'s ceiling is at least {claim.published}× {claim.versus}'s")
    if most < claim.value:
        factor = _factor_range(least, most)
        return Verdict("does not hold", ours, f"{claim.backend}'s ceiling is {factor} {claim.versus}'s, not {claim.published}×")
    return waiting(ours, "not yet re-tested: the searches' resolution does not decide the factor", "search")


def _factor_range(least: float, most: float) -> str:
    """'1.26–1.39×', '≥ 1.50×', '1.33×'."""
    if math.isinf(most):
        return f"≥ {least:.2f}×"
    return f"{least:.2f}×" if f"{least:.2f}" == f"{most:.2f}" else f"{least:.2f}–{most:.2f}×"


def _expandable_words(claim: Claim, evidence: Evidence) -> str:
    """The same two ceilings with expandable segments, where both of those searches finished ('' otherwise)."""
    rows = [find_search(evidence.searches, claim.stack, claim.regime, name, claim.card, "expandable")
            for name in (claim.backend, claim.versus)]  # fmt: skip
    if any(row is None or row.settled is None for row in rows):
        return ""
    return f"; with expandable segments {ceiling_text(rows[0])} vs {ceiling_text(rows[1])}"  # type: ignore[arg-type]


def check_untestable(claim: Claim, evidence: Evidence) -> Verdict:
    return waiting("—", f"not re-testable: {claim.not_retestable}", "untestable")


CHECKS: dict[str, Callable[[Claim, Evidence], Verdict]] = {
    **{quantity: check_memory for quantity in ("op_held", "op_backward", "op_forward", "op_total", "step_peak_alloc",
                                               "step_peak_reserved", "pre_oom_alloc", "pre_oom_reserved", "oom_request",
                                               "oom_unallocated")},
    "outcome": check_outcome, "same_oom": check_same_oom, "op_reduction": check_op_reduction,
    "op_growth": check_op_growth, "step_time": check_time, "samples_per_sec": check_time, "speedup": check_speedup,
    "ceiling_below": check_ceiling_bound, "ceiling_at_least": check_ceiling_bound, "ceiling_gain": check_ceiling_ratio,
    "ceiling_same": check_ceiling_ratio, "untestable": check_untestable,
}  # fmt: skip


def retest(claim: Claim, evidence: Evidence) -> Verdict:
    """One claim against the evidence."""
    if claim.not_retestable:
        wait = "untestable" if claim.quantity == "untestable" else "no cell"
        return waiting("—", f"not {'re-testable' if wait == 'untestable' else 'yet re-tested'}: {claim.not_retestable}", wait)
    return CHECKS[claim.quantity](claim, evidence)


def retest_all(source: data.Source = None, claims: Sequence[Claim] | None = None) -> list[tuple[Claim, Verdict]]:
    """Every published claim (default: ``published_claims.csv``) against the committed results (or ``source``)."""
    found = evidence(source)
    return [(claim, retest(claim, found)) for claim in (read_claims() if claims is None else claims)]


# ---- what the page shows -------------------------------------------------------------------------


def published_words(claim: Claim) -> str:
    """The published value as a table cell: '2.40 GiB', 'OOM in the MaxSim op', '~130×', 'OOM at 128'."""
    if claim.quantity == "outcome":
        return {"ok": "trains", "oom": "OOM", "oom in maxsim": "OOM in the MaxSim op",
                "oom elsewhere": "OOM outside the op"}.get(claim.published, claim.published)  # fmt: skip
    if claim.quantity == "same_oom":
        return "OOM, identically"
    if claim.quantity == "ceiling_below":
        return f"OOM at {claim.published}"
    if claim.quantity == "ceiling_at_least":
        return f"trains {claim.published}"
    if claim.quantity == "ceiling_same":
        return "the same ceiling"
    if claim.quantity == "ceiling_gain":
        return f"{claim.published}×"
    if claim.quantity == "untestable":
        return claim.published
    if claim.unit == "×":
        return f"{claim.published}×"
    return f"{claim.published} {claim.unit}"


def claims_table(rows: Sequence[tuple[Claim, Verdict]]) -> pd.DataFrame:
    """One row per claim: the claim, its source, the published value, ours, the verdict."""
    return pd.DataFrame(
        [{"claim": claim.claim, "source": claim.source, "published": published_words(claim), "ours": verdict.ours,
          "verdict": verdict.text} for claim, verdict in rows],
        columns=["claim", "source", "published", "ours", "verdict"],
    )  # fmt: skip


def by_section(rows: Sequence[tuple[Claim, Verdict]]) -> dict[str, list[tuple[Claim, Verdict]]]:
    """The rows grouped by section, in :data:`SECTIONS` order (sections with no claim left out)."""
    return {title: chosen for key, title in SECTIONS.items() if (chosen := [r for r in rows if r[0].section == key])}


def counts(rows: Sequence[tuple[Claim, Verdict]]) -> dict[str, int]:
    """How many claims have each status."""
    return {status: sum(verdict.status == status for _, verdict in rows) for status in STATUSES}


def summary(rows: Sequence[tuple[Claim, Verdict]]) -> str:
    """The verdicts in one paragraph: how many hold, differ, do not hold, and why the rest wait."""
    if not rows:
        return "No published claims are listed."
    n = counts(rows)
    text = (f"Of the {len(rows)} quantitative claims of the published work, {n['holds']} "
            f"{'holds' if n['holds'] == 1 else 'hold'}, {n['differs']} {'differs' if n['differs'] == 1 else 'differ'} "
            f"and {n['does not hold']} {'does' if n['does not hold'] == 1 else 'do'} not hold on our data.")  # fmt: skip
    waits = [verdict.waits_on for _, verdict in rows if verdict.status == "not re-tested"]
    if waits:
        parts = [f"{counted(waits.count(key), one, several)}{why}" for key, (one, several, why) in WAITS.items()
                 if waits.count(key)]  # fmt: skip
        text += f" {n['not re-tested']} {'is' if n['not re-tested'] == 1 else 'are'} not re-tested yet: " + "; ".join(parts) + "."
    return text


def contradictions(rows: Sequence[tuple[Claim, Verdict]]) -> list[str]:
    """Every claim that does not hold or differs, in a line: the claim, the published value, ours, why."""
    return [f"**{verdict.status}** — {claim.claim} (published {published_words(claim)}; ours {verdict.ours}): {verdict.reason}"
            for claim, verdict in rows if verdict.status in ("does not hold", "differs")]  # fmt: skip


def tolerance_table() -> pd.DataFrame:
    """Each tolerance class the claims use: how it reads and why it is that wide."""
    used = {claim.tolerance for claim in read_claims()}
    return pd.DataFrame([{"tolerance": tolerance.reads, "why": tolerance.why}
                         for name, tolerance in TOLERANCES.items() if name in used])  # fmt: skip
