"""Op-level cells on CPU: colpali-engine's loss heads (colpali environment) and PyLate's scores (pylate)."""

import importlib.util

import pytest

from harness.cell import CellError
from harness.memory import MIB
from harness.opbench import OpCellParams, check_op, run_op_cell

HAS_COLPALI = importlib.util.find_spec("colpali_engine") is not None


def op_cell(tmp_path, **fields):
    values = dict(stack="op-colpali", head="inbatch", batch_size=4, reps=3, warmup=1, rotate=2, query_length=8,
                  doc_length=40, device="cpu", output=tmp_path / "op.json")  # fmt: skip
    values.update(fields)
    return run_op_cell(OpCellParams(**values))


@pytest.mark.colpali
def test_the_in_batch_head_is_timed_and_holds_exactly_colpalis_grid(tmp_path):
    result = op_cell(tmp_path)
    assert result.outcome == "ok" and result.preset == "op" and result.regime == "inbatch"
    assert len(result.step_times_sec) == 3 and result.steady_step_time_sec > 0
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
    grids = (4 * 3 + 4 + 4 * 4) * 8 * 40 * 2  # negatives, positives, in-batch term
    assert replay.predicted_grid_mib * MIB == grids and replay.predicted_saved_for_backward_mib is None
    assert replay.saved_for_backward_mib * MIB >= grids  # every vanilla grid is kept for its amax backward


@pytest.mark.pylate
def test_pylates_in_batch_scores_match_the_e2e_replay_prediction(tmp_path):
    result = op_cell(tmp_path, stack="op-pylate", query_length=6, doc_length=10)
    (replay,) = result.maxsim_calls_isolated
    assert replay.doc_shape == [4, 2, 10, 128] and replay.doc_mask_shape == [4, 2, 10] and replay.dtype == "float32"
    assert round(replay.saved_for_backward_mib * MIB) == round(replay.predicted_saved_for_backward_mib * MIB)


def test_bad_op_cells_are_refused_before_anything_runs(tmp_path):
    for fields, message in [
        (dict(head="negative-ce"), "needs negatives"),
        (dict(negatives=4), "no explicit negatives"),
        (dict(head="sideways"), "unknown head"),
        (dict(stack="op-pylate", head="negative-ce", negatives=2), "unknown head"),
        (dict(variant="flash"), "unknown variant 'flash'"),
    ]:
        with pytest.raises(CellError, match=message):
            op_cell(tmp_path, **fields)
    with pytest.raises(Exception, match="CUDA"):
        op_cell(tmp_path, stack="op-pylate", variant="lik")
    assert not (tmp_path / "op.json").exists()
    with pytest.raises(ValueError, match="unknown op stack"):
        check_op("colpali", "inbatch", None)
