"""Measure what late-interaction (MaxSim) scoring costs inside real training steps.

``spec`` describes a cell (and holds the registries); ``grid`` expands grid files into specs. The
measurement core is shared by every stack: ``memory`` (probes), ``bracket`` (the one measurement),
``recorder`` (in-train op records), ``ops`` and ``replay`` (isolated replay with an analytic
prediction), ``backends`` (strict variants), ``timing`` (step timer), ``cards`` and ``allocator``.
``cell`` and ``opbench`` run cells (``notebook`` is what a cell notebook calls); ``stacks`` build
them. ``results`` is the schema and the one loader, ``provenance`` names the code behind a result,
``search`` reads ceiling searches from results, ``orchestrate`` launches cells, ``report`` computes
the book's pages, ``cli`` is the ``harness`` command. This file imports nothing: ``tools/envs.py``
reads ``harness.spec`` before anything is installed.
"""

__version__ = "0.1.0"
