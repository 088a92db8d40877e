"""The sweep driver on CPU: tiny PyLate cells, each a papermill run in a fresh kernel (pylate environment)."""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from harness import gpu_gate, sweep
from harness.results import load_result

pytestmark = pytest.mark.pylate
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def dying_notebook(tmp_path):
    """The PyLate notebook, with a kernel that dies (os._exit) when batch == 3."""
    notebook = nbformat.read(ROOT / "notebooks" / "pylate.ipynb", as_version=4)
    position = next(i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", []))
    notebook.cells.insert(position + 1, nbformat.v4.new_code_cell("import os\nif batch == 3:\n    os._exit(1)"))
    path = tmp_path / "dying.ipynb"
    nbformat.write(notebook, path)
    return path


def write_grid(tmp_path, notebook, batches, name="tiny"):
    grid = {
        "name": name,
        "defaults": {"preset": "tiny", "device": "cpu", "card": "native", "steps": 1, "kernel": "python3",
                     "notebook": str(notebook)},
        "cells": [{"stack": "pylate", "regime": "plain", "batch_size": batches, "variant": "vanilla"}],
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def test_a_sweep_survives_a_dead_kernel_and_resumes_without_redoing_cells(tmp_path, dying_notebook):
    grid = write_grid(tmp_path, dying_notebook, [2, 3, 4])
    results, notebooks = tmp_path / "results", tmp_path / "cells"
    plans = sweep.load_grid(grid)
    lines = []
    runs = sweep.run_sweep(plans, results, notebooks, echo=lines.append)
    assert sorted((r.plan.batch_size, r.outcome) for r in runs) == [(2, "ok"), (3, "crashed"), (4, "ok")]
    crashed = load_result(plans[1].result_path(results))
    assert crashed.outcome == "crashed" and crashed.batch_size == 3 and crashed.regime == "plain"
    assert "Kernel died" in crashed.crash_log_tail or "DeadKernelError" in crashed.crash_log_tail
    ok = load_result(plans[0].result_path(results))
    assert ok.outcome == "ok" and ok.maxsim_calls_in_train[0].query_shape == [2, 48, 128]
    assert set(ok.phase_sec) == {"device", "build", "train", "replay"}
    assert all("build" in r.phases for r in runs if r.outcome == "ok")  # the progress line says where the time went
    executed = nbformat.read(plans[0].notebook_path(notebooks), as_version=4)
    assert executed.cells[0].source.startswith("# pylate · plain · B=2 · vanilla · native — ok")
    assert "1 crashed, 2 ok" in lines[-1]
    # papermill writes beside the result while the cell runs; the book only gets ended cells
    dead = nbformat.read(plans[1].notebook_path(notebooks), as_version=4)
    assert dead.cells[0].source.startswith("# pylate · plain · B=3 · vanilla · native — crashed")
    assert not list(results.rglob("*.running.ipynb"))

    stamps = {p.cell_id: os.stat(p.result_path(results)).st_mtime_ns for p in plans}
    assert sweep.run_sweep(plans, results, notebooks, echo=lines.append) == []  # resume: nothing to redo
    again = sweep.run_sweep(plans, results, notebooks, rerun_crashed=True, echo=lines.append)
    assert [(r.plan.batch_size, r.outcome) for r in again] == [(3, "crashed")]
    assert os.stat(plans[0].result_path(results)).st_mtime_ns == stamps[plans[0].cell_id]


def test_cells_run_concurrently_one_per_gpu(tmp_path, dying_notebook):
    plans = sweep.load_grid(write_grid(tmp_path, dying_notebook, [2, 4], name="pair"))
    lines = []
    runs = sweep.run_sweep(plans, tmp_path / "results", tmp_path / "cells", gpus=["0", "1"], echo=lines.append)
    assert sorted(r.slot for r in runs) == ["0", "1"]
    first_finish = next(i for i, line in enumerate(lines) if line.startswith("[1/2]"))
    assert sum(line.strip().startswith("start") for line in lines[:first_finish]) == 2  # both running at once


def test_two_cells_per_gpu_start_together_and_measure_one_at_a_time(tmp_path, dying_notebook, monkeypatch):
    monkeypatch.setattr(sweep, "gate_path", lambda gpu: tmp_path / f"gpu-{gpu}.lock")
    plans = sweep.load_grid(write_grid(tmp_path, dying_notebook, [2, 4], name="gated"))
    lines = []
    runs = sweep.run_sweep(plans, tmp_path / "results", tmp_path / "cells", gpus=["7"], cells_per_gpu=2, echo=lines.append)
    assert sorted((r.plan.batch_size, r.outcome, r.slot) for r in runs) == [(2, "ok", "7"), (4, "ok", "7")]
    first_finish = next(i for i, line in enumerate(lines) if line.startswith("[1/2]"))
    assert sum(line.strip().startswith("start") for line in lines[:first_finish]) == 2
    # both started at once, so one of them waited for the other's whole process to end
    waits = sorted(load_result(p.result_path(tmp_path / "results")).gpu_wait_sec for p in plans)
    assert waits[0] < 0.5 < waits[1]
    monkeypatch.undo()
    assert sweep.gate_path("7").name == "maxsim-gpu-7.gate"
    with pytest.raises(ValueError, match="at least 1"):
        sweep.run_sweep(plans, tmp_path / "results", tmp_path / "cells", cells_per_gpu=0)


def test_a_gate_passes_its_lock_and_share_budget_to_the_cell(tmp_path):
    alone = sweep.Gate(tmp_path / "gpu.lock")
    assert alone.environment() == {gpu_gate.LOCK_VARIABLE: str(tmp_path / "gpu.lock")}
    shared = sweep.Gate(tmp_path / "gpu.lock", share_gib=138.75)
    assert shared.environment()[gpu_gate.SHARE_VARIABLE] == "138.75"


def test_an_invalid_grid_is_rejected_before_anything_runs(tmp_path, dying_notebook):
    path = write_grid(tmp_path, dying_notebook, [2])
    grid = yaml.safe_load(path.read_text())
    grid["cells"] += [
        {"stack": "pylate", "regime": "plain", "batch_size": 0, "variant": "vanilla"},
        {"stack": "pylate", "regime": "sideways", "batch_size": 2, "variant": "vanilla"},
        {"stack": "pylate", "regime": "plain", "batch_size": 2, "variant": "turbo"},
        {"stack": "pylate", "regime": "plain", "batch_size": 2, "variant": "vanilla"},
    ]
    path.write_text(yaml.safe_dump(grid))
    with pytest.raises(sweep.GridError) as error:
        sweep.load_grid(path)
    message = str(error.value)
    for expected in ("greater than 0", "unknown regime 'sideways'", "unknown variant 'turbo'", "cells repeat"):
        assert expected in message
    assert not (tmp_path / "results").exists()
    assert sweep.main([str(path), "--dry-run"]) == 2


def test_the_published_grid_expands_to_its_cells_and_lists_them(capsys):
    plans = sweep.load_grid(ROOT / "grids" / "published.yaml", stacks=["pylate"])
    assert len(plans) == 3 * 2 + 4 * 2 + 2
    assert {p.card for p in plans} == {"h100-80gb"}
    assert sweep.main([str(ROOT / "grids" / "published.yaml"), "--stack", "pylate", "--dry-run"]) == 0
    assert "pylate-grad-checkpoint-b1024-vanilla-chunk64-h100-80gb" in capsys.readouterr().out


def test_a_skypilot_task_is_written_for_a_grid(tmp_path):
    target = tmp_path / "sky.yaml"
    assert sweep.main([str(ROOT / "grids" / "ours.yaml"), "--stack", "pylate", "--skypilot", str(target)]) == 0
    task = yaml.safe_load(target.read_text())
    assert set(task) == {"name", "workdir", "resources", "setup", "run"}
    assert task["name"] == "maxsim-ours" and task["resources"]["accelerators"] == "H100:1"
    assert "tools/envs.py create pylate --torch system" in task["setup"]
    assert "harness-sweep grids/ours.yaml --gpus all" in task["run"]


def test_every_cell_sees_exactly_one_gpu():
    assert sweep.cell_environment("1", {"CUDA_VISIBLE_DEVICES": "0,1"})["CUDA_VISIBLE_DEVICES"] == "1"
    assert sweep.cell_environment(None, {"CUDA_VISIBLE_DEVICES": "3,5"})["CUDA_VISIBLE_DEVICES"] == "3"
    assert sweep.cell_environment(None, {})["CUDA_VISIBLE_DEVICES"] == "0"


def test_op_level_cells_run_through_the_same_sweep(tmp_path):
    grid = {
        "name": "op-tiny",
        "defaults": {"device": "cpu", "card": "native", "steps": 2, "kernel": "python3"},
        "cells": [{"stack": "op-pylate", "regime": "inbatch", "batch_size": [2, 3], "variant": "vanilla"}],
    }
    path = tmp_path / "op.yaml"
    path.write_text(yaml.safe_dump(grid))
    plans = sweep.load_grid(path)
    runs = sweep.run_sweep(plans, tmp_path / "results", tmp_path / "cells", echo=lambda line: None)
    assert [(r.plan.batch_size, r.outcome) for r in runs] == [(2, "ok"), (3, "ok")]
    result = load_result(plans[1].result_path(tmp_path / "results"))
    assert result.preset == "op" and len(result.step_times_sec) == 2
    assert result.maxsim_calls_isolated[0].query_shape == [3, 48, 128]


def test_the_op_grid_expands_and_rejects_negatives_where_they_do_not_belong(tmp_path):
    plans = sweep.load_grid(ROOT / "grids" / "op.yaml")
    assert len(plans) == 3 * 2 + 2 * 3 * 3 * 2 + 5 * 3
    assert "op-colpali-negative-ce-b256-n16-lik-native" in {p.cell_id for p in plans}
    bad = {"name": "bad", "defaults": {"device": "cpu"},
           "cells": [{"stack": "pylate", "regime": "plain", "batch_size": 2, "variant": "vanilla", "negatives": 4},
                     {"stack": "op-colpali", "regime": "negative-ce", "batch_size": 2, "variant": "vanilla"}]}  # fmt: skip
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(sweep.GridError) as error:
        sweep.load_grid(path)
    assert "negatives are for op-level heads" in str(error.value) and "needs negatives" in str(error.value)


def test_match_selects_cells_by_id(capsys):
    grid = str(ROOT / "grids" / "ours.yaml")
    assert sweep.main([grid, "--match", "colpali-*-b256-*", "--dry-run"]) == 0
    listed = [line.split()[-1] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert listed == ["colpali-plain-b256-vanilla-native", "colpali-plain-b256-lik-native"]
    assert sweep.main([grid, "--match", "nothing-*", "--dry-run"]) == 2


def test_the_progress_line_says_where_a_cells_time_went():
    from harness.results import CellResult

    result = CellResult(stack="pylate", regime="plain", batch_size=2, variant="vanilla", card="native", steps=8, seed=42,
                        preset="tiny", outcome="ok", gpu_wait_sec=31.2,
                        phase_sec={"device": 2.6, "build": 40.1, "train": 86.0, "replay": 0.2})  # fmt: skip
    assert sweep.describe_phases(result) == "wait 31s · device 3s · build 40s · train 86s"  # under half a second: left out
    assert sweep.describe_phases(result.model_copy(update={"gpu_wait_sec": None, "phase_sec": {}})) == ""


def test_a_kernel_that_dies_before_it_starts_is_started_again(tmp_path, dying_notebook, monkeypatch):
    plans = sweep.load_grid(write_grid(tmp_path, dying_notebook, [2]))
    real_run, starts = subprocess.run, []

    def flaky_start(command, stdout, **kwargs):
        starts.append(command)
        if len(starts) == 1:  # what papermill prints when the kernel dies before kernel_info
            stdout.write("RuntimeError: Kernel died before replying to kernel_info\n")
            stdout.flush()
            return subprocess.CompletedProcess(command, 1)
        return real_run(command, stdout=stdout, **kwargs)

    monkeypatch.setattr(sweep.subprocess, "run", flaky_start)
    (run,) = sweep.run_sweep(plans, tmp_path / "results", tmp_path / "cells", echo=lambda line: None)
    assert run.outcome == "ok" and len(starts) == 2
    assert "starting the cell again" in plans[0].log_path(tmp_path / "results").read_text()


def test_a_kernel_that_dies_while_running_is_not_started_again(tmp_path, dying_notebook, monkeypatch):
    plans = sweep.load_grid(write_grid(tmp_path, dying_notebook, [3]))
    real_run, starts = subprocess.run, []
    monkeypatch.setattr(sweep.subprocess, "run", lambda command, **kwargs: starts.append(command) or real_run(command, **kwargs))
    (run,) = sweep.run_sweep(plans, tmp_path / "results", tmp_path / "cells", echo=lambda line: None)
    assert run.outcome == "crashed" and len(starts) == 1  # it died in a cell: a real crash, recorded once
