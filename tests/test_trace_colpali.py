"""Training parity (harness.trace) on the CPU: ColQwen2's tiny model through colpali-engine's trainer."""

from __future__ import annotations

import pytest
import torch

from harness import trace
from harness.cell import run_cell
from harness.spec import TrainSpec

pytestmark = pytest.mark.colpali


def test_a_traced_colqwen2_cell_keeps_its_lora_gradient_as_the_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXSIM_PARITY_DIR", str(tmp_path / "store"))
    spec = TrainSpec(stack="colpali", regime="plain", batch_size=2, steps=2, preset="tiny", device="cpu", trace=True)
    result = run_cell(spec, tmp_path / "cell.json")
    assert result.outcome == "ok" and len(result.loss_per_step) == len(result.grad_norm_per_step) == 2
    saved = torch.load(tmp_path / "store" / f"{trace.reference_key(spec)}.pt", weights_only=True)
    # only the LoRA adapters train: the kept vectors are theirs, and the first is the unclipped gradient
    assert float(saved["first_grad"].norm()) == pytest.approx(result.grad_norm_per_step[0], rel=1e-4)
    assert 0 < saved["final"].numel() < 10_000_000
