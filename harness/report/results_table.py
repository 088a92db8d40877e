"""The results page's one table of every cell: readable columns with units, and the same table as CSV.

The HTML is a plain ``<table>`` inside a scrolling container; ``book/_static/results-table.js`` (our
own, no third-party code) makes it sortable by its headers and filterable by a text box and by a
select per categorical column. Numeric cells carry their exact value in ``data-value`` so sorting is
numeric; a cell with no measurement is empty (its reason is in the ``outcome`` column).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from html import escape
from urllib.parse import quote

import pandas as pd

from harness.report.data import GIB_PER_MIB, backend_label
from harness.report.text import failed_request, gpu_text, missing, regime_words, significant

TABLE_ID = "all-cells"


@dataclass(frozen=True)
class Column:
    """One column: its header, the frame column it shows, how to turn a value into text, and how the page filters it."""

    header: str
    field: str
    scale: float | None = None  # numeric: multiply, then show 3 significant digits
    choose: bool = False  # a select of its values above the table
    title: str = ""  # the header's tooltip


COLUMNS = [
    Column("stack", "stack", choose=True),
    Column("regime", "regime_text", choose=True,
           title="The training regime; ColQwen2's 'plain' (result files, cell ids) is its recipe, which checkpoints"),
    Column("batch", "batch_size", title="Training batch size (queries per step)"),
    Column("backend", "backend", choose=True, title="MaxSim backend: vanilla, lik, flash, or vanilla + chunk N"),
    Column("card", "card", choose=True, title="The card profile the cell was capped to; native: the whole device"),
    Column("GPU", "gpu_text", choose=True,
           title="The GPU the cell ran on, as its result records it: its times are that GPU's (an H100's are not an "
                 "H200's, whatever the card it was capped to)"),
    Column("allocator", "allocator", choose=True, title="PyTorch CUDA allocator setting"),
    Column("seed", "seed"),
    Column("outcome", "outcome_text", choose=True, title="ok, or where the step ran out of memory"),
    Column("peak allocated (GiB)", "step_peak_alloc_mib", scale=GIB_PER_MIB,
           title="Peak memory allocated by tensors over the training steps"),
    Column("peak reserved (GiB)", "step_peak_reserved_mib", scale=GIB_PER_MIB,
           title="Peak memory the CUDA caching allocator held over the training steps"),
    Column("reserved − allocated (GiB)", "fragmentation_mib", scale=GIB_PER_MIB,
           title="Reserved minus allocated at the step peak: the allocator's fragmentation"),
    Column("time per step (s)", "steady_step_time_sec", scale=1.0,
           title="Median over the steady (post-warm-up) steps, on the GPU of its row; only for a cell timed alone "
                 "(the timing rule)"),
    Column("samples / s", "samples_per_sec", scale=1.0,
           title="On the GPU of its row; only for a cell timed alone (the timing rule)"),
    Column("times", "times_text", choose=True,
           title="'timed alone': the cell had its GPU and CPU cores to itself, so its times are the card's and are "
                 "shown; 'not shown': it shared its host (or has no record of it), so its times are left out"),
    Column("failed request (GiB)", "oom_request", title="What the allocation that ran out of memory asked for"),
    Column("negatives", "negatives", title="Hard negatives per query (op-level cells); empty: in-batch only"),
    Column("grid", "grid", choose=True, title="The grid (grids/*.yaml) the cell belongs to"),
]  # fmt: skip
NUMERIC = {"batch", "negatives", "seed", "failed request (GiB)"}  # sorted as numbers, like the measurements
ORDER = ["stack", "regime", "grid", "backend", "card", "allocator", "batch_size", "negatives", "seed"]


def request_gib(message: object) -> str:
    """An OOM message's failed request in GiB ('Tried to allocate 254.00 MiB' → '0.248'); empty for no message,
    the request's own words where they name no size."""
    if missing(message):
        return ""
    request = failed_request(message)
    found = re.search(r"([0-9.]+) (GiB|MiB)", request)
    if not found:
        return request
    return significant(float(found.group(1)) * (GIB_PER_MIB if found.group(2) == "MiB" else 1.0))


def outcome_text(row: pd.Series) -> str:
    """'ok', 'OOM in MaxSim op', 'OOM elsewhere', or the outcome as recorded."""
    if row["outcome"] == "oom":
        return {"maxsim": "OOM in MaxSim op", "elsewhere": "OOM elsewhere"}.get(str(row["oom_where"]), "OOM")
    return str(row["outcome"])


