"""The backend switch and trainer match the installed colpali-engine release (colpali and colpali-0.3.16 environments)."""

import inspect
import os

import pytest

pytest.importorskip("colpali_engine", reason="needs the colpali or colpali-0.3.16 environment")
from harness.stacks import colpali as stack  # noqa: E402

pytestmark = [pytest.mark.colpali, pytest.mark.release]
NATIVE = stack.colpali_version() >= stack.NATIVE_SWITCH_SINCE


@pytest.mark.skipif(not NATIVE, reason="colpali-engine < 0.3.17 has no native switch")
@pytest.mark.parametrize("variant, value", [("vanilla", "torch"), ("lik", "lik")])
def test_native_releases_switch_strictly_through_colpalis_own_variable(monkeypatch, variant, value):
    monkeypatch.delenv("COLPALI_SCORES_BACKEND", raising=False)
    assert stack.select_backend(variant) == f"COLPALI_SCORES_BACKEND={value}"
    assert os.environ["COLPALI_SCORES_BACKEND"] == value
    from colpali_engine.trainer.contrastive_trainer import ContrastiveTrainer

    assert stack.trainer_class() is ContrastiveTrainer  # 0.3.17+ carries both trainer fixes itself


@pytest.mark.skipif(NATIVE, reason="only colpali-engine < 0.3.17 is patched")
def test_older_releases_patch_for_lik_and_stay_untouched_for_vanilla():
    from colpali_engine.loss.late_interaction_losses import ColbertPairwiseCELoss

    original = ColbertPairwiseCELoss.forward
    assert stack.select_backend("lik") == "late_interaction_kernels.patch_colpali_engine()"
    assert ColbertPairwiseCELoss.forward is not original
    assert stack.select_backend("vanilla") == "untouched library"
    assert ColbertPairwiseCELoss.forward is original
    assert "COLPALI_SCORES_BACKEND" not in os.environ


@pytest.mark.skipif(NATIVE, reason="only colpali-engine < 0.3.17 needs the trainer fixes")
def test_older_releases_get_the_two_trainer_fixes_transformers_5_needs():
    trainer = stack.trainer_class()
    assert trainer.__name__ == "PatchedContrastiveTrainer"
    assert "dataset" in inspect.signature(trainer._get_train_sampler).parameters  # transformers 5 passes it
