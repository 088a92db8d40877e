"""The book's executed cell notebooks: their tables are rendered from their committed results by
``harness.cellbook refresh``, which is idempotent, edits no source cell and never writes a result; the
committed notebooks show no local path, no warning, no six-decimal float and no "None" or "[]"; each
one's header and title say its result's spec and outcome; the index page links every notebook."""

import copy
import hashlib
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from harness import cellbook, display
from harness.report import data
from harness.results import CellResult

ROOT = Path(__file__).resolve().parent.parent
CELLS = ROOT / "book" / "cells"
COMMITTED_NOTEBOOKS = sorted(CELLS.rglob("*.ipynb"))
LOCAL = ("/work/", "/root/", "/tmp/")
SIX_DECIMALS = re.compile(r"\d\.\d{6}")
TABLE_WORDS = re.compile(r"(?<![\w-])(None|NaN|nan|\[\])(?![\w-])")


@pytest.fixture(scope="module")
def results() -> data.Results:
    return data.read(ROOT / "results")


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def sources(notebook) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def noisy(notebook):
    """A committed notebook as papermill left it before any refresh: warnings, bars and raw tables."""
    notebook = copy.deepcopy(notebook)
    notebook.cells = [cell for cell in notebook.cells if cellbook.HEADER_TAG not in cell.metadata.get("tags", [])]
    for cell in notebook.cells:
        cell.metadata["tags"] = [t for t in cell.metadata.get("tags", []) if t not in ("remove-input", "hide-input")]
        if cell.cell_type != "code" or not cell.outputs:
            continue
        if cellbook._runs_the_cell(cell.source):
            warning = "/opt/torch/.venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found.\n"
            cell.outputs.insert(0, nbformat.v4.new_output("stream", name="stderr", text=warning))
            cell.outputs.insert(1, nbformat.v4.new_output("stream", name="stdout", text="saved to /work/main/results/x.json\n"))
        for output in cell.outputs:
            if output.output_type == "execute_result":
                output.data = {
                    "text/plain": "step peak (MiB)  54468.220703\nOOM  None\nsteady steps  []",
                    "text/html": "<td>None</td>",
                }
    return notebook


def one_of_each() -> list[Path]:
    """A colpali, a pylate, an op and an out-of-memory notebook of the committed book."""
    chosen = []
    for part in ("/colpali/", "/pylate/", "/op-colpali/", "/op-pylate/"):
        chosen.append(next(p for p in COMMITTED_NOTEBOOKS if part in str(p)))
    chosen.append(next(p for p in COMMITTED_NOTEBOOKS if p.read_text().count("— oom")))
    return chosen


@pytest.fixture
def scratch_book(tmp_path, results):
    """A copy of a few committed notebooks, made noisy again, under a cells folder of its own."""
    cells = tmp_path / "cells"
    for path in one_of_each():
        target = cells / path.relative_to(CELLS)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(noisy(nbformat.read(path, as_version=4)), target)
    return cells


def test_refresh_is_idempotent_and_changes_no_source_cell_nor_result(scratch_book, results):
    before = {path: nbformat.read(path, as_version=4) for path in scratch_book.rglob("*.ipynb")}
    results_before = digest(ROOT / "results")
    first = cellbook.refresh(scratch_book, results)
    assert sorted(first.changed) == sorted(before) and first.unmatched == []
    after = {path: path.read_bytes() for path in before}
    second = cellbook.refresh(scratch_book, results)
    assert second.changed == [] and sorted(second.unchanged) == sorted(before)
    assert {path: path.read_bytes() for path in before} == after  # the second run wrote nothing new
    assert digest(ROOT / "results") == results_before
    for path, original in before.items():
        refreshed = nbformat.read(path, as_version=4)
        kept = [c for c in sources(refreshed)[1:] if c[1] and not c[1].startswith("| stack")]
        assert kept == sources(original)[1:]  # only the title heading and the header cell are the refresh's
        assert cellbook.refresh_notebook(refreshed, *_result_of(path, scratch_book, results)) == refreshed


def _result_of(path: Path, cells: Path, results: data.Results):
    grid, cell_id = cellbook.notebook_key(path, cells)
    matches = [(p, r) for p, r in results.of(grid) if r.cell_id == cell_id]
    assert len(matches) == 1, f"{path}: {len(matches)} results"
    result_path, result = matches[0]
    return result, cellbook.result_file(result_path, results.root)


