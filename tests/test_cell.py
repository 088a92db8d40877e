"""The cell runner on CPU through a real transformers.Trainer (the toy stack in toy_stack.py)."""

import pytest
import torch

from harness import backends
from harness.cell import CellError, CellParams, main, run_cell, validate
from harness.memory import MIB
from harness.results import load_result
from toy_stack import DIM, DOC_LENGTH, OOM_MESSAGE, QUERY_LENGTH, ToyStack


def params(tmp_path, **overrides):
    fields = dict(stack="toy", regime="plain", batch_size=4, steps=3, preset="tiny", device="cpu",
                  output=tmp_path / "cell.json")  # fmt: skip
    fields.update(overrides)
    return CellParams(**fields)


def test_a_cell_trains_records_every_call_and_replays_its_shape(tmp_path):
    result = run_cell(params(tmp_path), ToyStack())
    assert result.outcome == "ok"
    assert len(result.step_times_sec) == 3 and result.steady_steps == [1, 2]
    assert result.samples_per_sec == pytest.approx(4 / result.steady_step_time_sec)
    # one MaxSim call per step, each with the real shapes, tagged with its step
    assert [c.step for c in result.maxsim_calls_in_train] == [0, 1, 2]
    for call in result.maxsim_calls_in_train:
        assert (call.query_shape, call.doc_shape, call.dtype) == ([4, QUERY_LENGTH, DIM], [4, DOC_LENGTH, DIM], "float32")
        # in train the head holds the grid, amax and scores plus the small loss tensors ([B, B] and scalars)
        extra = round((call.saved_for_backward_mib - call.predicted_saved_for_backward_mib) * MIB)
        assert 0 <= extra <= 4 * 4 * 4 * 4
    # the one distinct shape is replayed in isolation, exactly as predicted
    (isolated,) = result.maxsim_calls_isolated
    grid = 4 * 4 * QUERY_LENGTH * DOC_LENGTH * 4
    assert round(isolated.saved_for_backward_mib * MIB) == grid + 4 * 4 * QUERY_LENGTH * 4 + 4 * 4 * 4
    assert result.step_peak_alloc_mib >= isolated.saved_for_backward_mib
    assert result.step_peak_reserved_mib == result.step_peak_alloc_mib  # no caching allocator on CPU
    # each step's own peak: it holds the step's grid (B x B x Lq x Ld fp32) on top of the model, and
    # the run peak is the largest of them or was reached outside the steps
    per_step = result.step_peak_alloc_per_step_mib
    assert len(per_step) == len(result.step_peak_reserved_per_step_mib) == 3
    assert all(peak * MIB >= grid for peak in per_step) and max(per_step) <= result.step_peak_alloc_mib
    assert result.step_peak_reserved_per_step_mib == per_step  # CPU: reserved is allocated
    assert result.env.seed == 42 and result.env.packages["torch"] and result.env.model_source == "toy:random"
    # where the wall time went, phase by phase, within it
    assert set(result.phase_sec) == {"device", "build", "train", "replay"}
    assert all(seconds > 0 for seconds in result.phase_sec.values())
    assert sum(result.phase_sec.values()) <= result.wall_sec
    assert result.phase_sec["train"] >= sum(result.step_times_sec)
    assert load_result(tmp_path / "cell.json") == result


def test_an_oom_inside_the_op_is_an_outcome_with_its_message_and_replays_still_run(tmp_path):
    result = run_cell(params(tmp_path), ToyStack(oom_in_head_at_step=1))
    assert result.outcome == "oom" and result.oom_where == "maxsim"
    assert result.oom_message == OOM_MESSAGE.splitlines()[0]
    first, failed = result.maxsim_calls_in_train
    assert not first.oom_in_forward and failed.oom_in_forward and failed.oom_message == result.oom_message
    assert failed.saved_for_backward_mib is None
    assert len(result.step_times_sec) == 1  # the step that died has no time
    assert result.phase_sec["train"] >= result.step_times_sec[0]  # timed up to the OOM
    assert result.pre_oom_alloc_mib == result.step_peak_alloc_mib > 0
    assert len(result.maxsim_calls_isolated) == 1 and not result.maxsim_calls_isolated[0].oom_in_replay
    assert load_result(tmp_path / "cell.json").outcome == "oom"


def test_an_oom_outside_the_op_is_recorded_as_elsewhere(tmp_path):
    result = run_cell(params(tmp_path), ToyStack(oom_in_encoder_at_step=2))
    assert result.outcome == "oom" and result.oom_where == "elsewhere"
    assert [c.oom_in_forward for c in result.maxsim_calls_in_train] == [False, False]
    assert len(result.step_times_sec) == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(batch_size=0), "greater than 0"),
        (dict(steps=0), "greater than 0"),
        (dict(variant="fast"), "unknown variant 'fast'"),
        (dict(card="h300"), "unknown card 'h300'"),
        (dict(score_mini_batch_size=0), "greater than 0"),
    ],
)
def test_bad_parameters_fail_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        params(tmp_path, **overrides)


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (dict(regime="ckpt"), CellError, "unknown regime 'ckpt'"),
        (dict(preset="full"), CellError, "unknown preset 'full'"),
        (dict(card="h100-80gb"), CellError, "needs a CUDA device"),
        (dict(score_mini_batch_size=64), CellError, "PyLate's chunking"),
        (dict(variant="lik"), backends.BackendUnavailable, "lik"),
        (dict(variant="flash"), ValueError, "unknown variant 'flash' for the colpali MaxSim op"),
    ],
)
def test_cells_that_cannot_run_are_refused_before_anything_is_built(tmp_path, overrides, error, message):
    stack = ToyStack()
    with pytest.raises(error, match=message):
        run_cell(params(tmp_path, **overrides), stack)
    assert stack.builds == 0 and not (tmp_path / "cell.json").exists()


