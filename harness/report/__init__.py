"""What the book's summary pages show, computed from the committed results (never typed in).

One module per layer, none of which imports torch or anything that runs cells:

- :mod:`harness.report.data` — loading: the results of the report's grids (read by the grid each
  result embeds, never by its path), every file it could not use, ceiling searches as typed rows;
- :mod:`harness.report.text` — the small phrases and number formats the other layers share;
- :mod:`harness.report.tables` — tables with display headers;
- :mod:`harness.report.plots` — matplotlib figures, annotated with slopes measured from the data;
- :mod:`harness.report.prose` — sentences and headlines computed from the data;
- :mod:`harness.report.display` — showing tables and figures in a page (IPython).
"""
