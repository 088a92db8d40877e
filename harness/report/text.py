"""The small phrases and number formats that tables, figures and sentences share."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, TypeGuard

import pandas as pd

from harness.report.data import GIB_PER_MIB, LongRunVerdict, SearchRow
from harness.results import HOST_OUT_OF_MEMORY
from harness.search import REFERENCE_GPU
from harness.spec import CARDS


def missing(value: Any) -> bool:
    """None or NaN: a measurement the cell does not have."""
    return value is None or bool(pd.isna(value))


def number(value: object, spec: str) -> str:
    """A table number, or a dash where the cell has none (e.g. every step was warm-up); a negative one with a
    true minus ('−0.25'), and one that rounds to zero as '0', never '-0.00' or '0.00'."""
    if missing(value):
        return "—"
    text = format(value, spec)
    if not text.lstrip("+-").strip("0.,%"):  # only zeros left: it rounds to zero
        return "0"
    return text.replace("-", MINUS)


def mib(value: object) -> str:
    """A MiB figure to three significant digits, never finer than 0.1 MiB: '7196', '97.9', '0.56'; a dash for none."""
    if missing(value):
        return "—"
    return sig(value) if abs(float(value)) < 100 else format(float(value), ".0f")  # type: ignore[arg-type]


def significant(value: float, digits: int = 3, whole: bool = False, thousands: bool = False) -> str:
    """``value`` to ``digits`` significant digits in plain decimals, never an exponent, trailing zeros
    kept ('0.0123', '1.20', '45100'); 99.96 reads '100', not '100.0'. ``whole``: a number with more
    integer digits than ``digits`` keeps them all ('45062', not '45100'); ``thousands``: with
    separators ('45,062'). The one rounding rule of every table of the report and the cell notebooks."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else f"{value:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, decimals)
    if rounded and math.floor(math.log10(abs(rounded))) > math.floor(math.log10(abs(value))):
        decimals -= 1  # rounding carried into a new digit: 99.96 → 100
    shown = value if whole else rounded
    return format(shown, f"{',' if thousands else ''}.{max(0, decimals)}f")


def sig(value: object, digits: int = 3) -> str:
    """A table number to ``digits`` significant digits, whole numbers kept whole ('41.0', '7.00', '1234'); a dash for none."""
    return "—" if missing(value) else significant(float(value), digits, whole=True)  # type: ignore[arg-type]


def nowrap(label: str) -> str:
    """A short label that a narrow table column must not break: 'vanilla + chunk 64', 'grad-checkpoint'
    or '4.1e-03' on one line (no-break spaces, non-breaking hyphens)."""
    return label.replace(" ", "\u00a0").replace("-", "\u2011")


def span(low: float, high: float, spec: str = ".1f") -> str:
    """'5.8–27.5': a range of values formatted with ``spec``, or one value where both read the same."""
    low_text, high_text = format(low, spec), format(high, spec)
    return low_text if low_text == high_text else f"{low_text}–{high_text}"


def allocator_words(allocator: str) -> str:
    """An allocator setting in words: 'default allocator', 'expandable segments'."""
    return "default allocator" if allocator == "default" else f"{allocator} segments"


def joined(parts: Sequence[str]) -> str:
    """'a, b and c': parts in a sentence."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def counted(count: int, one: str, many: str | None = None) -> str:
    """'1 probe', '3 probes', '2 batches' (``many``: the plural where it is not ``one`` + s)."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def seed_words(steps: int, seeds: Sequence[int]) -> str:
    """What one probe trains: '8 steps on seed 42', '8 steps on each of seeds 42, 43 and 44'."""
    return f"{steps} steps on {'each of seeds' if len(seeds) > 1 else 'seed'} {joined([str(seed) for seed in seeds])}"


def failed_request(message: object) -> str:
    """The failed request of an OOM message: "CUDA out of memory. Tried to allocate X GiB. ..." → its 2nd sentence."""
    sentences = str(message).split(". ")
    return sentences[1] if len(sentences) > 1 else str(message)


_SIZES_MIB = {"bytes": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}


def requested_mib(message: object) -> float | None:
    """The failed request of an OOM message in MiB ('Tried to allocate 1.79 GiB' → 1832.96); None where it names no size."""
    found = None if missing(message) else re.search(r"Tried to allocate ([0-9.]+) (bytes|KiB|MiB|GiB)", str(message))
    return None if found is None else float(found.group(1)) * _SIZES_MIB[found.group(2)]