def test_refresh_strips_warnings_and_paths_and_renders_the_tables(scratch_book, results):
    cellbook.refresh(scratch_book, results)
    for path in scratch_book.rglob("*.ipynb"):
        problems = list(output_problems(nbformat.read(path, as_version=4)))
        assert problems == [], f"{path.name}: {problems[:3]}"


def test_paths_are_shortened_inside_ipythons_coloured_tracebacks_too():
    coloured = "File \x1b[0;32m/work/main/harness/cell.py:175\x1b[0m, in \x1b[0;36mrun_cell\x1b[0;34m(spec)"
    assert cellbook.shorten_paths(coloured) == "File \x1b[0;32m…/cell.py:175\x1b[0m, in \x1b[0;36mrun_cell\x1b[0;34m(spec)"
    assert cellbook.shorten_paths("see /tmp/run/harness/backends.py:140 and ~/x") == "see …/backends.py:140 and ~/x"


def test_the_check_command_says_the_committed_notebooks_are_current(capsys):
    from harness.cli import main

    assert main(["cellbook", "check"]) == 0
    assert f"would rewrite 0 executed notebooks; {len(COMMITTED_NOTEBOOKS)} already current" in capsys.readouterr().out


def output_problems(notebook):
    """What a notebook's outputs must not show: a local path, a warning, a six-decimal float, None or []."""
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                texts = {"stream": output.text}
            elif output.output_type == "error":
                texts = {"error": output.evalue + "\n".join(output.traceback)}
            else:
                texts = {kind: value for kind, value in output.get("data", {}).items() if kind in ("text/plain", "text/html")}
            for kind, text in texts.items():
                for bad in LOCAL:
                    if bad in text:
                        yield index, kind, f"local path {bad}"
                if "Warning" in text and output.output_type == "stream":
                    yield index, kind, "a warning"
                if output.output_type == "stream" and output.name == "stderr":
                    yield index, kind, "a stderr stream"
                if kind.startswith("text/"):
                    if SIX_DECIMALS.search(text):
                        yield index, kind, f"six decimals: {SIX_DECIMALS.search(text)[0]}"
                    if TABLE_WORDS.search(text):
                        yield index, kind, f"table word: {TABLE_WORDS.search(text)[0]}"


