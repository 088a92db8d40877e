"""A tiny stack for CPU tests of the cell runner: a real transformers.Trainer, a toy two-tower
encoder and colpali-engine's in-batch MaxSim as the loss head (the wrapped call site).

It stands in for the colpali stack (``name = "colpali"``, its op is colpali's in-batch MaxSim), so
the cells it builds are described by ordinary ``TrainSpec(stack="colpali", ...)`` specs and pass
the spec's own checks; ``run_cell(spec, output, stack=ToyStack())`` builds it instead of the real one.

It can be told to raise ``torch.OutOfMemoryError`` inside the MaxSim head or in the encoder at a
given step, to exercise OOM-as-outcome without a GPU.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

from harness.ops import ColpaliInBatchMaxSim
from harness.stacks import BuiltCell, scratch_output_dir

QUERY_LENGTH, DOC_LENGTH, DIM, VOCAB = 6, 20, 16, 50
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 56.25 GiB. GPU 0 has a total capacity of 79.19 GiB\n"
    "Of the allocated memory 40.00 GiB is allocated by PyTorch"
)


class ToyEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.proj = nn.Linear(32, DIM, bias=False)
        self.oom_at_step: int | None = None
        self.step = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.oom_at_step is not None and self.step == self.oom_at_step:
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        return nn.functional.normalize(self.proj(self.embed(ids)), dim=-1)


class MaxSimHead(nn.Module):
    """Pairwise in-batch loss on colpali-engine's vanilla scores: forward(query, doc) is the call site."""

    def __init__(self) -> None:
        super().__init__()
        self.oom_at_step: int | None = None
        self.step = 0

    def forward(self, query_embeddings: torch.Tensor, doc_embeddings: torch.Tensor) -> torch.Tensor:
        if self.oom_at_step is not None and self.step == self.oom_at_step:
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        scores = torch.einsum("bnd,csd->bcns", query_embeddings, doc_embeddings).amax(dim=3).sum(dim=2)
        return nn.functional.cross_entropy(scores, torch.arange(scores.shape[0], device=scores.device))


class ToyTrainer(Trainer):
    def __init__(self, *args, head: MaxSimHead, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.head = head

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        query = model(inputs["query_ids"])
        doc = model(inputs["doc_ids"])
        loss = self.head(query, doc)
        model.step += 1
        self.head.step += 1
        return loss


@dataclasses.dataclass
class ToyStack:
    """Implements harness.stacks.Stack; ``builds`` counts how often build() ran, ``specs`` what it was given."""

    oom_in_head_at_step: int | None = None
    oom_in_encoder_at_step: int | None = None
    name: str = "colpali"
    regimes: tuple[str, ...] = ("plain",)
    presets: tuple[str, ...] = ("tiny", "full")
    op: ColpaliInBatchMaxSim = dataclasses.field(default_factory=ColpaliInBatchMaxSim)
    builds: int = 0
    specs: list = dataclasses.field(default_factory=list)

    def check(self, spec):  # type: ignore[no-untyped-def]
        return None

    def build(self, spec, device):  # type: ignore[no-untyped-def]
        self.builds += 1
        self.specs.append(spec)
        torch.manual_seed(spec.seed)
        generator = torch.Generator().manual_seed(spec.seed)
        n_rows = spec.batch_size * spec.max_steps
        rows = [
            {
                "query_ids": torch.randint(0, VOCAB, (QUERY_LENGTH,), generator=generator),
                "doc_ids": torch.randint(0, VOCAB, (DOC_LENGTH,), generator=generator),
            }
            for _ in range(n_rows)
        ]
        encoder, head = ToyEncoder(), MaxSimHead()
        encoder.oom_at_step = self.oom_in_encoder_at_step
        head.oom_at_step = self.oom_in_head_at_step
        args = TrainingArguments(
            output_dir=scratch_output_dir("toy-trainer-"),
            max_steps=spec.max_steps,
            per_device_train_batch_size=spec.batch_size,
            learning_rate=1e-3,
            use_cpu=device.type == "cpu",
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            remove_unused_columns=False,
            dataloader_num_workers=0,
            seed=spec.seed,
            data_seed=spec.seed,
            disable_tqdm=True,
        )
        trainer = ToyTrainer(model=encoder, args=args, train_dataset=rows, head=head)
        return BuiltCell(
            trainer=trainer,
            call_site_owner=head,
            call_site_attribute="forward",
            samples_per_step=spec.batch_size,
            model_source="toy:random",
            data_source="toy:random-ids",
        )


def first_batches(stack: str, batch_size: int, steps: int, seed: int, keys: Callable[[str], bool], n: int = 2) -> list:
    """The first ``n`` batches a tiny CPU cell of ``stack`` would train on, drawn by the stack's own
    trainer (its sampler, collator and dataset), as the lists of the batch entries ``keys`` selects."""
    from harness.spec import make_spec
    from harness.stacks import load_stack

    spec = make_spec(dict(stack=stack, batch_size=batch_size, variant="vanilla", steps=steps, seed=seed, preset="tiny",
                          device="cpu"))  # fmt: skip
    loader = load_stack(stack).build(spec, torch.device("cpu")).trainer.get_train_dataloader()
    drawn = [batch for batch, _ in zip(loader, range(n), strict=False)]
    return [[batch[key].tolist() for key in sorted(batch) if keys(key)] for batch in drawn]


def run_in_a_fresh_process(output: Path, env: dict[str, str], **spec_fields: object) -> subprocess.CompletedProcess[str]:
    """A toy cell run as the launcher runs one: in a fresh Python process, with ``env`` (CUDA not
    started yet, so its allocator setting and temporary directory are its own); its result at ``output``."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from harness.cell import run_cell\n"
        "from harness.spec import TrainSpec\n"
        "from toy_stack import ToyStack\n"
        f"spec = TrainSpec(**{spec_fields!r})\n"
        "result = run_cell(spec, Path(sys.argv[1]), stack=ToyStack())\n"
        "assert result.outcome == 'ok', result.outcome\n"
    )
    tests = str(Path(__file__).parent)
    env = env | {"PYTHONPATH": os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", script, str(output)], env=env, capture_output=True, text=True, timeout=300)