_HELD = re.compile(r"Of the allocated memory ([0-9.]+) (bytes|KiB|MiB|GiB) is allocated by PyTorch, .*?"
                   r"([0-9.]+) (bytes|KiB|MiB|GiB) is reserved by PyTorch but unallocated")


def oom_held_mib(message: object) -> tuple[float, float] | None:
    """What an OOM message says the process held when the request failed, in MiB: (allocated, reserved but
    unallocated); None where the message does not say."""
    found = None if missing(message) else _HELD.search(str(message))
    if found is None:
        return None
    return float(found.group(1)) * _SIZES_MIB[found.group(2)], float(found.group(3)) * _SIZES_MIB[found.group(4)]


_IN_USE = re.compile(r"this process has ([0-9.]+) (bytes|KiB|MiB|GiB) memory in use")


def oom_in_use_mib(message: object) -> float | None:
    """The memory an OOM message says the process had in use on the device (PyTorch's and the CUDA
    context's together), in MiB; None where the message does not say."""
    found = None if missing(message) else _IN_USE.search(str(message))
    return None if found is None else float(found.group(1)) * _SIZES_MIB[found.group(2)]


def as_published(value_mib: object) -> str:
    """A memory figure as the published harness prints it: GiB to two decimals from 1 GiB up, whole MiB below
    ('7.81 GiB', '61 MiB'); a dash for none. Ours and the published figures side by side, at one precision."""
    if missing(value_mib):
        return "—"
    value = float(value_mib)  # type: ignore[arg-type]
    return f"{value * GIB_PER_MIB:.2f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def card_label(name: str, lines: bool = False) -> str:
    """A card as measured: '80 GB (H100 profile, capped at 78.43 GiB)', '141 GB (the whole H200)'; with ``lines``,
    the same over three lines for a tick label ('80 GB', 'H100 profile', '78.43 GiB'). A capped card names no GPU:
    its probes ran on an H200 or on a GPU the cross-card check vouches for, which the pages say in words
    (:func:`harness.report.prose.capped_gpus_words`)."""
    profile = CARDS.get(name)
    if profile is None or profile.nominal_gb is None:
        return name
    if profile.usable_gib is None:
        if lines:
            return f"{profile.nominal_gb} GB\nthe whole\n{REFERENCE_GPU}"
        return f"{profile.nominal_gb} GB (the whole {REFERENCE_GPU})"
    model = card_gpu(name)
    if lines:
        return f"{profile.nominal_gb} GB\n{model} profile\n{profile.usable_gib:.2f} GiB"
    return f"{profile.nominal_gb} GB ({model} profile, capped at {profile.usable_gib:.2f} GiB)"


def card_column(name: str) -> str:
    """A card as a table's column heading, its cap left to the words above the table (:func:`caps_words`):
    '80 GB (H100)', '141 GB (whole H200)'."""
    gpu = card_gpu(name)
    return card_short(name) + (f" ({gpu})" if gpu else "")


def caps_words(names: Sequence[str]) -> str:
    """What the capped cards among ``names`` may allocate, smallest first: 'each capped GPU's allocator is held
    to what PyTorch can use on that card: 22.96 GiB for the 24 GB (RTX4090) and 78.43 GiB for the 80 GB (H100); the
    141 GB (whole H200) is uncapped'; empty where none is capped."""
    ordered = cards_in_order(names)
    capped = [name for name in ordered if CARDS[name].usable_gib is not None]
    whole = [card_column(name) for name in ordered if CARDS[name].usable_gib is None]
    if not capped:
        return ""
    text = ("each capped GPU's allocator is held to what PyTorch can use on that card: "
            + joined([f"{CARDS[name].usable_gib:.2f} GiB for the {card_column(name)}" for name in capped]))  # fmt: skip
    return text + (f"; the {joined(whole)} is uncapped" if whole else "")


def card_gpu(name: str) -> str | None:
    """The GPU a capped card profile is named after: 'h100-80gb' → 'H100'; None for the whole device ('native')."""
    profile = CARDS.get(name)
    return None if profile is None or profile.usable_gib is None else name.split("-")[0].upper()


def on_card_gpu(device_name: object, card: str) -> bool:
    """Whether a result's GPU ('NVIDIA H100 80GB HBM3') is the one the card profile ``card`` is named after
    ('h100-80gb': an H100); False where the result names no GPU. A cap emulates a card's memory, not its
    speed, so only a cell run on that GPU times what the card itself would."""
    model = card_gpu(card)
    if missing(device_name) or not device_name or model is None:
        return False
    return model in str(device_name).upper().replace(" ", "")


