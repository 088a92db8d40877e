"""The cell notebooks: their parameters cell is the spec's fields under their notebook names, with the spec's
defaults; those defaults are the default spec; a notebook run by hand writes under runs/, never results/."""

import ast
import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from harness import notebook as notebook_module
from harness.spec import STACKS, OpSpec, TrainSpec, from_notebook, notebook_parameters

ROOT = Path(__file__).resolve().parent.parent
# keyed by file name: a test id holding a bare stack name ("colpali") would be taken for that stack's marker
NOTEBOOKS = {
    "colpali.ipynb": "notebooks/colpali.ipynb",
    "pylate.ipynb": "notebooks/pylate.ipynb",
    "op.ipynb": "notebooks/op.ipynb",
}
# the spec each notebook describes when papermill passes nothing
DEFAULT_SPECS = {"colpali.ipynb": TrainSpec(stack="colpali"), "pylate.ipynb": TrainSpec(stack="pylate"), "op.ipynb": OpSpec()}
LAUNCHER_PARAMETERS = {"output": None, "grid": None}


def cells(name):
    return json.loads((ROOT / NOTEBOOKS[name]).read_text())["cells"]


def parameters_cell(name):
    (cell,) = [c for c in cells(name) if "parameters" in c["metadata"].get("tags", [])]
    return "".join(cell["source"])


def parameters(name):
    """The parameters cell's assignments, in order: name -> literal value (nothing else may be there)."""
    assigned = {}
    for statement in ast.parse(parameters_cell(name)).body:
        assert isinstance(statement, ast.Assign) and len(statement.targets) == 1, ast.unparse(statement)
        (target,) = statement.targets
        assert isinstance(target, ast.Name) and target.id not in assigned, ast.unparse(statement)
        assigned[target.id] = ast.literal_eval(statement.value)
    return assigned


def run_call(name):
    """The stack name the notebook passes to ``harness.notebook.run``."""
    for cell in cells(name):
        if cell["cell_type"] != "code" or "parameters" in cell["metadata"].get("tags", []):
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "notebook.run":
                return node.args[0]
    raise AssertionError(f"{NOTEBOOKS[name]} never calls harness.notebook.run")


def test_every_stack_notebook_is_one_of_these():
    assert {stack.notebook for stack in STACKS.values()} == set(NOTEBOOKS.values())


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_parameters_cell_is_the_spec_s_fields_with_their_defaults(name):
    spec = DEFAULT_SPECS[name]
    expected = notebook_parameters(spec)
    if isinstance(spec, TrainSpec):
        del expected["stack"]  # a training notebook is its stack's: it passes the stack to harness.notebook.run
    expected |= LAUNCHER_PARAMETERS
    found = parameters(name)
    assert list(found) == list(expected)  # the same names, in the spec's order, then output and grid
    assert found == expected
    assert all(type(found[key]) is type(expected[key]) for key in expected)  # 4, not 4.0; None, not "None"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_s_defaults_are_the_default_spec(name):
    call = run_call(name)
    if isinstance(call, ast.Constant):  # notebook.run('pylate', globals())
        stack = call.value
        assert STACKS[stack].notebook == NOTEBOOKS[name]
    else:  # notebook.run(stack, globals()): the op notebook's own `stack` parameter
        assert ast.unparse(call) == "stack"
        stack = parameters(name)["stack"]
    assert from_notebook(stack, parameters(name)) == DEFAULT_SPECS[name]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_runs_in_its_stack_s_kernel(name):
    kernel = json.loads((ROOT / NOTEBOOKS[name]).read_text())["metadata"]["kernelspec"]["name"]
    assert kernel == STACKS[DEFAULT_SPECS[name].stack].kernel


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_parameter_is_documented_by_its_spec_field(name):
    lines = {line.split("=")[0].strip(): line for line in parameters_cell(name).splitlines()}
    assert all("#" in line for line in lines.values())
    spec = DEFAULT_SPECS[name]
    names = type(spec).NOTEBOOK_NAMES
    for field in dataclasses.fields(spec):
        if field.name in lines or names.get(field.name) in lines:
            line = lines.get(names.get(field.name, field.name))
            assert field.metadata["help"].split(":")[0] in line, line


