"""Every summary page of the built book, as a browser renders it (headless Chromium).

The book is built once (test_book's session build). Each page is screenshotted into
``tests/artifacts/pages/`` (ignored by git: look at them after a run), and a copy of it carrying a small
measuring script is rendered with ``--dump-dom``: the script writes what it measured (images that
did not load, elements wider than the article that no scrolling box holds, the results table's sort
and filter at work) into the DOM, which the tests read back.
"""

import csv
import io
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from test_book import ROOT, committed_book

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "tests" / "artifacts" / "pages"
SUMMARY_PAGES = sorted(path.stem for path in (ROOT / "book").glob("*.md") if path.stem != "cells")
CHECK_ID = "page-check"

# Runs after the page (and its images) loaded; writes JSON into <pre id="page-check">.
MEASURE = """
<script>
window.addEventListener("load", function () {
  var report = {broken_images: [], too_wide: [], article_width: 0, table: null};
  var article = document.querySelector("article") || document.querySelector("main") || document.body;
  var articleRight = article.getBoundingClientRect().right + 2;
  // a cell tagged full-width may use the theme's margin, up to the window's edge
  var limitOf = function (element) {
    return element.closest(".tag_full-width, .full-width") ? document.documentElement.clientWidth + 1 : articleRight;
  };
  report.article_width = Math.round(article.getBoundingClientRect().width);
  document.querySelectorAll("img").forEach(function (img) {
    if (!img.complete || img.naturalWidth === 0) { report.broken_images.push(img.getAttribute("src")); }
  });
  function scrolls(element) {
    for (var node = element.parentElement; node && node !== article.parentElement; node = node.parentElement) {
      var overflow = getComputedStyle(node).overflowX;
      if ((overflow === "auto" || overflow === "scroll") && node.getBoundingClientRect().right <= limitOf(node)) { return true; }
    }
    return false;
  }
  article.querySelectorAll("table, img, pre, figure, .cell_output > *").forEach(function (element) {
    var limit = limitOf(element);
    if (element.getBoundingClientRect().right > limit && !scrolls(element)) {
      report.too_wide.push(element.tagName.toLowerCase() + "." + element.className + " right="
                           + Math.round(element.getBoundingClientRect().right) + " > " + Math.round(limit));
    }
  });
  report.page_scrolls_sideways = document.documentElement.scrollWidth > window.innerWidth + 1;
  var box = document.querySelector("div.results-table");
  if (box) {
    var table = box.querySelector("table"), rows = function () { return Array.from(table.tBodies[0].rows); };
    var headers = Array.from(table.tHead.rows[0].cells).map(function (th) { return th.textContent.trim(); });
    var visible = function () { return rows().filter(function (r) { return !r.hidden; }).length; };
    var column = function (name) {
      var i = headers.indexOf(name);
      return rows().filter(function (r) { return !r.hidden; }).map(function (r) { return r.cells[i].textContent.trim(); });
    };
    var t = {headers: headers, rows: rows().length, controls: !!box.querySelector(".results-table-controls"),
             count_text: (box.querySelector(".results-table-count") || {}).textContent};
    var outcome = box.querySelector("select[aria-label='outcome']");
    t.selects = Array.from(box.querySelectorAll("select")).map(function (s) { return s.getAttribute("aria-label"); });
    outcome.value = "ok"; outcome.dispatchEvent(new Event("change"));
    t.ok_rows = visible();
    t.ok_outcomes = Array.from(new Set(column("outcome")));
    var peak = Array.from(table.tHead.rows[0].cells)[headers.indexOf("peak allocated (GiB)")];
    peak.click();
    t.peaks_ascending = column("peak allocated (GiB)");
    peak.click();
    t.peaks_descending = column("peak allocated (GiB)");
    outcome.value = ""; outcome.dispatchEvent(new Event("change"));
    var search = box.querySelector("input[type=search]");
    search.value = "pylate flash"; search.dispatchEvent(new Event("input"));
    t.search_rows = visible();
    t.search_stacks = Array.from(new Set(column("stack")));
    t.search_backends = Array.from(new Set(column("backend")));
    report.table = t;
  }
  var out = document.createElement("pre");
  out.id = "CHECK_ID";
  out.textContent = JSON.stringify(report);
  document.body.appendChild(out);
});
</script>
""".replace("CHECK_ID", CHECK_ID)


