"""What a cell notebook calls: its parameters become a spec, the spec runs, the result comes back.

A notebook's ``parameters`` cell holds one variable per spec field (under its notebook name,
``batch`` for ``batch_size``; see :func:`harness.spec.notebook_parameters`) plus ``output`` and
``grid``; papermill overrides them. Errors a user can fix (an unknown variant, ``lik`` on a CPU)
are shown as their one-line reason, not under a traceback.
"""

from __future__ import annotations

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
ONE_LINE_ERRORS: tuple[type[BaseException], ...] = (SpecError, BackendUnavailable, StackUnavailable)


def default_output(cell_id: str) -> Path:
    return RUNS_DIR / f"{cell_id}.json"


def run(stack: str, namespace: Mapping[str, Any]) -> CellResult:
    """Run the cell a notebook's parameters describe (``namespace``: its globals) and return its result."""
    from harness.cell import CellError, run_cell
    from harness.opbench import run_op_cell

    _show_reasons_in_one_line(CellError)
    spec = from_notebook(stack, namespace)
    output = Path(namespace.get("output") or default_output(spec.cell_id))
    grid, notebook = namespace.get("grid"), Path(STACKS[spec.stack].notebook)
    if isinstance(spec, OpSpec):
        return run_op_cell(spec, output, grid, notebook)
    return run_cell(spec, output, grid, notebook)


def _show_reasons_in_one_line(*more: type[BaseException]) -> None:
    """Under IPython, show a refused cell as ``Error: reason`` alone (the cell still fails)."""
    try:
        shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821 — defined inside IPython only
    except NameError:
        return

    def one_line(shell: Any, etype: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None) -> list[str]:
        line = f"{etype.__name__}: {value}"
        print(line)
        return [line]

    shell.set_custom_exc((*ONE_LINE_ERRORS, *more), one_line)
