/* Sortable, filterable results table (the results page). Our own code, no library: a
   <div class="results-table"> holding a plain <table>; headers with data-numeric sort by number,
   headers with data-choose get a select of their values, and one text box filters on every cell. */
(function () {
  "use strict";

  function cellText(row, index) {
    return row.cells[index].textContent.trim();
  }

  function setUp(container) {
    var table = container.querySelector("table");
    if (!table || container.dataset.ready) { return; }
    container.dataset.ready = "1";
    var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);

    var controls = document.createElement("div");
    controls.className = "results-table-controls";
    var search = document.createElement("input");
    search.type = "search";
    search.placeholder = "Filter rows (all words must match)…";
    search.setAttribute("aria-label", "Filter rows");
    controls.appendChild(search);

    var selects = [];
    headers.forEach(function (th, index) {
      if (!th.hasAttribute("data-choose")) { return; }
      var values = {};
      rows.forEach(function (row) { values[cellText(row, index)] = true; });
      var select = document.createElement("select");
      select.setAttribute("aria-label", th.textContent);
      var all = document.createElement("option");
      all.value = "";
      all.textContent = th.textContent + ": all";
      select.appendChild(all);
      Object.keys(values).sort().forEach(function (value) {
        var option = document.createElement("option");
        option.value = value;
        option.textContent = value === "" ? "(empty)" : value;
        select.appendChild(option);
      });
      select.dataset.column = String(index);
      selects.push(select);
      controls.appendChild(select);
    });

    var count = document.createElement("span");
    count.className = "results-table-count";
    controls.appendChild(count);
    container.insertBefore(controls, container.querySelector(".results-table-scroll"));

    function filter() {
      var words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
      var shown = 0;
      rows.forEach(function (row) {
        var text = row.textContent.toLowerCase();
        var keep = words.every(function (word) { return text.indexOf(word) >= 0; });
        selects.forEach(function (select) {
          if (keep && select.value !== "" && cellText(row, Number(select.dataset.column)) !== select.value) {
            keep = false;
          }
        });
        row.hidden = !keep;
        if (keep) { shown += 1; }
      });
      count.textContent = shown + " of " + rows.length + " rows";
    }

    function sortBy(index) {
      var th = headers[index];
      var ascending = th.getAttribute("aria-sort") !== "ascending";
      var numeric = th.hasAttribute("data-numeric");
      headers.forEach(function (other) { other.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var keyed = rows.map(function (row, position) {
        var text = cellText(row, index);
        return { row: row, position: position, empty: text === "", key: numeric ? parseFloat(text) : text.toLowerCase() };
      });
      keyed.sort(function (a, b) {
        if (a.empty !== b.empty) { return a.empty ? 1 : -1; }  // empty cells last, either way
        var order = a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
        if (!numeric && order !== 0) {
          order = String(a.key).localeCompare(String(b.key), undefined, { numeric: true });
        }
        return (ascending ? order : -order) || a.position - b.position;
      });
      rows = keyed.map(function (item) { return item.row; });
      rows.forEach(function (row) { body.appendChild(row); });
    }

    headers.forEach(function (th, index) {
      th.tabIndex = 0;
      th.classList.add("results-table-sortable");
      th.addEventListener("click", function () { sortBy(index); });
      th.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortBy(index); }
      });
    });
    search.addEventListener("input", filter);
    selects.forEach(function (select) { select.addEventListener("change", filter); });
    filter();
  }

  function setUpAll() {
    Array.prototype.forEach.call(document.querySelectorAll("div.results-table"), setUp);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setUpAll);
  } else {
    setUpAll();
  }
})();