def test_a_notebook_run_by_hand_writes_under_runs_never_results(monkeypatch):
    import harness.cell
    import harness.opbench

    ran = []
    monkeypatch.setattr(harness.cell, "run_cell", lambda spec, output, grid, notebook: ran.append((spec, output, grid, notebook)))
    monkeypatch.setattr(
        harness.opbench, "run_op_cell", lambda spec, output, grid, notebook: ran.append((spec, output, grid, notebook))
    )
    for name, spec in DEFAULT_SPECS.items():
        namespace = parameters(name)
        notebook_module.run(spec.stack, namespace)
        ran_spec, output, grid, notebook = ran.pop()
        assert ran_spec == spec and grid is None and notebook == Path(NOTEBOOKS[name])
        assert output == ROOT / "runs" / f"{spec.cell_id}.json"
        assert not output.is_relative_to(ROOT / "results")
        # a grid's launcher names the output and the grid
        notebook_module.run(spec.stack, namespace | {"output": "results/ours/x.json", "grid": "ours"})
        assert ran.pop()[1:3] == (Path("results/ours/x.json"), "ours")


def test_runs_is_ignored_by_git():
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "runs/colpali-plain-b4-vanilla-native.json"])
    assert ignored.returncode == 0


def test_harness_cell_writes_under_runs_by_default(monkeypatch, capsys):
    import harness.cell
    from harness.cli import main
    from harness.results import CellResult

    ran = []

    def fake_run_cell(spec, output):
        ran.append((spec, output))
        return CellResult(grid=None, cell_id=spec.cell_id, spec=spec, outcome="ok")

    monkeypatch.setattr(harness.cell, "run_cell", fake_run_cell)
    assert main(["cell", "--stack", "pylate", "--device", "cpu", "--batch-size", "8"]) == 0
    ((spec, output),) = ran
    assert spec == TrainSpec(stack="pylate", batch_size=8, device="cpu") and spec.preset == "auto"
    assert output == ROOT / "runs" / "pylate-plain-b8-vanilla-native.json"
    assert capsys.readouterr().out == f"pylate-plain-b8-vanilla-native: ok; result in {output}\n"


def test_a_notebook_refuses_a_bad_parameter_before_running_anything(monkeypatch):
    import harness.cell
    from harness.spec import SpecError

    monkeypatch.setattr(harness.cell, "run_cell", lambda *args: pytest.fail("ran a cell its spec refuses"))
    namespace = parameters("pylate.ipynb") | {"variant": "flahs"}
    with pytest.raises(
        SpecError, match=r"^unknown variant 'flahs' \(did you mean 'flash'\?\); choose one of vanilla, lik, flash\.$"
    ):
        notebook_module.run("pylate", namespace)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_opens_on_its_header_and_every_table_is_one_the_cellbook_renders(name):
    """The run cell shows ``header(result)`` (spec and outcome, from the result); every other code cell
    after it ends on a display call that ``harness.cellbook refresh`` renders again from the result file."""
    from harness.cellbook import display_call

    code = [c for c in cells(name) if c["cell_type"] == "code" and "parameters" not in c["metadata"].get("tags", [])]
    run, *tables = ["".join(c["source"]) for c in code]
    assert "notebook.run(" in run and display_call(run) == ("header", ())
    shown = [display_call(source) for source in tables]
    assert None not in shown and ("summary", ()) in shown


def test_a_notebook_run_keeps_warnings_and_progress_bars_out_of_its_outputs(monkeypatch):
    import warnings

    for variable in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY"):
        monkeypatch.delenv(variable, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notebook_module._quiet_progress_bars()
        warnings.warn("IProgress not found. Please update jupyter and ipywidgets.", stacklevel=1)
        warnings.warn("late-interaction-kernels: `maxsim(..., normalize=False)` but Q's median L2 norm is 0.000", stacklevel=1)
    assert caught == []
    import os

    assert os.environ["TQDM_DISABLE"] == "1" and os.environ["TRANSFORMERS_VERBOSITY"] == "error"