@pytest.mark.parametrize("path", COMMITTED_NOTEBOOKS, ids=[p.stem for p in COMMITTED_NOTEBOOKS])
def test_a_committed_notebook_reads_as_a_record(path, results):
    notebook = nbformat.read(path, as_version=4)
    assert list(output_problems(notebook)) == []
    result, result_file = _result_of(path, CELLS, results)
    title = next(c for c in notebook.cells if c.cell_type == "markdown" and c.source.startswith("# "))
    assert title.source.splitlines()[0] == f"# {result.spec.title} — {result.outcome}"
    headers = [c for c in notebook.cells if cellbook.HEADER_TAG in c.metadata.get("tags", [])]
    if not headers:  # the notebook shows header(result) itself: its output, rendered from the result, states the spec
        (shows,) = [c for c in notebook.cells if c.cell_type == "code" and "header(result)" in c.source]
        html = "".join(o.get("data", {}).get("text/html", "") for o in shows.outputs)
        fields = display.header_fields(result)
        assert all(str(value) in html for value in fields.values() if "`" not in str(value)), html[:500]
        return
    (header,) = headers
    names, _, values = header.source.splitlines()[:3]
    shown = dict(zip(names.strip("| ").split(" | "), values.strip("| ").split(" | "), strict=True))
    fields = display.header_fields(result)
    assert shown == {k.replace(" per query", ""): v for k, v in fields.items() if k in cellbook.HEADER_COLUMNS}
    assert all(f"{k} {v}" in header.source for k, v in fields.items() if k not in (*cellbook.HEADER_COLUMNS, "grid", "cell id"))
    assert shown["outcome"].startswith(result.outcome) and shown["batch"] == str(result.spec.batch_size)
    assert shown["backend"].startswith(result.spec.variant) and shown["stack"] == result.spec.stack
    assert f"`{result.grid}`" in header.source and f"`{result.cell_id}`" in header.source and result_file in header.source
    injected = [c for c in notebook.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert all("remove-input" in c.metadata["tags"] for c in injected)
    _assert_the_command_is_the_cells_own(notebook, title.source, result)


def _assert_the_command_is_the_cells_own(notebook, title: str, result: CellResult) -> None:
    """The title cell's papermill command runs this cell: every parameter it passes is the one papermill
    injected, every one it leaves out is the template's default, and the batch is the result's."""
    lines = [line.strip() for line in title.splitlines()]
    (start,) = [i for i, line in enumerate(lines) if line.startswith("papermill ")]
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    assert all(len(line) <= cellbook.COMMAND_WIDTH + 6 for line in lines[start : end + 1])  # past the indent, " \\"
    line = " ".join(line.removesuffix("\\").strip() for line in lines[start : end + 1])
    assert cellbook.GENERIC_RUN not in title and cellbook.OWN_RUN in title
    passed = dict(re.findall(r" -p (\S+) (\S+)", line))
    cells = notebook.cells
    injected = cellbook._assignments(next(c for c in cells if "injected-parameters" in c.metadata.get("tags", [])).source)
    template = next((c for c in cells if "parameters" in c.metadata.get("tags", [])), None)
    defaults = cellbook._assignments(template.source) if template is not None else {}
    for name, value in injected.items():
        if name in ("output", "grid"):
            assert name not in passed
        elif name in passed:
            assert passed[name] == str(value), name
        else:
            assert defaults[name] == value, name
    assert passed.get("batch", str(defaults.get("batch"))) == str(result.spec.batch_size)


def test_a_cells_command_replaces_the_templates_example_and_stays_put():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# t\n\nRun it with papermill, one fresh kernel per cell:\n\n    papermill "
                                      "notebooks/pylate.ipynb out.ipynb -k maxsim-pylate -p batch 512 -p variant lik\n\nAfter."),
        nbformat.v4.new_code_cell("batch = 4\nvariant = 'vanilla'\nsteps = 4", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell('# Parameters\nstack = "pylate"\nbatch = 256\nvariant = "vanilla"\nsteps = 8\n'
                                  'output = "/x/y.json"\ngrid = "ceilings"\ngather = True',
                                  metadata={"tags": ["injected-parameters"]}),
    ]  # fmt: skip
    once = cellbook._own_run(notebook.cells[0].source, notebook.cells)
    assert once == ("# t\n\n" + cellbook.OWN_RUN + "\n\n    papermill notebooks/pylate.ipynb out.ipynb -k maxsim-pylate "
                    "-p stack pylate -p batch 256 \\\n        -p steps 8 -p gather True\n\nAfter.")  # fmt: skip
    assert cellbook._own_run(once, notebook.cells) == once
    del notebook.cells[2]  # a notebook papermill did not run keeps the template's example
    assert cellbook._own_run(notebook.cells[0].source, notebook.cells) == notebook.cells[0].source


def test_the_header_and_summary_of_an_out_of_memory_cell(results):
    result = next(r for _, r in results.of("published") if r.outcome == "oom" and not r.step_times_sec)
    header = display.header_fields(result)
    assert header["outcome"] == "oom" and header["grid"] == "published" and header["cell id"] == result.cell_id
    summary = display.summary(result)["value"]
    assert summary["OOM"].startswith("CUDA out of memory. Tried to allocate") and summary["OOM"].count(".") <= 3
    assert "steady step time (s)" not in summary  # no step completed: no time, rather than None
    assert display.step_times(result)["value"]["note"].startswith("no step completed")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.451612, "0.452"),
        (2.650584, "2.65"),
        (71.15, "71.2"),
        (283.429, "283"),
        (5489.3, "5,489"),
        (0.046612, "0.0466"),
        (0, "0"),
        (None, ""),
    ],  # fmt: skip
)
def test_seconds_and_rates_have_three_significant_digits(value, text):
    assert display.significant(value) == text


def test_memory_and_step_lists_read_plainly():
    assert display.mib(54468.220703) == "54,468.2" and display.mib_gib(52343.338379) == "52,343.3 MiB (51.1 GiB)"
    assert display.integers([1, 2, 3]) == "1–3" and display.integers([]) == "none" and display.integers([0, 2, 3]) == "0, 2, 3"
    assert display.integers([0, *range(2, 50)]) == "0, 2–49"


def test_the_index_lists_every_cell_grouped_and_links_its_notebook(results):
    assert cellbook.grids_in_order(results)[:2] == ["published", "ours"]
    for grid in cellbook.grids_in_order(results):
        page = cellbook.index_html(results, grid)
        assert page.count("<tr>") == len(results.of(grid)) + page.count("<thead>")
        for href in re.findall(r'href="([^"]+)"', page):
            assert (ROOT / "book" / href).with_suffix(".ipynb").exists(), href
    published = cellbook.index_html(results, "published")
    assert len(re.findall(r'href="cells/published/', published)) == len(results.of("published"))
    linked = {
        href
        for grid in cellbook.grids_in_order(results)
        for href in re.findall(r'href="([^"]+)"', cellbook.index_html(results, grid))
    }
    assert len(linked) == len(COMMITTED_NOTEBOOKS)  # every committed notebook is reachable from the index


