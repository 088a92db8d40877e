"""The report builds (warnings are errors) from the committed results, loads nothing from the network,
and every summary page runs from whatever results exist, none at all included.

A full build takes minutes, so the suite builds the book once (:func:`committed_book`, shared with
test_report); the pages' code runs in-process for every other case.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from myst_nb.core.read import read_myst_markdown_notebook

from harness.results import RESULTS_DIR_VARIABLE, result_paths

ROOT = Path(__file__).resolve().parent.parent
JUPYTER_BOOK = Path(sys.executable).parent / "jupyter-book"
COMMITTED = ROOT / "results"
PAGES = sorted(path.stem for path in (ROOT / "book").glob("*.md") if "{code-cell}" in path.read_text())
_BUILT: dict[str, Path | str] = {}  # the one build of the session: its html folder, or why it failed


def build(tmp_path: Path, results_dir: Path) -> Path:
    """Build the book from a copy of this checkout, reading results from ``results_dir``; its html folder."""
    if not JUPYTER_BOOK.exists():
        pytest.skip("jupyter-book is not installed in this environment")
    source = tmp_path / "src"
    ignored = shutil.ignore_patterns(".venvs", "_build", ".git", ".cache", "results", "wheelhouse", ".whl")

    def ignore(folder: str, names: list[str]) -> set[str]:
        # of the executed cell notebooks, the published grid's only: every kind of page still builds
        # (and -W still fails on a warning in one), in a third of the time the ~300 notebooks take
        skipped = set(ignored(folder, names))
        if Path(folder) == ROOT / "book" / "cells":
            skipped |= {name for name in names if name != "published"}
        return skipped

    shutil.copytree(ROOT, source, ignore=ignore)
    env = dict(os.environ, **{RESULTS_DIR_VARIABLE: str(results_dir)})
    completed = subprocess.run(  # the design card's command: `jupyter-book build book`
        [JUPYTER_BOOK, "build", "--all", "-W", "--keep-going", "book"], cwd=source, env=env, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return source / "book" / "_build" / "html"


def committed_book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The book built from the committed results, once per test session (a failed build fails every user)."""
    if "html" not in _BUILT:
        try:
            _BUILT["html"] = build(tmp_path_factory.mktemp("book"), COMMITTED)
        except AssertionError as error:
            _BUILT["html"] = f"the book did not build: {error}"
    built = _BUILT["html"]
    if isinstance(built, str):
        pytest.fail(built)
    return built


@pytest.fixture(scope="session")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return committed_book(tmp_path_factory)


def run_page(page: str, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Run a summary page's code cells in this process, reading ``results_dir``; what they displayed."""
    import IPython.display

    shown: list[object] = []
    monkeypatch.setenv(RESULTS_DIR_VARIABLE, str(results_dir))
    monkeypatch.setattr(IPython.display, "display", lambda *items, **_: shown.extend(items))
    notebook = read_myst_markdown_notebook((ROOT / "book" / f"{page}.md").read_text())
    namespace: dict[str, object] = {}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            exec(compile(cell.source, f"book/{page}.md", "exec"), namespace)
    return shown


def texts(shown: list[object]) -> str:
    """The Markdown and table text a page displayed."""
    from IPython.display import Markdown

    return "\n".join(item.data if isinstance(item, Markdown) else getattr(item, "to_string", item.__str__)() for item in shown)


@pytest.mark.parametrize("page", PAGES, ids=[f"{page}.md" for page in PAGES])
def test_every_page_runs_with_no_results_and_says_so(page, tmp_path, monkeypatch):
    shown = run_page(page, tmp_path / "empty", monkeypatch)
    if page == "results":
        assert "No results have been committed yet" in texts(shown)
        assert "Files not read" not in texts(shown)


def test_the_results_page_names_the_files_it_skipped(tmp_path, monkeypatch):
    from harness.results import write_result
    from test_results import make_result

    write_result(make_result(batch_size=96), tmp_path / "ours" / "colpali" / "plain" / "b96.json")
    (tmp_path / "ours" / "broken.json").write_text('{"schema_version": 2, "grid"')
    text = texts(run_page("results", tmp_path, monkeypatch))
    assert "No results have been committed yet" not in text and "Files not read." in text
    assert "ours/broken.json" in text and "not JSON" in text


def test_the_book_loads_nothing_from_the_network(book):
    for name in ("index.html", "results.html", "methodology.html", "ceilings.html"):
        text = (book / name).read_text()
        external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', text)
        assert external == [], f"{name} loads {external}"


def committed_cell(**spec: object) -> dict:
    """The one committed result (its JSON, read without the harness) whose spec has these fields."""
    found = []
    for path in result_paths(COMMITTED):
        document = json.loads(path.read_text())
        if document["grid"] in ("ours", "published") and all(document["spec"].get(k) == v for k, v in spec.items()):
            found.append(document)
    assert len(found) == 1, f"{len(found)} committed results match {spec}"
    return found[0]


def test_the_book_shows_committed_results(book):
    results = (book / "results.html").read_text()
    assert "No results have been committed yet" not in results and "Files not read" not in results
    assert f"({len(result_paths(COMMITTED))} cells, 18 columns)" in results  # 18: "times" (timing rule) and "GPU"
    intro = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (book / "intro.html").read_text()))
    for variant in ("vanilla", "lik"):
        cell = committed_cell(stack="colpali", regime="plain", batch_size=64, variant=variant, card="h100-80gb")
        peak, step = cell["step_peak_alloc_mib"] / 1024, cell["steady_step_time_sec"]
        assert f"{peak:.2f} GiB allocated at the step peak · {step:.2f} s/step" in intro
    cell = committed_cell(stack="colpali", regime="plain", batch_size=128, variant="vanilla", card="h100-80gb")
    if cell["outcome"] == "oom":  # the sentence names the failed request, whatever the committed cell says
        assert "runs out of memory" in intro and cell["oom_message"].split(". ")[1] in intro
    else:
        peak, step = cell["step_peak_alloc_mib"] / 1024, cell["steady_step_time_sec"]
        assert f"{peak:.2f} GiB allocated at the step peak · {step:.2f} s/step" in intro
