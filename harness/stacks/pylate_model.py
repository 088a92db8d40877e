"""The GTE-ModernColBERT-v1 model for the PyLate stack: offline by default, any checkpoint when given.

Offline, the published architecture is rebuilt with random weights (values change neither memory
nor FLOPs): ModernBERT-base from the config shipped beside this file (22 layers, hidden 768,
GeGLU 1152, 149,014,272 parameters), a WordPiece tokenizer with ModernBERT's special-token ids
(:mod:`harness.stacks.lexicon`), then ``pylate.models.ColBERT`` adds the Dense 768→128 projection
without bias and the ``[Q] ``/``[D] `` prefixes as tokens 50368/50369, forces padding to
``[MASK]`` for query expansion and skips ASCII punctuation.

Building ColBERT from a bare backbone resizes the embeddings on every load, so the model is built
once, saved, and every cell loads the saved directory, as users load a published checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import string
from pathlib import Path
from typing import Any

from harness.stacks import lexicon

CONFIGS = Path(__file__).resolve().parent / "configs"
QUERY_LENGTH = 48
DOCUMENT_LENGTH = 300
EMBEDDING_SIZE = 128
HUB_MODEL = "lightonai/GTE-ModernColBERT-v1"


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    description: str
    config_overrides: dict[str, int]


PRESETS = {
    "full": Preset("full", "GTE-ModernColBERT-v1: ModernBERT-base, 149M parameters", {}),
    "tiny": Preset(
        "tiny",
        "the same architecture at toy width for CPU tests (2 layers, hidden 64)",
        {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4},
    ),
}


def cache_dir() -> Path:
    """Where built models are kept: ``$MAXSIM_CACHE`` or ``.cache/`` in this checkout."""
    return Path(os.environ.get("MAXSIM_CACHE", Path(__file__).resolve().parents[2] / ".cache"))


def build_tokenizer():  # type: ignore[no-untyped-def]
    """A fast WordPiece tokenizer with ModernBERT's 50,368-entry id layout and specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = lexicon.vocabulary()
    core = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", lexicon.SPECIALS["[CLS]"]), ("[SEP]", lexicon.SPECIALS["[SEP]"])],
    )
    core.add_special_tokens(list(lexicon.SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_max_length=8192,
    )


def backbone_config(preset: Preset):  # type: ignore[no-untyped-def]
    from transformers import ModernBertConfig

    values = json.loads((CONFIGS / "gte-moderncolbert-v1" / "config.json").read_text())
    values.update(preset.config_overrides)
    return ModernBertConfig.from_dict(values)


def colbert_options() -> dict[str, Any]:
    """The published GTE-ModernColBERT-v1 settings the report measured with."""
    return dict(
        query_prefix="[Q] ",
        document_prefix="[D] ",
        query_length=QUERY_LENGTH,
        document_length=DOCUMENT_LENGTH,
        embedding_size=EMBEDDING_SIZE,
        bias=False,
        do_query_expansion=True,
        attend_to_expansion_tokens=False,
        skiplist_words=list(string.punctuation),
    )


def materialize(preset_name: str, seed: int) -> Path:
    """Build (once) and save the offline model; return the directory ColBERT loads from."""
    import torch
    from pylate import models
    from transformers import ModernBertModel

    preset = PRESETS[preset_name]
    target = cache_dir() / "models" / f"gte-moderncolbert-v1-{preset.name}-random-seed{seed}"
    if (target / "modules.json").exists():
        return target
    # Built in a folder of this process's own, then renamed into place: cells starting at once on
    # several GPUs may all build it; the first rename wins and the others discard their copy.
    staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
    backbone = staging / "backbone"
    torch.manual_seed(seed)
    ModernBertModel(backbone_config(preset)).save_pretrained(backbone)
    build_tokenizer().save_pretrained(backbone)
    model = models.ColBERT(str(backbone), device="cpu", **colbert_options())
    model.save(str(staging / "colbert"))
    try:
        (staging / "colbert").rename(target)
    except OSError:
        if not (target / "modules.json").exists():
            raise
    shutil.rmtree(staging, ignore_errors=True)
    return target


def load(source: str | None, preset_name: str, seed: int, device: str):  # type: ignore[no-untyped-def]
    """The ColBERT model to train and a description of where it came from.

    ``source`` None: the offline model of ``preset_name``. ``"hub"``: the published checkpoint.
    Anything else: a hub id or a local checkpoint directory.
    """
    from pylate import models

    if source is None:
        path = materialize(preset_name, seed)
        return models.ColBERT(str(path), device=device), f"offline:{path.name}"
    name = HUB_MODEL if source == "hub" else source
    options = {k: v for k, v in colbert_options().items() if k in ("query_length", "document_length")}
    return models.ColBERT(name, device=device, **options), f"{'local' if Path(name).exists() else 'hub'}:{name}"