def gpu_words(name: str) -> str:
    """A GPU as nvidia-smi names it, in a sentence: 'NVIDIA H100 80GB HBM3' → 'H100 80GB HBM3'."""
    return name.removeprefix("NVIDIA ")


def other_gpu(name: object) -> TypeGuard[str]:
    """Whether a result's recorded GPU is one other than the H200 the book's cards are measured on (False where
    none is recorded): what a page names beside a number of such a GPU."""
    return isinstance(name, str) and bool(name) and REFERENCE_GPU not in name


def gpu_short(name: str) -> str:
    """A GPU in a table column, its model alone (the card's heading names it in full): the first word that holds
    a digit, after a series in capitals ('NVIDIA H100 80GB HBM3' → 'H100', 'NVIDIA GeForce RTX 4090' →
    'RTX\u00a04090'), else the first word."""
    words = gpu_words(name).split()
    at = next((k for k, word in enumerate(words) if any(c.isdigit() for c in word)), None)
    if at is None:
        return words[0] if words else name
    series = at > 0 and words[at - 1].isupper() and words[at - 1].isalpha()
    return nowrap(" ".join(words[at - 1:at + 1])) if series else words[at]


def a_gpu(name: str) -> str:
    """A GPU after its article, as said aloud: 'an H100 80GB HBM3', 'an A100', 'a GeForce RTX 4090', 'a B200'
    (a leading letter read by its name — A, E, F, H, I, L, M, N, O, R, S, X — takes 'an')."""
    words = gpu_words(name)
    initialism = words[:1] in set("AEFHILMNORSX") and (words[1:2].isdigit() or words[1:2].isupper())
    return f"{'an' if initialism or words[:1] in set('AEIOU') else 'a'} {words}"


def gpu_text(name: object) -> str:
    """The GPU a result records, in a table: 'NVIDIA H100 80GB HBM3' → 'H100 80GB HBM3'; 'unrecorded' for a
    result that does not name its GPU (the results table and the cell notebooks' index alike)."""
    return "unrecorded" if missing(name) or not name else gpu_words(str(name))


def card_short(name: str) -> str:
    """A card in a narrow column: '80 GB', '141 GB (whole H200)'."""
    profile = CARDS.get(name)
    if profile is None or profile.nominal_gb is None:
        return name
    return f"{profile.nominal_gb} GB" + (f" (whole {REFERENCE_GPU})" if profile.usable_gib is None else "")


STACK_NAMES = {"colpali": "ColQwen2", "pylate": "PyLate"}  # a stack as the pages name it

MINUS = "\u2212"  # a true minus sign: a hyphen before a figure reads as a dash in a table


def percent(value: float, spec: str = "+.1f") -> str:
    """A signed percentage with a true minus ('−1.5%') that never reads '−0.0%': a value that rounds to zero is '0%'."""
    text = format(value, spec)
    return "0%" if float(text) == 0 else f"{text.replace('-', MINUS)}%"


def signed(value: float, spec: str = "+.2f") -> str:
    """A signed number with a true minus ('−0.50') that never reads '−0.00': a value that rounds to zero is '0'."""
    text = format(value, spec)
    return "0" if float(text.replace(",", "")) == 0 else text.replace("-", MINUS)


def cards_in_order(names: object) -> list[str]:
    """The known cards among ``names``, smallest first."""
    present = set(names)  # type: ignore[call-overload]
    return [name for name in sorted(CARDS, key=lambda n: CARDS[n].nominal_gb or 0) if name in present]


def cell_words(row: pd.Series, allocated: str = "") -> str:
    """One cell's result in brief: '54.38 GiB · 7.98 s/step', 'OOM (Tried to allocate …)', 'crashed';
    ``allocated`` follows the peak where the context does not say what it is (' allocated at the step
    peak'). The step time only where it was measured under the timing rule (``times_comparable``)."""
    if row["outcome"] == "oom":
        return f"OOM ({failed_request(row['oom_message'])})"
    if row["outcome"] != "ok":
        return row["outcome"]
    peak = f"{row['step_peak_alloc_mib'] * GIB_PER_MIB:.2f} GiB{allocated}"
    if not row.get("times_comparable", False) or missing(row["steady_step_time_sec"]):
        return peak
    return f"{peak} · {row['steady_step_time_sec']:.2f} s/step"


