"""Training parity: does a backend train the same model? A traced cell records, per optimizer step,
the loss and the trainable parameters' gradient norm (both as the trainer itself computes them: the
step's returned loss, and the norm before clipping), and compares its first step's gradient and its
final trainable weights with those of the vanilla cell of the same stack, regime, batch, seed and
steps.

Cells run one per process, so the vanilla cell leaves its first gradient and final weights in a
reference store (``$MAXSIM_PARITY_DIR``, default ``runs/parity-reference/``; never committed: a
ColQwen2 LoRA gradient is tens of MB, a PyLate one hundreds) and every other backend's cell compares
with it when it finishes. A cell whose reference is not there yet says so instead of a comparison;
run the grid's vanilla cells first (the sweep does, and holds the others back until theirs has ended).

The gradient is compared at step 0, where every backend starts from the same weights and batch, so
the cosine measures the op's numerics alone (the gradient as backward left it, before the trainer
clips it); the final weights show where 50 steps of them lead.
Copies go straight to host memory, so the GPU's peaks are those of the untraced step.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
from transformers import TrainerCallback

from harness.results import Parity
from harness.spec import TrainSpec
from harness.spec import is_trace_reference as is_reference
from harness.spec import trace_reference_path as reference_path


def _host_vector(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors flattened into one float64 vector in host memory (no temporary on the device)."""
    return torch.cat([t.detach().to("cpu", copy=True).to(torch.float64).flatten() for t in tensors])


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class TrainingTrace(TrainerCallback):
    """A trainer callback with two wrappers of the trainer's own methods: ``training_step`` (the
    step's loss) and ``_get_grad_norm`` (the norm it clips from)."""

    def __init__(self) -> None:
        self.loss_per_step: list[float] = []
        self.grad_norm_per_step: list[float] = []
        self.first_grad: torch.Tensor | None = None
        self._step_loss = 0.0

    @contextlib.contextmanager
    def installed(self, trainer: Any) -> Iterator[None]:
        step, clip, norm = trainer.training_step, trainer._clip_grad_norm, trainer._get_grad_norm

        def training_step(*args: Any, **kwargs: Any) -> Any:
            loss = step(*args, **kwargs)
            self._step_loss += float(loss.detach().float())
            return loss

        def clip_grad_norm(model: torch.nn.Module) -> Any:
            self._keep_first_grad(model)  # before clipping scales it
            return clip(model)

        def get_grad_norm(*args: Any, **kwargs: Any) -> Any:
            value = norm(*args, **kwargs)
            self.grad_norm_per_step.append(float(value))
            return value

        trainer.training_step, trainer._clip_grad_norm, trainer._get_grad_norm = training_step, clip_grad_norm, get_grad_norm
        trainer.add_callback(self)
        try:
            yield
        finally:
            trainer.training_step, trainer._clip_grad_norm, trainer._get_grad_norm = step, clip, norm

    def _keep_first_grad(self, model: torch.nn.Module) -> None:
        if self.first_grad is None:
            self.first_grad = _host_vector([p.grad for p in trainable(model) if p.grad is not None])

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        if model is not None:  # without clipping (max_grad_norm 0) the first gradient is kept here
            self._keep_first_grad(model)

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.loss_per_step.append(self._step_loss)
        self._step_loss = 0.0

    def finish(self, spec: TrainSpec, model: torch.nn.Module) -> Parity:
        """Write the reference (the vanilla cell) or compare with it (every other backend)."""
        final = _host_vector(list(trainable(model)))
        path = reference_path(spec)
        if self.first_grad is None:
            return Parity(reference=path.name, note="no optimizer step was taken: nothing to compare")
        if is_reference(spec):
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", suffix=".pt", delete=False) as handle:
                torch.save({"cell_id": spec.cell_id, "first_grad": self.first_grad, "final": final}, handle)
            os.replace(handle.name, path)
            return Parity(reference=path.name, reference_cell_id=spec.cell_id, note="the reference: vanilla itself")
        if not path.exists():
            return Parity(reference=path.name, note=f"no reference at {path}: the vanilla cell has not run here yet")
        saved = torch.load(path, weights_only=True)
        return compare(self.first_grad, final, saved["first_grad"], saved["final"], path.name, saved["cell_id"])


def compare(first_grad: torch.Tensor, final: torch.Tensor, reference_grad: torch.Tensor, reference_final: torch.Tensor,
            reference: str, reference_cell_id: str) -> Parity:  # fmt: skip
    """A backend's first gradient and final weights against the reference's (float64 vectors)."""
    if first_grad.shape != reference_grad.shape or final.shape != reference_final.shape:
        return Parity(reference=reference, reference_cell_id=reference_cell_id,
                      note=f"trainable parameters differ in size: {final.numel()} vs {reference_final.numel()}")  # fmt: skip
    cosine = float(torch.nn.functional.cosine_similarity(first_grad, reference_grad, dim=0))
    norm_ratio = float(first_grad.norm() / reference_grad.norm())
    difference = final - reference_final
    return Parity(
        reference=reference, reference_cell_id=reference_cell_id, first_grad_cosine=cosine, first_grad_norm_ratio=norm_ratio,
        first_grad_rel_diff=float((first_grad - reference_grad).norm() / reference_grad.norm()),
        final_weight_max_abs_diff=float(difference.abs().max()),
        final_weight_rel_diff=float(difference.norm() / reference_final.norm()),
    )  # fmt: skip
