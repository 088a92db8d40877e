"""The colpali stack: ColQwen2 + LoRA through colpali-engine's own training recipe.

One cell is built the way colpali-engine's users train (its ``scripts/configs/qwen2`` recipe):
``ColModelTrainingConfig`` (which wraps the model in LoRA) → ``ColModelTraining`` (which builds the
``VisualRetrieverCollator``) → ``ContrastiveTrainer`` with ``ColbertPairwiseCELoss()``. LoRA r=32,
alpha 32, dropout 0.1, gaussian init, bias none, FEATURE_EXTRACTION, on every projection of the
language model and on ``custom_text_proj`` (36,982,784 trainable parameters); bf16, sdpa
attention, non-reentrant gradient checkpointing, lr 5e-5, no warm-up, seed = data_seed, four
dataloader workers on CUDA (a cell's ``dataloader_workers`` sets fewer where the host's memory
binds: the workers collate on the host). The wrapped call site is the trainer's ``loss_func`` (the
loss module's forward: in-batch MaxSim plus the pairwise head on its [B, B] scores).

The backend is colpali-engine's own strict switch, ``COLPALI_SCORES_BACKEND=torch|lik``
(colpali-engine >= 0.3.17). On 0.3.16 (the ``colpali-0.3.16`` environment) vanilla is the
untouched library and lik is ``late_interaction_kernels.patch_colpali_engine()``; that release
also needs two trainer fixes under transformers 5.x, applied by :func:`trainer_class`.
"""

from __future__ import annotations

import torch

from harness.ops import ColpaliInBatchMaxSim
from harness.spec import STACKS
from harness.stacks import BuiltCell, colpali_data, colqwen2_model, measurement_arguments, release, switch_backend

NATIVE_SWITCH_SINCE = (0, 3, 17)
BACKEND_SWITCH = {"vanilla": "torch", "lik": "lik"}
LEARNING_RATE = 5e-5
DATALOADER_WORKERS = 4
LORA_TARGETS = "(.*(model).*(down_proj|gate_proj|up_proj|k_proj|q_proj|v_proj|o_proj).*$|.*(custom_text_proj).*$)"


def dataloader_workers(workers: int | None, device: torch.device) -> int:
    """The trainer's dataloader workers: the cell's where it names them, else the recipe's on CUDA and
    none on the CPU (where the tests run)."""
    if workers is not None:
        return workers
    return DATALOADER_WORKERS if device.type == "cuda" else 0


def colpali_version() -> tuple[int, ...]:
    return release("colpali-engine")


def select_backend(variant: str) -> str:
    """Switch colpali-engine to ``variant`` strictly; return how."""
    return switch_backend(variant, native=colpali_version() >= NATIVE_SWITCH_SINCE,
                          variable="COLPALI_SCORES_BACKEND", values=BACKEND_SWITCH, library="colpali_engine")  # fmt: skip


def lora_config():  # type: ignore[no-untyped-def]
    from peft import LoraConfig

    return LoraConfig(
        r=32,
        lora_alpha=32,
        lora_dropout=0.1,
        init_lora_weights="gaussian",
        bias="none",
        task_type="FEATURE_EXTRACTION",
        target_modules=LORA_TARGETS,
    )


def trainer_class():  # type: ignore[no-untyped-def]
    """colpali-engine's ``ContrastiveTrainer``; on 0.3.16 with the two fixes transformers 5.x needs.

    0.3.16's ``_get_train_sampler(self)`` takes no dataset (transformers 5 passes one), and its
    single-dataset path never sets the collator prefixes ``compute_loss`` reads. 0.3.17 fixed
    both the same way; on 0.3.17+ the class is used as is.
    """
    from colpali_engine.trainer.contrastive_trainer import ContrastiveTrainer

    if colpali_version() >= NATIVE_SWITCH_SINCE:
        return ContrastiveTrainer

    class PatchedContrastiveTrainer(ContrastiveTrainer):
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            collator = kwargs.get("data_collator")
            self.query_prefix = getattr(collator, "query_prefix", "query_")
            self.pos_prefix = getattr(collator, "pos_doc_prefix", "doc_")
            self.neg_prefix = getattr(collator, "neg_doc_prefix", "neg_doc_")

        def _get_train_sampler(self, dataset=None):  # type: ignore[no-untyped-def]
            if self.train_dataset_list is None:
                return super(ContrastiveTrainer, self)._get_train_sampler(dataset)
            return super()._get_train_sampler()

    return PatchedContrastiveTrainer


class ColpaliStack:
    name = "colpali"
    regimes = STACKS["colpali"].regimes
    presets = tuple(colqwen2_model.PRESETS)
    op = ColpaliInBatchMaxSim()

    def check(self, params) -> None:  # type: ignore[no-untyped-def]
        """Refuse, before any GPU work, real data with the offline processor."""
        if params.model_source is None and params.data_source not in (None, "synthetic"):
            # The offline tokenizer's merges are learned from the synthetic queries; real text would
            # split into about twice as many tokens as Qwen2's, and the grid would grow with it.
            raise ValueError(
                "real data (data_source) needs the real ColQwen2 processor: pass model_source='hub' or a checkpoint "
                "directory holding the processor; the offline processor only tokenizes the synthetic queries realistically."
            )

    def build(self, params, device: torch.device) -> BuiltCell:  # type: ignore[no-untyped-def]
        from colpali_engine.data.dataset import ColPaliEngineDataset
        from colpali_engine.loss.late_interaction_losses import ColbertPairwiseCELoss
        from colpali_engine.trainer.colmodel_training import ColModelTraining, ColModelTrainingConfig
        from transformers import TrainingArguments, set_seed

        select_backend(params.variant)
        set_seed(params.seed)
        model, processor, model_source = colqwen2_model.load(params.model_source, params.preset, params.seed, str(device))
        rows, data_source = colpali_data.load_train_set(params.data_source, params.batch_size * params.max_steps, params.seed)
        args = TrainingArguments(
            **measurement_arguments(params, device),
            learning_rate=LEARNING_RATE,
            gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            bf16=True,
            dataloader_num_workers=dataloader_workers(params.dataloader_workers, device),
        )
        config = ColModelTrainingConfig(
            model=model,
            processor=processor,
            train_dataset=ColPaliEngineDataset(rows, pos_target_column_name="image"),
            tr_args=args,
            output_dir=args.output_dir,
            run_eval=False,
            peft_config=lora_config(),
            loss_func=ColbertPairwiseCELoss(),
        )
        training = ColModelTraining(config)
        trainer = trainer_class()(
            model=training.model,
            train_dataset=training.train_dataset,
            eval_dataset=training.eval_dataset,
            args=config.tr_args,
            data_collator=training.collator,
            loss_func=config.loss_func,
            is_vision_model=True,
        )
        return BuiltCell(
            trainer=trainer,
            call_site_owner=trainer,
            call_site_attribute="loss_func",
            samples_per_step=params.batch_size,
            model_source=model_source,
            data_source=data_source,
        )


STACK = ColpaliStack()
