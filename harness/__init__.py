"""Measure what late-interaction (MaxSim) scoring costs inside real training steps.

The measurement core is shared by every stack: ``memory`` (probes), ``bracket`` (the one
measurement), ``recorder`` (in-train op records), ``ops`` and ``replay`` (isolated replay with an
analytic prediction), ``backends`` (strict variants), ``timing`` (step timer), ``cards`` (emulated
cards), ``cell`` (the cell runner) and ``results`` (the schema and the one loader). Stacks live in
``harness.stacks``.
"""

__version__ = "0.1.0"