ANSI_COLOUR = re.compile(r"(\x1b\[[0-9;]*m)")  # an ANSI colour code, as IPython colours tracebacks (split keeps it)
LONG_RUN_MARK = "†"  # follows a ceiling at which a long run ran out of memory part way (tables, figures)
LOADER_MARK = "‡"  # follows a ceiling whose probes collated with fewer dataloader workers than the recipe's
TUNER_MARK = "◊"  # follows op memory measured on a call during which Triton autotuned (the op page)
RUNNING_MARK = "*"  # follows a table's ceiling whose search is still running: 'A–B*', '≥ A*' (every page's tables)
EARLIER_DRAW_MARK = "°"  # follows a table's ceiling found on probes of the data's earlier draw, which run again
EARLIER_DRAW = " (found on the data's earlier draw; running again)"  # the same in a sentence
SEARCHING = " (searching)"  # follows a sentence's ceiling whose search is still running: 'A–B (searching)'


def ran_out_of_host_memory(row: SearchRow) -> bool:
    """Whether the crashed probe that stopped a search was ended by the host's out-of-memory killer."""
    return row.crash_message is not None and row.crash_message.endswith(HOST_OUT_OF_MEMORY)


def ceiling_text(row: SearchRow, running_note: str = SEARCHING) -> str:
    """A search's answer in words: '672' (the next probe, 704, failed), '≥ 8192', '< 32', 'not run';
    a search still running gives the range it has not settled, followed by ``running_note``: '256–511 (searching)'
    in a sentence, '256–511*' in a table (:func:`ceiling_entry`), '256–511' where the sentence says so itself;
    a search stopped by a crashed probe (its kernel died: neither fit nor failure) says where:
    '≥ 288 (the probe at 320 crashed)', or one the host's out-of-memory killer ended '≥ 288 (the probe at
    320 ran out of host memory)'; a ceiling at which a long run ran out of memory says when:
    '160† (OOM at step 27 of 100)', and where a run below it ended, how: '160† (OOM at step 27 of 100;
    144 trained all 100)'; one whose probes collated with fewer dataloader workers than the
    recipe's is marked: '336‡' ('288–303‡*' while it runs); one whose walk ended on probes of the data's earlier
    draw, which run again on the current one (:attr:`harness.search.Ceiling.earlier_draw`), is marked '36°' in a
    table and said in a sentence: '36 (found on the data's earlier draw; running again)'."""
    answer = _answer(row)
    if row.search.dataloader_workers is not None and row.probes:
        answer += LOADER_MARK
    if row.ceiling.earlier_draw:
        return answer + (EARLIER_DRAW_MARK if running_note == RUNNING_MARK else EARLIER_DRAW)
    return answer + running_note if row.running and (row.fits or row.fails) else answer


def ceiling_entry(row: SearchRow) -> str:
    """A search's answer as a table shows it: :func:`ceiling_text` with a running search's range marked
    :data:`RUNNING_MARK` ('256–511*', '≥ 256*'), as every page's key (:func:`ceiling_key`) explains it."""
    return ceiling_text(row, RUNNING_MARK)


def earlier_draw_words() -> str:
    """What :data:`EARLIER_DRAW_MARK` marks, for a key: 'a ColQwen2 ceiling found on probes of …'."""
    return ("a ColQwen2 ceiling found on probes of the data's earlier draw (batch × steps rows per cell, before one "
            "stream per seed), whose batches had other shapes: its deciding probes run again on the current draw")


def ceiling_key(compact: bool = False, figure: bool = False) -> str:
    """The key to the marks of a table of ceiling searches, written from :data:`RUNNING_MARK`,
    :data:`LONG_RUN_MARK` and :data:`LOADER_MARK`, so that a mark changed there changes every page's key (each
    page shows it through this function). ``compact``: the decision table's entries
    (:func:`harness.report.decision.entry`: a long run's ceiling is 'N†' alone, and the sentence above the
    table says at which step it ran out); otherwise every form :func:`ceiling_entry` writes. ``figure``:
    the page's figures mark a long run's ceiling too (:func:`harness.report.plots.draw_ceilings`)."""
    running = (f"an entry marked `{RUNNING_MARK}` is a search still under way: its ceiling lies in that range "
               f"(`A–B{RUNNING_MARK}`: A trained on every seed run so far, B + 1 did not) or at least at A "
               f"(`≥ A{RUNNING_MARK}`: no batch has failed yet)")  # fmt: skip
    drawn = f" (a {LONG_RUN_MARK} beside its marker where a figure shows it)" if figure else ""
    loader = f"`N{LOADER_MARK}`, a ceiling whose probes collated with fewer dataloader workers than the recipe's"
    not_run = "`not run`, a search with no probe yet"
    earlier = f"`N{EARLIER_DRAW_MARK}`, {earlier_draw_words()}"
    if compact:
        long_run = (f"`N{LONG_RUN_MARK}`, a ceiling at which a long run (`grids/long-run.yaml`) ran out of memory part "
                    f"way{drawn}, so it holds for the search's steps but not for a whole run (the sentence above the "
                    "table says at which step, and how a run at a smaller batch went)")  # fmt: skip
        return f"{running}; {earlier}; {not_run}; {long_run}; {loader}."
    limits = "`≥ N`, a search that reached its limit without failing; `< N`, one whose smallest probe failed"
    crashed = ("`≥ A (the probe at N crashed)`, a search stopped by a probe whose kernel died, neither training nor "
               "running out of GPU memory, until that probe is run again (its notebook records the crash), and "
               "`≥ A (the probe at N ran out of host memory)`, one the host's out-of-memory killer ended")  # fmt: skip
    long_run = (f"`N{LONG_RUN_MARK} (OOM at step k of S; M trained all S)`, a ceiling at which a long run "
                f"(`grids/long-run.yaml`) of S steps ran out of memory at step k{drawn}, and how the run at a smaller "
                "batch M went")  # fmt: skip
    return f"{limits}; {running}; {earlier}; {crashed}; {long_run}; {loader}; {not_run}."


