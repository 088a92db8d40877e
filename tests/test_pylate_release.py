"""The backend switch matches the installed PyLate release (run in the pylate and pylate-1.5 environments)."""

import os

import pytest

from harness.cell import CellError, run_cell
from harness.spec import TrainSpec

pytest.importorskip("pylate", reason="needs the pylate or pylate-1.5 environment")
from harness.stacks import pylate as stack  # noqa: E402

pytestmark = [pytest.mark.pylate, pytest.mark.release]
NATIVE = stack.pylate_version() >= stack.NATIVE_SWITCH_SINCE


@pytest.mark.skipif(not NATIVE, reason="PyLate < 1.5.1 has no native switch")
@pytest.mark.parametrize("variant, value", [("vanilla", "torch"), ("lik", "lik"), ("flash", "flash")])
def test_native_releases_switch_strictly_through_pylates_own_variable(monkeypatch, variant, value):
    monkeypatch.delenv("PYLATE_SCORES_BACKEND", raising=False)
    assert stack.select_backend(variant) == f"PYLATE_SCORES_BACKEND={value}"
    assert os.environ["PYLATE_SCORES_BACKEND"] == value


@pytest.mark.skipif(NATIVE, reason="only PyLate < 1.5.1 is patched")
def test_older_releases_patch_for_lik_and_stay_untouched_for_vanilla():
    import late_interaction_kernels.pylate_compat as compat
    import pylate.scores as scores

    assert stack.select_backend("lik") == "late_interaction_kernels.patch_pylate()"
    assert scores.colbert_scores is compat.patched_colbert_scores
    assert stack.select_backend("vanilla") == "untouched library"
    assert scores.colbert_scores is not compat.patched_colbert_scores
    assert "PYLATE_SCORES_BACKEND" not in os.environ


@pytest.mark.skipif(NATIVE, reason="flash runs on PyLate >= 1.5.1")
def test_older_releases_refuse_flash_before_building_anything(tmp_path):
    spec = TrainSpec(stack="pylate", regime="plain", batch_size=4, variant="flash", preset="tiny", device="cpu")
    with pytest.raises(CellError, match="variant 'flash' needs PyLate >= 1.5.1"):
        run_cell(spec, tmp_path / "cell.json")
    assert not (tmp_path / "cell.json").exists()
