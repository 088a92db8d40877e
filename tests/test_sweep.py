"""The sweep on CPU: tiny PyLate and op-level cells, each a papermill run in a fresh kernel (pylate
environment), launched by :mod:`harness.orchestrate` — failures read from the executed notebook,
resuming, concurrent cells, GPU gates (in a temporary folder, never the host's), grids refused
before anything runs, and a driver killed mid-cell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml

from harness import cli, gpu_gate, host
from harness.grid import GridCell, GridError, load_grid
from harness.orchestrate import launcher, pool
from harness.orchestrate.launcher import Layout, describe_phases, set_aside, state
from harness.orchestrate.sweep import run_sweep, skypilot_task
from harness.results import CellResult, load_result, write_result
from harness.spec import SpecError, TrainSpec, with_fields

pytestmark = [pytest.mark.pylate, pytest.mark.usefixtures("own_gates")]
ROOT = Path(__file__).resolve().parent.parent
HARNESS = Path(sys.executable).with_name("harness")  # this environment's console script



def notebook_variant(folder: Path, name: str, source: str, base: str = "pylate") -> Path:
    """A stack notebook with one code cell (``source``) added right after its parameters cell, so it
    runs with the injected parameters but before the cell itself."""
    notebook = nbformat.read(ROOT / "notebooks" / f"{base}.ipynb", as_version=4)
    position = next(i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", []))
    notebook.cells.insert(position + 1, nbformat.v4.new_code_cell(source))
    path = folder / f"{name}.ipynb"
    nbformat.write(notebook, path)
    return path


FAILING = """
import faulthandler
if batch == 3:
    faulthandler._sigsegv()  # the kernel dies of a segmentation fault in the middle of a cell
if batch == 5:
    raise RuntimeError("this cell fails on purpose")
if batch == 7:  # as a dataloader whose worker the host's out-of-memory killer killed
    try:
        raise RuntimeError("DataLoader worker (pid 1357) is killed by signal: Killed.")
    except RuntimeError as error:
        raise RuntimeError("DataLoader worker (pid(s) 1357) exited unexpectedly") from error
"""

KERNEL = """
import pathlib, sys
starts = pathlib.Path(__file__).with_name(pathlib.Path(__file__).stem + ".starts")
count = int(starts.read_text()) if starts.exists() else 0
starts.write_text(str(count + 1))
if count < {fails}:
    sys.exit(1)  # dies before it replies to kernel_info: no cell ever runs