def rows(cells: pd.DataFrame) -> pd.DataFrame:
    """The table's rows as display text (column headers as in :data:`COLUMNS`), sorted, no NaN: a
    measurement a cell lacks (an OOM's step peaks, warm-up-only timings) is an empty string."""
    frame = cells.assign(
        backend=[backend_label(v, c) for v, c in zip(cells["variant"], cells["score_mini_batch_size"], strict=True)],
        outcome_text=cells.apply(outcome_text, axis=1) if len(cells) else [],
        oom_request=[request_gib(m) for m in cells["oom_message"]],
        times_text=[TIMED if alone else NOT_TIMED for alone in _alone(cells)],
        gpu_text=[gpu_text(name) for name in (cells["device_name"] if "device_name" in cells else [None] * len(cells))],
        regime_text=[regime_words(str(stack), str(regime))
                     for stack, regime in zip(cells["stack"], cells["regime"], strict=True)],
    ).sort_values(ORDER, na_position="first")
    shown = {}
    for column in COLUMNS:
        values = frame[column.field]
        if column.field in TIMES:  # the timing rule: a time is the card's only if the cell had its host alone
            rows_of = zip(values, frame["outcome"], frame["times_text"], strict=True)
            shown[column.header] = [_measured(v, column.scale or 1.0, outcome) if times == TIMED else ""
                                    for v, outcome, times in rows_of]  # fmt: skip
        elif column.scale is not None:
            shown[column.header] = [_measured(v, column.scale, row) for v, row in zip(values, frame["outcome"], strict=True)]
        else:
            shown[column.header] = ["" if missing(v) else _plain(v) for v in values]
    return pd.DataFrame(shown).reset_index(drop=True)


TIMES = {"steady_step_time_sec", "samples_per_sec"}
TIMED, NOT_TIMED = "timed alone", "not shown"


def _alone(cells: pd.DataFrame) -> list[bool]:
    """Per row, whether its times may be published (``times_comparable``; no column: none may)."""
    if "times_comparable" not in cells:
        return [False] * len(cells)
    return [value is True or (not missing(value) and bool(value)) for value in cells["times_comparable"]]


def _measured(value: object, scale: float, outcome: object) -> str:
    """A measurement as text; none for a missing one, and none for an OOM cell (which has no full step to measure)."""
    if missing(value) or outcome != "ok":
        return ""
    return significant(float(value) * scale)  # type: ignore[arg-type]


def _plain(value: object) -> str:
    """A categorical or integer value: 16.0 → '16'."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def csv_text(table: pd.DataFrame) -> str:
    """The table as CSV, the same headers and text as the page shows."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.columns)
    writer.writerows(table.itertuples(index=False))
    return buffer.getvalue()


def html(cells: pd.DataFrame) -> str:
    """The page's HTML: filter controls, a CSV download link (a data: URI, so it works offline from the
    built file), and the table in its own horizontally scrolling container."""
    table = rows(cells)
    numeric = {column.header for column in COLUMNS if column.scale is not None} | NUMERIC
    heads = "".join(
        f'<th scope="col" title="{escape(column.title or column.header)}"'
        f'{" data-choose" if column.choose else ""}{" data-numeric" if column.header in numeric else ""}>'
        f"{escape(column.header)}</th>"
        for column in COLUMNS
    )
    body = "\n".join(
        "<tr>" + "".join(_cell(value, header in numeric) for header, value in zip(table.columns, record, strict=True)) + "</tr>"
        for record in table.itertuples(index=False)
    )
    link = "data:text/csv;charset=utf-8," + quote(csv_text(table))
    return (
        f'<div class="results-table" data-table="{TABLE_ID}">'
        f'<p class="results-table-download"><a href="{link}" download="results.csv">Download this table as CSV</a>'
        f" ({len(table)} cells, {len(table.columns)} columns). Click a header to sort; type in the box or pick"
        " values to filter.</p>"
        f'<div class="results-table-scroll"><table id="{TABLE_ID}" class="results-table-grid">'
        f"<thead><tr>{heads}</tr></thead>\n<tbody>\n{body}\n</tbody></table></div></div>"
    )


def _cell(text: str, numeric: bool) -> str:
    if numeric and text:
        return f'<td data-value="{escape(text)}">{escape(text)}</td>'
    return f"<td>{escape(text)}</td>"
