"""The executed cell notebooks of the book (``book/cells/``): their tables rendered from their result files.

An executed notebook under ``book/cells/<grid>/<stack>/<regime or head>/<cell id>.ipynb`` is the
record of one papermill run; its measurement lives in the result file of the same grid and cell id
(``results/<grid>/…/<cell id>.json``), and its display cells (``summary(result)``,
``calls_table(result, …)``, ``step_times(result)``, ``op_timing(result)``, ``header(result)``) only
show that result. :func:`refresh` renders those outputs again with :mod:`harness.display` from the
committed result, so every notebook reads alike whichever version of the display code ran it:

- each display cell's table output is replaced (a cell that showed nothing, say after a crash, is
  left without one);
- the measurement cell's stderr streams (progress bars, warnings, library log lines) are dropped
  unless the cell failed; local paths left in its outputs, an error's included, are shortened to
  their last part; error outputs stay, they are the record;
- the title heading is the launcher's (``<spec title> — <outcome>``), and a header cell below it
  (tagged ``cell-header``) states the spec and outcome from the result, unless the notebook shows
  ``header(result)`` itself;
- the injected-parameters cell, whose ``output`` names a local result path, is kept in the file but
  not shown in the book (tag ``remove-input``; the header states the same values from the result),
  and so is the template's cell of default parameters (tag ``remove-cell``): its values are the
  template's, not what the cell ran, which the header states (its steps as trained, not as asked);
- a time of a cell not timed alone carries its mark (:func:`harness.display.alone_mark`).

Source cells are never edited; a result file is only read. Running it twice changes nothing the
second time. ``python -m harness.cellbook refresh`` (or ``harness cellbook refresh``) runs it over
``book/cells/``; ``check`` says which notebooks it would change and exits 1 if any.

:func:`index_html` is the index page's table of one grid's cells (``book/cells.md``). Torch-free.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import html
import json
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd

from harness import display
from harness.report import data
from harness.report.text import ANSI_COLOUR, counted, gpu_text, regime_label
from harness.results import CellResult
from harness.search import REFERENCE_GPU, load_searches

ROOT = Path(__file__).resolve().parent.parent
CELLS_DIR = ROOT / "book" / "cells"
HEADER_TAG = "cell-header"
COMMAND = "python -m harness.cellbook refresh"
# the grids in the order the index page (book/cells.md) has a section for each: the published recipe
# first; a grid with results that is not here is listed under the page's last section, "Other grids"
GRID_ORDER = ("published", "ours", "gradcache", data.MULTI_GPU, "op", "ceilings", data.SHARED_CHECK, data.CROSS_CARD,
              "long-run", "parity", "repeat")  # fmt: skip

DISPLAYS: dict[str, Callable[..., pd.DataFrame]] = {
    "header": display.header, "summary": display.summary, "calls_table": display.calls_table,
    "step_times": display.step_times, "op_timing": display.op_timing,
}  # fmt: skip
RUN_CALLS = ("run_cell", "run_op_cell", "notebook.run")
LOCAL_PATH = re.compile(r"(?<![\w.~])/(?:work|root|tmp|opt|home|scratch|mnt|var|usr|srv|data)/[^\s'\"`<>)\]]*")


def shorten_paths(text: str) -> str:
    """``/tmp/run/harness/backends.py:140`` → ``…/backends.py:140``: no local path in a notebook's outputs."""

    def last_part(match: re.Match[str]) -> str:
        path = match.group(0).rstrip("/")
        return "…/" + path.rsplit("/", 1)[-1]

    # an ANSI colour code (IPython's tracebacks) ends in a letter that would hide the path after it
    return "".join(part if ANSI_COLOUR.fullmatch(part) else LOCAL_PATH.sub(last_part, part) for part in ANSI_COLOUR.split(text))


# ---- one notebook ----------------------------------------------------------------------------------


def _tags(cell: Any) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _add_tag(cell: Any, tag: str) -> None:
    tags = _tags(cell)
    if tag not in tags:
        cell.setdefault("metadata", {})["tags"] = [*tags, tag]