def test_an_unwritable_output_is_refused_before_training(tmp_path):
    stack = ToyStack()
    (tmp_path / "taken").mkdir()
    with pytest.raises(CellError, match="is a directory"):
        validate(params(tmp_path, output=tmp_path / "taken"), stack)
    (tmp_path / "file").write_text("")
    with pytest.raises(CellError, match="cannot write the result"):
        validate(params(tmp_path, output=tmp_path / "file" / "cell.json"), stack)
    assert stack.builds == 0


def test_cuda_is_refused_clearly_on_a_cpu_host(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    with pytest.raises(CellError, match="no CUDA device is visible"):
        validate(params(tmp_path, device="cuda"), ToyStack())


def test_the_command_line_reports_a_bad_cell_and_exits_2(tmp_path, capsys):
    code = main(["--stack", "pylate", "--regime", "plain", "--batch-size", "-1", "--output", str(tmp_path / "x.json")])
    assert code == 2
    assert "greater than 0" in capsys.readouterr().err


def test_a_cell_that_sees_two_gpus_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(CellError, match="sees 2 CUDA devices"):
        validate(params(tmp_path, device="cuda"), ToyStack())


def test_auto_picks_the_device_and_preset_the_machine_can_run():
    import torch

    from harness.cell import resolve_auto

    expected = ("cuda", "full") if torch.cuda.is_available() else ("cpu", "tiny")
    assert resolve_auto("auto", "auto") == expected
    assert resolve_auto("cpu", "auto") == ("cpu", "tiny")
    assert resolve_auto("cpu", "full") == ("cpu", "full")  # explicit choices are kept


# PyTorch's message for an OOM under a 43.75 GiB cap on a shared H200, as a committed probe recorded it
CAP_OOM = (
    "CUDA out of memory. Tried to allocate 486.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which 15.17 GiB "
    "is free. Including non-PyTorch memory, this process has 44.47 GiB memory in use. 43.75 GiB allowed; Of the "
    "allocated memory 41.17 GiB is allocated by PyTorch, and 2.56 GiB is reserved by PyTorch but unallocated."
)
# the same request refused by the device while the process was far below its cap
DEVICE_OOM = CAP_OOM.replace("15.17 GiB is free", "100.00 MiB is free").replace("41.17 GiB is allocated", "20.00 GiB is allocated")


def test_an_oom_is_the_cards_only_when_the_cap_refused_it():
    from harness.cards import oom_cause

    cap = int(43.75 * 1024**3)
    assert oom_cause(CAP_OOM, cap) == "cap"  # 41.17 + 2.56 + 0.47 GiB passes the cap: the card's OOM
    assert oom_cause(DEVICE_OOM, cap) == "device"  # 20 + 2.56 + 0.47 GiB is within it, but the device had 100 MiB
    assert oom_cause(DEVICE_OOM, None) == "cap"  # uncapped: the device is the card
    # PyTorch prints small sizes in bytes, and CUDA-graph pools when there are any
    starved = DEVICE_OOM.replace("100.00 MiB is free", "0 bytes is free").replace("2.56 GiB is reserved", "512 bytes is reserved")
    assert oom_cause(starved, cap) == "device"
    pooled = CAP_OOM.replace("by PyTorch, and", "by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and")
    assert oom_cause(pooled, cap) == "cap"
    assert oom_cause(OOM_MESSAGE, cap) is None  # without the allocator's accounting it cannot say


def test_a_capped_cell_that_the_device_starved_measures_nothing(tmp_path, monkeypatch):
    import toy_stack

    from harness import cell

    monkeypatch.setattr(cell.cards, "apply_card", lambda profile, device: int(43.75 * 1024**3))
    monkeypatch.setattr(toy_stack, "OOM_MESSAGE", DEVICE_OOM)
    with pytest.raises(cell.DeviceOutOfMemory, match="another process was using the GPU"):
        run_cell(params(tmp_path), ToyStack(oom_in_head_at_step=1))
    assert not (tmp_path / "cell.json").exists()
    monkeypatch.setattr(toy_stack, "OOM_MESSAGE", CAP_OOM)
    assert run_cell(params(tmp_path), ToyStack(oom_in_head_at_step=1)).outcome == "oom"
    monkeypatch.setattr(toy_stack, "OOM_MESSAGE", OOM_MESSAGE)  # a message that cannot be attributed:
    assert run_cell(params(tmp_path), ToyStack(oom_in_head_at_step=1)).outcome == "oom"  # the card's when alone,
    monkeypatch.setattr(cell.gpu_gate, "share_gib", lambda: 24.96)
    with pytest.raises(cell.DeviceOutOfMemory):  # but not on a shared GPU
        run_cell(params(tmp_path), ToyStack(oom_in_head_at_step=1))


def test_a_cell_leaves_nothing_in_the_temporary_directory(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = (
        "import sys\n"
        "from harness.cell import CellParams, run_cell\n"
        "from toy_stack import ToyStack\n"
        "params = CellParams(stack='toy', regime='plain', batch_size=4, steps=2, preset='tiny', device='cpu', output=sys.argv[1])\n"
        "result = run_cell(params, ToyStack())\n"
        "assert result.outcome == 'ok', result.outcome\n"
    )
    tests = str(Path(__file__).parent)
    env = os.environ | {"TMPDIR": str(scratch), "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "cell.json")], env=env, check=True, timeout=300)
    assert load_result(tmp_path / "cell.json").outcome == "ok"
    assert sorted(os.listdir(scratch)) == []  # the trainer's output_dir went with the process
