"""ColQwen2 for the colpali stack: offline by default, any checkpoint when given.

Offline, the published ``vidore/colqwen2-base`` architecture is built with random weights (values
change neither memory nor FLOPs) from the config shipped beside this file: Qwen2-VL-2B (28 text
layers, hidden 1536, GQA 12/2 heads, 32-block ViT, model vocabulary 151,936) plus colpali-engine's
``custom_text_proj`` to 128 dimensions — 2,209,182,336 parameters.

The processor is built offline too and saved like a hub checkpoint, so every cell loads it through
``ColQwen2Processor.from_pretrained(dir, max_num_visual_tokens=768)`` — the only call that applies
the 768 visual-token cap. Its tokenizer is Qwen2's (the same pre-tokenizer regex and byte-level
BPE) with a vocabulary learned from the synthetic query text (:mod:`harness.stacks.colpali_data`),
padded to Qwen2's 151,643 regular entries, and the fourteen specials at their real ids
151643–151656, so the prompt layout tokenizes as with the hub processor: 11 prompt tokens around a
page's visual tokens, queries ~4.2 characters per token plus the 10 ``<|endoftext|>`` augmentation
tokens colpali-engine's collator appends.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parent / "configs"
HUB_MODEL = "vidore/colqwen2-base"
MAX_NUM_VISUAL_TOKENS = 768
REGULAR_VOCAB = 151643  # Qwen2's byte-level BPE entries; the specials follow
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)  # ids 151643 … 151656, in this order
PROCESSOR_BUILD = 2  # bump when the tokenizer, its corpus or the image processor changes: a new cache entry
LEARNED_MERGES_VOCAB = 8000  # BPE entries learned from the synthetic text before padding
# Qwen2-VL's preprocessor_config.json: the pixel range before colpali-engine's cap.
IMAGE_PROCESSOR = dict(
    size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384},
    patch_size=14,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    description: str
    text_overrides: dict[str, Any]
    vision_overrides: dict[str, Any]


PRESETS = {
    "full": Preset("full", "colqwen2-base: Qwen2-VL-2B + 128-d projection, 2,209,182,336 parameters", {}, {}),
    "tiny": Preset(
        "tiny",
        "the same architecture at toy width for CPU tests (2 text layers, hidden 64; 2 vision blocks)",
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "max_window_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        },
        {"depth": 2, "embed_dim": 32, "num_heads": 2, "hidden_size": 64},
    ),
}


def cache_dir() -> Path:
    """Where built processors are kept: ``$MAXSIM_CACHE`` or ``.cache/`` in this checkout."""
    return Path(os.environ.get("MAXSIM_CACHE", Path(__file__).resolve().parents[2] / ".cache"))


def model_config(preset_name: str):  # type: ignore[no-untyped-def]
    """The Qwen2-VL config of ``preset_name``, read the way ``from_pretrained`` reads the hub's."""
    from transformers import Qwen2VLConfig

    preset = PRESETS[preset_name]
    values = json.loads((CONFIGS / "colqwen2-base" / "config.json").read_text())
    values.update(preset.text_overrides)
    values["vision_config"] = {**values["vision_config"], **preset.vision_overrides}
    return Qwen2VLConfig.from_dict(values)


def build_model(preset_name: str, seed: int, device: str):  # type: ignore[no-untyped-def]
    """ColQwen2 with random weights, in bf16 on ``device`` (as ``from_pretrained(dtype=bf16)`` gives)."""
    import torch
    from colpali_engine.models import ColQwen2

    torch.manual_seed(seed)
    config = model_config(preset_name)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        return ColQwen2._from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()


def build_tokenizer(seed: int = 0):  # type: ignore[no-untyped-def]
    """Qwen2's tokenizer with a vocabulary learned from the synthetic query text, specials at their ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from harness.stacks import colpali_data

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNED_MERGES_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    learner.train_from_iterator(colpali_data.tokenizer_corpus(seed), trainer=trainer)
    learned = json.loads(learner.to_str())["model"]
    vocab: dict[str, int] = dict(learned["vocab"])
    merges = [tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in learned["merges"]]
    # Qwen2 has 151,643 regular entries; the unlearned ones are never produced (no merge reaches them).
    for index in range(len(vocab), REGULAR_VOCAB):
        vocab[f"<|unlearned_{index}|>"] = index
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=32768)
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS[1:]])
    ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    expected = list(range(REGULAR_VOCAB, REGULAR_VOCAB + len(SPECIAL_TOKENS)))
    if ids != expected:
        raise RuntimeError(f"offline Qwen2 specials landed at {ids}, expected {expected}.")
    return tokenizer


def materialize_processor(seed: int = 0) -> Path:
    """Build (once) and save the offline ColQwen2 processor; return its directory."""
    from colpali_engine.models import ColQwen2Processor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    target = cache_dir() / "processors" / f"colqwen2-offline-v{PROCESSOR_BUILD}-seed{seed}"
    if (target / "processor_config.json").exists() or (target / "preprocessor_config.json").exists():
        return target
    staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
    processor = ColQwen2Processor(
        image_processor=Qwen2VLImageProcessor(**IMAGE_PROCESSOR),
        tokenizer=build_tokenizer(seed),
        video_processor=Qwen2VLVideoProcessor(),
    )
    processor.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:
        if not target.exists():
            raise
    shutil.rmtree(staging, ignore_errors=True)
    return target


def load_processor(path: str | Path):  # type: ignore[no-untyped-def]
    """The processor as colpali-engine's recipe loads it: ``from_pretrained`` with the 768 cap."""
    from colpali_engine.models import ColQwen2Processor

    return ColQwen2Processor.from_pretrained(str(path), max_num_visual_tokens=MAX_NUM_VISUAL_TOKENS)


def load(source: str | None, preset_name: str, seed: int, device: str):  # type: ignore[no-untyped-def]
    """(model, processor, description of the source).

    ``source`` None: the offline model of ``preset_name`` and the offline processor. ``"hub"``: the
    published ``vidore/colqwen2-base``. Anything else: a hub id or a local checkpoint directory
    holding the model and its processor files.
    """
    if source is None:
        return build_model(preset_name, seed, device), load_processor(materialize_processor()), (
            f"offline:colqwen2-base-{preset_name}-random-seed{seed}"
        )
    import torch
    from colpali_engine.models import ColQwen2

    name = HUB_MODEL if source == "hub" else source
    model = ColQwen2.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="sdpa", device_map=device).eval()
    return model, load_processor(name), f"{'local' if Path(name).exists() else 'hub'}:{name}"
