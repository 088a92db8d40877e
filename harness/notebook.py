"""What a cell notebook calls: its parameters become a spec, the spec runs, the result comes back.

A notebook's ``parameters`` cell holds one variable per spec field (under its notebook name,
``batch`` for ``batch_size``; see :func:`harness.spec.notebook_parameters`) plus ``output`` and
``grid``; papermill overrides them. Errors a user can fix (an unknown variant, ``lik`` on a CPU)
are shown as their one-line reason, not under a traceback.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.backends import BackendUnavailable
from harness.results import CellResult
from harness.spec import STACKS, OpSpec, SpecError, from_notebook
from harness.stacks import StackUnavailable

ROOT = Path(__file__).resolve().parent.parent
# A notebook run by hand writes here, never under results/: only a grid's cells are the report's data.
RUNS_DIR = ROOT / "runs"


def default_output(cell_id: str) -> Path:
    return RUNS_DIR / f"{cell_id}.json"


def run(stack: str, namespace: Mapping[str, Any]) -> CellResult:
    """Run the cell a notebook's parameters describe (``namespace``: its globals) and return its result."""
    _quiet_progress_bars()
    from harness.cell import CellError, run_cell
    from harness.opbench import run_op_cell

    try:
        spec = from_notebook(stack, namespace)
        output = Path(namespace.get("output") or default_output(spec.cell_id))
        grid, notebook = namespace.get("grid"), Path(STACKS[spec.stack].notebook)
        if isinstance(spec, OpSpec):
            return run_op_cell(spec, output, grid, notebook)
        return run_cell(spec, output, grid, notebook)
    except (SpecError, BackendUnavailable, StackUnavailable, CellError):
        _one_line_traceback()  # a refusal, raised before any GPU work: its reason is the whole story
        raise


def _one_line_traceback() -> None:
    """Under IPython, show the exception being raised as ``Name: reason`` alone; the notebook still
    records it as an error (its name and value), and the cell fails."""
    try:
        shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821 — defined inside IPython only
    except NameError:
        return
    shell.InteractiveTB.set_mode(mode="Minimal")


def _quiet_progress_bars() -> None:
    """Keep the executed notebook a record of the measurement, not of the libraries' chatter.

    tqdm warns, with a local path, that a kernel without ipywidgets shows no widgets, and the
    libraries draw progress bars (loading weights, writing shards) into stderr: a cell has no bars to
    show. late-interaction-kernels warns, with a local path, when the queries it scores are not unit
    norm (the offline random weights give such queries; the cell measures memory and time, not
    scores). Library log lines below errors (a checkpoint folder has no sentence-transformers config,
    new embeddings are initialised) go too. Nothing here changes what runs or what is measured.
    """
    warnings.filterwarnings("ignore", message="IProgress not found")
    warnings.filterwarnings("ignore", message=r"late-interaction-kernels: `maxsim\(")
    for variable in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(variable, "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("sentence_transformers", "transformers", "peft"):
        logging.getLogger(name).setLevel(logging.ERROR)
