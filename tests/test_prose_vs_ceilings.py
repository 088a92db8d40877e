"""The pages' sentences about how far a batch goes, read from the ceiling searches (the finer
measurement) and checked against them: a sentence that says which backend binds first, or that one
fails where another trains, must be what the committed searches say."""

from __future__ import annotations

import pytest

from harness.report import data, prose
from harness.search import Ceiling, CeilingSearch


def row(backend: str, card: str, fits: int | None, fails: int | None, where: str | None = None, done: bool = True,
        probes: int = 5, stack: str = "pylate", regime: str = "plain") -> data.SearchRow:  # fmt: skip
    variant, chunk = (backend, None) if "chunk" not in backend else ("vanilla", int(backend.split()[-1]))
    search = CeilingSearch(stack=stack, regime=regime, variant=variant, score_mini_batch_size=chunk, card=card,
                           seeds=(42, 43, 44), start=128, limit=4096, resolution=8)  # fmt: skip
    ceiling = Ceiling(fits=fits, fails=fails, next_batch=None if done else (fails or 2 * (fits or 64)))
    return data.SearchRow(search=search, ceiling=ceiling, probes=probes, usable_gib=78.43, fails_where=where)


@pytest.fixture(scope="module")
def searches():
    return data.ceilings(data.read())


def test_the_ceiling_reading_says_which_backend_binds_first_from_where_the_next_batch_failed():
    binds = [row("vanilla", "h100-80gb", 176, 184, "maxsim"), row("lik", "h100-80gb", 184, 192, "elsewhere"),
             row("flash", "native", None, None, done=False, probes=0), row("vanilla", "native", 304, 320, "maxsim"),
             row("lik", "native", 336, 352, "elsewhere")]  # fmt: skip
    assert prose.ceiling_reach(binds, "pylate", "plain") == [
        "On the 80 GB card: vanilla trains 176 (B=184 runs out of memory in the MaxSim op); lik trains 184 (B=192 runs "
        "out of memory outside the op) — vanilla's score grid binds first: its next batch fails in the MaxSim op, while "
        "the others train more (lik 184: up to 1.05× vanilla's batch).",
        "On the 141 GB (whole H200) card: vanilla trains 304 (B=320 runs out of memory in the MaxSim op); lik trains "
        "336 (B=352 runs out of memory outside the op); flash not run — vanilla's score grid binds first: its next "
        "batch fails in the MaxSim op, while the others train more (lik 336: up to 1.11× vanilla's batch)."]
    same = [row("vanilla", "rtx4090-24gb", 48, 52, "elsewhere"), row("lik", "rtx4090-24gb", 48, 52, "elsewhere")]
    assert prose.ceiling_reach(same, "pylate", "plain")[0].endswith(
        "every backend stops at the same batch, outside the op: the score op is not what fills the card.")
    # a search under way decides nothing: its range is given and nothing is concluded
    running = [row("vanilla", "h100-80gb", 176, 184, "maxsim"), row("lik", "h100-80gb", 184, 256, done=False)]
    assert prose.ceiling_reach(running, "pylate", "plain") == [
        "On the 80 GB card: vanilla trains 176 (B=184 runs out of memory in the MaxSim op); lik 184–255 (searching)."]


@pytest.mark.parametrize("regime", ["plain", "grad-checkpoint"])
def test_the_pylate_pages_never_say_the_score_op_does_not_fill_a_card_where_vanilla_fails_in_it(searches, regime):
    """pylate-plain.md / pylate-grad-checkpoint.md lead: each card's sentence names vanilla's ceiling and
    where the batch above it died exactly as the search recorded it."""
    lines = prose.ceiling_reach(searches, "pylate", regime)
    assert lines
    for line in lines:
        card = next(r.card for r in searches if line.startswith(f"On the {prose.card_short(r.card)} card:"))
        vanilla = data.find_search(searches, "pylate", regime, "vanilla", card)
        assert vanilla is not None
        if vanilla.settled is not None and vanilla.fails is not None:
            where = prose.WHERE_FAILED[vanilla.fails_where or ""]
            assert f"vanilla trains {vanilla.settled} (B={vanilla.fails} runs out of memory {where})" in line
            if vanilla.fails_where == "maxsim":
                assert "the score op is not what fills the card" not in line
        if "binds first" in line:
            others = [r for r in searches if (r.stack, r.regime, r.card, r.allocator) == ("pylate", regime, card, "default")
                      and r.backend != "vanilla" and r.settled is not None]  # fmt: skip
            assert vanilla.fails_where == "maxsim" and any(r.settled > vanilla.settled for r in others), line
