"""The PyLate stack: GTE-ModernColBERT + Contrastive through SentenceTransformerTrainer.

One cell is built the way PyLate's users train: ``pylate.models.ColBERT``,
``losses.Contrastive(model, score_mini_batch_size=None|N)``, ``SentenceTransformerTrainer`` with
``ColBERTCollator(model.tokenize)``, bf16 on CUDA, lr 3e-6, no warm-up, seed = data_seed.
Regimes: ``plain`` (the canonical recipe), ``grad-checkpoint`` (non-reentrant gradient
checkpointing enabled on the HF encoder, the regime where the score grid binds before the
encoder's activations) and ``gradcache`` (``losses.CachedContrastive(model, mini_batch_size,
score_mini_batch_size)``: the encoder's activations stop growing with the batch, so the score grid
of each query chunk against every document is what grows). The wrapped call site is the loss's
``score_metric``: with chunking each query chunk is its own call. The backend is PyLate's own
strict switch, ``PYLATE_SCORES_BACKEND`` (PyLate >= 1.5.1); on older releases (the ``pylate-1.5``
environment) vanilla is the untouched library and lik is ``late_interaction_kernels.patch_pylate()``;
flash needs the native switch. Data-parallel cells (``world_size`` > 1, launched with torchrun by
:mod:`harness.ranks`) train under the Trainer's DDP; ``gather`` turns on the loss's
``gather_across_devices``: every rank scores its queries against all ranks' documents.
"""

from __future__ import annotations

import torch

from harness.ops import PylateColbertScores
from harness.spec import GRADCACHE, GRADCACHE_MINI_BATCH, STACKS
from harness.stacks import BuiltCell, measurement_arguments, msmarco, pylate_model, release, switch_backend

BACKEND_SWITCH = {"vanilla": "torch", "lik": "lik", "flash": "flash"}
NATIVE_SWITCH_SINCE = (1, 5, 1)
LEARNING_RATE = 3e-6


def pylate_version() -> tuple[int, ...]:
    return release("pylate")


def select_backend(variant: str) -> str:
    """Switch PyLate to ``variant`` strictly; return how."""
    return switch_backend(variant, native=pylate_version() >= NATIVE_SWITCH_SINCE,
                          variable="PYLATE_SCORES_BACKEND", values=BACKEND_SWITCH, library="pylate")  # fmt: skip


class PylateStack:
    name = "pylate"
    regimes = STACKS["pylate"].regimes
    presets = tuple(pylate_model.PRESETS)
    op = PylateColbertScores()

    def check(self, params) -> None:  # type: ignore[no-untyped-def]
        """Refuse, before any GPU work, a variant this PyLate release cannot run."""
        if params.variant == "flash" and pylate_version() < NATIVE_SWITCH_SINCE:
            found = ".".join(map(str, pylate_version()))
            raise ValueError(
                f"variant 'flash' needs PyLate >= 1.5.1 (its native backend switch); this environment has pylate "
                f"{found}. Use the pylate environment (python tools/envs.py create pylate)."
            )

    def build(self, params, device: torch.device) -> BuiltCell:  # type: ignore[no-untyped-def]
        from pylate import losses, utils
        from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
        from transformers import set_seed

        select_backend(params.variant)
        set_seed(params.seed)
        model, model_source = pylate_model.load(params.model_source, params.preset, params.seed, str(device))
        if params.regime == "grad-checkpoint":
            model[0].auto_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        dataset, data_source = msmarco.load_triplets(params.data_source, params.batch_size * params.max_steps, params.seed)
        loss: losses.Contrastive | losses.CachedContrastive
        if params.regime == GRADCACHE:
            # GradCache: embeddings without a graph first, the loss scored per query chunk (a backward per
            # chunk, into cached embedding gradients), then the encoder again per mini-batch with its graph.
            loss = losses.CachedContrastive(model=model, mini_batch_size=params.mini_batch_size or GRADCACHE_MINI_BATCH,
                                            score_mini_batch_size=params.score_mini_batch_size,
                                            gather_across_devices=params.gather)  # fmt: skip
        else:
            loss = losses.Contrastive(model=model, score_mini_batch_size=params.score_mini_batch_size,
                                      gather_across_devices=params.gather)  # fmt: skip
        args = SentenceTransformerTrainingArguments(
            **measurement_arguments(params, device),
            learning_rate=LEARNING_RATE,
            bf16=device.type == "cuda",
            dataloader_num_workers=0,
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            loss=loss,
            data_collator=utils.ColBERTCollator(model.tokenize),
        )
        return BuiltCell(
            trainer=trainer,
            call_site_owner=loss,
            call_site_attribute="score_metric",
            samples_per_step=params.batch_size,
            model_source=model_source,
            data_source=data_source,
        )


STACK = PylateStack()