def display_call(source: str) -> tuple[str, tuple[Any, ...]] | None:
    """The display function a code cell ends on, with its constant arguments after ``result``:
    ``calls_table(result, "isolated")`` → ``("calls_table", ("isolated",))``; None for any other cell."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    if not body or not isinstance(body[-1], ast.Expr) or not isinstance(body[-1].value, ast.Call):
        return None
    call = body[-1].value
    name = ast.unparse(call.func).removeprefix("display.")
    if name not in DISPLAYS or not call.args or ast.unparse(call.args[0]) != "result" or call.keywords:
        return None
    if not all(isinstance(arg, ast.Constant) for arg in call.args[1:]):
        return None
    return name, tuple(arg.value for arg in call.args[1:] if isinstance(arg, ast.Constant))


def _runs_the_cell(source: str) -> bool:
    return any(f"{call}(" in source for call in RUN_CALLS)


def table_output(frame: pd.DataFrame, execution_count: int | None) -> Any:
    """A DataFrame as a notebook shows it: an execute_result with its text and HTML."""
    with pd.option_context("display.max_rows", 1000, "display.max_columns", 100, "display.max_colwidth", None,
                           "display.width", 250):  # fmt: skip
        text, markup = repr(frame), str(frame._repr_html_())  # type: ignore[operator]
    return nbformat.v4.new_output("execute_result", data={"text/plain": text, "text/html": markup},
                                  execution_count=execution_count)  # fmt: skip


def _stream_outputs(outputs: list[Any], failed: bool) -> list[Any]:
    """A cell's outputs less stderr streams (unless it failed), with local paths shortened."""
    kept = []
    for output in outputs:
        output = copy.deepcopy(output)
        if output.get("output_type") == "stream":
            if output.get("name") == "stderr" and not failed:
                continue
            output["text"] = shorten_paths(output.get("text", ""))
        elif output.get("output_type") == "error":
            output["evalue"] = shorten_paths(output.get("evalue", ""))
            output["traceback"] = [shorten_paths(line) for line in output.get("traceback", [])]
        kept.append(output)
    return kept


def _shows_a_table(cell: Any) -> bool:
    return any(output.get("output_type") == "execute_result" for output in cell.get("outputs", []))


def title(result: CellResult) -> str:
    """The launcher's title of an executed notebook: ``<spec title> — <outcome>``."""
    return f"{result.spec.title} — {result.outcome}"


HEADER_COLUMNS = ("stack", "regime", "head", "batch", "negatives per query", "backend", "card", "allocator", "seed", "outcome")


def header_markdown(result: CellResult, result_file: str) -> str:
    """The header cell: the spec and outcome as a one-row table, then the rest of the spec and where
    the tables come from."""
    fields = display.header_fields(result)
    shown = {name.replace(" per query", ""): fields[name] for name in HEADER_COLUMNS if name in fields}
    head = "| " + " | ".join(shown) + " |\n|" + "---|" * len(shown) + "\n| " + " | ".join(shown.values()) + " |"
    rest = "; ".join(f"{name} {value}" for name, value in fields.items() if name not in (*HEADER_COLUMNS, "grid", "cell id"))
    crashed = ""
    if result.outcome == "crashed" and result.oom_message:
        crashed = f"\n\nThe run crashed: {result.oom_message}. The last lines of its log are kept in the result file."
    return (
        f"{head}\n\n"
        f"Grid `{fields['grid']}`, cell `{fields['cell id']}`; {rest}. The tables below are rendered from this cell's "
        f"result file, `{result_file}`, by `{COMMAND}` (the display code of `harness/display.py`); the code cells "
        f"are as papermill ran them.{crashed}"
    )


GENERIC_RUN = "Run it with papermill, one fresh kernel per cell:"
OWN_RUN = "This cell again, by hand (papermill, one fresh kernel; a hand run writes its result outside `results/`):"
# the template's example, or a cell's own command over several lines (each but the last ending in a backslash)
_EXAMPLE = re.compile(r"^(?P<indent>[ \t]+)papermill (?P<notebook>\S+\.ipynb) out\.ipynb -k (?P<kernel>\S+)"
                      r"(?:[^\n]*\\\n)*[^\n]*$", re.M)  # fmt: skip
COMMAND_WIDTH = 88  # a line of the command, past its indent, that the page shows without scrolling
# the injected parameters that say where a grid's run wrote its result, not what it measured
_WHERE = ("output", "grid")


