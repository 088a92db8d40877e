"""GPU paths: the CUDA probe, fused replays, card emulation and a cell on CUDA. Run on a GPU host:
``pytest -m gpu`` (skipped where no CUDA device is visible)."""

import pytest
import torch

from harness import cards
from harness.cell import run_cell
from harness.memory import MIB, CudaMemoryProbe
from harness.ops import ColpaliInBatchMaxSim, OpShape, PylateColbertScores
from harness.replay import replay_shapes
from harness.spec import OpSpec, TrainSpec
from harness.timing import AutotuneWatch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
COLPALI_SHAPE = OpShape((16, 51, 128), (16, 771, 128), "float32")


@pytest.fixture
def probe():
    yield CudaMemoryProbe()
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def test_vanilla_colpali_replay_on_cuda_holds_its_prediction_within_a_mib(probe):
    (record,) = replay_shapes(ColpaliInBatchMaxSim(), [COLPALI_SHAPE], "vanilla", probe)
    assert abs(record.saved_for_backward_mib - record.predicted_saved_for_backward_mib) < 1
    assert record.backward_transient_peak_mib > record.predicted_grid_mib


def test_vanilla_pylate_replay_on_cuda_matches_its_prediction_within_allocator_rounding(probe):
    shape = OpShape((64, 48, 128), (64, 2, 300, 128), "float32", doc_mask_shape=(64, 2, 300))
    (record,) = replay_shapes(PylateColbertScores(), [shape], "vanilla", probe)
    # The prediction counts tensor bytes; the caching allocator may hand out a block up to 1 MiB
    # larger than asked when the rest is too small to split, and this op keeps several blocks live.
    assert 0 <= record.forward_transient_peak_mib - record.predicted_forward_transient_mib <= 2
    assert 0 <= record.saved_for_backward_mib - record.predicted_saved_for_backward_mib <= 2


def test_lik_replay_runs_the_fused_kernel_and_holds_no_grid(probe):
    pytest.importorskip("late_interaction_kernels")
    (record,) = replay_shapes(ColpaliInBatchMaxSim(), [COLPALI_SHAPE], "lik", probe)
    assert record.entry_point_calls == 1 and not record.oom_in_replay
    assert record.saved_for_backward_mib < record.predicted_grid_mib / 10


def test_the_emulated_card_turns_an_oversized_grid_into_a_recorded_oom(probe):
    cap = cards.apply_card(cards.card("h100-80gb"), probe.device)
    assert cap == int(78.43 * 2**30)
    huge = OpShape((512, 128, 128), (512, 1024, 128), "float32")  # a 128 GiB grid
    (record,) = replay_shapes(ColpaliInBatchMaxSim(), [huge], "vanilla", probe)
    assert record.oom_in_replay and "Tried to allocate 128.00 GiB" in record.oom_message
    assert "\n" not in record.oom_message


def test_a_cell_runs_on_cuda_under_the_emulated_card(tmp_path, probe):
    from toy_stack import ToyStack

    spec = TrainSpec(stack="colpali", batch_size=32, steps=3, preset="tiny", device="cuda", card="h100-80gb")
    result = run_cell(spec, tmp_path / "cell.json", stack=ToyStack())  # the toy stands in for colpali's
    assert result.outcome == "ok" and len(result.step_times_sec) == 3
    assert result.spec == spec and result.cell_id == "colpali-plain-b32-vanilla-h100-80gb"
    assert result.env.card_cap_mib == pytest.approx(78.43 * 1024) and result.env.device_name
    assert result.step_peak_reserved_mib >= result.step_peak_alloc_mib > 0
    (isolated,) = result.maxsim_calls_isolated
    assert abs(isolated.saved_for_backward_mib - isolated.predicted_saved_for_backward_mib) < 1
    assert MIB * isolated.saved_for_backward_mib > 0


