"""Our vanilla replays compute exactly what the libraries compute (run in each stack's environment)."""

import importlib
import importlib.util

import pytest
import torch

from harness.ops import ColpaliInBatchMaxSim, OpShape, PylateColbertScores

pytestmark = pytest.mark.release


@pytest.mark.colpali
def test_colpali_vanilla_is_colpali_engines_own_torch_path(monkeypatch):
    losses = importlib.import_module("colpali_engine.loss.late_interaction_losses")
    op = ColpaliInBatchMaxSim()
    inputs = op.make_inputs(OpShape((5, 7, 16), (5, 19, 16), "float32"), torch.device("cpu"), torch.Generator().manual_seed(1))
    ours = op.forward("vanilla", inputs)
    if importlib.util.find_spec("colpali_engine.utils.maxsim"):  # 0.3.17+: the dispatcher's torch path
        monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")
        theirs = importlib.import_module("colpali_engine.utils.maxsim").maxsim_inbatch(inputs["query"], inputs["doc"])
    else:  # 0.3.16: the loss's own einsum and amax/sum aggregation, captured as the loss runs
        captured = []
        aggregate = losses.ColbertPairwiseCELoss._aggregate
        monkeypatch.setattr(losses.ColbertPairwiseCELoss, "_aggregate",
                            lambda self, *a, **k: captured.append(aggregate(self, *a, **k)) or captured[-1])  # fmt: skip
        losses.ColbertPairwiseCELoss(normalize_scores=False)(inputs["query"], inputs["doc"])
        (theirs,) = captured
    assert ours.shape == (5, 5)
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
