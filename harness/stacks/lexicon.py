"""A synthetic subword vocabulary laid out like ModernBERT's, for the offline tokenizer and data.

ModernBERT's tokenizer cannot be downloaded here, and weight values and token identities change
neither memory nor FLOPs; what must be right are the ids PyLate relies on and the vocabulary size.
So ids 0–50276 hold punctuation, digits, word-piece suffixes and pseudo-word stems, 50277–50279
the three ``|||…|||`` placeholders, 50280–50284 ``[UNK] [CLS] [SEP] [PAD] [MASK]`` at ModernBERT's
ids, and 50285–50367 unused slots, for 50,368 entries before PyLate adds ``[Q] `` and ``[D] ``.
"""

from __future__ import annotations

import itertools
import random
import string

VOCAB_SIZE = 50368
SPECIALS = {"[UNK]": 50280, "[CLS]": 50281, "[SEP]": 50282, "[PAD]": 50283, "[MASK]": 50284}
PLACEHOLDERS = {"|||IP_ADDRESS|||": 50277, "|||EMAIL|||": 50278, "|||PHONE_NUMBER|||": 50279}
FIRST_UNUSED = 50285

_CONSONANTS = "bcdfghjklmnprstvwxyz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 100 open syllables

SUFFIXES = ["##" + v + c for v in _VOWELS for c in _CONSONANTS]  # 100 closed pieces: ##an, ##ed, ...


def _stems(count: int) -> list[str]:
    """``count`` distinct pseudo-words of 2–3 open syllables, in a fixed shuffled order."""
    two = ["".join(p) for p in itertools.product(_SYLLABLES, repeat=2)]
    three = ["".join(p) for p in itertools.product(_SYLLABLES[:40], repeat=3)]
    words = two + three
    random.Random(0).shuffle(words)
    return words[:count]


_FIXED = list(string.punctuation) + list(string.digits)
STEMS = _stems(min(PLACEHOLDERS.values()) - len(_FIXED) - len(SUFFIXES))
SUFFIXES = [piece[2:] for piece in SUFFIXES]  # as written in text: the bare ending


def vocabulary() -> dict[str, int]:
    """Token → id for all 50,368 entries."""
    tokens = _FIXED + ["##" + s for s in SUFFIXES] + STEMS
    vocab = {token: index for index, token in enumerate(tokens)}
    vocab.update(PLACEHOLDERS)
    vocab.update(SPECIALS)
    for index in range(FIRST_UNUSED, VOCAB_SIZE):
        vocab[f"[unused{index - FIRST_UNUSED}]"] = index
    assert len(vocab) == VOCAB_SIZE and sorted(vocab.values()) == list(range(VOCAB_SIZE))
    return vocab