def test_the_index_page_says_the_tables_come_from_the_results():
    text = (ROOT / "book" / "cells.md").read_text()
    assert cellbook.COMMAND in text and "rendered from the cell's committed result file" in " ".join(text.split())


def test_refresh_leaves_a_notebook_without_result_alone(tmp_path, results):
    cells = tmp_path / "cells" / "ours" / "pylate" / "plain"
    cells.mkdir(parents=True)
    shutil.copy(COMMITTED_NOTEBOOKS[0], cells / "no-such-cell.ipynb")
    before = (cells / "no-such-cell.ipynb").read_bytes()
    done = cellbook.refresh(tmp_path / "cells", results)
    assert done.changed == [] and len(done.unmatched) == 1
    assert (cells / "no-such-cell.ipynb").read_bytes() == before


def test_a_notebook_whose_kernel_died_before_its_header_gets_one_that_says_why(results):
    # a colpali notebook shows header(result) at the end of its measurement cell; a kernel that died
    # mid-cell left that cell only its stream lines, so the refresh adds the header cell, crash included
    path = next(p for p in COMMITTED_NOTEBOOKS
                if "/colpali/" in str(p) and "— ok" in (text := p.read_text()) and "header(result)" in text)
    notebook = nbformat.read(path, as_version=4)
    (runs,) = [c for c in notebook.cells if c.cell_type == "code" and "header(result)" in c.source]
    runs.outputs = [nbformat.v4.new_output("stream", name="stdout", text="Configurating PEFT model\n")]
    ran, result_file = _result_of(path, CELLS, results)
    why = "the kernel stopped in the middle of a cell: Fatal Python error: Segmentation fault"
    crashed = CellResult.crashed(ran.spec, ran.grid, "kernel_died", "…", 53.5, why)
    refreshed = cellbook.refresh_notebook(notebook, crashed, result_file)
    (header,) = [c for c in refreshed.cells if cellbook.HEADER_TAG in c.metadata.get("tags", [])]
    assert "| crashed (kernel died) |" in header.source
    assert header.source.endswith(f"The run crashed: {why}. The last lines of its log are kept in the result file.")
    assert refreshed.cells[0].source.startswith(f"# {ran.spec.title} — crashed")


def test_a_time_not_timed_alone_is_marked_wherever_a_notebook_shows_it(results):
    """The timing rule: a notebook shows a time of a cell that did not have its host and GPU to itself only
    with the mark "not timed alone" (and why); a time of a cell timed alone carries none."""
    seen = {True: 0, False: 0}
    for _, result in results.found:
        if not result.step_times_sec:
            continue
        mark = display.alone_mark(result)
        assert bool(mark) == (not result.timed_alone) and (not mark or mark.startswith("not timed alone ("))
        seen[result.timed_alone] += 1
        steps = display.step_times(result)
        assert list(steps.columns)[0] == (f"seconds — {mark}" if mark else "seconds")
        if result.kind == "op":
            timing = display.op_timing(result)
            assert list(timing.columns) == [f"value — {mark}" if mark else "value"]
            continue
        summary = display.summary(result)["value"]
        for row in ("steady step time (s)", "samples / s"):
            if row in summary:
                assert summary[row].endswith(f" — {mark}") if mark else "not timed alone" not in summary[row]
    assert seen[True] and seen[False]


def test_the_header_says_the_steps_the_cell_ran_and_its_gpu(results):
    """A timed grid cell asks for a few steps and trains on until it has timed its steady steps; a cell that
    ran out of memory stops short: the header states the steps it ran beside those it was to run."""
    for _, result in results.found:
        fields = display.header_fields(result)
        ran = fields["steps trained" if result.kind == "train" else "timed repetitions"]
        done = len(result.step_times_sec)
        if result.outcome == "crashed" and not done:
            assert ran.startswith("none recorded of")
            continue
        assert ran.split(" ")[0] == str(done), (result.cell_id, ran)
        if result.outcome == "oom":
            assert ran.endswith(f"then out of memory in step {done + 1}")
        if result.kind == "train" and result.spec.min_steady_steps and result.outcome == "ok":
            assert f"until {result.spec.min_steady_steps} steady steps" in ran
        if result.env is not None and result.env.device_name:
            assert fields["GPU"] == result.env.device_name.removeprefix("NVIDIA ")
    (cut,) = [r for _, r in results.of("long-run") if r.outcome == "oom"]
    assert display.header_fields(cut)["steps trained"] == (
        f"{len(cut.step_times_sec)} of {cut.spec.steps}, then out of memory in step {len(cut.step_times_sec) + 1}")