def _assignments(source: str) -> dict[str, Any]:
    """``name = literal`` lines of a parameters cell, as values (anything else is skipped)."""
    values: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def own_command(cells: Sequence[Any], notebook_path: str, kernel: str, indent: str = "") -> str | None:
    """The papermill command that runs this cell again: the template with every parameter papermill
    injected that differs from the template's default (None where no parameters were injected),
    broken into lines of at most :data:`COMMAND_WIDTH` characters, each continued with a backslash
    and the next indented by ``indent`` and four spaces."""
    injected = next((cell for cell in cells if cell.cell_type == "code" and "injected-parameters" in _tags(cell)), None)
    if injected is None:
        return None
    template = next((cell for cell in cells if cell.cell_type == "code" and "parameters" in _tags(cell)), None)
    defaults = _assignments(template.source) if template is not None else {}
    changed = [(name, value) for name, value in _assignments(injected.source).items()
               if name not in _WHERE and (name not in defaults or defaults[name] != value)]  # fmt: skip
    lines = [f"papermill {notebook_path} out.ipynb -k {kernel}"]
    for name, value in changed:
        part = f"-p {name} {shlex.quote(str(value))}"
        if len(lines[-1]) + 1 + len(part) > COMMAND_WIDTH:
            lines.append("    " + part)
        else:
            lines[-1] += " " + part
    return f" \\\n{indent}".join(lines)


def _own_run(source: str, cells: Sequence[Any]) -> str:
    """The title cell's text with the template's example command replaced by this cell's own."""
    match = _EXAMPLE.search(source)
    command = None if match is None else own_command(cells, match["notebook"], match["kernel"], match["indent"])
    if match is None or command is None:
        return source
    return source[: match.start()].replace(GENERIC_RUN, OWN_RUN) + match["indent"] + command + source[match.end():]


