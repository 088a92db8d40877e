"""vidore/colpali_train_set for the colpali stack: synthetic by default, the real shards when reachable.

The synthetic set has the real schema (``query``, ``image``, ``image_filename``, ``options``,
``answer``, ``page``, ``model``, ``prompt``, ``source``) and calibrated shapes, which is all the
memory depends on:

* **pages** follow the set's mixture of sources — scanned letters (DocVQA), PDF renders (TAT-DQA
  and the synthetic crawl), tall infographics (InfoVQA) and arXiv figures, a few of them small.
  Under the 768-token cap (max 768·28·28 pixels) every page above ~0.6 MP is scaled down, so
  ≥95% of pages land at 700–768 visual tokens, as in the published run (documents 755–779 tokens
  with the 11 prompt tokens);
* **queries** are question-like text whose character length is log-normal with the real mean
  (≈67 characters, spec §3) and a tail. The published run saw queries padded to 33–57 tokens
  across its batches and 42–57 at B=128 (text + colpali-engine's 10 augmentation tokens). Measured
  with the offline tokenizer over independent batches of 128 for each of the grids' seeds, the median
  batch pads to the centre of the published range, most batches within it and a few past it (a batch
  holding one of the few long questions): the ranges are
  :data:`harness.report.tables.QUERY_CALIBRATION`, which ``tests/test_colpali_stack.py`` checks and
  the methodology page states.

**One seed, one stream.** Row ``i`` of the stream of seed ``s`` is drawn from its own generator
(``s``, ``i``), and the stream has a fixed length (:data:`STREAM_ROWS`) whatever the cell, so the
trainer's seeded sampler permutes the same rows in every run: the first k batches of a longer run
are those of a shorter one at the same batch size.

Rows are drawn when they are read (pages as a plain canvas of the row's size), so the stream costs
nothing until a batch is collated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from harness.stacks import lexicon

HUB_DATASET = "vidore/colpali_train_set"
QUERY_CHARS_MEAN = 67.0
QUERY_CHARS_SIGMA = 0.35  # log-normal shape: sets the padded lengths of harness.report.tables.QUERY_CALIBRATION
STREAM_ROWS = 1 << 20  # rows in every seed's stream: more than any cell reads (300 steps x 2048 = 614,400)
QUESTION_STARTERS = (
    "What is the", "What are the", "How many", "Which", "What was the", "According to the",
    "In which year did the", "Who", "What does the", "How much", "Where is the", "What percentage of",
)  # fmt: skip
FUNCTION_WORDS = ("the", "of", "in", "for", "and", "to", "a", "on", "by", "with", "from", "is", "was", "as", "at")


@dataclasses.dataclass(frozen=True)
class PageFamily:
    """A source of pages in the set: its share of rows and its (width, height) ranges in pixels."""

    source: str
    share: float
    width: tuple[int, int]
    height: tuple[int, int]


PAGE_MIXTURE = (
    PageFamily("docvqa", 0.33, (1600, 2560), (2000, 3300)),  # scanned letters
    PageFamily("pdf_render", 0.38, (1240, 1754), (1600, 2480)),  # synthetic crawl and TAT-DQA pages
    PageFamily("infovqa", 0.09, (700, 1500), (1500, 6000)),  # tall infographics
    PageFamily("arxivqa", 0.17, (900, 1800), (700, 1400)),  # figures rendered at print size
    PageFamily("arxivqa_small", 0.03, (400, 700), (300, 600)),  # small figures: below the cap
)


def _query(rng: np.random.Generator) -> str:
    mu = np.log(QUERY_CHARS_MEAN) - QUERY_CHARS_SIGMA**2 / 2
    target = max(12, int(rng.lognormal(mu, QUERY_CHARS_SIGMA))) - 1  # the "?" ends it
    words = [QUESTION_STARTERS[rng.integers(len(QUESTION_STARTERS))]]
    length = len(words[0])
    while length < target:
        draw = rng.random()
        if draw < 0.3:
            word = FUNCTION_WORDS[rng.integers(len(FUNCTION_WORDS))]
        elif draw < 0.37:
            word = str(int(rng.integers(1950, 2024)))
        else:  # Zipf-distributed terms: frequent ones are whole tokens, rare ones split
            word = lexicon.STEMS[min(int(rng.zipf(1.3)) - 1, len(lexicon.STEMS) - 1)]
        if length + 1 + len(word) > target + 3:
            break
        words.append(word)
        length += len(word) + 1
    return " ".join(words) + "?"


def query(seed: int, index: int) -> str:
    """Row ``index``'s query in the stream of ``seed``."""
    return _query(np.random.default_rng([seed, 1, index]))


