"""Op-level cells on CPU: colpali-engine's loss heads (colpali environment) and PyLate's scores (pylate)."""

import pytest

from harness import backends
from harness.cell import CellError
from harness.memory import MIB
from harness.opbench import ColpaliLossHead, PylateScoresHead, head_op, run_op_cell, validate
from harness.results import load_result
from harness.spec import OpSpec, SpecError, TrainSpec


def op_spec(**fields):
    values = dict(stack="op-colpali", head="inbatch", batch_size=4, reps=3, warmup=1, rotate=2, query_length=8,
                  doc_length=40, device="cpu")  # fmt: skip
    return OpSpec(**(values | fields))


def op_cell(tmp_path, **fields):
    return run_op_cell(op_spec(**fields), tmp_path / "op.json")


@pytest.mark.colpali
def test_the_in_batch_head_is_timed_and_holds_exactly_colpalis_grid(tmp_path):
    result = op_cell(tmp_path)
    assert result.outcome == "ok" and result.preset == "op" and result.regime == "inbatch"
    assert result.cell_id == "op-colpali-inbatch-b4-vanilla-native" and result.grid is None
    assert load_result(tmp_path / "op.json") == result
    assert len(result.step_times_sec) == 3 and result.steady_step_time_sec > 0
    assert result.backend_entry_point_calls is None and result.provenance.harness_sha256
    (replay,) = result.maxsim_calls_isolated
    assert replay.query_shape == [4, 8, 128] and replay.doc_shape == [4, 40, 128] and replay.dtype == "bfloat16"
    grid = 4 * 4 * 8 * 40 * 2  # bf16 grid; the loss keeps it (amax's backward) + amax + scores + a few [B] tensors
    assert replay.predicted_grid_mib * MIB == grid
    held, predicted = replay.saved_for_backward_mib * MIB, replay.predicted_saved_for_backward_mib * MIB
    assert predicted <= held <= predicted + 64 * 4 * 4


@pytest.mark.colpali
@pytest.mark.parametrize("head", ["negative-ce", "pairwise-negative-ce"])
def test_negative_heads_take_their_negatives_as_a_separate_tensor(tmp_path, head):
    result = op_cell(tmp_path, head=head, negatives=3)
    (replay,) = result.maxsim_calls_isolated
    assert result.negatives == 3 and replay.doc_shape == [4, 4, 40, 128]  # positive + 3 negatives per query
    assert result.cell_id == f"op-colpali-{head}-b4-n3-vanilla-native"
    grids = (4 * 3 + 4 + 4 * 4) * 8 * 40 * 2  # negatives, positives, in-batch term
    assert replay.predicted_grid_mib * MIB == grids and replay.predicted_saved_for_backward_mib is None
    assert replay.saved_for_backward_mib * MIB >= grids  # every vanilla grid is kept for its amax backward


@pytest.mark.pylate
def test_pylates_in_batch_scores_match_the_e2e_replay_prediction(tmp_path):
    result = op_cell(tmp_path, stack="op-pylate", query_length=6, doc_length=10)
    (replay,) = result.maxsim_calls_isolated
    assert replay.doc_shape == [4, 2, 10, 128] and replay.doc_mask_shape == [4, 2, 10] and replay.dtype == "float32"
    assert round(replay.saved_for_backward_mib * MIB) == round(replay.predicted_saved_for_backward_mib * MIB)
    assert result.cell_id == "op-pylate-inbatch-b4-vanilla-native" and len(result.step_times_sec) == 3


def test_the_head_an_op_spec_names_and_its_published_shapes():
    assert isinstance(head_op(op_spec()), ColpaliLossHead) and head_op(op_spec(head="negative-ce", negatives=2)).negatives
    assert isinstance(head_op(op_spec(stack="op-pylate")), PylateScoresHead)
    assert OpSpec(stack="op-colpali").lengths == (32, 1030) and OpSpec(stack="op-pylate").lengths == (48, 300)
    assert op_spec().lengths == (8, 40)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(head="negative-ce"), "the negative-ce head needs negatives"),
        (dict(negatives=4), "the inbatch head has no explicit negatives"),
        (dict(head="sideways"), "unknown head for op-colpali 'sideways'"),
        (dict(stack="op-pylate", head="negative-ce", negatives=2), "unknown head for op-pylate 'negative-ce'"),
        (dict(variant="flash"), "variant 'flash' is not available for colpali; choose one of vanilla, lik"),
        (dict(reps=0), "reps must be an integer of at least 1"),
        (dict(stack="colpali"), "'colpali' trains; describe its cells with TrainSpec"),
    ],
)
def test_bad_op_cells_are_refused_when_their_spec_is_made(fields, message):
    with pytest.raises(SpecError, match=message):
        op_spec(**fields)


def test_op_cells_that_cannot_run_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(SpecError, match="'op-colpali' is an op-level stack; describe its cells with OpSpec"):
        TrainSpec(stack="op-colpali")
    with pytest.raises(backends.BackendUnavailable, match="CUDA"):
        op_cell(tmp_path, stack="op-pylate", variant="lik")
    with pytest.raises(CellError, match="resolve the spec first"):
        validate(op_spec(device="auto"), tmp_path / "op.json")
    (tmp_path / "taken").mkdir()
    with pytest.raises(CellError, match="is a directory"):
        validate(op_spec(), tmp_path / "taken")
    assert not (tmp_path / "op.json").exists()