@pytest.mark.parametrize("path", COMMITTED_NOTEBOOKS[:: max(1, len(COMMITTED_NOTEBOOKS) // 40)])
def test_the_templates_default_parameters_are_not_shown(path):
    """The template's parameters cell holds its defaults (not what the cell ran): removed from the page."""
    notebook = nbformat.read(path, as_version=4)
    defaults = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert all("remove-cell" in c.metadata["tags"] and "hide-input" not in c.metadata["tags"] for c in defaults)


def test_the_index_names_each_cells_gpu_and_each_recipe_as_the_pages_do(results):
    from harness.report.decision import REGIME_NAMES

    long_runs = cellbook.index_html(results, "long-run")
    other = [r for _, r in results.of("long-run") if r.env and r.env.device_name and "H200" not in r.env.device_name]
    assert other, "the committed long runs include one on another GPU than an H200"
    for result in other:  # its row names its GPU beside its time
        row = next(row for row in long_runs.split("<tr>") if f'title="{result.cell_id}"' in row)
        assert f">{result.env.device_name.removeprefix('NVIDIA ')}<" in row
    for grid in cellbook.grids_in_order(results):
        page = cellbook.index_html(results, grid)
        assert "<th" in page and ">GPU</th>" in page
        assert "regime <strong>plain" not in page and "<strong>plain</strong>" not in page
    assert f"<strong>{REGIME_NAMES[('colpali', 'plain')]}</strong>" in cellbook.index_html(results, "published")


def test_the_index_and_the_results_table_name_a_gpu_with_one_function():
    """A GPU as a result records it reads alike in the cell notebooks' index and the results table."""
    from harness.report import results_table, text

    assert text.gpu_text("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3" and text.gpu_text("NVIDIA H200") == "H200"
    assert [text.gpu_text(name) for name in (None, float("nan"), "")] == ["unrecorded"] * 3
    assert cellbook.gpu_text is results_table.gpu_text is text.gpu_text


def test_every_grid_has_its_own_section_on_the_index_page(results):
    text = (ROOT / "book" / "cells.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for grid in cellbook.GRID_ORDER:
        (section,) = [s for s in sections if f'cellbook.show_index(results, "{grid}")' in s]
        assert section.count("cellbook.show_index(") == 1, grid
    assert set(cellbook.grids_in_order(results)) <= set(cellbook.GRID_ORDER)  # none falls to "Other grids" today
    assert sections[-1].startswith("Other grids") and "show_other_grids" in sections[-1]


def test_the_cross_card_section_counts_its_searches_from_the_grid(tmp_path):
    """cells.md: the cross-card check's section says how many searches it runs again, counted from
    grids/cross-card-check.yaml (a variant list expands to one search per variant), and on which GPU not,
    as harness.search names it; the page shows that sentence, never a typed count."""
    from harness.search import REFERENCE_GPU, load_searches

    grid = data.CROSS_CARD_GRID
    count = len(load_searches(grid))
    assert count == grid.read_text().count("\n  - {stack: ")  # one search per entry (none lists two variants)
    lead = cellbook.cross_card_lead()
    assert lead.startswith(f"The check runs {count} ceiling searches again, ")
    assert f"other than the {REFERENCE_GPU} every card label names" in lead and f"(`grids/{grid.name}`)" in lead
    more = tmp_path / grid.name  # a variant list expands to one search per variant
    more.write_text(grid.read_text().replace("variant: flash, card: rtx4090-24gb", "variant: [lik, flash], card: rtx4090-24gb"))
    assert cellbook.cross_card_lead(more).startswith(f"The check runs {count + 1} ceiling searches again, ")
    section = re.split(r"^## ", (ROOT / "book" / "cells.md").read_text(), flags=re.M)
    (cross,) = [text for text in section if text.startswith("Cross-card check")]
    assert "cellbook.show_cross_card_lead()" in cross and "Four" not in cross and "H200" not in cross