def test_the_autotune_watch_sees_a_fused_kernel_tune_for_a_new_key(probe):
    pytest.importorskip("late_interaction_kernels")
    # Triton's autotune key includes every tensor argument's dtype: no bf16 lik call ran before
    # in this process, so this one must tune; the same call again must not.
    shape = OpShape((48, 37, 128), (48, 333, 128), "bfloat16")
    first, again = AutotuneWatch(), AutotuneWatch()
    with first.active():
        replay_shapes(ColpaliInBatchMaxSim(), [shape], "lik", probe)
    with again.active():
        replay_shapes(ColpaliInBatchMaxSim(), [shape], "lik", probe)
    assert first.events >= 1 and again.events == 0


@pytest.mark.colpali
@pytest.mark.parametrize("variant", ["vanilla", "lik"])
def test_an_op_level_negative_head_is_timed_with_cuda_events(tmp_path, probe, variant):
    from harness.opbench import run_op_cell

    spec = OpSpec(stack="op-colpali", head="negative-ce", batch_size=32, negatives=4, variant=variant, reps=10, device="cuda")
    result = run_op_cell(spec, tmp_path / "op.json")
    assert result.cell_id == f"op-colpali-negative-ce-b32-n4-{variant}-native" and result.env.device == "cuda:0"
    assert result.outcome == "ok" and len(result.step_times_sec) == 10 and result.steady_step_time_sec > 0
    (replay,) = result.maxsim_calls_isolated
    if variant == "lik":
        assert result.backend_entry_point_calls >= 10  # every timed repetition reached the kernel
        assert replay.saved_for_backward_mib * MIB < replay.predicted_grid_mib * MIB / 10  # no grids kept
    else:
        assert replay.saved_for_backward_mib * MIB >= replay.predicted_grid_mib * MIB


def test_a_lik_cell_whose_trainer_never_reached_the_kernel_fails(tmp_path, probe, monkeypatch):
    """The toy head computes colpali's vanilla math whatever the variant: a lik cell built on it trains with the
    real entry-point counter on the real kernel module, which counts no call, so the cell fails and writes nothing."""
    pytest.importorskip("late_interaction_kernels")
    from harness import cell
    from harness.cell import BackendPathError
    from toy_stack import ToyStack

    monkeypatch.setattr(cell, "replay_shapes", lambda *args, **kwargs: [])  # the replays are not what is checked here
    spec = TrainSpec(stack="colpali", batch_size=8, steps=2, preset="tiny", device="cuda", variant="lik")
    with pytest.raises(BackendPathError, match="2 MaxSim calls were recorded but only 0 reached late_interaction_kernels"):
        run_cell(spec, tmp_path / "cell.json", stack=ToyStack())
    assert not (tmp_path / "cell.json").exists()


def test_a_cell_runs_with_the_allocator_its_spec_names(tmp_path):
    # CUDA has started in this process already, so the cell runs in a fresh one, as under the launcher
    import os

    from toy_stack import run_in_a_fresh_process

    env = {key: value for key, value in os.environ.items() if key != "PYTORCH_CUDA_ALLOC_CONF"}
    completed = run_in_a_fresh_process(tmp_path / "cell.json", env, stack="colpali", batch_size=8, steps=2, preset="tiny",
                                       device="cuda", allocator="expandable")  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    from harness.results import load_result

    result = load_result(tmp_path / "cell.json")
    assert result.outcome == "ok" and result.allocator == "expandable"
    assert result.cell_id == "colpali-plain-b8-vanilla-native-expandable"
    assert result.env.pytorch_cuda_alloc_conf == "expandable_segments:True"  # what the process really ran with


def test_the_emulated_card_still_caps_memory_under_expandable_segments(tmp_path):
    # the allocator setting must be in place before CUDA starts, so it runs in its own process
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from harness import cards\n"
        "device = torch.device('cuda', 0)\n"
        "cap = cards.apply_card(cards.card('rtx4090-24gb'), device)\n"
        "kept = torch.empty(cap // 2, dtype=torch.uint8, device=device)\n"
        "more = torch.empty(cap // 2 - 2**28, dtype=torch.uint8, device=device)  # just under the cap: fits\n"
        "try:\n"
        "    torch.empty(2**29, dtype=torch.uint8, device=device)  # past the cap\n"
        "    print('no-oom')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('oom', torch.cuda.memory_reserved(device) <= cap)\n"
    )
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    completed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert completed.stdout.split() == ["oom", "True"], completed.stderr[-2000:]
