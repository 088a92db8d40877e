"""Training parity (harness.trace) on the CPU: PyLate's tiny model, vanilla against its own chunking."""

from __future__ import annotations

import pytest
import torch

from harness import trace
from harness.cell import run_cell
from harness.spec import TrainSpec

pytestmark = pytest.mark.pylate
FIELDS = dict(stack="pylate", regime="plain", batch_size=6, steps=3, preset="tiny", device="cpu", trace=True)


def test_a_traced_backend_is_compared_with_the_vanilla_cell_of_its_batch_and_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXSIM_PARITY_DIR", str(tmp_path / "store"))
    vanilla = run_cell(TrainSpec(**FIELDS), tmp_path / "vanilla.json")
    assert len(vanilla.loss_per_step) == len(vanilla.grad_norm_per_step) == 3
    assert all(loss > 0 for loss in vanilla.loss_per_step) and all(norm > 0 for norm in vanilla.grad_norm_per_step)
    assert vanilla.parity.reference_cell_id == vanilla.cell_id and vanilla.parity.first_grad_cosine is None
    assert trace.reference_path(vanilla.spec).parent == tmp_path / "store"
    saved = torch.load(trace.reference_path(vanilla.spec), weights_only=True)
    assert saved["first_grad"].dtype == torch.float64 and saved["first_grad"].numel() == saved["final"].numel()
    assert float(saved["first_grad"].norm()) == pytest.approx(vanilla.grad_norm_per_step[0], rel=1e-5)

    chunked = run_cell(TrainSpec(**FIELDS, score_mini_batch_size=4), tmp_path / "chunked.json")
    parity = chunked.parity
    assert parity.reference_cell_id == vanilla.cell_id
    # the same math in another order, in fp32: the same gradient and the same model, to rounding
    assert parity.first_grad_cosine == pytest.approx(1.0, abs=1e-6)
    assert parity.first_grad_norm_ratio == pytest.approx(1.0, abs=1e-5)
    assert parity.final_weight_rel_diff < 1e-5
    assert chunked.loss_per_step == pytest.approx(vanilla.loss_per_step, rel=1e-5)


def test_the_comparison_measures_direction_and_size():
    reference = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    final = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)
    turned = trace.compare(torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), final + 0.3, reference, final, "r", "v")
    assert turned.first_grad_cosine == pytest.approx(2**-0.5) and turned.first_grad_norm_ratio == pytest.approx(2**0.5)
    assert turned.final_weight_max_abs_diff == pytest.approx(0.3)
    assert turned.final_weight_rel_diff == pytest.approx(0.3 * 3**0.5 / 3)
    other = trace.compare(torch.ones(2, dtype=torch.float64), final, reference, final, "r", "v")
    assert other.first_grad_cosine is None and "differ in size" in other.note



def test_a_backend_traced_before_its_reference_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXSIM_PARITY_DIR", str(tmp_path / "store"))
    traced = trace.TrainingTrace()
    traced.first_grad = torch.ones(3, dtype=torch.float64)
    model = torch.nn.Linear(1, 1)
    parity = traced.finish(TrainSpec(**FIELDS, variant="vanilla", score_mini_batch_size=4), model)
    assert parity.first_grad_cosine is None and parity.note.startswith("no reference at ")  # said, not guessed
    assert not (tmp_path / "store").exists()  # only the reference cell writes there


def test_the_command_line_turns_tracing_on_with_a_flag():
    from harness import cli

    assert cli.build_parser().parse_args(["cell", "--stack", "pylate", "--trace"]).trace is True
    assert cli.build_parser().parse_args(["cell", "--stack", "pylate"]).trace is False