def page_size(seed: int, index: int) -> tuple[str, int, int]:
    """Row ``index``'s page in the stream of ``seed``: (source, width, height) from the page mixture."""
    rng = np.random.default_rng([seed, 2, index])
    shares = np.array([family.share for family in PAGE_MIXTURE])
    family = PAGE_MIXTURE[int(rng.choice(len(PAGE_MIXTURE), p=shares / shares.sum()))]
    return family.source, int(rng.integers(*family.width)), int(rng.integers(*family.height))


def queries(n: int, seed: int) -> list[str]:
    """The first ``n`` queries of the stream of ``seed``."""
    return [query(seed, index) for index in range(n)]


def page_sizes(n: int, seed: int) -> list[tuple[str, int, int]]:
    """The first ``n`` pages of the stream of ``seed``."""
    return [page_size(seed, index) for index in range(n)]


def tokenizer_corpus(seed: int) -> Iterator[str]:
    """Text the offline tokenizer learns its merges from: synthetic queries and the prompt words."""
    yield from queries(50_000, seed + 1_000)  # the processor is built with seed 0: stream 1000, no cell's default
    for _ in range(2_000):
        yield "user\nDescribe the image."


class SyntheticTrainSet(torch.utils.data.Dataset):
    """The stream of ``seed``: :data:`STREAM_ROWS` rows of a synthetic colpali_train_set, each drawn
    when it is read. A map-style torch dataset, which is what ``ColPaliEngineDataset`` wraps."""

    def __init__(self, seed: int, rows: int = STREAM_ROWS) -> None:
        self.seed = seed
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        from PIL import Image

        if not 0 <= index < len(self):
            raise IndexError(index)
        source, width, height = page_size(self.seed, index)
        shade = tuple(int(v) for v in np.random.default_rng([self.seed, 3, index]).integers(160, 256, size=3))
        return {
            "query": query(self.seed, index),
            "image": Image.new("RGB", (width, height), shade),
            "image_filename": f"synthetic/{source}/{index:07d}.png",
            "options": None,
            "answer": "",
            "page": "1",
            "model": "synthetic",
            "prompt": None,
            "source": source,
        }


def load_train_set(source: str | None, n_rows: int, seed: int):  # type: ignore[no-untyped-def]
    """Rows for ``ColPaliEngineDataset`` and a description of where they came from.

    ``source`` None: the synthetic stream of ``seed`` (``n_rows`` only checked: the stream's length is
    fixed, so the trainer's sampler draws the same first batches in every run). ``"hub"``: the first
    parquet shard of ``vidore/colpali_train_set`` (downloaded alone, never the whole set). Anything
    else: a local directory laid out like the hub repository (``data/train-*.parquet``) or a parquet
    file, every train shard of it. Real rows are likewise a fixed set whatever the cell (``n_rows``
    only checked against it), so one seed names one stream of batches on real data too.
    """
    if source is None or source == "synthetic":
        if n_rows > STREAM_ROWS:
            raise ValueError(f"{n_rows} rows (batch x steps) exceed the synthetic stream's {STREAM_ROWS}.")
        return SyntheticTrainSet(seed), f"synthetic:colpali_train_set:seed={seed}:stream={STREAM_ROWS}"
    if source == "hub":
        from huggingface_hub import snapshot_download

        local = snapshot_download(HUB_DATASET, repo_type="dataset", allow_patterns=["data/train-00000-*.parquet"])
        rows, shards = _load_parquet_rows(Path(local), n_rows)
        return rows, f"hub:{HUB_DATASET}:{','.join(shards)}:rows={len(rows)}"
    rows, shards = _load_parquet_rows(Path(source), n_rows)
    return rows, f"local:{source}:{','.join(shards)}:rows={len(rows)}"


def _load_parquet_rows(root: Path, n_rows: int):  # type: ignore[no-untyped-def]
    """Every train row of the shards under ``root`` (a fixed set whatever the cell), refused when it
    holds fewer than the ``n_rows`` a cell reads."""
    import datasets

    shards = [root] if root.is_file() else sorted((root / "data").glob("train-*.parquet")) or sorted(root.glob("train-*.parquet"))
    if not shards:
        raise FileNotFoundError(f"no train-*.parquet shards under {root} (expected {root}/data/train-00000-of-N.parquet).")
    dataset = datasets.load_dataset("parquet", data_files={"train": [str(s) for s in shards]}, split="train")
    if len(dataset) < n_rows:
        # Fewer rows than batch x steps would make the trainer run a short last batch: another cell.
        raise ValueError(f"{root}: {len(dataset)} train rows in {len(shards)} shard(s), fewer than the {n_rows} this cell needs.")
    missing = {"query", "image"} - set(dataset.column_names)
    if missing:
        raise ValueError(f"{root}: the train shards lack the columns {sorted(missing)} of {HUB_DATASET}.")
    return dataset, [shard.name for shard in shards]
