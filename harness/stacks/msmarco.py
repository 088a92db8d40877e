"""MS MARCO triplets for the PyLate stack: synthetic by default, the real set when reachable.

The synthetic set has the real schema (``query``, ``positive``, ``negative``) and calibrated
lengths: passages average ~56 words with a long right tail (log-normal), queries ~6.4 words. Its
words come from :mod:`harness.stacks.lexicon`, which the offline tokenizer knows, so ~1 word in 5
splits into two word pieces and punctuation is tokenized separately, as with a real subword
vocabulary (~70 tokens per passage). In training PyLate pads every column to its fixed length
(queries 48, documents 300), so lengths change which tokens are real, not the tensor shapes.
"""

from __future__ import annotations

import numpy as np

from harness.stacks import lexicon

PASSAGE_WORDS_MEAN = 56.0
PASSAGE_WORDS_SIGMA = 0.5  # log-normal shape: a tail of long passages, as in MS MARCO
QUERY_WORDS_MEAN = 6.4
COMPOUND_RATE = 0.2  # words made of a stem and a suffix piece (two tokens)
HUB_DATASET = ("sentence-transformers/msmarco-bm25", "triplet")


def _words(rng: np.random.Generator, n: int, punctuate: bool) -> str:
    stems = rng.integers(0, len(lexicon.STEMS), size=n)
    suffixes = rng.integers(0, len(lexicon.SUFFIXES), size=n)
    compound = rng.random(n) < COMPOUND_RATE
    words = []
    for i in range(n):
        word = lexicon.STEMS[stems[i]] + (lexicon.SUFFIXES[suffixes[i]] if compound[i] else "")
        words.append(word)
        if punctuate and i < n - 1 and rng.random() < 0.1:
            words[-1] += ","
    text = " ".join(words)
    return text + "." if punctuate else text


def passage_word_count(rng: np.random.Generator) -> int:
    mu = np.log(PASSAGE_WORDS_MEAN) - PASSAGE_WORDS_SIGMA**2 / 2  # so that the mean is PASSAGE_WORDS_MEAN
    return max(3, int(round(rng.lognormal(mu, PASSAGE_WORDS_SIGMA))))


def query_word_count(rng: np.random.Generator) -> int:
    return 1 + int(rng.poisson(QUERY_WORDS_MEAN - 1))


def synthetic_triplets(n_rows: int, seed: int) -> dict[str, list[str]]:
    """``n_rows`` seeded (query, positive, negative) rows as columns."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[str]] = {"query": [], "positive": [], "negative": []}
    for _ in range(n_rows):
        rows["query"].append(_words(rng, query_word_count(rng), punctuate=False))
        rows["positive"].append(_words(rng, passage_word_count(rng), punctuate=True))
        rows["negative"].append(_words(rng, passage_word_count(rng), punctuate=True))
    return rows


def load_triplets(source: str | None, n_rows: int, seed: int):  # type: ignore[no-untyped-def]
    """A ``datasets.Dataset`` of triplets and a description of where it came from.

    ``source`` None: synthetic. ``"hub"``: the real ``sentence-transformers/msmarco-bm25`` triplet
    config (first ``n_rows`` rows). Anything else: a local directory or file ``datasets`` can load.
    """
    import datasets

    if source is None or source == "synthetic":
        described = f"synthetic:msmarco-triplet:seed={seed}:rows={n_rows}"
        return datasets.Dataset.from_dict(synthetic_triplets(n_rows, seed)), described
    if source == "hub":
        name, config = HUB_DATASET
        dataset = datasets.load_dataset(name, config, split=f"train[:{n_rows}]")
        return dataset, f"hub:{name}/{config}:rows={n_rows}"
    dataset = datasets.load_dataset(source, split="train")
    dataset = dataset.select(range(min(n_rows, len(dataset))))
    return dataset.select_columns(["query", "positive", "negative"]), f"local:{source}:rows={len(dataset)}"
