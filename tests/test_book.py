"""The report builds (warnings are errors) from whatever results exist, and needs no network."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import RESULTS_DIR_VARIABLE, write_result
from test_results import make_result

ROOT = Path(__file__).resolve().parent.parent
JUPYTER_BOOK = Path(sys.executable).parent / "jupyter-book"


def build(tmp_path, results_dir):
    if not JUPYTER_BOOK.exists():
        pytest.skip("jupyter-book is not installed in this environment")
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venvs", "_build", ".git", "results", "wheelhouse", ".whl"))
    env = dict(os.environ, **{RESULTS_DIR_VARIABLE: str(results_dir)})
    completed = subprocess.run(
        [JUPYTER_BOOK, "build", "--all", "-W", "--keep-going", str(source)], env=env, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return source / "_build" / "html"


def test_the_book_builds_with_no_results_and_says_so(tmp_path):
    html = build(tmp_path, tmp_path / "empty")
    page = (html / "book" / "results.html").read_text()
    assert "No results have been committed yet" in page
    for name in ("index.html", "book/results.html", "book/methodology.html"):
        text = (html / name).read_text()
        external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', text)
        assert external == [], f"{name} loads {external}"


def test_the_book_shows_committed_results(tmp_path):
    results = tmp_path / "results"
    write_result(make_result(batch_size=96), results / "colpali" / "b96.json")
    page = (build(tmp_path, results) / "book" / "results.html").read_text()
    assert "No results have been committed yet" not in page
    assert re.search(r"<td>\s*96\s*</td>", page)