class Cells(HTMLParser):
    """The text of every table cell (th and td) of a document, and its <img> sources and links."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.images: list[str] = []
        self.links: list[dict[str, str | None]] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("td", "th"):
            self._open = []
        elif tag == "img":
            self.images.append(dict(attrs).get("src") or "")
        elif tag == "a":
            self.links.append(dict(attrs))

    def handle_data(self, data):
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._open is not None:
            self.cells.append("".join(self._open).strip())
            self._open = None


def chromium(*arguments: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,2400", *arguments],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


_RENDERED: dict[str, tuple[Path, str, dict]] = {}


def rendered(page: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    """(the page's html file, its rendered DOM, what the measuring script reported), once per page."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium (.ci/run installs it)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    if page not in _RENDERED:
        html = committed_book(tmp_path_factory) / f"{page}.html"
        profile = tmp_path_factory.mktemp(f"chromium-{page}")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        chromium(f"--screenshot={ARTIFACTS / f'{page}.png'}", html.as_uri(), profile=profile)
        checked = html.with_name(f"{page}.check.html")  # beside the page: its relative links resolve alike
        checked.write_text(html.read_text().replace("</body>", MEASURE + "</body>"))
        dom = chromium("--virtual-time-budget=10000", "--dump-dom", checked.as_uri(), profile=profile).stdout
        found = re.search(rf'<pre id="{CHECK_ID}"[^>]*>(.*?)</pre>', dom, re.S)
        assert found, f"{page}: the measuring script did not report (page load never finished?)"
        report = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
        print(f"screenshot: {ARTIFACTS / f'{page}.png'}")
        _RENDERED[page] = (html, dom, report)
    return _RENDERED[page]


def parsed(dom: str) -> Cells:
    parser = Cells()
    parser.feed(dom)
    return parser


@pytest.mark.parametrize("page", SUMMARY_PAGES)
def test_no_table_cell_reads_nan_or_none(page, tmp_path_factory):
    _, dom, _ = rendered(page, tmp_path_factory)
    bad = [cell for cell in parsed(dom).cells if re.search(r"\b(nan|NaN|NAN|None|<NA>|NaT)\b", cell)]
    assert bad == [], f"{page}: {len(bad)} table cells read nan/None, e.g. {bad[:5]}"


@pytest.mark.parametrize("page", SUMMARY_PAGES)
def test_every_figure_is_there_and_loaded(page, tmp_path_factory):
    html, dom, report = rendered(page, tmp_path_factory)
    for source in parsed(dom).images:
        if not source.startswith("data:"):
            assert (html.parent / unquote(source.split("#")[0].split("?")[0])).is_file(), f"{page}: {source} missing"
    assert report["broken_images"] == [], f"{page}: images that did not load: {report['broken_images']}"


@pytest.mark.parametrize("page", SUMMARY_PAGES)
def test_nothing_is_wider_than_the_page(page, tmp_path_factory):
    _, _, report = rendered(page, tmp_path_factory)
    assert report["too_wide"] == [], f"{page} (article {report['article_width']}px): {report['too_wide'][:5]}"
    assert not report["page_scrolls_sideways"], f"{page}: the whole page scrolls sideways"


def test_the_results_table_sorts_filters_and_downloads(tmp_path_factory):
    from harness.report import data, results_table

    html, dom, report = rendered("results", tmp_path_factory)
    table = report["table"]
    assert table is not None and table["controls"], "results-table.js did not set the table up"
    cells = data.all_cells()
    headers = [column.header for column in results_table.COLUMNS]
    assert table["headers"] == headers and table["rows"] == len(cells)
    assert table["count_text"] == f"{len(cells)} of {len(cells)} rows"
    assert set(table["selects"]) == {column.header for column in results_table.COLUMNS if column.choose}
    assert table["ok_rows"] == int((cells["outcome"] == "ok").sum()) and table["ok_outcomes"] == ["ok"]
    ascending = [float(value) for value in table["peaks_ascending"]]
    assert ascending == sorted(ascending) and len(ascending) == table["ok_rows"]
    assert [float(value) for value in table["peaks_descending"]] == sorted(ascending, reverse=True)
    flash_pylate = cells[(cells["variant"] == "flash") & cells["stack"].str.contains("pylate")]
    assert table["search_rows"] == len(flash_pylate) > 0
    assert set(table["search_backends"]) == {"flash"} and all("pylate" in s for s in table["search_stacks"])
    # the CSV download: a data: URI of the same table, headers and rows
    links = [link for link in parsed(dom).links if link.get("download") == "results.csv"]
    assert len(links) == 1
    href = links[0]["href"] or ""
    assert href.startswith("data:text/csv")
    records = list(csv.reader(io.StringIO(unquote(href.split(",", 1)[1]))))
    assert records[0] == headers and len(records) == len(cells) + 1
    # the script and style are the book's own, shipped beside it
    source = html.read_text()
    for asset in ("results-table.js", "results-table.css"):
        assert re.search(rf'(src|href)="_static/{asset}(\?[^"]*)?"', source), f"{asset} not included"
        assert (html.parent / "_static" / asset).is_file()


def test_the_results_table_rows_read_as_words_and_numbers_never_nan():
    """No browser: every committed cell is a row, every value text (no NaN/None), measurements in 3 significant digits."""
    from harness.report import data, results_table

    cells = data.all_cells()
    table = results_table.rows(cells)
    assert len(table) == len(cells) and list(table.columns) == [column.header for column in results_table.COLUMNS]
    words = {str(value) for value in table.to_numpy().ravel()}
    assert not words & {"nan", "NaN", "None", "<NA>"}
    assert results_table.significant(0.0123456) == "0.0123" and results_table.significant(45062.5) == "45100"
    assert results_table.significant(1.2) == "1.20" and results_table.significant(99.96) == "100"
    assert results_table.request_gib("x. Tried to allocate 254.00 MiB. y") == "0.248"
    ok = table[table["outcome"] == "ok"]
    assert (ok["peak allocated (GiB)"] != "").all()
    oom = table[table["outcome"].str.startswith("OOM")]
    assert (oom["peak allocated (GiB)"] == "").all() and (oom["failed request (GiB)"] != "").all()


def test_the_results_table_names_the_gpu_of_every_time():
    """No browser: a time is of the GPU its row names; the long run on an H100 is named, not read as an H200's."""
    from harness.report import data, results_table

    cells = data.all_cells()
    table = results_table.rows(cells)
    timed = table[table["time per step (s)"] != ""]
    assert len(timed) and (timed["GPU"] != "").all() and (timed["GPU"] != "unrecorded").all()
    names = {str(name).removeprefix("NVIDIA ") for name in cells["device_name"].dropna()}
    assert set(table["GPU"]) - {"unrecorded"} == names
    other = timed[~timed["GPU"].str.contains("H200")]
    assert len(other) == len(cells[(cells["times_comparable"] == True) & (cells["outcome"] == "ok")  # noqa: E712
                                   & ~cells["device_name"].fillna("").str.contains("H200")])
