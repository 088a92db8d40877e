"""MS MARCO triplets for the PyLate stack: synthetic by default, the real set when reachable.

The synthetic set has the real schema (``query``, ``positive``, ``negative``) and calibrated
lengths: passages average ~56 words with a long right tail (log-normal), queries ~6.4 words. Its
words come from :mod:`harness.stacks.lexicon`, which the offline tokenizer knows, so ~1 word in 5
splits into two word pieces and punctuation is tokenized separately, as with a real subword
vocabulary (~70 tokens per passage). In training PyLate pads every column to its fixed length
(queries 48, documents 300), so lengths change which tokens are real, not the tensor shapes.

One seed names one stream: row ``i`` of seed ``s`` is drawn from its own generator (``s``, ``i``)
when it is read, and the stream has a fixed length (:data:`STREAM_ROWS`), so the trainer's seeded
sampler draws the same first batches whatever the number of steps.
"""

from __future__ import annotations

import numpy as np

from harness.stacks import lexicon

PASSAGE_WORDS_MEAN = 56.0
PASSAGE_WORDS_SIGMA = 0.5  # log-normal shape: a tail of long passages, as in MS MARCO
QUERY_WORDS_MEAN = 6.4
COMPOUND_RATE = 0.2  # words made of a stem and a suffix piece (two tokens)
HUB_DATASET = ("sentence-transformers/msmarco-bm25", "triplet")
STREAM_ROWS = 1 << 20  # rows in every seed's stream: more than any cell reads (300 steps x 2048 = 614,400)


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


def triplet(seed: int, index: int) -> dict[str, str]:
    """Row ``index`` of the stream of ``seed``: a (query, positive, negative) triplet."""
    rng = np.random.default_rng([seed, index])
    return {
        "query": _words(rng, query_word_count(rng), punctuate=False),
        "positive": _words(rng, passage_word_count(rng), punctuate=True),
        "negative": _words(rng, passage_word_count(rng), punctuate=True),
    }


def synthetic_triplets(n_rows: int, seed: int) -> dict[str, list[str]]:
    """The first ``n_rows`` rows of the stream of ``seed``, as columns."""
    rows = [triplet(seed, index) for index in range(n_rows)]
    return {column: [row[column] for row in rows] for column in ("query", "positive", "negative")}


def synthetic_stream(seed: int, rows: int = STREAM_ROWS):  # type: ignore[no-untyped-def]
    """The stream of ``seed`` as a ``datasets.Dataset`` whose rows are drawn when they are read.

    The table holds only the row numbers; a transform turns the rows a batch reads into triplets.
    """
    import datasets

    def draw(batch: dict[str, list[int]]) -> dict[str, list[str]]:
        drawn = [triplet(seed, index) for index in batch["row"]]
        return {column: [row[column] for row in drawn] for column in ("query", "positive", "negative")}

    return datasets.Dataset.from_dict({"row": np.arange(rows, dtype=np.int64)}).with_transform(draw)


def load_triplets(source: str | None, n_rows: int, seed: int):  # type: ignore[no-untyped-def]
    """A ``datasets.Dataset`` of triplets and a description of where it came from.

    ``source`` None: the synthetic stream of ``seed`` (``n_rows`` only checked: the stream's length is
    fixed). ``"hub"``: the real ``sentence-transformers/msmarco-bm25`` triplet config (its first
    :data:`STREAM_ROWS` rows). Anything else: a local directory or file ``datasets`` can load (its
    whole train split). Real rows are a fixed set whatever the cell (``n_rows`` only checked against
    it), so one seed names one stream of batches on real data too.
    """
    import datasets

    if source is None or source == "synthetic":
        if n_rows > STREAM_ROWS:
            raise ValueError(f"{n_rows} rows (batch x steps) exceed the synthetic stream's {STREAM_ROWS}.")
        return synthetic_stream(seed), f"synthetic:msmarco-triplet:seed={seed}:stream={STREAM_ROWS}"
    if source == "hub":
        name, config = HUB_DATASET
        dataset = datasets.load_dataset(name, config, split=f"train[:{STREAM_ROWS}]")
        where = f"hub:{name}/{config}"
    else:
        dataset = datasets.load_dataset(source, split="train")
        where = f"local:{source}"
    if len(dataset) < n_rows:
        raise ValueError(f"{where}: {len(dataset)} train rows, fewer than the {n_rows} this cell needs.")
    return dataset.select_columns(["query", "positive", "negative"]), f"{where}:rows={len(dataset)}"
