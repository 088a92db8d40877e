"""Our vanilla replays compute exactly what the libraries compute (run in each stack's environment)."""

import importlib

import pytest
import torch

from harness.ops import ColpaliInBatchMaxSim, OpShape, PylateColbertScores


@pytest.mark.colpali
def test_colpali_vanilla_is_colpali_engines_own_torch_path(monkeypatch):
    maxsim = importlib.import_module("colpali_engine.utils.maxsim")
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")
    op = ColpaliInBatchMaxSim()
    inputs = op.make_inputs(OpShape((5, 7, 16), (6, 19, 16), "float32"), torch.device("cpu"), torch.Generator().manual_seed(1))
    ours = op.forward("vanilla", inputs)
    theirs = maxsim.maxsim_inbatch(inputs["query"], inputs["doc"])
    assert ours.shape == (5, 6)
    assert torch.equal(ours, theirs)


@pytest.mark.pylate
@pytest.mark.parametrize("with_query_mask", [False, True])
def test_pylate_vanilla_is_colbertscores_torch_path(with_query_mask):
    scores = importlib.import_module("pylate.scores")
    op = PylateColbertScores()
    shape = OpShape((4, 6, 16), (3, 2, 11, 16), "float32",
                    query_mask_shape=(4, 6) if with_query_mask else None, doc_mask_shape=(3, 2, 11))  # fmt: skip
    inputs = op.make_inputs(shape, torch.device("cpu"), torch.Generator().manual_seed(2))
    inputs["doc_mask"][0, 1, 5:] = False  # a real skiplist/padding pattern, not all-True
    if with_query_mask:
        inputs["query_mask"][2, 4:] = False
    ours = op.forward("vanilla", inputs)
    from harness.stacks.pylate import select_backend

    select_backend("vanilla")  # PyLate's own torch path: its strict switch, or the untouched older release
    theirs = scores.ColBERTScores()(
        inputs["query"], inputs["doc"], queries_mask=inputs.get("query_mask"), documents_mask=inputs["doc_mask"]
    )
    assert ours.shape == (4, 6)
    assert torch.equal(ours, theirs)