sys.argv = [sys.argv[0], "-f", sys.argv[1]]
from ipykernel import kernelapp
kernelapp.launch_new_instance()
"""


def add_kernel(tmp_path: Path, monkeypatch, name: str, fails: int) -> Path:
    """A Jupyter kernel ``name`` (on this test's JUPYTER_PATH) that dies on its first ``fails`` starts,
    then runs as ipykernel; returns the file counting its starts."""
    script = tmp_path / f"{name}.py"
    script.write_text(KERNEL.format(fails=fails))
    spec = tmp_path / "jupyter" / "kernels" / name / "kernel.json"
    spec.parent.mkdir(parents=True)
    argv = [sys.executable, str(script), "{connection_file}"]
    spec.write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return script.with_suffix(".starts")


TINY = {"preset": "tiny", "device": "cpu", "steps": 2, "kernel": "python3"}  # a tiny PyLate cell on the CPU


def write_grid(path: Path, cells: list[dict], name: str = "tiny", defaults: dict = TINY, **more: object) -> Path:
    path.write_text(yaml.safe_dump({"name": name, "defaults": defaults | more, "cells": cells}))
    return path


def pylate_cells(batches: list[int]) -> list[dict]:
    return [{"stack": "pylate", "regime": "plain", "batch_size": batches, "variant": "vanilla"}]


def starts(path: Path) -> int:
    return int(path.read_text()) if path.exists() else 0


def test_a_sweep_sets_aside_a_broken_result_survives_failing_kernels_and_resumes(tmp_path, monkeypatch):
    # B=2 trains; B=3's kernel dies mid-cell; B=5's notebook raises. Their kernel dies before it
    # runs a cell on its very first start (B=2's): that start is retried, the others are not.
    counter = add_kernel(tmp_path, monkeypatch, "flaky", fails=1)
    notebook = notebook_variant(tmp_path, "failing", FAILING)
    cells = load_grid(write_grid(tmp_path / "tiny.yaml", pylate_cells([2, 3, 5]), kernel="flaky", notebook=str(notebook)))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    path = {cell.spec.batch_size: layout.result_path(cell) for cell in cells}
    path[2].parent.mkdir(parents=True)
    path[2].write_text('{"schema_version": 2, "grid": "tin')  # a truncated write at B=2's path
    lines: list[str] = []
    runs = run_sweep(cells, layout, echo=lines.append)

    assert any("pylate-plain-b2-vanilla-native: its result file was not a valid result" in line
               and "kept aside as pylate-plain-b2-vanilla-native.json.broken" in line for line in lines)  # fmt: skip
    assert path[2].with_name(path[2].name + ".broken").read_text() == '{"schema_version": 2, "grid": "tin'
    assert "3 cells in the grid: 0 already have a result, 3 to run one after another" in lines
    assert sorted((r.cell.spec.batch_size, r.outcome, r.failure) for r in runs) == [
        (2, "ok", None), (3, "crashed", "kernel_died"), (5, "crashed", "error")]  # fmt: skip
    assert starts(counter) == 4  # B=2 started twice, B=3 and B=5 once: a kernel that died in a cell is not restarted
    assert "the kernel died before it ran a cell (attempt 1); starting the cell again" in layout.log_path(cells[0]).read_text()

    # the crash markers say why, structured, from the executed notebook
    died, raised = load_result(path[3]), load_result(path[5])
    assert (died.outcome, died.failure, died.grid, died.cell_id, died.spec) == (
        "crashed", "kernel_died", "tiny", "pylate-plain-b3-vanilla-native", cells[1].spec)  # fmt: skip
    # the kernel's fault handler reported the signal into the cell's log, and the marker names it
    why = "the kernel stopped in the middle of a cell: Fatal Python error: Segmentation fault, in File "
    assert died.oom_message.startswith(why)
    assert died.provenance.harness_sha256 == load_result(path[2]).provenance.harness_sha256 and died.provenance.notebook_sha256
    assert (raised.outcome, raised.failure) == ("crashed", "error")
    assert raised.oom_message == "RuntimeError: this cell fails on purpose"
    assert "this cell fails on purpose" in raised.crash_log_tail

    ok = load_result(path[2])
    assert (ok.outcome, ok.grid, ok.cell_id, ok.failure) == ("ok", "tiny", "pylate-plain-b2-vanilla-native", None)
    assert (ok.spec.preset, ok.spec.device, ok.spec.steps) == ("tiny", "cpu", 2)  # the spec it ran, resolved
    assert ok.provenance is not None and ok.provenance.harness_sha256
    assert ok.maxsim_calls_in_train[0].query_shape == [2, 48, 128]
    assert set(ok.phase_sec) == {"device", "build", "train", "replay"}
    assert all("build" in r.phases for r in runs if r.outcome == "ok")  # the progress line says where the time went
    executed = nbformat.read(layout.notebook_path(cells[0]), as_version=4)
    assert executed.cells[0].source.startswith("# pylate · plain · B=2 · vanilla · native — ok")
    # papermill writes beside the result while a cell runs; the book only gets cells that ended
    dead = nbformat.read(layout.notebook_path(cells[1]), as_version=4)
    assert dead.cells[0].source.startswith("# pylate · plain · B=3 · vanilla · native — crashed")
    assert not list(tmp_path.rglob("*.running.ipynb"))
    assert "2 crashed, 1 ok" in lines[-1]

    # resume: nothing to redo; with --rerun-crashed only the crashed cells run again
    stamp = os.stat(path[2]).st_mtime_ns
    assert run_sweep(cells, layout, echo=lines.append) == []
    assert "3 cells in the grid: 3 already have a result, 0 to run one after another" in lines
    again = run_sweep(cells, layout, rerun_crashed=True, echo=lines.append)
    assert [(r.cell.spec.batch_size, r.outcome, r.failure) for r in again] == [
        (3, "crashed", "kernel_died"), (5, "crashed", "error")]  # fmt: skip
    assert os.stat(path[2]).st_mtime_ns == stamp and starts(counter) == 6


def test_a_crash_names_its_first_cause_and_the_hosts_oom_killer(tmp_path, monkeypatch):
    counts = iter([0, 1])  # the host's out-of-memory killer killed one process while the cell ran
    monkeypatch.setattr(launcher.host, "oom_kills", lambda: next(counts))
    notebook = notebook_variant(tmp_path, "failing", FAILING)
    (cell,) = load_grid(write_grid(tmp_path / "tiny.yaml", pylate_cells([7]), notebook=str(notebook)))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    (run,) = run_sweep([cell], layout, echo=lambda line: None)
    marker = load_result(layout.result_path(cell))
    assert (run.outcome, marker.failure) == ("crashed", "error")
    assert marker.oom_message == (
        "RuntimeError: DataLoader worker (pid(s) 1357) exited unexpectedly, caused by RuntimeError: DataLoader worker "
        "(pid 1357) is killed by signal: Killed.; the host's out-of-memory killer killed 1 process of this cell's "
        "control group while it ran (oom_kill 0 → 1): the host's memory, not the GPU's, ran out")  # fmt: skip


def test_a_kernel_that_never_runs_a_cell_is_started_again_then_marked(tmp_path, monkeypatch):
    counter = add_kernel(tmp_path, monkeypatch, "stillborn", fails=10**6)
    no_back_off = SimpleNamespace(perf_counter=time.perf_counter, sleep=lambda seconds: None)
    monkeypatch.setattr(launcher, "time", no_back_off)  # the launcher's own clock only
    (cell,) = load_grid(write_grid(tmp_path / "tiny.yaml", pylate_cells([2]), kernel="stillborn"))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    (run,) = run_sweep([cell], layout, echo=lambda line: None)
    assert (run.outcome, run.failure) == ("crashed", "kernel_never_started")
    assert starts(counter) == launcher.KERNEL_START_ATTEMPTS == 3
    log = layout.log_path(cell).read_text()
    assert "(attempt 1); starting the cell again" in log and "(attempt 2); starting the cell again" in log
    marker = load_result(layout.result_path(cell))
    assert (marker.outcome, marker.failure, marker.spec) == ("crashed", "kernel_never_started", cell.spec)
    assert state(cell, layout) == "crashed"  # a crashed cell: --rerun-crashed runs it again


def test_why_a_notebook_failed_is_read_from_papermills_record_in_it(tmp_path):
    def executed(*cells: dict) -> Path:
        """A notebook as papermill leaves it: each code cell's status, start time and outputs."""
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# a cell")])
        for index, (status, started, outputs) in enumerate((c["status"], c.get("started"), c.get("outputs", [])) for c in cells):
            cell = nbformat.v4.new_code_cell(f"step_{index}()", outputs=[nbformat.v4.new_output(**o) for o in outputs])
            cell.metadata["papermill"] = {"status": status, "start_time": started, "exception": None}
            notebook.cells.append(cell)
        path = tmp_path / f"notebook-{len(list(tmp_path.glob('*.ipynb')))}.ipynb"
        nbformat.write(notebook, path)
        return path

    at = "2026-11-30T22:00:00"
    raised = {"output_type": "error", "ename": "RuntimeError", "evalue": "no", "traceback": []}
    starved = raised | {"ename": "DeviceOutOfMemory", "evalue": "the device refused 2 GiB"}
    assert launcher.notebook_failure(tmp_path / "none.ipynb") == ("kernel_never_started", "no executed notebook was written")
    # papermill's last save marks every cell still pending "completed": only the start times tell
    never = executed({"status": "completed"}, {"status": "completed"})
    assert launcher.notebook_failure(never) == ("kernel_never_started", "no code cell of the notebook ran")
    died = executed({"status": "completed", "started": at}, {"status": "running", "started": at})
    assert launcher.notebook_failure(died) == ("kernel_died", "the kernel stopped in the middle of a cell")
    assert launcher.notebook_failure(executed({"status": "failed", "started": at, "outputs": [raised]})) == (
        "error", "RuntimeError: no")  # fmt: skip
    assert launcher.notebook_failure(executed({"status": "failed", "started": at, "outputs": [starved]})) == (
        "device_out_of_memory", "DeviceOutOfMemory: the device refused 2 GiB")  # fmt: skip
    # a chained traceback (as IPython colours it): the error and the first exception it was raised from
    chained = raised | {"evalue": "worker exited", "traceback": [
        "\x1b[0;31mRuntimeError\x1b[0m: worker killed by signal: Killed.", "",
        "The above exception was the direct cause of the following exception:", "",
        "\x1b[0;31mRuntimeError\x1b[0m                              Traceback (most recent call last)",
        "\x1b[0;31mRuntimeError\x1b[0m: worker exited"]}  # fmt: skip
    assert launcher.notebook_failure(executed({"status": "failed", "started": at, "outputs": [chained]})) == (
        "error", "RuntimeError: worker exited, caused by RuntimeError: worker killed by signal: Killed.")  # fmt: skip
    assert launcher.root_cause(["RuntimeError: no"]) is None


def test_op_cells_run_through_the_same_sweep_one_per_gpu_at_once(tmp_path, own_gates):
    entries = [{"stack": "op-pylate", "head": "inbatch", "batch_size": [2, 3], "variant": "vanilla"}]
    defaults = {"device": "cpu", "reps": 2, "warmup": 1, "kernel": "python3"}
    cells = load_grid(write_grid(tmp_path / "op.yaml", entries, name="op-tiny", defaults=defaults))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    lines: list[str] = []
    pin = len(os.sched_getaffinity(0)) >= 2
    runs = run_sweep(cells, layout, gpus=["0", "1"], echo=lines.append, pin_cpus=pin)
    assert sorted((r.cell.spec.batch_size, r.outcome) for r in runs) == [(2, "ok"), (3, "ok")]
    if pin:  # each GPU's cells ran on their own cores: a neighbour on the other GPU never shared them
        timings = [load_result(layout.result_path(cell)).timing for cell in cells]
        assert all(t.pinned and t.neighbours_on_own_cpus == 0 for t in timings), timings
        shares = pool.split_cpus(sorted(os.sched_getaffinity(0)), 2)
        assert sorted(t.cpus for t in timings) == [host.cpu_ranges(list(share)) for share in shares]
    assert sorted(r.slot for r in runs) == ["0", "1"]
    first_finish = next(i for i, line in enumerate(lines) if line.startswith("[1/2]"))
    assert sum(line.strip().startswith("start") for line in lines[:first_finish]) == 2  # both running at once
    result = load_result(layout.result_path(cells[1]))
    assert (result.kind, result.preset, result.regime, len(result.step_times_sec)) == ("op", "op", "inbatch", 2)
    assert result.maxsim_calls_isolated[0].query_shape == [3, 48, 128]
    assert layout.result_path(cells[1]).relative_to(tmp_path / "results") == Path(
        "op-tiny", "op-pylate", "inbatch", "op-pylate-inbatch-b3-vanilla-native.json")
    # each GPU's cells entered that GPU's gate, in this test's gate folder
    assert {p.name for p in own_gates.glob("*.gate")} == {"maxsim-gpu-0.gate", "maxsim-gpu-1.gate"}


def test_two_cells_per_gpu_start_together_and_measure_one_at_a_time(tmp_path, own_gates):
    cells = load_grid(write_grid(tmp_path / "gated.yaml", pylate_cells([2, 4]), name="gated"))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    lines: list[str] = []
    runs = run_sweep(cells, layout, gpus=["7"], cells_per_gpu=2, echo=lines.append)
    assert sorted((r.cell.spec.batch_size, r.outcome, r.slot) for r in runs) == [(2, "ok", "7"), (4, "ok", "7")]
    first_finish = next(i for i, line in enumerate(lines) if line.startswith("[1/2]"))
    assert sum(line.strip().startswith("start") for line in lines[:first_finish]) == 2
    # both started at once, so one of them waited for the other's whole process to end
    waits = sorted(load_result(layout.result_path(cell)).gpu_wait_sec for cell in cells)
    assert waits[0] < 0.5 < waits[1]
    assert (own_gates / "maxsim-gpu-7.gate").exists()  # the gate they shared is this test's own
    with pytest.raises(ValueError, match="at least 1"):
        run_sweep(cells, layout, cells_per_gpu=0, echo=lambda line: None)


SLEEPY = """
import os, pathlib, time
marker = pathlib.Path({marker!r})
if batch == 3 and not marker.exists():  # the first time only: the sweep is killed here
    marker.write_text(str(os.getpid()))
    time.sleep(300)
"""


def test_a_sweep_whose_driver_was_killed_mid_cell_resumes_there(tmp_path, own_gates):
    marker = tmp_path / "sleeping-kernel.pid"
    notebook = notebook_variant(tmp_path, "sleepy", SLEEPY.format(marker=str(marker)))
    grid = write_grid(tmp_path / "tiny.yaml", pylate_cells([2, 3]), notebook=str(notebook))
    cells = load_grid(grid)
    layout = Layout(tmp_path / "results", tmp_path / "book")
    folders = ["--results-dir", str(layout.results_dir), "--notebooks-dir", str(layout.notebooks_dir)]
    command = [str(HARNESS), "sweep", str(grid), *folders]
    env = os.environ | {pool.GATE_DIR_VARIABLE: str(own_gates)}
    with open(tmp_path / "driver.log", "w") as log:  # both cells at once: B=2 trains while B=3 sleeps
        driver = subprocess.Popen([*command, "--cells-per-gpu", "2"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                  start_new_session=True)  # fmt: skip
    kernel = None
    try:
        deadline = time.monotonic() + 240
        while not (marker.exists() and marker.read_text() and layout.notebook_path(cells[0]).exists()):  # B=2 ended
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()
            assert time.monotonic() < deadline, "B=2 never finished while B=3 slept"
            time.sleep(0.2)
        kernel = int(marker.read_text())
        assert layout.result_path(cells[1]).with_suffix(".running.ipynb").exists()  # B=3 is mid-cell
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and its papermill, as a closed terminal or a lost node would
        driver.wait()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        if kernel is not None:  # the kernel runs in a session of its own: end it by its id
            with contextlib.suppress(ProcessLookupError):
                os.kill(kernel, signal.SIGKILL)
    assert state(cells[0], layout) == "done" and state(cells[1], layout) == "missing"
    assert not list(layout.notebooks_dir.rglob("*.running.ipynb"))  # the book has only cells that ended
    stamp = os.stat(layout.result_path(cells[0])).st_mtime_ns

    again = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 cells in the grid: 1 already have a result, 1 to run one after another" in again.stdout
    assert "start pylate-plain-b3-vanilla-native" in again.stdout and "start pylate-plain-b2" not in again.stdout
    assert load_result(layout.result_path(cells[1])).outcome == "ok"
    assert os.stat(layout.result_path(cells[0])).st_mtime_ns == stamp  # the finished cell was not run again
    assert not list(tmp_path.rglob("*.running.ipynb"))
    assert nbformat.read(layout.notebook_path(cells[1]), as_version=4).cells[0].source.startswith(
        "# pylate · plain · B=3 · vanilla · native — ok")


def test_a_notebook_a_killed_driver_left_behind_a_finished_cell_reaches_the_book(tmp_path):
    (cell,) = load_grid(write_grid(tmp_path / "tiny.yaml", pylate_cells([2])))
    layout = Layout(tmp_path / "results", tmp_path / "book")
    ran = with_fields(cell.spec, preset="tiny", device="cpu")
    write_result(CellResult(grid="tiny", cell_id=ran.cell_id, spec=ran, outcome="ok"), layout.result_path(cell))
    running = layout.result_path(cell).with_suffix(".running.ipynb")  # papermill was still in the display cells
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# PyLate cell")]), running)
    assert run_sweep([cell], layout, echo=lambda line: None) == []  # the cell is done: it does not run again
    assert not running.exists() and layout.notebook_path(cell).exists()


def test_a_cell_state_is_read_from_the_result_at_its_path(tmp_path):
    (cell,) = load_grid(write_grid(tmp_path / "tiny.yaml", pylate_cells([2])))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    path = layout.result_path(cell)
    assert path == tmp_path / "results" / "tiny" / "pylate" / "plain" / "pylate-plain-b2-vanilla-native.json"
    assert layout.notebook_path(cell) == tmp_path / "cells" / "tiny" / "pylate" / "plain" / "pylate-plain-b2-vanilla-native.ipynb"
    assert layout.log_path(cell) == path.with_suffix(".log")
    assert state(cell, layout) == "missing"
    ran = with_fields(cell.spec, preset="tiny", device="cpu")
    write_result(CellResult(grid="tiny", cell_id=ran.cell_id, spec=ran, outcome="ok"), path)
    assert state(cell, layout) == "done"
    write_result(CellResult.crashed(cell.spec, "tiny", "kernel_died", "log", 1.0), path)
    assert state(cell, layout) == "crashed"
    for foreign in (CellResult(grid="other", cell_id=ran.cell_id, spec=ran, outcome="ok"),  # another grid's
                    CellResult(grid="tiny", cell_id=ran.cell_id, spec=with_fields(ran, steps=3), outcome="ok")):  # fmt: skip
        write_result(foreign, path)
        assert state(cell, layout) == "broken"
    path.write_text("not json")
    assert state(cell, layout) == "broken"
    assert set_aside(path).name == "pylate-plain-b2-vanilla-native.json.broken" and not path.exists()
    path.write_text("{}")
    assert set_aside(path).name == "pylate-plain-b2-vanilla-native.json.broken-1"  # the first one is kept


def test_an_invalid_grid_is_rejected_before_anything_runs(tmp_path, capsys):
    cells = pylate_cells([2]) + [
        {"stack": "pylate", "regime": "plain", "batch_size": 0, "variant": "vanilla"},
        {"stack": "pylate", "regime": "sideways", "batch_size": 2, "variant": "vanilla"},
        {"stack": "pylate", "regime": "plain", "batch_size": 2, "variant": "turbo"},
        {"stack": "pylate", "regime": "plain", "batch_size": 2, "variant": "vanilla"},
    ]
    path = write_grid(tmp_path / "bad.yaml", cells)
    with pytest.raises(GridError) as error:
        load_grid(path)
    message = str(error.value)
    for expected in ("batch_size must be an integer of at least 1, got 0", "unknown regime for pylate 'sideways'",
                     "unknown variant 'turbo'", "cells repeat: pylate-plain-b2-vanilla-native"):  # fmt: skip
        assert expected in message
    results = tmp_path / "results"
    assert cli.main(["sweep", str(path), "--results-dir", str(results), "--notebooks-dir", str(tmp_path / "cells")]) == 2
    assert "unknown variant 'turbo'" in capsys.readouterr().err
    assert not results.exists() and not (tmp_path / "cells").exists()
    with pytest.raises(SpecError, match="unknown stack 'pylat' \\(did you mean 'pylate'\\?\\)"):
        load_grid(ROOT / "grids" / "ours.yaml", stacks=["pylat"])


def test_the_published_grid_expands_to_its_cells_and_lists_them(capsys):
    cells = load_grid(ROOT / "grids" / "published.yaml", stacks=["pylate"])
    assert len(cells) == 3 * 2 + 4 * 2 + 2
    assert {c.spec.card for c in cells} == {"h100-80gb"} and {c.grid for c in cells} == {"published"}
    assert all(isinstance(c.spec, TrainSpec) and c.kernel is None and c.notebook is None for c in cells)
    assert cli.main(["sweep", str(ROOT / "grids" / "published.yaml"), "--stack", "pylate", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pylate-grad-checkpoint-b1024-vanilla-chunk64-h100-80gb" in out and out.endswith("16 cells\n")


def test_a_skypilot_task_is_written_for_a_grid(tmp_path):
    target = tmp_path / "sky.yaml"
    assert cli.main(["sweep", str(ROOT / "grids" / "ours.yaml"), "--stack", "pylate", "--skypilot", str(target)]) == 0
    task = yaml.safe_load(target.read_text())
    assert set(task) == {"name", "workdir", "resources", "setup", "run"}
    assert task["name"] == "maxsim-ours" and task["resources"]["accelerators"] == "H100:1"
    assert "tools/envs.py create pylate --torch system" in task["setup"]
    assert ".venvs/pylate/bin/harness sweep grids/ours.yaml --gpus all" in task["run"]
    assert task == skypilot_task(ROOT / "grids" / "ours.yaml", load_grid(ROOT / "grids" / "ours.yaml", ["pylate"]))


def test_every_cell_sees_exactly_one_gpu():
    assert pool.cell_environment("1", {"CUDA_VISIBLE_DEVICES": "0,1"})["CUDA_VISIBLE_DEVICES"] == "1"
    assert pool.cell_environment(None, {"CUDA_VISIBLE_DEVICES": "3,5"})["CUDA_VISIBLE_DEVICES"] == "3"
    assert pool.cell_environment(None, {})["CUDA_VISIBLE_DEVICES"] == "0"
    assert pool.visible_gpus("0, 1") == ["0", "1"]


def test_workers_take_every_task_once_and_share_their_gpus_gate(own_gates):
    taken: list[tuple[int, str | None, pool.Gate]] = []
    pool.run_on_gpus(5, lambda index, gpu, gate: taken.append((index, gpu, gate)), ["0", "1"], cells_per_gpu=2,
                     share_gib={"1": 60.0})  # fmt: skip
    assert sorted(index for index, _, _ in taken) == [0, 1, 2, 3, 4]
    assert {(gpu, gate) for _, gpu, gate in taken} <= {
        ("0", pool.Gate(own_gates / "maxsim-gpu-0.gate")), ("1", pool.Gate(own_gates / "maxsim-gpu-1.gate", 60.0))}
    with pytest.raises(ValueError, match="at least 1"):
        pool.run_on_gpus(1, lambda *args: None, None, cells_per_gpu=0)


def test_a_gate_passes_its_lock_and_share_budget_to_the_cell(tmp_path):
    alone = pool.Gate(tmp_path / "gpu.lock")
    assert alone.environment() == {gpu_gate.LOCK_VARIABLE: str(tmp_path / "gpu.lock")}
    shared = pool.Gate(tmp_path / "gpu.lock", share_gib=138.75)
    assert shared.environment()[gpu_gate.SHARE_VARIABLE] == "138.75"


def test_the_op_grid_expands_and_rejects_negatives_where_they_do_not_belong(tmp_path):
    cells = load_grid(ROOT / "grids" / "op.yaml")
    assert len(cells) == 3 * 2 + 2 * 3 * 3 * 2 + 5 * 3
    assert "op-colpali-negative-ce-b256-n16-lik-native" in {c.cell_id for c in cells}
    bad = write_grid(tmp_path / "bad.yaml", [
        {"stack": "pylate", "regime": "plain", "batch_size": 2, "variant": "vanilla", "negatives": 4},
        {"stack": "op-colpali", "head": "negative-ce", "batch_size": 2, "variant": "vanilla"},
        {"stack": "op-colpali", "head": "inbatch", "batch_size": 2, "variant": "vanilla", "negatives": 4},
    ], name="bad", defaults={"device": "cpu"})  # fmt: skip
    with pytest.raises(GridError) as error:
        load_grid(bad)
    message = str(error.value)
    assert "train cells have no field 'negatives'" in message
    assert "the negative-ce head needs negatives" in message
    assert "the inbatch head has no explicit negatives" in message


def test_match_selects_cells_by_id(capsys):
    grid = str(ROOT / "grids" / "ours.yaml")
    assert cli.main(["sweep", grid, "--match", "colpali-*-b256-*", "--dry-run"]) == 0
    listed = [line.split()[-1] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert listed == ["colpali-plain-b256-vanilla-native", "colpali-plain-b256-lik-native"]
    assert cli.main(["sweep", grid, "--match", "nothing-*", "--dry-run"]) == 2
    assert "no cell of" in capsys.readouterr().err


def test_the_progress_line_says_where_a_cells_time_went():
    spec = TrainSpec(stack="pylate", regime="plain", batch_size=2, steps=8, preset="tiny", device="cpu")
    result = CellResult(grid="tiny", cell_id=spec.cell_id, spec=spec, outcome="ok", gpu_wait_sec=31.2,
                        phase_sec={"device": 2.6, "build": 40.1, "train": 86.0, "replay": 0.2})  # fmt: skip
    assert describe_phases(result) == "wait 31s · device 3s · build 40s · train 86s"  # under half a second: left out
    assert describe_phases(result.model_copy(update={"gpu_wait_sec": None, "phase_sec": {}})) == ""


def test_grid_entries_carry_their_launcher_settings(tmp_path):
    (cell,) = load_grid(write_grid(tmp_path / "g.yaml", pylate_cells([2]), notebook="elsewhere.ipynb"))
    assert cell == GridCell("tiny", TrainSpec(stack="pylate", regime="plain", batch_size=2, steps=2, preset="tiny", device="cpu"),
                            kernel="python3", notebook="elsewhere.ipynb")  # fmt: skip


def test_traced_cells_wait_for_their_vanilla_reference_however_many_start_together(tmp_path, monkeypatch):
    """A lik cell listed before its vanilla reference, two workers: vanilla still runs first, and the
    lik cell starts only once vanilla's run has ended (the reference exists then)."""
    from harness.orchestrate import sweep

    base = TrainSpec(stack="pylate", regime="plain", batch_size=2, steps=2, preset="tiny", device="cpu", trace=True)
    specs = [with_fields(base, variant="lik"), with_fields(base, batch_size=4), with_fields(base)]
    cells = [GridCell("parity", spec, "pylate", "notebooks/pylate.ipynb") for spec in specs]
    events: list[tuple[str, str]] = []

    def fake_launch(cell, layout, slot, gate):
        events.append(("start", cell.cell_id))
        time.sleep(0.3)
        events.append(("end", cell.cell_id))
        return SimpleNamespace(cell=cell, outcome="ok", seconds=0.3, phases="", detail="")

    monkeypatch.setattr(sweep, "launch", fake_launch)
    monkeypatch.setattr(sweep, "state", lambda cell, layout: "missing")
    sweep.run_sweep(cells, Layout(tmp_path / "r", tmp_path / "c"), cells_per_gpu=2, echo=lambda line: None)
    lik, vanilla = specs[0].cell_id, specs[2].cell_id
    assert events.index(("end", vanilla)) < events.index(("start", lik))
    ordered, waits = sweep.reference_first(cells)
    assert [c.spec.cell_id for c in ordered] == [specs[1].cell_id, vanilla, lik]
    assert len(waits) == 2


def test_a_traced_cell_is_not_run_when_its_reference_crashed_and_a_stale_reference_is_removed(tmp_path, monkeypatch):
    """The vanilla reference crashes: its lik cell is not launched (nothing to compare with), and the
    reference file an earlier run left is gone before the reference starts, so no cell can read it."""
    from harness.orchestrate import sweep
    from harness.spec import trace_reference_path

    monkeypatch.setenv("MAXSIM_PARITY_DIR", str(tmp_path / "store"))
    base = TrainSpec(stack="pylate", regime="plain", batch_size=2, steps=2, preset="tiny", device="cpu", trace=True)
    specs = [with_fields(base, variant="lik"), with_fields(base)]
    cells = [GridCell("parity", spec, "pylate", "notebooks/pylate.ipynb") for spec in specs]
    stale = trace_reference_path(base)
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier run's reference")
    launched: list[str] = []
    seen_stale: list[bool] = []

    def fake_launch(cell, layout, slot, gate):
        launched.append(cell.cell_id)
        seen_stale.append(stale.exists())
        return SimpleNamespace(cell=cell, outcome="crashed", seconds=0.1, phases="", detail="")

    monkeypatch.setattr(sweep, "launch", fake_launch)
    monkeypatch.setattr(sweep, "state", lambda cell, layout: "missing")
    lines: list[str] = []
    runs = sweep.run_sweep(cells, Layout(tmp_path / "r", tmp_path / "c"), cells_per_gpu=2, echo=lines.append)
    assert launched == [specs[1].cell_id] and seen_stale == [False]
    assert {run.cell.cell_id: run.outcome for run in runs} == {specs[1].cell_id: "crashed", specs[0].cell_id: "skipped"}
    assert any(f"{specs[0].cell_id}: not run — its vanilla reference ended crashed" in line for line in lines)


def test_a_result_the_launcher_refuses_is_marked_crashed_with_the_reason(tmp_path):
    """The notebook wrote a result of another spec at the cell's path: the crash marker says which
    fields differ, not only that no valid result was written."""
    cells = load_grid(write_grid(tmp_path / "tiny.yaml", pylate_cells([2])))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    path = layout.result_path(cells[0])
    path.parent.mkdir(parents=True)
    other = with_fields(cells[0].spec, steps=cells[0].spec.steps + 1)
    write_result(CellResult.crashed(other, cells[0].grid, "error", None, 1.0), path)
    result, why = launcher._own_result_or_why(path, cells[0])
    assert result is None and why == f"{path} is a result of another spec (it differs in steps)"
    path.write_text('{"schema_version": 2}')
    assert "not a valid cell result" in launcher._own_result_or_why(path, cells[0])[1]



def test_a_traced_cell_whose_reference_is_not_rerun_follows_the_result_it_has(tmp_path, monkeypatch):
    """The vanilla reference already has a crash marker and is not run again (no --rerun-crashed): its
    lik cell is not launched against whatever reference file is lying around."""
    from harness.orchestrate import sweep

    monkeypatch.setenv("MAXSIM_PARITY_DIR", str(tmp_path / "store"))
    base = TrainSpec(stack="pylate", regime="plain", batch_size=2, steps=2, preset="tiny", device="cpu", trace=True)
    specs = [with_fields(base), with_fields(base, variant="lik")]
    cells = [GridCell("parity", spec, "pylate", "notebooks/pylate.ipynb") for spec in specs]
    layout = Layout(tmp_path / "r", tmp_path / "c")
    marker = layout.result_path(cells[0])
    marker.parent.mkdir(parents=True)
    write_result(CellResult.crashed(specs[0], "parity", "error", None, 1.0), marker)
    launched: list[str] = []
    monkeypatch.setattr(sweep, "launch", lambda cell, *rest: launched.append(cell.cell_id))
    lines: list[str] = []
    runs = sweep.run_sweep(cells, layout, echo=lines.append)
    assert launched == [] and [(run.cell.cell_id, run.outcome) for run in runs] == [(specs[1].cell_id, "skipped")]
    assert any("its vanilla reference ended crashed" in line for line in lines)


def test_a_data_parallel_cell_runs_after_the_others_on_its_gpu_set_holding_every_gate(tmp_path, monkeypatch, own_gates):
    """A world-size-2 cell waits for the one-GPU cells, then runs on the first two GPUs of --gpus with
    both GPUs' gates; without two GPUs it is not run, and says why."""
    from harness.orchestrate import sweep

    base = TrainSpec(stack="pylate", regime="plain", batch_size=2, steps=2, preset="tiny", device="cpu")
    specs = [with_fields(base, world_size=2, gather=True), with_fields(base), with_fields(base, variant="lik")]
    cells = [GridCell("multi-gpu", spec, "pylate", "notebooks/pylate.ipynb") for spec in specs]
    launched: list[tuple[str, str | None, pool.Gate]] = []

    def fake_launch(cell, layout, slot, gate):
        launched.append((cell.cell_id, slot, gate))
        return SimpleNamespace(cell=cell, outcome="ok", seconds=0.0, phases="", detail="")

    monkeypatch.setattr(sweep, "launch", fake_launch)
    monkeypatch.setattr(sweep, "state", lambda cell, layout: "missing")
    sweep.run_sweep(cells, Layout(tmp_path / "r", tmp_path / "c"), gpus=["0", "1", "2"], echo=lambda line: None)
    assert launched[-1][:2] == (specs[0].cell_id, "0,1") and len(launched) == 3
    gate = launched[-1][2]
    assert gate.environment()[gpu_gate.LOCK_VARIABLE] == os.pathsep.join(
        str(own_gates / f"maxsim-gpu-{gpu}.gate") for gpu in ("0", "1"))
    lines: list[str] = []
    launched.clear()
    runs = sweep.run_sweep(cells, Layout(tmp_path / "r", tmp_path / "c"), gpus=None, echo=lines.append)
    assert [cell_id for cell_id, _, _ in launched] == [specs[1].cell_id, specs[2].cell_id]
    assert any(f"{specs[0].cell_id}: not run — world size 2 needs 2 GPUs, one per rank; this sweep was given none"
               in line for line in lines)
    assert [run.outcome for run in runs][-1] == "skipped"


def test_a_cell_given_several_gates_holds_them_all(tmp_path, monkeypatch):
    """gpu_gate.hold with two gates (a data-parallel cell's): both are held until the process ends."""
    gates = [tmp_path / "a.gate", tmp_path / "b.gate"]
    monkeypatch.setenv(gpu_gate.LOCK_VARIABLE, os.pathsep.join(map(str, gates)))
    monkeypatch.setattr(gpu_gate, "_held", None)
    monkeypatch.setattr(gpu_gate, "_also_held", [])
    assert gpu_gate.hold() >= 0.0
    for gate in gates:
        assert [p.name.split("-")[0] for p in gate.with_name(gate.name + ".d").iterdir()] == ["hold"]
    gpu_gate._close_in_child()  # what a forked child does: it releases them
    assert gpu_gate._held is None and gpu_gate._also_held == []


def test_a_shared_sweep_gives_its_cells_the_gpus_budget_and_runs_a_starved_one_again_alone(tmp_path, monkeypatch):
    # --share-gpu on a sweep (the long runs measure bytes, not times): each cell enters its GPU's gate
    # with the budget, and one whose device, not its cap, ran out beside the others runs again alone.
    from harness.orchestrate import sweep as sweep_module
    from harness.orchestrate.launcher import CellRun

    cells = load_grid(write_grid(tmp_path / "shared.yaml", pylate_cells([2, 4]), name="shared"))
    layout = Layout(tmp_path / "results", tmp_path / "cells")
    gates: list[tuple[int, float | None]] = []

    def launch(cell, layout, gpu, gate):
        gates.append((cell.spec.batch_size, gate.share_gib))
        if cell.spec.batch_size == 4 and gate.share_gib is not None:
            return CellRun(cell, "crashed", 0.0, gpu or "-", failure="device_out_of_memory")
        return CellRun(cell, "ok", 0.0, gpu or "-")

    monkeypatch.setattr(sweep_module, "launch", launch)
    lines: list[str] = []
    runs = run_sweep(cells, layout, gpus=["5"], echo=lines.append, share_gib={"5": 90.5})
    assert sorted(gates, key=lambda pair: (pair[0], pair[1] is None)) == [(2, 90.5), (4, 90.5), (4, None)]
    assert sorted((run.cell.spec.batch_size, run.outcome) for run in runs) == [(2, "ok"), (4, "ok")]
    assert any("running it alone" in line for line in lines)


def test_the_sweep_command_refuses_a_bad_share_budget_before_running_anything(tmp_path, capsys):
    grid = write_grid(tmp_path / "tiny.yaml", pylate_cells([2]))
    assert cli.main(["sweep", str(grid), "--share-gpu", "half", "--results-dir", str(tmp_path / "r")]) == 2
    assert "GiB or nothing" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_dead_kernels_fatal_report_is_read_from_its_log(tmp_path):
    log = tmp_path / "cell.log"
    log.write_text("Executing notebook with kernel: maxsim-colpali\n"
                   "Fatal Python error: Aborted\n\nThread 0x00007f01 (most recent call first):\n"
                   '  File "/x/threading.py", line 331 in wait\n\n'
                   "Current thread 0x00007f02 (most recent call first):\n"
                   '  File "/x/forward.py", line 88 in launch\n  File "/x/autograd.py", line 12 in forward\n\n'
                   "Extension modules: numpy\nKernel died while waiting for execute reply.\n")  # fmt: skip
    assert launcher.fatal_report(log) == 'Fatal Python error: Aborted, in File "/x/forward.py", line 88 in launch'
    log.write_text("Executing notebook with kernel: maxsim-colpali\nKernel died while waiting for execute reply.\n")
    assert launcher.fatal_report(log) == "no fatal-signal report in its log (it exited, or was killed outright, as by SIGKILL)"