def refresh_notebook(notebook: Any, result: CellResult, result_file: str) -> Any:
    """``notebook`` (an nbformat node, not changed) with its display outputs, title and header set from ``result``."""
    notebook = copy.deepcopy(notebook)
    cells = notebook.cells
    # the title: the first markdown heading, as the launcher writes it
    for cell in cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
            _, _, rest = cell.source.lstrip().partition("\n")
            cell.source = f"# {title(result)}\n{_own_run(rest, cells)}"
            break
    else:
        cells.insert(0, nbformat.v4.new_markdown_cell(f"# {title(result)}"))
    calls = [display_call(cell.source) if cell.cell_type == "code" else None for cell in cells]
    # the notebook shows header(result) itself only where that cell ran (a kernel that died before it did not)
    shows_header = any(call is not None and call[0] == "header" and _shows_a_table(cell)
                       for cell, call in zip(cells, calls, strict=True))  # fmt: skip
    for cell, call in zip(cells, calls, strict=True):
        if cell.cell_type != "code":
            continue
        tags = _tags(cell)
        if "injected-parameters" in tags:
            _add_tag(cell, "remove-input")
        elif "parameters" in tags:  # the template's defaults, not the cell's values: never shown
            cell.metadata["tags"] = [tag for tag in tags if tag != "hide-input"]
            _add_tag(cell, "remove-cell")
        failed = any(output.get("output_type") == "error" for output in cell.get("outputs", []))
        outputs = _stream_outputs(cell.get("outputs", []), failed)
        if call is not None and not failed:
            name, arguments = call
            frame = DISPLAYS[name](result, *arguments)
            outputs = [table_output(frame, cell.get("execution_count")) if o.get("output_type") == "execute_result" else o
                       for o in outputs]  # fmt: skip
        cell.outputs = outputs
    headers = [i for i, cell in enumerate(cells) if HEADER_TAG in _tags(cell)]
    for index in reversed(headers):
        del cells[index]
    if not shows_header:
        first = next(i for i, cell in enumerate(cells) if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "))
        header = nbformat.v4.new_markdown_cell(header_markdown(result, result_file), metadata={"tags": [HEADER_TAG]})
        header.pop("id", None)
        if notebook.get("nbformat_minor", 0) >= 5:
            header["id"] = HEADER_TAG  # a fixed id: a second refresh writes the same notebook
        cells.insert(first + 1, header)
    return notebook


# ---- the book's notebooks ----------------------------------------------------------------------------


@dataclasses.dataclass
class Refreshed:
    """What :func:`refresh` did: notebooks rewritten, already current, and those it could not match."""

    changed: list[Path] = dataclasses.field(default_factory=list)
    unchanged: list[Path] = dataclasses.field(default_factory=list)
    unmatched: list[tuple[Path, str]] = dataclasses.field(default_factory=list)


def notebook_key(path: Path, cells_dir: Path) -> tuple[str, str]:
    """(grid, cell id) of an executed notebook: the first folder under the cells folder, and the file stem."""
    return path.resolve().relative_to(cells_dir.resolve()).parts[0], path.stem


def result_file(path: Path, results_root: Path) -> str:
    """A result's path as the book names it: relative to the checkout (``results/…``), never local."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return "results/" + path.resolve().relative_to(results_root.resolve()).as_posix()


def _serialized(notebook: Any) -> str:
    return json.dumps(notebook, sort_keys=True, ensure_ascii=False)


def refresh(cells_dir: Path = CELLS_DIR, source: data.Source = None, write: bool = True) -> Refreshed:
    """Render the display outputs of every executed notebook under ``cells_dir`` from its result
    (``source``: a results folder, default the committed one); write only the notebooks that change."""
    results = data.results_of(source)
    by_key = {(result.grid, result.cell_id): (path, result) for path, result in results.found}
    done = Refreshed()
    for path in sorted(cells_dir.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        key = notebook_key(path, cells_dir)
        if key not in by_key:
            done.unmatched.append((path, f"no result of grid {key[0]!r} with cell id {key[1]!r}"))
            continue
        result_path, result = by_key[key]
        notebook = nbformat.read(path, as_version=4)
        refreshed = refresh_notebook(notebook, result, result_file(result_path, results.root))
        if _serialized(refreshed) == _serialized(notebook):
            done.unchanged.append(path)
            continue
        done.changed.append(path)
        if write:
            nbformat.write(refreshed, path)
    return done


# ---- the index page ------------------------------------------------------------------------------------


def grids_in_order(results: data.Results) -> list[str]:
    """The grids with results: those of :data:`GRID_ORDER` in its order (the published recipe first), then any other."""
    present = sorted({result.grid for _, result in results.found if result.grid})
    return [grid for grid in GRID_ORDER if grid in present] + [grid for grid in present if grid not in GRID_ORDER]


def _peak_gib(result: CellResult) -> str:
    return "" if result.step_peak_alloc_mib is None else display.significant(result.step_peak_alloc_mib / 1024)


CELL_STYLE = "white-space: nowrap; padding: 0.1em 1em 0.1em 0; text-align: left"


def group_name(stack: str, regime: str, kind: str) -> str:
    """A group's heading in the index: a training regime by the report's name for it ('ColQwen2 + LoRA
    (colpali-engine recipe)', not its cell ids' 'plain'); an op-level cell's stack and loss head."""
    if kind == "op":
        return f"<strong>{html.escape(stack)}</strong> · head <strong>{html.escape(regime)}</strong>"
    from harness.report.decision import REGIME_NAMES  # imported here: the command needs no plotting library

    return f"<strong>{html.escape(REGIME_NAMES.get((stack, regime), regime_label(stack, regime)))}</strong>"


def index_html(results: data.Results, grid: str, cells_dir: Path = CELLS_DIR, page_dir: Path | None = None) -> str:
    """One grid's cells as HTML, grouped stack → regime (or head): one row per cell with its outcome,
    peak, step time and the GPU it ran on, and a link to its executed notebook relative to the index
    page (``book/cells``)."""
    page_dir = page_dir or cells_dir.parent
    items = sorted(
        (result for _, result in results.of(grid)),
        key=lambda r: (r.stack, r.regime, r.card, r.variant, r.score_mini_batch_size or 0, r.negatives or 0,
                       r.batch_size, r.allocator, r.seed),
    )  # fmt: skip
    parts: list[str] = []
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for result in items:
        groups.setdefault((result.stack, result.regime), []).append(result)
    for (stack, regime), members in groups.items():
        parts.append(f'<p class="cells-group" style="margin: 1.2em 0 0.3em">{group_name(stack, regime, members[0].kind)} '
                     f"— {len(members)} cells</p>")  # fmt: skip
        rows = []
        for result in members:
            notebook = cells_dir.joinpath(grid, *result.spec.folder, f"{result.cell_id}.ipynb")
            if notebook.exists():
                href = notebook.relative_to(page_dir).with_suffix(".html").as_posix()
                link = f'<a href="{html.escape(href)}" title="{html.escape(result.cell_id)}">B={result.batch_size}</a>'
            else:
                link = f'<span title="{html.escape(result.cell_id)}">B={result.batch_size}</span> (no notebook)'
            extra = [f"{result.negatives} negatives"] if result.negatives else []
            extra += [f"{result.allocator} allocator"] if result.allocator != "default" else []
            extra += [f"seed {result.seed}"] if result.seed != 42 else []
            outcome = result.outcome + (f" ({result.failure.replace('_', ' ')})" if result.failure else "")
            gpu = gpu_text(None if result.env is None else result.env.device_name)
            cells = [link, display.backend(result) + "".join(f" · {e}" for e in extra),
                     result.card, gpu, outcome, _peak_gib(result), _alone_time(result)]  # fmt: skip
            texts = [cells[0], *(html.escape(cell) for cell in cells[1:])]
            rows.append("<tr>" + "".join(f'<td style="{CELL_STYLE}">{text}</td>' for text in texts) + "</tr>")
        names = ("notebook (batch)", "backend", "card", "GPU", "outcome", "peak (GiB)", "s / step")
        head = "".join(f'<th style="{CELL_STYLE}">{name}</th>' for name in names)
        parts.append(f'<table class="cells-index"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
    return "\n".join(parts)


def _alone_time(result: CellResult) -> str:
    """The steady step time of a cell that was timed alone (the timing rule held and no other cell ran
    on its host); "—" for any other: its notebook still shows what it measured, marked as such."""
    return display.significant(result.steady_step_time_sec) if result.timed_alone and result.steady_step_time_sec else "—"


def index_counts(results: data.Results, grid: str) -> str:
    """``24 cells: 20 ok, 4 oom`` for one grid."""
    outcomes = pd.Series([result.outcome for _, result in results.of(grid)], dtype=object)
    counts = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.value_counts().sort_index().items())
    return f"{len(outcomes)} cells: {counts}" if len(outcomes) else "no cells"


def show_index(results: data.Results, grid: str, cells_dir: Path = CELLS_DIR) -> None:
    """Display one grid's index (``book/cells.md``): its count by outcome, then its tables; a line if it has no cell."""
    from IPython.display import HTML, Markdown, display

    if not results.of(grid):
        display(Markdown(f"No result of the `{grid}` grid has been committed yet."))
        return
    display(Markdown(index_counts(results, grid) + "."))
    display(HTML(index_html(results, grid, cells_dir)))


def cross_card_lead(grid_file: Path = data.CROSS_CARD_GRID) -> str:
    """What the cross-card check's section of the index is: its searches, counted from ``grid_file``
    (``grids/cross-card-check.yaml``), run again on a GPU other than :data:`harness.search.REFERENCE_GPU`."""
    searches = load_searches(grid_file)
    return (f"The check runs {counted(len(searches), 'ceiling search', 'ceiling searches')} again, under the same "
            f"caps, on a GPU other than the {REFERENCE_GPU} every card label names "
            f"(`grids/{grid_file.name}`); the ceilings page sets each probe beside its {REFERENCE_GPU} twin of the "
            "same data draw.")  # fmt: skip


def show_cross_card_lead(grid_file: Path = data.CROSS_CARD_GRID) -> None:
    """Display :func:`cross_card_lead` (``book/cells.md``, above the cross-card check's index)."""
    from IPython.display import Markdown, display

    display(Markdown(cross_card_lead(grid_file)))


def show_other_grids(results: data.Results, cells_dir: Path = CELLS_DIR) -> None:
    """Display the index of any grid with results that the page has no section for (not in
    :data:`GRID_ORDER`), each under its name; a line saying there is none otherwise."""
    from IPython.display import Markdown, display

    others = [grid for grid in grids_in_order(results) if grid not in GRID_ORDER]
    if not others:
        display(Markdown("Every grid with committed results has its own section above."))
    for grid in others:
        display(Markdown(f"**Grid `{grid}`**"))
        show_index(results, grid, cells_dir)


# ---- command -------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["refresh", "check"],
                        help="refresh: rewrite the notebooks' display outputs; "
                             "check: say which would change (exit 1 if any)")  # fmt: skip
    parser.add_argument("--cells-dir", type=Path, default=CELLS_DIR, help="default: book/cells/")
    parser.add_argument("--results-dir", type=Path, default=None, help="default: results/ (or $MAXSIM_RESULTS_DIR)")


def command(args: argparse.Namespace) -> int:
    done = refresh(args.cells_dir, args.results_dir, write=args.action == "refresh")
    verb = "rewrote" if args.action == "refresh" else "would rewrite"
    print(f"{verb} {len(done.changed)} executed notebooks; {len(done.unchanged)} already current")
    for path, reason in done.unmatched:
        print(f"not refreshed {path.relative_to(args.cells_dir)}: {reason}", file=sys.stderr)
    return 1 if done.unmatched or (args.action == "check" and done.changed) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cellbook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