def _answer(row: SearchRow) -> str:
    if row.ceiling.crashed:
        ended = "ran out of host memory" if ran_out_of_host_memory(row) else "crashed"
        crashed = f"the probe at {row.ceiling.next_batch} {ended}"
        return f"≥ {row.fits} ({crashed})" if row.fits else crashed
    if row.stopped:
        return f"stopped ({row.stopped})"
    if row.probes == 0:
        return "not run"
    if not row.done and not row.ceiling.earlier_draw:  # (a walk ended on the earlier draw reads as one that ended)
        if row.fits and row.fails:
            return f"{row.fits}–{row.fails - 1}"
        if row.fits or row.fails:
            return f"≥ {row.fits}" if row.fits else f"< {row.fails}"
        return "searching"
    if row.fails is None:
        return f"≥ {row.fits}"
    if row.fits is None:
        return f"< {row.fails}"
    run = row.long_run
    if run is not None and run.ran_out:
        return f"{row.fits}{LONG_RUN_MARK} (OOM at step {run.steps_trained + 1} of {run.steps}{below_words(run.below)})"
    return f"{row.fits}"


def below_words(run: LongRunVerdict | None) -> str:
    """How the long run below a ceiling that ran out of memory ended, as a ceiling's note goes on:
    '; 144 trained all 100', '; 144 OOM at step 40 of 100' ('' where none ended)."""
    if run is None:
        return ""
    if run.held:
        return f"; {run.batch_size} trained all {run.steps}"
    if run.ran_out:
        return f"; {run.batch_size} OOM at step {run.steps_trained + 1} of {run.steps}"
    return f"; {run.batch_size} {run.outcome} after {run.steps_trained} of {run.steps}"


# The regime as a reader needs it: ColQwen2's "plain" regime is colpali-engine's own recipe, which trains
# with gradient checkpointing — 'plain' would read as "no checkpointing" beside PyLate's plain regime.
# Result files and cell ids keep the regime's name; only what a page shows changes.
REGIME_WORDS = {("colpali", "plain"): "recipe (grad-checkpointed)"}


def regime_words(stack: str, regime: str) -> str:
    """A regime as a page shows it: 'grad-checkpoint', 'recipe (grad-checkpointed)' for ColQwen2's 'plain'."""
    return REGIME_WORDS.get((stack, regime), regime)


# a regime as a sentence names it ("in 23 of the 182 committed PyLate gradient-checkpointing cells")
REGIME_SPOKEN = {("pylate", "gradcache"): "PyLate GradCache", ("pylate", "grad-checkpoint"): "PyLate gradient-checkpointing",
                 ("pylate", "plain"): "PyLate no-checkpointing", ("colpali", "plain"): "ColQwen2"}  # fmt: skip


def regime_spoken(stack: str, regime: str) -> str:
    """A regime as a sentence names it: 'PyLate GradCache', 'ColQwen2' (its one regime, colpali-engine's recipe)."""
    return REGIME_SPOKEN.get((stack, regime), f"{stack} {regime}")


def regime_label(stack: str, regime: str) -> str:
    """'pylate · grad-checkpoint', 'colpali · recipe (grad-checkpointed)': a stack and regime for a page."""
    return f"{stack} · {regime_words(stack, regime)}"
