"""Sentences and headlines the pages print, computed from the frames and rows of :mod:`harness.report.data`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from harness.report import claims, style, timing
from harness.report.data import (
    CEILINGS,
    CROSS_CARD,
    CROSS_CARD_GRID,
    GIB_PER_MIB,
    PUBLISHED_GRID,
    SHARED_CHECK,
    TIMED_TWINS_NEEDED,
    UNRECORDED,
    BelowCeiling,
    CappedGpus,
    CardCheck,
    Rerun,
    SearchRow,
    SeedEffect,
    SharedCheck,
    Source,
    StepsCheck,
    VouchScope,
    _cell_specs,
    backend_label,
    failed_step,
    find_search,
    finished,
    grid_spec,
    group_by,
    least_steps,
    matching,
    probes_of,
    published_op,
    results_of,
    steps_check,
    timed_checks,
)
from harness.report.tables import (
    PUBLISHED_QUERY_RANGE,
    QUERY_CALIBRATION,
    QueryCalibration,
    call_tokens,
    largest_call,
    timed,
)
from harness.report.text import (
    EARLIER_DRAW_MARK,
    LOADER_MARK,
    LONG_RUN_MARK,
    STACK_NAMES,
    a_gpu,
    allocator_words,
    as_published,
    card_gpu,
    card_label,
    card_short,
    cards_in_order,
    ceiling_text,
    cell_words,
    counted,
    failed_request,
    gpu_text,
    gpu_words,
    joined,
    missing,
    on_card_gpu,
    oom_held_mib,
    oom_in_use_mib,
    other_gpu,
    percent,
    ran_out_of_host_memory,
    regime_label,
    regime_spoken,
    regime_words,
    requested_mib,
    span,
)
from harness.results import CellResult, Skipped
from harness.search import AUTOTUNE, CURRENT_DRAW, MIN_STEPS, REFERENCE_GPU, STEADY, load_searches
from harness.spec import CARDS

# ---- measured cells ------------------------------------------------------------------------------


def headline(cells: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str = "h100-80gb") -> str:
    """One measured cell in words, for the introduction: its step peak (allocated), or the request it died on."""
    if cells.empty:
        return "not measured yet"
    row = matching(cells, stack=stack, regime=regime, batch_size=batch, backend=backend, card=card, allocator="default")
    if row.empty:
        return "not measured yet"
    return cell_words(row.iloc[0], allocated=" allocated at the step peak")


# ---- ceiling probes of one batch -----------------------------------------------------------------


def _oom_words(row: pd.Series) -> str:
    where = "in the MaxSim op" if row["oom_where"] == "maxsim" else "outside the op"
    least = least_steps(row)
    planned = f"{least}" if least == row["steps"] else f"at least {least}"  # a timed cell trains past `steps`
    return (f"runs out of memory {where} after {row['n_steps_done']} of {planned} steps "
            f"({failed_request(row['oom_message'])}; {row['pre_oom_alloc_mib'] * GIB_PER_MIB:.2f} GiB allocated, "
            f"{row['pre_oom_reserved_mib'] * GIB_PER_MIB:.2f} GiB reserved at the peak before it)")  # fmt: skip


def _ok_words(steps: int, alloc_mib: float, reserved_mib: float, seeds: str = "") -> str:
    return (f"trains all {steps} steps{seeds} (peak {alloc_mib * GIB_PER_MIB:.2f} GiB allocated, "
            f"{reserved_mib * GIB_PER_MIB:.2f} GiB reserved)")  # fmt: skip


def probe_headline(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str,
                   allocator: str = "default") -> str:  # fmt: skip
    """The ceiling probes (:func:`harness.report.data.ceiling_probes`) of one batch in words: every
    seed's steps trained (with the peaks), or the first seed that ran out of memory, where, after
    how many steps and on what request."""
    chosen = probes_of(probes, stack, regime, batch, backend, card, allocator)
    if chosen.empty:
        return "not probed yet"
    failed = chosen[chosen["outcome"] == "oom"]
    ok = chosen[chosen["outcome"] == "ok"]
    if failed.empty and ok.empty:
        return f"crashed ({len(chosen)} probe{'s' if len(chosen) > 1 else ''}; see the cell notebooks)"
    if not failed.empty:
        return _oom_words(failed.iloc[0])
    seeds = f"each of the {len(ok)} seeds run" if len(ok) > 1 else "the one seed run so far"
    return _ok_words(ok["steps"].max(), ok["step_peak_alloc_mib"].max(), ok["step_peak_reserved_mib"].max(), f" for {seeds}")


def probe_seeds(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str,
                allocator: str = "default") -> list[str]:  # fmt: skip
    """Each seed's probe of one batch in words: 'seed 42 trains all 8 steps (…)', 'seed 43 runs out
    of memory outside the op after 3 of 8 steps (…)'."""
    lines = []
    for _, row in probes_of(probes, stack, regime, batch, backend, card, allocator).iterrows():
        if row["outcome"] == "oom":
            words = _oom_words(row)
        elif row["outcome"] == "ok":
            words = _ok_words(row["steps"], row["step_peak_alloc_mib"], row["step_peak_reserved_mib"])
        else:
            words = "crashed (see its cell notebook)"
        lines.append(f"seed {row['seed']} {words}")
    return lines


def seed_reading(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str,
                 allocator: str = "default") -> str:  # fmt: skip
    """The ceiling probes of one batch as a paragraph: steps, cap and seeds run, each seed's outcome,
    and — where one seed trained and another ran out of memory — that the draw decided it. Empty
    where the batch was not probed."""
    chosen = probes_of(probes, stack, regime, batch, backend, card, allocator)
    if chosen.empty:
        return ""
    cap = chosen["memory_limit_mib"].max() * GIB_PER_MIB
    under = "" if missing(cap) else f" under a {cap:.2f} GiB cap"
    seeds = len(chosen)
    text = (f"The ceiling search ran B={batch} for {chosen['steps'].max()} steps{under}, "
            f"with {seeds} seed{'s' if seeds > 1 else ''} (each seed draws other data and lengths): "
            + "; ".join(probe_seeds(probes, stack, regime, batch, backend, card, allocator)) + ".")  # fmt: skip
    if (chosen["outcome"] == "ok").any() and (chosen["outcome"] == "oom").any():
        text += " Same batch, card and backend: whether it trains is decided by the draw."
    return text


# ---- ceiling searches ----------------------------------------------------------------------------


def binding_reading(searches: Sequence[SearchRow], allocator: str = "default") -> list[str]:
    """Per stack, regime and card with finished searches: each backend's ceiling and where the batch
    above it failed — in the MaxSim op (vanilla's B² grid binds) or outside it (the encoder binds) —
    and how far the largest fused ceiling goes beyond vanilla's."""
    lines = []
    for (stack, regime, card), group in group_by(finished(searches, allocator), "stack", "regime", "card").items():
        parts = []
        for row in group:
            where = {"maxsim": "fails in the MaxSim op", "elsewhere": "fails outside the op"}.get(row.fails_where or "", "")
            parts.append(f"{row.backend} {ceiling_text(row)}" + (f" (the next batch {where})" if where else ""))
        text = f"{regime_label(str(stack), str(regime))} on {card_label(str(card))}: " + "; ".join(parts)
        vanilla = [row for row in group if row.backend == "vanilla"]
        fused = [row for row in group if row.backend in ("lik", "flash")]
        if vanilla and fused:
            text += f" — the fused kernels train {max(row.fits for row in fused) / vanilla[0].fits:.2f}× vanilla's batch"
        lines.append(text + ".")
    return lines


def allocator_reading(searches: Sequence[SearchRow]) -> list[str]:
    """Per stack, regime, backend and card searched under both allocator settings (by stack and regime,
    then card from the smallest, then backend in the legend's order): the two ceilings, and reserved −
    allocated at each ceiling's step peak (the memory fragmentation kept from use)."""
    ran = [row for row in searches if row.probes > 0]
    groups = group_by(ran, "stack", "regime", "backend", "card")
    cards, backends = cards_in_order(row.card for row in ran), style.in_order(row.backend for row in ran)
    lines = []
    for stack, regime, backend, card in sorted(groups, key=lambda key: (str(key[0]), str(key[1]), cards.index(str(key[3])),
                                                                         backends.index(str(key[2])))):  # fmt: skip
        rows = {row.allocator: row for row in groups[(stack, regime, backend, card)]}
        if not {"default", "expandable"} <= rows.keys():
            continue
        default, expandable = rows["default"], rows["expandable"]
        text = (f"{regime_label(str(stack), str(regime))}, {backend} on {card_label(str(card))}: {ceiling_text(default)} "
                f"with the default allocator, {ceiling_text(expandable)} with expandable segments")  # fmt: skip
        if default.fragmentation_gib is not None and expandable.fragmentation_gib is not None:
            where = "the ceiling" if default.done and expandable.done else "the largest batch trained so far"
            text += (f" (reserved − allocated at {where}: {default.fragmentation_gib:.2f} → "
                     f"{expandable.fragmentation_gib:.2f} GiB)")  # fmt: skip
        lines.append(text + ".")
    return lines


def ceiling_of(searches: Sequence[SearchRow], stack: str, regime: str, backend: str, card: str,
               allocator: str = "default") -> str:  # fmt: skip
    """One search's ceiling in words (``ceiling_text``), or 'not searched' where the grid has no such search."""
    row = find_search(searches, stack, regime, backend, card, allocator)
    return "not searched" if row is None else ceiling_text(row)


def search_plan(searches: Sequence[SearchRow], stack: str, regime: str, backend: str, card: str) -> str:
    """How one search probes a batch: '8 steps and 3 seeds' ('several seeds' where the grid has no such search)."""
    row = find_search(searches, stack, regime, backend, card)
    if row is None:
        return "several seeds"
    return f"{row.search.steps} steps and {counted(len(row.search.seeds), 'seed')}"


def ceiling_gains(searches: Sequence[SearchRow], stack: str, regime: str, card: str, fused: str = "lik") -> str:
    """How far the fused backend and, separately, expandable segments move vanilla's default-allocator
    ceiling on one card, in words; a note that the comparison waits while any of the three searches
    is unfinished."""
    rows = {
        "base": find_search(searches, stack, regime, "vanilla", card),
        "fused": find_search(searches, stack, regime, fused, card),
        "expandable": find_search(searches, stack, regime, "vanilla", card, "expandable"),
    }
    settled = {name: None if row is None else row.settled for name, row in rows.items()}
    if None in settled.values():
        return "How far each choice moves the ceiling is stated once those searches have finished."
    base = rows["base"]
    assert base is not None and base.settled is not None
    base_batch = base.settled

    def change(name: str) -> str:
        row = rows[name]
        assert row is not None and row.settled is not None
        difference = row.settled - base_batch
        at_least = "at least " if row.fails is None else ""
        more = "more" if difference >= 0 else "fewer"
        return f"{at_least}{abs(difference)} {more} ({ceiling_text(row)} against {base_batch})"

    if base.fails is None:
        return f"Vanilla scoring reached the search's limit ({ceiling_text(base)}), so there is nothing to compare."
    return (f"Against vanilla scoring under the default allocator, the fused kernel trains {change('fused')}; "
            f"expandable segments, with vanilla scoring kept, {change('expandable')}.")


# ---- probes on a shared GPU ----------------------------------------------------------------------


def sharing_reading(checks: Sequence[SharedCheck]) -> str:
    """The shared-GPU check (:func:`harness.report.data.shared_checks`) in words: the bytes against the same
    probes run without ``--share-gpu``, and step times only against twins recorded with their GPU and
    host to themselves (:func:`harness.report.data.timed_checks`) — where too few are, the check is said
    to compare bytes only."""
    if not checks:
        return "No shared-GPU check has been committed yet."
    same = sum(check.identical for check in checks)
    verdict = "the same outcome and the same peaks to the byte, step by step," if same == len(checks) else (
        f"the same outcome and peaks for only {same} of them,")  # fmt: skip
    searches = "; ".join(sorted(_search_words(check) for check in {_search_key(check): check for check in checks}.values()))
    text = (f"{len(checks)} probes of {searches} run again on a shared GPU, beside other probes, gave {verdict} as the "
            "same probes run without `--share-gpu`.")  # fmt: skip
    timed = timed_checks(checks)
    slowdown = [check.slowdown for check in timed if check.slowdown is not None]
    if slowdown:
        return text + (f" Against the {len(slowdown)} of those runs that record having their GPU and host to themselves, "
                       f"the shared runs' steady step times were {min(slowdown):.1f}× to {max(slowdown):.1f}×, depending "
                       "on what ran beside them.")  # fmt: skip
    recorded = sum(check.timed_alone for check in checks)
    if recorded == 0:
        which = f"none of those {len(checks)} runs without `--share-gpu` records"
    else:
        which = (f"only {recorded} of those {len(checks)} runs without `--share-gpu` "
                 f"{'records' if recorded == 1 else 'record'}")  # fmt: skip
    needed = "" if recorded == 0 else f" (a comparison needs at least {TIMED_TWINS_NEEDED} such runs with step times)"
    return text + (f" Step times may be compared only between cells that owned their host, and {which} that it had its "
                   f"GPU and host to itself{needed}: the check compares bytes only, not step times.")  # fmt: skip


def cross_card_reading(checks: Sequence[CardCheck], probe_devices: Mapping[str, int],
                       other_draws: Sequence[CardCheck] = (), vouched: frozenset[str] = frozenset()) -> str:  # fmt: skip
    """The cross-card check (:func:`harness.report.data.cross_card_checks`) in words, with what GPUs the
    ceiling probes ran on (``probe_devices``: GPU name → committed probes) and whether the check vouches for
    the GPU it ran on (``vouched``: :func:`harness.search.vouched_devices`), then the check's probes whose
    H200 twin trained on the other draw of the data (``other_draws``:
    :func:`harness.report.data.cross_card_other_draws`), left out of the verdict."""
    return " ".join(part for part in (_same_draw_reading(checks, probe_devices, vouched), _other_draw_reading(other_draws))
                    if part)  # fmt: skip


def capped_gpus_words(gpus: CappedGpus) -> str:
    """Where the capped cards' ceiling probes ran (:func:`harness.report.data.capped_probe_gpus`): 'on an H200', or
    'on an H200, or for 12 of the 299 capped probes on an H100 80GB HBM3, which the cross-card check vouches for'."""
    total = sum(gpus.probes.values())
    others = {name: count for name, count in gpus.probes.items() if gpu_words(name) != REFERENCE_GPU}
    verdict = {name: "vouches for" if name in gpus.vouched else "has not vouched for" for name in others}
    if len(others) == len(gpus.probes) and others:  # none on the reference GPU
        return "; ".join(f"on {a_gpu(name)} ({count} of the {total} capped probes), which the cross-card check {verdict[name]}"
                         for name, count in others.items())  # fmt: skip
    said = [f"for {count} of the {total} capped probes on {a_gpu(name)}, which the cross-card check {verdict[name]}"
            for name, count in others.items()]  # fmt: skip
    return "; or ".join([f"on an {REFERENCE_GPU}", *said]).replace("; or ", ", or ", 1)


def cross_card_intro(gpus: CappedGpus, grid_file: Path | None = None) -> str:
    """What the cross-card check is and when it lets another GPU into the capped searches
    (:func:`harness.search.vouched_devices`), its searches counted from ``grid_file``; where the capped probes ran."""
    grid_file = grid_file or CROSS_CARD_GRID
    searches = load_searches(grid_file)
    return (f"The capped ceiling searches' probes ran {capped_gpus_words(gpus)}. Whether a probe's bytes under a cap depend "
            f"on the GPU below it is checked by running {counted(len(searches), 'of the searches', 'of the searches')} "
            f"again, with the same caps, on another GPU (`grids/{grid_file.name}`), compared probe by probe with the "
            f"{REFERENCE_GPU}'s that trained on the same draw of the data. A capped search takes probes from another GPU "
            "only once that check has finished there, each of its searches has a probe with such a twin, and every "
            "such pair measured the same outcome and step peaks: to the byte, or no further apart at any step than two "
            "runs of a probe of the same stack and backend on one GPU have measured (a probe committed by two grids, "
            "or run alone and beside others), since a GPU can be asked to agree with another no better than with "
            "itself.")  # fmt: skip


def _other_draw_reading(other_draws: Sequence[CardCheck]) -> str:
    """The check's probes whose only H200 twin trained on the other draw: how many, and, per stack,
    how many of them measured the same bytes anyway (a stack whose batches have fixed shapes draws other
    tokens in the same shapes)."""
    if not other_draws:
        return ""
    parts = []
    for stack in sorted({check.other.spec.stack for check in other_draws}):
        mine = [check for check in other_draws if check.other.spec.stack == stack]
        same = sum(check.identical for check in mine)
        outcome = sum(check.other.outcome != check.h200.outcome for check in mine)
        moved = f", and {outcome} of them another outcome" if outcome else ""
        parts.append(f"{STACK_NAMES.get(stack, stack)}: {same} of {len(mine)} the same to the byte{moved}")
    draws = joined(sorted({f"{check.other.data_draw} against {check.h200.data_draw}" for check in other_draws}))
    one = len(other_draws) == 1
    return (f"{counted(len(other_draws), 'more probe')} of the check {'has' if one else 'have'} an H200 twin only on the "
            f"other draw of the data ({draws}), so {'it compares' if one else 'they compare'} draws as well as GPUs and "
            f"{'is' if one else 'are'} left out of the verdict ({'; '.join(parts)}).")  # fmt: skip


def _same_draw_reading(checks: Sequence[CardCheck], probe_devices: Mapping[str, int], vouched: frozenset[str]) -> str:
    known = {name: count for name, count in probe_devices.items() if name != UNRECORDED}
    ran = [f"{count} ran on {a_gpu(name)}" for name, count in sorted(known.items())]
    ran_on = joined(ran) if ran else ""
    total = sum(probe_devices.values())
    unrecorded = probe_devices.get(UNRECORDED, 0)
    none = f" ({counted(unrecorded, 'crashed probe')} recorded no GPU)" if unrecorded else ""
    where = f"Of the {total} committed ceiling probes, {ran_on}{none}." if known else ""
    if not checks:
        return (f"{where} No probe has run again on another GPU on the same draw of the data yet, so whether a probe's "
                "bytes under a cap depend on the GPU below it is not measured: the ceiling searches take probes from an "
                "H200 only.").strip()  # fmt: skip
    devices = joined(sorted({a_gpu(check.device) for check in checks}))
    keys = sorted({_search_key(check) for check in checks})
    settings = "; ".join(_setting_words(key) for key in keys)
    same, matched = sum(check.identical for check in checks), sum(check.matches for check in checks)
    text = (f"{where} {counted(len(checks), 'probe')} of {counted(len(keys), 'search', 'searches')} ({settings}) run again on "
            f"{devices} under the same caps")  # fmt: skip
    if matched == len(checks):
        checked = sorted({check.device for check in checks})
        yes, no = [gpu_words(d) for d in checked if d in vouched], [gpu_words(d) for d in checked if d not in vouched]
        vouches = (f"the check vouches for the {joined(yes)}, so the capped searches take probes from "
                   f"{'it' if len(yes) == 1 else 'them'} too" if yes else "")  # fmt: skip
        waits = (f"until the check has finished each of its searches on the {joined(no)}, with such a twin for each, the "
                 f"capped searches take no probe from {'it' if len(no) == 1 else 'them'}" if no else "")  # fmt: skip
        if same == len(checks):  # the verdict follows its sentence: '…as on the H200: the check vouches…; until…'
            admitted = f": {vouches}" if vouches else ""
            if waits:
                admitted += f"; {waits}" if vouches else f". {waits[0].upper()}{waits[1:]}"
            return f"{text} gave the same outcome and the same peaks to the byte, step by step, as on the H200{admitted}.".strip()
        after = "".join(f". {clause[0].upper()}{clause[1:]}" for clause in (vouches, waits) if clause)  # sentences of their own
        differ = _within_repeat_words([check for check in checks if not check.identical], some_same=same > 0)
        peaks = f", and the same peaks to the byte, step by step, for {same} of them" if same else ""
        return f"{text} gave the same outcome as on the H200{peaks}; {differ}{after}.".strip()
    gaps = [gap for gap in (check.largest_gap_mib() for check in checks if not check.matches) if gap is not None]
    widest = (f" (at most {max(gap[0] for gap in gaps):.0f} MiB allocated and {max(gap[1] for gap in gaps):.0f} MiB "
              "reserved apart at a step)" if gaps else "")  # fmt: skip
    return (f"{text} gave the same outcome and peaks for only {matched} of them{widest}: a probe's bytes depend on the "
            "GPU, so the ceiling searches take probes from an H200 only.").strip()  # fmt: skip


# the steps a repeat spread was measured at (search.phase_gaps): a kernel's autotuning step is held to its own kind
_PHASE_WORDS = {AUTOTUNE: "the steps that tuned a kernel", STEADY: "the steps that tuned no kernel"}


def _within_repeat_words(checks: Sequence[CardCheck], some_same: bool = True) -> str:
    """The check's pairs that differ, but by no more than two runs of the same setting on one GPU
    at steps of the same phase (:attr:`CardCheck.bounding`), in words (``some_same``: other pairs were the same to the byte):
    'the other one (ColQwen2 vanilla on 48 GB at B=80, seed 42) differs by at
    most 1.0 MiB allocated and 0 MiB reserved at a step, no further than the same stack and backend's probe
    colpali-plain-b64-vanilla-h100-80gb measured in two runs on an H200 (2.0 MiB allocated and 0 MiB reserved apart
    at the steps that tuned no kernel, grids published and repeat)'."""
    probes = "; ".join(f"{STACK_NAMES.get(c.other.spec.stack, c.other.spec.stack)} {c.other.spec.variant} on "
                       f"{card_short(c.other.spec.card)} at B={c.other.spec.batch_size}, seed {c.other.spec.seed}"
                       for c in checks)  # fmt: skip
    gaps = [gap for gap in (check.largest_gap_mib() for check in checks) if gap is not None]
    alloc, reserved = max(gap[0] for gap in gaps), max(gap[1] for gap in gaps)
    spreads = {spread for check in checks for spread in check.bounding}
    ordered = sorted(spreads, key=lambda spread: (spread.probe, spread.phase))
    repeats = joined([f"{spread.probe} measured in two runs on {a_gpu(spread.device)} ({spread.alloc_mib:.1f} MiB allocated "
                      f"and {spread.reserved_mib:.0f} MiB reserved apart at {_PHASE_WORDS[spread.phase]}, grids "
                      f"{' and '.join(spread.grids)})" for spread in ordered])  # fmt: skip
    one = len(checks) == 1
    subject = f"the other {'one' if one else len(checks)}" if some_same else ("its peaks" if one else "their peaks")
    return (f"{subject} ({probes}) {'differs' if one and some_same else 'differ'} by at most {alloc:.1f} MiB allocated and "
            f"{reserved:.0f} MiB reserved at a step, no further than the same stack and backend's probe {repeats}: within "
            "what one GPU repeats, so the check counts it as the same")  # fmt: skip


def _under(allocators: Sequence[str]) -> str:
    """'the default allocator and expandable segments'."""
    return joined([("the " if allocator == "default" else "") + allocator_words(allocator) for allocator in allocators])


def _run_words(result: CellResult) -> str:
    """How one run of a probe ended: 'trained every step', 'ran out of memory at step 3'."""
    if result.outcome != "oom":
        return "trained every step" if result.outcome == "ok" else f"ended {result.outcome}"
    step = failed_step(result)
    return f"ran out of memory at step {step}" if step > 1 else "ran out of memory before it finished a step"


def vouch_scope_reading(scope: VouchScope, reruns: Sequence[Rerun]) -> str:
    """What the cross-card check's verdict covers (:func:`harness.report.data.vouch_scope`): the settings it
    compared, the capped probes a vouched GPU gave the searches in a setting it did not compare, and the probes run
    twice on that GPU (:func:`harness.report.data.same_gpu_reruns`) — a pair that differs there shows a run that
    does not repeat itself on one GPU, which no comparison across GPUs can settle."""
    if not scope.admitted:
        return ""
    stacks = sorted({stack for stack, _ in scope.compared})
    compared = "; ".join(f"{STACK_NAMES.get(stack, stack)} under {_under(sorted(a for s, a in scope.compared if s == stack))}"
                         for stack in stacks)  # fmt: skip
    text = f"The check compared {compared}." if compared else ""
    beyond = scope.beyond()
    for device in sorted({device for device, _, _ in beyond}):
        mine = {(stack, allocator): count for (gpu, stack, allocator), count in beyond.items() if gpu == device}
        taken, outside = sum(count for (gpu, _, _), count in scope.admitted.items() if gpu == device), sum(mine.values())
        settings = joined([f"{STACK_NAMES.get(stack, stack)} under {_under([allocator])}"
                           + (f" ({count})" if len(mine) > 1 else "") for (stack, allocator), count in mine.items()])  # fmt: skip
        which = f"all {taken} are" if outside == taken and taken > 1 else f"{outside} {'is' if outside == 1 else 'are'}"
        text += (f" Of the {counted(taken, 'capped probe')} the searches took from {a_gpu(device)}, {which} of a setting it "
                 f"did not compare: {settings}.")  # fmt: skip
    if not beyond:
        text += " Every capped probe the searches took from a GPU it vouches for is of a setting it compared."
    if reruns:
        same = sum(rerun.identical for rerun in reruns)
        text += (f" {counted(len(reruns), 'probe')} ran twice on the same GPU and the same draw of the data (the check's "
                 f"run and the search's)")  # fmt: skip
        if len(reruns) > 1 or same:
            text += f": {same} of {len(reruns)} gave the same outcome and peaks to the byte"
        moved = [f"{STACK_NAMES.get(r.first.spec.stack, r.first.spec.stack)} {r.first.spec.variant} on "
                 f"{card_short(r.first.spec.card)} ({allocator_words(r.first.spec.allocator)}) at B={r.first.spec.batch_size}, "
                 f"seed {r.first.spec.seed}, on {a_gpu(r.device)}, {_run_words(r.first)} in the check's run and "
                 f"{_run_words(r.second)} in the search's" for r in reruns if not r.identical]  # fmt: skip
        said = f"the same GPU did not repeat {'it' if len(moved) == 1 else 'them'} to the byte"
        text += (f"{'; ' if len(reruns) > 1 or same else ': '}{'; '.join(moved)}: {said}." if moved else ".")
    return text.strip()


def _search_key(check: SharedCheck | CardCheck) -> tuple[str, str, str, str, str]:
    """The setting of the search a check's probe belongs to: stack, regime, backend, card, allocator."""
    spec = check.shared.spec if isinstance(check, SharedCheck) else check.other.spec
    return (spec.stack, spec.regime, backend_label(spec.variant, spec.score_mini_batch_size), spec.card, spec.allocator)


def _search_words(check: SharedCheck) -> str:
    return f"one search ({_setting_words(_search_key(check))})"


def _setting_words(key: tuple[str, str, str, str, str]) -> str:
    """A search's setting: 'colpali · recipe (grad-checkpointed), vanilla, the 24 GB card, default allocator'."""
    stack, regime, backend, card, allocator = key
    where = f"the whole {REFERENCE_GPU}" if CARDS.get(card) and CARDS[card].usable_gib is None else f"the {card_short(card)} card"
    return f"{regime_label(stack, regime)}, {backend}, {where}, {allocator} allocator"


def sharing_coverage(checks: Sequence[SharedCheck], probes: pd.DataFrame) -> str:
    """What the shared-GPU check does not cover, in words: the committed probes run on a shared GPU whose
    stack, regime and backend no check probe has (counted per stack and backend) — for them no committed
    result sets a shared run beside the same probe run alone."""
    if probes.empty or not checks:
        return ""
    covered = set(map(_search_key, checks))
    shared = probes[probes["gpu_share_gib"].notna()]
    keys = list(zip(shared["stack"], shared["regime"], shared["backend"], shared["card"], shared["allocator"], strict=True))
    other = shared[[key not in covered for key in keys]]
    if other.empty:
        return "Every probe run on a shared GPU belongs to a search the check covers."
    sizes = other.groupby(["stack", "regime", "backend"]).size()
    counts = ", ".join(f"{regime_label(str(key[0]), str(key[1]))} {key[2]} ({count})"
                       for key, count in zip(sizes.index.tolist(), sizes.tolist(), strict=True))  # fmt: skip
    share = f"All {len(shared)}" if len(other) == len(shared) else f"{len(other)} of the {len(shared)}"
    return (f"The check covers that search only. {share} ceiling-search probes run on a shared GPU belong to other "
            f"searches — {counts} — and no committed result sets any of them beside the same probe run alone: for "
            "them, whether sharing the GPU changed anything is not measured.")  # fmt: skip


def shared_probe_count(probes: pd.DataFrame) -> str:
    """How many committed probes ran under ``--share-gpu``, in words, and of the others how many record
    that they had the GPU and the host to themselves (``timed_alone``), record that they did not, or have
    no record of what ran beside them (``timing_recorded`` false: measured before the timing rule)."""
    if probes.empty:
        return ""
    beside = probes["gpu_share_gib"].notna()
    others = probes[~beside]
    text = (f"{int(beside.sum())} of the {len(probes)} committed probes were run under `--share-gpu`, beside whatever "
            "else fitted at the time.")  # fmt: skip
    if others.empty:
        return text

    def flag(column: str) -> pd.Series:
        return others[column].fillna(False).astype(bool) if column in others else pd.Series(False, index=others.index)

    recorded = flag("timing_recorded")
    alone = flag("timed_alone") & recorded
    parts = []
    count = int(alone.sum())
    if count:
        parts.append(f"{count} {'records that it' if count == 1 else 'record that they'} had the GPU and the host to "
                     f"{'itself' if count == 1 else 'themselves'}")  # fmt: skip
    count = int((recorded & ~alone).sum())
    if count:
        parts.append(f"{count} {'records that it' if count == 1 else 'record that they'} did not have both to "
                     f"{'itself' if count == 1 else 'themselves'}")  # fmt: skip
    count = int((~recorded).sum())
    if count:
        parts.append(f"{count} {'has' if count == 1 else 'have'} no record of what ran beside "
                     f"{'it (it predates' if count == 1 else 'them (they predate'} that record)")  # fmt: skip
    return text + f" Of the other {len(others)}, " + joined(parts) + "."


def shared_seed_agreement(probes: pd.DataFrame) -> str:
    """For batches whose every seed ran on a shared GPU with the same shapes (PyLate's are fixed
    lengths), whether the seeds' peaks agree to the byte — per backend, so the fused backends,
    whose Triton kernels are chosen by timing, are checked beside whatever else ran."""
    if probes.empty:
        return ""
    shared = probes[(probes["stack"] == "pylate") & probes["gpu_share_gib"].notna()]
    keys = ["card", "allocator", "batch_size", "regime"]
    parts = []
    for backend, group in shared.groupby("backend"):
        batches = [g for _, g in group.groupby(keys) if g["seed"].nunique() > 1 and (g["outcome"] == "ok").all()]
        if batches:
            agree = sum(g["step_peak_alloc_mib"].nunique() == 1 and g["step_peak_reserved_mib"].nunique() == 1 for g in batches)
            parts.append(f"{backend} {agree} of {len(batches)}")
    if not parts:
        return ""
    return ("PyLate batches whose seeds all trained on a shared GPU (same shapes, run at different moments beside "
            "different neighbours) with identical allocated and reserved peaks for every seed: " + ", ".join(parts) + ".")


def _seed_words(effect: SeedEffect) -> str:
    """What the seed changed in one stack's probes, in words: 'every PyLate score call had … whatever
    the seed: at 47 batches probed on several seeds (grad-checkpoint and plain; 94 later-seed probes), a
    step's peaks came within …'."""
    name = STACK_NAMES.get(effect.stack, effect.stack)
    if not effect.probes:
        return f"no {name} batch has trained on two seeds yet"
    if len(effect.lengths) == 1:
        ((query, document),) = effect.lengths
        shapes = f"every {name} score call had queries of {query} tokens and documents of {document}, whatever the seed"
    else:
        shapes = f"{name}'s score calls came in {len(effect.lengths)} (query, document) lengths"
    outcomes = (f"{len(effect.differing)} ended otherwise than the first seed ({joined(list(effect.differing))})"
                if effect.differing else "none ended otherwise than the first seed")  # fmt: skip
    regimes = joined([regime_words(effect.stack, regime) for regime in effect.regimes])
    return (f"{shapes}: at {counted(effect.batches, 'batch', 'batches')} probed on several seeds ({regimes}; "
            f"{counted(effect.probes, 'later-seed probe')}), a step's peaks came within {effect.alloc_mib:.0f} MiB "
            f"allocated and {effect.reserved_mib:.0f} MiB reserved of the first seed's, and {outcomes}")  # fmt: skip


def one_seed_reading(searches: Sequence[SearchRow], effects: Sequence[SeedEffect]) -> str:
    """Which searches confirm on one seed, and the data that rests on: what the seed changed in each
    stack's committed probes (:func:`harness.report.data.seed_effect`) — those stacks' first, then
    the others' for contrast — and, for a regime none of whose batches has run on several seeds yet,
    the searches of it that keep every seed as its own check. Empty where every search that has run runs several seeds."""
    single = [row for row in searches if len(row.search.seeds) == 1 and row.probes > 0]  # a search not run rests on nothing
    if not single:
        return ""
    regimes = list(dict.fromkeys((row.stack, row.regime) for row in single))
    seeds = sorted({row.search.seeds[0] for row in single})
    stacks = {row.stack for row in single}
    mine = [effect for effect in effects if effect.stack in stacks]
    searches_of = "The search" if len(single) == 1 else f"The {len(single)} searches"
    text = (f"{searches_of} of {joined([regime_label(*regime) for regime in regimes])} train{'s' if len(single) == 1 else ''} "
            f"seed{'s' if len(seeds) > 1 else ''} {joined([str(seed) for seed in seeds])} alone. A seed draws other "
            f"data; {'; '.join(_seed_words(effect) for effect in mine) or 'no probe says what it changes'}")  # fmt: skip
    if not (mine and all(effect.probes and not effect.differing for effect in mine)):
        text += " — which does not show that one seed answers for the others: these searches need their other seeds."
    else:
        checked = {(effect.stack, regime) for effect in mine for regime in effect.regimes}
        unchecked = [regime for regime in regimes if regime not in checked]
        if not unchecked:
            text += " — so the one seed answers for the others."
        else:
            own = [row for row in searches if (row.stack, row.regime) in unchecked and len(row.search.seeds) > 1]
            text += (f" — so one seed should answer for the others in {joined([regime_label(*r) for r in unchecked])} "
                     "too, where no batch has run on several seeds yet")  # fmt: skip
            names = joined([f"{row.backend}'s search on {card_short(row.card)}" for row in own])
            text += f"; there, {names} keep{'s' if len(own) == 1 else ''} every seed: the regime's own check." if own else "."
    others = [effect for effect in effects if effect.stack not in stacks and effect.probes]
    if others:
        text += (f" Not so everywhere: {'; '.join(_seed_words(effect) for effect in others)}; "
                 f"{'its' if len(others) == 1 else 'their'} searches keep every seed.")  # fmt: skip
    return text


def _steps_words(check: StepsCheck) -> str:
    """How far one regime's longer cells' peaks rose after ``check.steps`` steps, in words."""
    name = regime_spoken(check.stack, check.regime)
    if not check.cells:
        return f"no committed {name} cell has trained more than {check.steps} steps yet"
    if not check.rose:
        batches = joined([f"{batch:,}" for batch in check.batches])
        return (f"in each of the {counted(check.cells, f'committed {name} cell')} that trained longer ({check.least} "
                f"steps or more, at B = {batches}), the most the allocator reserved in a step was reached within the "
                f"first {check.steps}, and the allocated peak rose after them by at most "
                f"{check.alloc_rise_mib:.2f} MiB")  # fmt: skip
    rise = as_published(check.reserved_rise_mib)
    noun = f"committed {name} cell" + ("" if check.cells == 1 else "s")
    if len(check.rose) < check.cells:
        which = f"{len(check.rose)} of the {check.cells} {noun}"
    else:
        which = f"the one {noun}" if check.cells == 1 else f"all {check.cells} {noun}"
    return f"in {which} that trained longer, the most the allocator reserved rose after step {check.steps}, by up to {rise}"


def fewer_steps_reading(searches: Sequence[SearchRow], source: Source = None) -> str:
    """Which searches train fewer steps a probe than the rest (:data:`harness.search.MIN_STEPS_OF`), and
    the data that rests on: how far the peaks of that regime's committed cells that trained longer rose
    after the probe's steps (:func:`harness.report.data.steps_check`), then the same for the regimes that
    keep every step, for contrast. Empty where every search trains the same steps."""
    fewer = [row for row in searches if row.search.steps < MIN_STEPS]
    if not fewer:
        return ""
    results = results_of(source)
    parts = []
    groups: dict[tuple[str, str, int], list[SearchRow]] = {}
    for row in fewer:
        groups.setdefault((row.stack, row.regime, row.search.steps), []).append(row)
    for (stack, regime, steps), rows in groups.items():
        check = steps_check(results, stack, regime, steps)
        name = regime_spoken(stack, regime)
        searched = f"The {name} search trains" if len(rows) == 1 else f"The {len(rows)} {name} searches train"
        text = f"{searched} {steps} steps a probe, not {MIN_STEPS}: {_steps_words(check)}"
        if not check.holds:
            text += f" — which does not show that {steps} steps see what a longer run must fit."
        else:
            text += f" — so at those batches, {steps} steps see what the longer runs had to fit."
        others = [steps_check(results, *key, steps) for key in dict.fromkeys(
            (row.stack, row.regime) for row in searches if row.search.steps >= MIN_STEPS)]  # fmt: skip
        missed = [other for other in others if other.rose]
        if missed:
            text += (f" Not so in the regimes that keep {MIN_STEPS}: {'; '.join(_steps_words(other) for other in missed)}.")
        parts.append(text)
    return " ".join(parts)


# ---- the results folder --------------------------------------------------------------------------


def skipped_reading(skipped: Sequence[Skipped]) -> str:
    """How many files under the results folder the report could not use, in words (empty: none)."""
    if not skipped:
        return ""
    count = f"{len(skipped)} file{'s' if len(skipped) > 1 else ''}"
    return (f"**Files not read.** {count} under the results folder could not be used and "
            f"{'are' if len(skipped) > 1 else 'is'} left out of every page:")


# ---- op replays ----------------------------------------------------------------------------------


def prediction_shapes(calls: pd.DataFrame) -> str:
    """Which recorded call each row of the op-memory table shows and why the predicted vanilla memory
    of two backends at one batch can differ: every row is the largest call (most query × page tokens)
    its own cell recorded, and a cell that stopped early recorded fewer calls. Names the batches and
    cards where the backends' calls differ, with each call's tokens and how many calls each cell recorded."""
    if calls.empty:
        return ""
    found: dict[tuple[int, tuple[tuple[str, str, float, int], ...]], list[str]] = {}
    same = 0
    whole = calls[[style.chunk_size(str(b)) is None for b in calls["backend"]]]  # a chunked backend has its own grid
    for (batch, card), group in whole.reset_index(drop=True).groupby(["batch_size", "card"], sort=True):
        shapes: list[tuple[str, str, float, int]] = []
        for backend in style.in_order(group["backend"].unique()):
            call = largest_call(group[group["backend"] == backend])
            shapes.append((str(backend), call_tokens(call), float(call["predicted_saved_for_backward_mib"]),
                           int((group["backend"] == backend).sum())))  # fmt: skip
        if len({round(mib, 1) for _, _, mib, _ in shapes}) > 1:
            found.setdefault((int(str(batch)), (*shapes,)), []).append(card_short(str(card)))
        elif len(shapes) > 1:
            same += 1
    if not found:
        return "" if not same else ("At every batch the backends' cells recorded calls of the same shapes, so each "
                                    "batch's rows show the same call and the same predicted vanilla memory.")  # fmt: skip
    parts = []
    for (batch, recorded), cards in found.items():
        cells = ", ".join(f"{backend}'s cell {count} call{'s' if count > 1 else ''}, the largest {tokens} tokens "
                          f"({mib:.1f} MiB predicted)" for backend, tokens, mib, count in recorded)  # fmt: skip
        parts.append(f"at B={batch} on {' and '.join(cards)}: {cells}")
    return ("**Why two rows of one batch predict different vanilla memory.** Each row shows the largest call "
            "(most query × page tokens) its own cell recorded, and the grid grows with the batch's longest query "
            "and page; the synthetic lengths a step draws differ from step to step, so a cell that recorded "
            "fewer steps (e.g. one that ran out of memory) may not have met the longest draw. Calls recorded, "
            + "; ".join(parts) + f". At the other {same} batch and card pairs every backend's largest call has "
            "the same shape, and the rows agree.")  # fmt: skip


def _default(frame: pd.DataFrame, **values: object) -> pd.DataFrame:
    """The rows of ``frame`` under the default allocator whose columns equal ``values``; an empty frame as it is."""
    return frame if frame.empty else matching(frame, allocator="default", **values)


# ---- the causes an out-of-memory message names --------------------------------------------------


def oom_cause(row: pd.Series) -> str:
    """Why a cell's request failed, read from its OOM message: smaller than the memory reserved but
    unallocated (no free block was large enough: fragmentation), or not; empty where the message does
    not say."""
    request, held = requested_mib(row["oom_message"]), oom_held_mib(row["oom_message"])
    if request is None or held is None:
        return ""
    allocated, unallocated = held[0] * GIB_PER_MIB, held[1] * GIB_PER_MIB
    moment = (f"its error message, written when the request failed, counts {allocated:.2f} GiB allocated and "
              f"{unallocated:.2f} GiB reserved but unallocated ({allocated + unallocated:.2f} GiB reserved; not the "
              "peak, which came before)")  # fmt: skip
    if request <= held[1]:
        return (f"the {request * GIB_PER_MIB:.2f} GiB request failed with more than that free in reserved blocks — "
                f"{moment}: no free block was large enough (fragmentation), though the memory was there")  # fmt: skip
    return (f"the {request * GIB_PER_MIB:.2f} GiB request was larger than all the reserved memory free — {moment} — "
            "and the cap let no more be reserved")  # fmt: skip


def outside_allocator(source: Source = None) -> str:
    """What the committed out-of-memory messages from the H200 say our processes held outside PyTorch's
    allocator (the memory in use less what PyTorch had reserved: the CUDA context and what else the cell
    loaded), as a range in words: why the emulated cards' context is not a constant."""
    outside = []
    for _, result in results_of(source).found:
        if result.env is None or "H200" not in (result.env.device_name or ""):
            continue
        in_use, held = oom_in_use_mib(result.oom_message), oom_held_mib(result.oom_message)
        if in_use is not None and held is not None:
            outside.append((in_use - held[0] - held[1]) * GIB_PER_MIB)
    if not outside:
        return ("Whether the context is a constant of the card is not read yet: no committed out-of-memory message from "
                "the H200 says what its process held outside PyTorch's allocator.")  # fmt: skip
    return (f"Nor is the context a constant of the card: in the {len(outside)} out-of-memory messages of the committed "
            f"cells on the H200, the memory our own processes held there outside PyTorch's allocator was "
            f"{span(min(outside), max(outside), '.2f')} GiB, depending on what a cell loaded.")  # fmt: skip


def query_calibration(calibration: QueryCalibration = QUERY_CALIBRATION) -> str:
    """What the synthetic ColQwen2 queries are set to give against the published run's padded lengths
    (:class:`harness.report.tables.QueryCalibration`, which a test measures), in words; the steps of the
    published run are those of the grid that reproduces it (``grids/published.yaml``)."""
    low, high = PUBLISHED_QUERY_RANGE
    steps = sorted({spec.steps for spec in _cell_specs(PUBLISHED_GRID).values()
                    if spec.stack == "colpali" and spec.batch_size == calibration.batch})  # fmt: skip
    over = f", over its {joined([str(step) for step in steps])} steps" if steps else ""
    centre = (low + high) / 2
    middle = ", the centre of that range," if calibration.median[0] <= centre <= calibration.median[1] else ""

    def share(bounds: tuple[float, float]) -> str:
        return f"{span(100 * bounds[0], 100 * bounds[1], '.3g')}%"

    seeds = joined([str(seed) for seed in calibration.seeds])
    return (f"The published run's batches of {calibration.batch} padded their queries (text plus the collator's "
            f"{calibration.augmentation} augmentation tokens) to {low}–{high} tokens{over}; the generator is set so "
            f"that over {calibration.batches} independent batches of {calibration.batch} for each of the grids' seeds "
            f"{seeds} the median batch pads to {span(*calibration.median, 'g')} tokens{middle} "
            f"{share(calibration.inside)} land inside it and {share(calibration.above)} above it (a test measures "
            "these ranges with the offline tokenizer).")  # fmt: skip


# ---- a grid cell beside the ceiling probes of its batch ------------------------------------------


def _grid_cell(cells: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str) -> pd.Series | None:
    if cells.empty:
        return None
    row = matching(cells, stack=stack, regime=regime, batch_size=batch, backend=backend, card=card, allocator="default")
    return None if row.empty else row.iloc[0]


def _cell_reading(row: pd.Series) -> str:
    """A grid cell in words: 'trains (54.38 GiB · 7.98 s/step)' or its OOM with where, when and why."""
    if row["outcome"] == "ok":
        return f"trains all {max(row['steps'], row['n_steps_done'])} steps ({cell_words(row)})"
    if row["outcome"] != "oom":
        return str(row["outcome"])
    cause = oom_cause(row)
    return _oom_words(row) + (f"; {cause}" if cause else "")


def grid_and_probes(cells: pd.DataFrame, probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str,
                    card: str) -> str:  # fmt: skip
    """One batch of one backend on one card, as the grid cell and the ceiling search's probes measured it,
    in words — and, where they disagree (one trains the batch, another runs out of memory), that they
    do: neither result alone then settles whether the batch fits."""
    row = _grid_cell(cells, stack, regime, batch, backend, card)
    chosen = probes_of(probes, stack, regime, batch, backend, card) if not probes.empty else probes
    if row is None and chosen.empty:
        return "not measured yet"
    parts = []
    if row is not None:
        parts.append(f"The grid cell (seed {row['seed']}) {_cell_reading(row)}")
    if not chosen.empty:
        parts.append(f"The ceiling search's {chosen['steps'].max()}-step probes of B={batch}: "
                     + "; ".join(probe_seeds(probes, stack, regime, batch, backend, card)))  # fmt: skip
    outcomes = set(chosen["outcome"]) | ({row["outcome"]} if row is not None else set())
    draws = set(chosen["data_draw"].dropna()) | ({row["data_draw"]} if row is not None and row["data_draw"] else set())
    if len(draws) > 1:
        parts.append("They did not train the same batches: some drew theirs from the seed's one stream, the others "
                     "from the per-cell draw that preceded it (batch × steps rows)")  # fmt: skip
    if {"ok", "oom"} <= outcomes:
        parts.append("These committed runs of the same batch, backend and card disagree — one trains it, another runs "
                     "out of memory — so neither alone settles whether it fits")  # fmt: skip
    return ". ".join(parts) + "."


# ---- how far a batch goes on one card ------------------------------------------------------------


def grid_steps(cells: pd.DataFrame) -> str:
    """How long the grid cells of ``cells`` trained, from their grid specs and results: 'one seed each,
    trained until 8 steady steps were timed: 9–10 steps' (a timed spec trains past its ``steps``), or
    'one seed each, 4 steps' where no spec asks for steady steps."""
    train = cells[cells["kind"] == "train"] if "kind" in cells else cells
    if train.empty:
        return "none run"
    steady = {spec.min_steady_steps for _, row in train.iterrows() if (spec := grid_spec(row)) is not None}
    seeds = train["seed"].nunique()
    who = "one seed each" if seeds == 1 else f"{seeds} seeds"
    done = train.loc[train["outcome"] == "ok", "n_steps_done"]
    if done.empty:
        done = train["steps"]
    low, high = int(done.min()), int(done.max())
    steps = f"{span(low, high, 'd')} steps"
    if len(steady) == 1 and (count := steady.pop()) > 0:
        return f"{who}, trained until {count} steady steps were timed: {steps}"
    return f"{who}, {steps}"


def _grid_reach(cells: pd.DataFrame, stack: str, regime: str, backend: str, card: str) -> str:
    mine = _default(cells, stack=stack, regime=regime, backend=backend, card=card)
    if mine.empty:
        return ""
    mine = mine.sort_values("batch_size")
    failed = mine[mine["outcome"] != "ok"]
    if failed.empty:
        return f"{backend} trains every batch run, up to {mine['batch_size'].max()}"
    first = failed.iloc[0]
    trained = mine[(mine["outcome"] == "ok") & (mine["batch_size"] < first["batch_size"])]
    where = {"maxsim": "in the MaxSim op", "elsewhere": "outside the op"}.get(str(first["oom_where"]), "")
    below = f"trains up to {trained['batch_size'].max()} and " if not trained.empty else ""
    return f"{backend} {below}runs out of memory at {first['batch_size']}" + (f" ({where})" if where else "")


def _peak_spread(cells: pd.DataFrame, stack: str, regime: str, card: str, backends: Sequence[str]) -> tuple[float, int] | None:
    """The largest difference of step peak allocated (MiB) between ``backends`` over the batches all of
    them trained on one card, and how many batches that is; None where they trained none together."""
    if cells.empty:
        return None
    mine = matching(cells, stack=stack, regime=regime, card=card, allocator="default")
    mine = mine[mine["backend"].isin(backends) & (mine["outcome"] == "ok")]
    together = mine.groupby("batch_size").filter(lambda group: set(group["backend"]) >= set(backends))
    if together.empty:
        return None
    spread = together.groupby("batch_size")["step_peak_alloc_mib"].agg(lambda peaks: peaks.max() - peaks.min())
    return float(spread.max()), len(spread)


def peaks_compared(cells: pd.DataFrame, stack: str, regime: str, batch: int, backends: Sequence[str],
                   card: str = "h100-80gb") -> str:  # fmt: skip
    """Whether ``backends`` reach the same step peak allocated at one batch, in words: equal (to within
    1 MiB) means the op's extra memory is not live at the step's peak."""
    chosen = _default(cells, stack=stack, regime=regime, batch_size=batch, card=card)
    chosen = chosen[chosen["backend"].isin(backends) & (chosen["outcome"] == "ok")] if not chosen.empty else chosen
    if chosen.empty or chosen["backend"].nunique() < len(backends):
        return ""
    peaks = chosen.set_index("backend")["step_peak_alloc_mib"]
    spread = float(peaks.max() - peaks.min())
    if spread < 1:
        return "equal step peaks allocated (to within 1 MiB): the op's extra memory is not live at the step's peak"
    return f"{peaks.idxmin()}'s step peak allocated is {spread * GIB_PER_MIB:.2f} GiB below {peaks.idxmax()}'s"


def batch_reach(cells: pd.DataFrame, searches: Sequence[SearchRow], probes: pd.DataFrame, stack: str, regime: str,
                card: str, backends: Sequence[str] = ("vanilla", "lik")) -> str:  # fmt: skip
    """How far each backend's batch goes on one card: in the grid cells (a few steps, one seed), in the
    ceiling searches (8 steps, every seed, with the batches that ran out of memory), whether the two
    disagree, and — from the searches — whether vanilla scoring stops at a batch the fused backend trains."""
    sentences = []
    grid = [reach for backend in backends if (reach := _grid_reach(cells, stack, regime, backend, card))]
    if grid:
        text = f"In the grid cells ({grid_steps(matching(cells, stack=stack, regime=regime, card=card))}), " + "; ".join(grid)
        spread = _peak_spread(cells, stack, regime, card, backends)
        if spread is not None and spread[1] > 1:
            size = f"{spread[0]:.1f} MiB" if spread[0] < 1024 else f"{spread[0] * GIB_PER_MIB:.2f} GiB"
            text += f", with step peaks allocated within {size} of each other at the {spread[1]} batches both trained"
        sentences.append(text)
    rows = {backend: find_search(searches, stack, regime, backend, card) for backend in backends}
    searched = []
    for backend, row in rows.items():
        if row is None or row.probes == 0:
            continue
        failed = _default(probes, stack=stack, regime=regime, backend=backend, card=card, outcome="oom")
        ceiling, notes = ceiling_text(row, running_note=""), ["searching"] if row.running else []
        if not failed.empty:
            batches = [str(b) for b in sorted({int(b) for b in failed["batch_size"]})]
            where = {"maxsim": "in the MaxSim op", "elsewhere": "outside the op"}
            places = sorted({where.get(str(w), "") for w in failed["oom_where"]} - {""})
            listed = batches[0] if len(batches) == 1 else f"{', '.join(batches[:-1])} and {batches[-1]}"
            notes.append(f"B={listed} ran out of memory" + (f" {' and '.join(places)}" if places else ""))
        searched.append(f"{backend} {ceiling}" + (f" ({'; '.join(notes)})" if notes else ""))
    if searched:
        plan = next(row for row in rows.values() if row is not None and row.probes > 0).search
        sentences.append(f"The ceiling searches ({plan.steps} steps, {counted(len(plan.seeds), 'seed')}): "
                         + "; ".join(searched))  # fmt: skip
    disagree = [f"{backend} at B={batch}" for backend in backends
                for batch in _disputed(cells, probes, stack, regime, backend, card)]  # fmt: skip
    if disagree:
        sentences.append("The grid cell and the search's probes disagree about " + ", ".join(disagree)
                         + ": one trains the batch, another runs out of memory")  # fmt: skip
    vanilla, fused = rows.get("vanilla"), [row for b in backends if b != "vanilla" and (row := rows.get(b)) is not None]
    if vanilla is not None and vanilla.probes > 0 and fused:
        sentences.append(_search_verdict(vanilla, fused, probes))
    return ". ".join(sentences) + "." if sentences else "not measured yet"


def _search_verdict(vanilla: SearchRow, fused: Sequence[SearchRow], probes: pd.DataFrame) -> str:
    """What the ceiling searches of one card say of vanilla against the fused backends, only from what
    they settled: vanilla fails at a batch a fused backend trained on every seed; both stop at the same
    batch; or not separated yet — with, for a search under way, how many seeds its largest batch has
    trained so far (its walk runs on the first seed; the others confirm only the batch it ends on)."""
    settled = [(row.backend, row.settled) for row in fused if row.settled is not None]
    if vanilla.settled is not None and vanilla.fails is not None and any(fits >= vanilla.fails for _, fits in settled):
        backend, fits = max(settled, key=lambda item: item[1])
        return (f"So on this card vanilla scoring fails at a batch that {backend} trains on every seed (vanilla "
                f"{vanilla.settled}, {backend} {fits}): with the same encoder, the scoring backend decides how far the "
                "batch goes")  # fmt: skip
    if vanilla.settled is not None and len(settled) == len(fused) and all(fits == vanilla.settled for _, fits in settled):
        return "Both stop at the same batch: the encoder, not the score grid, decides how far the batch goes"
    pending = [row for row in (vanilla, *fused) if row.settled is None]
    seeds = []
    for row in pending:
        if row.fits is None or probes.empty:
            continue
        trained = probes_of(probes, row.stack, row.regime, row.fits, row.backend, row.card)
        count = trained.loc[trained["outcome"] == "ok", "seed"].nunique() if not trained.empty else 0  # a seed once
        if count < len(row.search.seeds):
            seeds.append(f"{row.backend}'s B={row.fits} has trained {count} of its {len(row.search.seeds)} seeds")
    names = _names([row.backend for row in pending])
    text = (f"Until {names}'s search{'es have' if len(pending) > 1 else ' has'} finished, the searches have not "
            "separated the backends on this card")  # fmt: skip
    return text + (f" ({'; '.join(seeds)} so far)" if seeds else "")


def _disputed(cells: pd.DataFrame, probes: pd.DataFrame, stack: str, regime: str, backend: str, card: str) -> list[int]:
    """Batches of one backend and card where a grid cell and a ceiling probe disagree (one trained, one ran out of memory)."""
    if cells.empty or probes.empty:
        return []
    grid = matching(cells, stack=stack, regime=regime, backend=backend, card=card, allocator="default")
    disputed = []
    for _, row in grid.iterrows():
        chosen = probes_of(probes, stack, regime, int(row["batch_size"]), backend, card)
        if {"ok", "oom"} <= set(chosen["outcome"]) | {row["outcome"]}:
            disputed.append(int(row["batch_size"]))
    return sorted(disputed)


def allocator_verdict(probes: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str) -> str:
    """Whether the allocator setting changes the outcome of one batch's probes, in words: the batch trains
    (every seed) under one setting and runs out of memory under the other, or the two agree."""
    outcomes = {}
    for allocator in ("default", "expandable"):
        chosen = probes_of(probes, stack, regime, batch, backend, card, allocator) if not probes.empty else probes
        if chosen.empty:
            return ""
        failed, trained = (chosen["outcome"] == "oom").any(), (chosen["outcome"] == "ok").all()
        outcomes[allocator] = "fails" if failed else "trains" if trained else None
    if None in outcomes.values():
        return ""
    if outcomes["default"] != outcomes["expandable"]:
        return f"at that batch the allocator setting alone decides whether {backend} scoring trains"
    return f"at that batch the allocator setting does not change the outcome (it {outcomes['default']} under both)"


# ---- beside the published numbers ----------------------------------------------------------------


def published_agreement(cells: pd.DataFrame, published: pd.DataFrame) -> str:
    """How our cells compare with the published ones (:func:`harness.report.data.published`): the step
    peaks where both trained (the table's Δ column), the outcomes, and the step times, in words."""
    if published.empty:
        return ""
    deltas, times, agree, differ = [], [], 0, []
    timed_on: list[tuple[object, str]] = []  # each timed cell compared: our GPU, the published card
    for _, ref in published.iterrows():
        backend = backend_label(ref["variant"], ref["score_mini_batch_size"])
        ours = _default(cells, batch_size=ref["batch_size"], backend=backend, card=ref["card"])
        if ours.empty:
            continue
        mine = ours.iloc[0]
        if mine["outcome"] == ref["outcome"]:
            agree += 1
        else:
            theirs = "trained" if ref["outcome"] == "ok" else "ran out of memory"
            ours_word = {"ok": "trained", "oom": "ran out of memory"}.get(str(mine["outcome"]), str(mine["outcome"]))
            differ.append(f"B={ref['batch_size']} {backend} ({theirs} in the published run, {ours_word} in ours)")
        if mine["outcome"] == ref["outcome"] == "ok":
            if not pd.isna(ref["step_peak_alloc_gib"]):
                deltas.append((mine["step_peak_alloc_mib"] * GIB_PER_MIB, float(ref["step_peak_alloc_gib"])))
            if not pd.isna(ref["steady_step_time_sec"]) and not timed(ours.iloc[:1]).empty:
                times.append(timing.ratio(mine["steady_times_sec"], [ref["steady_step_time_sec"]]))
                timed_on.append((mine.get("device_name"), str(ref["card"])))
    compared = agree + len(differ)
    if not compared:
        return ""
    sentences = []
    if deltas:
        sentences.append(f"Where both runs trained ({counted(len(deltas), 'cell')}), {peak_offsets(deltas)} (the Δ column)")
    else:
        sentences.append("The published run gives no step peak for a cell that trained here, only outcomes, so there is "
                         "no peak to compare")  # fmt: skip
    if differ:
        sentences.append(f"The outcome agrees at {agree} of the {compared} published cells; it differs at " + "; ".join(differ))
    else:
        sentences.append(f"The outcome (trained or out of memory) agrees at all {compared} published cells")
    if times:
        values = [ratio.value for ratio in times]
        low, high = min(ratio.low for ratio in times), max(ratio.high for ratio in times)
        digits = ".3f" if span(low, high, ".2f") == span(min(values), max(values), ".2f") else ".2f"
        interval = span(low, high, digits)
        sentences.append(f"Our steady step times are {span(min(values), max(values), digits)}× the published ones over "
                         f"{len(times)} cells ({interval} with each cell's bootstrap 95% interval, which covers our median "
                         "only, since a published time is one figure with no spread)")  # fmt: skip
        sentences.append(published_gpus(timed_on))
    return ". ".join(sentences) + "."


def peak_offsets(peaks_gib: Sequence[tuple[float, float]]) -> str:
    """Where our step peaks allocated lie against the published ones, each cell given as (ours, published)
    in GiB, in words: 'our step peaks allocated lie 0.5–1.5% below the published ones'; above, or between
    a figure below and one above; equal where every one of ours reads the published figure to its
    hundredth of a GiB (the precision the published figures are given to)."""
    one = len(peaks_gib) == 1
    ours = "our step peak allocated" if one else "our step peaks allocated"
    theirs = "the published one" if one else "the published ones"
    if all(f"{mine:.2f}" == f"{published:.2f}" for mine, published in peaks_gib):
        return f"{ours} {'equals' if one else 'equal'} {theirs} to the hundredth of a GiB"
    offsets = [100 * (mine - published) / published for mine, published in peaks_gib]
    digits = 1 if max(abs(offset) for offset in offsets) >= 0.05 else 2
    shown = [round(offset, digits) for offset in offsets]  # an offset that reads 0 lies on neither side
    below, above = [-offset for offset in shown if offset < 0], [offset for offset in shown if offset > 0]
    if not below and not above:
        return f"{ours} {'lies' if one else 'lie'} within 0.01% of {theirs}"
    if below and above:
        return f"{ours} lie between {max(below):.{digits}f}% below and {max(above):.{digits}f}% above {theirs}"
    sizes = [abs(offset) for offset in shown]
    side = "below" if below else "above"
    return f"{ours} {'lies' if one else 'lie'} {span(min(sizes), max(sizes), f'.{digits}f')}% {side} {theirs}"


def _ran_on(devices: Sequence[object]) -> str:
    """'an H200', or 'an H200 (4) and an H100 80GB HBM3 (1)' where the cells ran on several GPUs."""
    names = [gpu_text(device) for device in devices]
    words = {name: "an unrecorded GPU" if name == UNRECORDED else f"an {name}" for name in names}
    if len(words) == 1:
        return next(iter(words.values()))
    return joined([f"{words[name]} ({names.count(name)})" for name in sorted(words)])


def published_gpus(timed_on: Sequence[tuple[object, str]]) -> str:
    """Which GPUs our timed cells ran on beside the one the published figures name, each cell given as
    (its GPU, the published card), in words. A cap emulates a card's memory, not its speed: a step time
    compares across the two runs only where our cell ran on the published card's GPU; elsewhere only
    the ratios between backends within each run do."""
    if not timed_on:
        return ""
    theirs = joined(sorted({card_gpu(card) or card for _, card in timed_on}))
    same = [device for device, card in timed_on if on_card_gpu(device, card)]
    other = [device for device, card in timed_on if not on_card_gpu(device, card)]
    within = "so compare backends within one run, not across the two"
    if not same:
        return f"Our {counted(len(other), 'timed cell')} ran on {_ran_on(other)}, the published ones on an {theirs}, {within}"
    its = "its time" if len(same) == 1 else "their times"
    alike = f"the GPU the published figures name, so the GPU does not set {its} apart from the published ones"
    if not other:
        return f"Our {counted(len(same), 'timed cell')} ran on {_ran_on(same)}, {alike}"
    return (f"{len(same)} of our {len(timed_on)} timed cells ran on {_ran_on(same)}, {alike}; the other {len(other)} "
            f"ran on {_ran_on(other)}, not an {theirs}, so for those compare backends within one run, not across the two")


def published_op_reading(calls: pd.DataFrame, published: pd.DataFrame, backend: str = "vanilla") -> str:
    """The published op figures of one backend that split held and backward spike (:data:`PUBLISHED_OP`),
    beside our replays of the same cells, in words: each total, and whether the backward spike stands to
    the held memory in the same ratio in both runs (the same op, on a grid of another size)."""
    parts, ratios, tokens = [], [], []
    for _, ref in published_op(published).iterrows():
        if backend_label(ref["variant"], ref["score_mini_batch_size"]) != backend:
            continue
        if any(pd.isna(ref[c]) for c in ("op_held_mib", "op_backward_spike_mib", "op_total_mib")) or calls.empty:
            continue
        mine = calls[(calls["batch_size"] == ref["batch_size"]) & (calls["backend"] == backend) & (calls["card"] == ref["card"])
                     & ~calls["oom_in_replay"].astype(bool)]  # fmt: skip
        if mine.empty:
            continue
        call = largest_call(mine)
        held, spike = float(call["saved_for_backward_mib"]), float(call["backward_transient_peak_mib"])
        total = held + spike
        parts.append(f"at B={ref['batch_size']} the published figure is {as_published(ref['op_held_mib'])} held + "
                     f"{as_published(ref['op_backward_spike_mib'])} backward spike = {as_published(ref['op_total_mib'])}, "
                     f"ours {as_published(held)} + {as_published(spike)} = {as_published(total)} "
                     f"({percent(100 * (total - ref['op_total_mib']) / ref['op_total_mib'])})")  # fmt: skip
        ratios.append((ref["op_backward_spike_mib"] / ref["op_held_mib"], spike / held))
        tokens.append(call_tokens(call))
    if not parts:
        return ""
    text = (f"**The op beside the published figures.** The published op memory of {backend} scoring is held + "
            "backward spike: " + "; ".join(parts) + ".")  # fmt: skip
    if all(abs(theirs - ours) <= 0.02 * theirs for theirs, ours in ratios):
        shown = sorted({f"{ours:.2f}" for _, ours in ratios})
        text += (f" In both runs the backward spike is {' to '.join(shown)}× the held memory at every batch compared: "
                 "the same op on grids of another size — a grid follows the query and page tokens of the call replayed "
                 f"(ours: {', '.join(tokens)}), which each run's batches draw.")  # fmt: skip
    else:
        text += " The backward spike stands to the held memory as " + "; ".join(
            f"{theirs:.2f}× published, {ours:.2f}× ours" for theirs, ours in ratios) + "."
    return text


def published_failure(published: pd.DataFrame, evidence: claims.Evidence | None = None) -> str:
    """A published out-of-memory cell beside the backends that trained its batch, from the published
    figures: the request, what was allocated and reserved at its peak, and the peaks of those that
    trained; with ``evidence`` (:func:`harness.report.claims.evidence`), the memory reserved but not
    allocated, published and ours, read at both moments (:func:`harness.report.claims.oom_reading`, the
    reading the claims page shows)."""
    if published.empty:
        return ""
    failed = published[(published["outcome"] == "oom") & published["step_peak_alloc_gib"].notna()]
    if failed.empty:
        return ""
    ref = failed.iloc[0]
    others = published[(published["batch_size"] == ref["batch_size"]) & (published["outcome"] == "ok")
                       & published["step_peak_alloc_gib"].notna()]  # fmt: skip
    backend = backend_label(ref["variant"], ref["score_mini_batch_size"])
    text = (f"in the published run {backend} scoring ran out of memory at B={ref['batch_size']} asking for "
            f"{ref['oom_request_gib']:.2f} GiB with {ref['step_peak_alloc_gib']:.2f} GiB allocated and "
            f"{ref['step_peak_reserved_gib']:.2f} GiB reserved at its peak")  # fmt: skip
    for _, other in others.iterrows():
        text += (f", while {backend_label(other['variant'], other['score_mini_batch_size'])} trained the same batch at "
                 f"{other['step_peak_alloc_gib']:.2f} GiB allocated "
                 f"({other['step_peak_reserved_gib']:.2f} GiB reserved)")  # fmt: skip
    if evidence is not None:
        reading = claims.oom_reading(evidence, str(ref["stack"]), str(ref["regime"]), int(ref["batch_size"]), backend,
                                     str(ref["card"]))  # fmt: skip
        if reading:
            text += ". " + reading.removesuffix(".")
    return text


# ---- shapes and what fails first -----------------------------------------------------------------


def call_shapes(calls: pd.DataFrame) -> str:
    """The query and document tokens and the dtype of every recorded MaxSim call, in words."""
    if calls.empty:
        return ""
    queries = [list(shape)[1] for shape in calls["query_shape"]]
    documents = [list(shape)[1:-1] for shape in calls["doc_shape"]]
    pages = [n for shape in documents for n in shape]
    dtypes = ", ".join(sorted({str(d) for d in calls["dtype"]}))
    return (f"In the {len(calls)} recorded calls, queries have {min(queries)}–{max(queries)} tokens and documents "
            f"{min(pages)}–{max(pages)}, and the embeddings reach the loss as {dtypes}.")  # fmt: skip


WHERE_FAILED = {"maxsim": "in the MaxSim op", "elsewhere": "outside the op"}


def _names(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def ceiling_reach(searches: Sequence[SearchRow], stack: str, regime: str, allocator: str = "default") -> list[str]:
    """Per card, from the ceiling searches (the finer measurement: every seed, bisected to the search's
    resolution), the largest batch each backend trains and where the next batch ran out of memory — in
    the MaxSim op or outside it — then what that says, computed:

    - vanilla's next batch fails in the op and another backend trains more: vanilla's score grid binds first;
    - every backend stops at the same batch, outside the op: the score op is not what fills the card;
    - the same batch, vanilla failing in the op: at the search's resolution the score op does not move it.

    A search under way is given as its range, one not started as 'not run'; a card with no probe is left out."""
    lines = []
    rows = [row for row in searches if (row.stack, row.regime, row.allocator) == (stack, regime, allocator)]
    for card in cards_in_order(row.card for row in rows if row.probes > 0):
        on_card = [row for row in rows if row.card == card]
        order = style.in_order({row.backend for row in on_card})
        on_card.sort(key=lambda row: order.index(row.backend))
        parts = []
        for row in on_card:
            if row.settled is not None and row.fails is not None:
                where = WHERE_FAILED.get(row.fails_where or "", "")
                parts.append(f"{row.backend} trains {row.settled} (B={row.fails} runs out of memory {where})".replace(" )", ")"))
            elif row.probes == 0:
                parts.append(f"{row.backend}'s search has not run")
            else:
                parts.append(f"{row.backend} {ceiling_text(row)}")
        text = f"On the {card_short(card)} card: " + "; ".join(parts)
        vanilla = next((row for row in on_card if row.backend == "vanilla"), None)
        others = [row for row in on_card if row is not vanilla and row.settled is not None]
        if vanilla is not None and vanilla.settled is not None and vanilla.fails is not None and others:
            above = [row for row in others if row.settled is not None and row.settled > vanilla.settled]
            same = all(row.settled == vanilla.settled for row in others)
            if vanilla.fails_where == "maxsim" and above:
                batches: dict[int, list[str]] = {}
                for row in above:
                    batches.setdefault(int(row.settled or 0), []).append(row.backend)
                more = ", ".join(f"{_names(names)} {batch}" for batch, names in sorted(batches.items()))
                others_word = "the others" if len(above) == len(others) else "others"
                text += (f" — vanilla's score grid binds first: its next batch fails in the MaxSim op, while {others_word} "
                         f"train more ({more}: up to {max(batches) / vanilla.settled:.2f}× vanilla's batch)")  # fmt: skip
            elif same and all(row.fails_where == "elsewhere" for row in [vanilla, *others]):
                text += " — every backend stops at the same batch, outside the op: the score op is not what fills the card"
            elif same and vanilla.fails_where == "maxsim":
                text += (" — every backend stops at the same batch: vanilla's next batch fails in the MaxSim op, the "
                         "others' outside it, so at the search's resolution the score op does not move the ceiling")  # fmt: skip
        lines.append(text + ".")
    return lines


def speed_ratios(cells: pd.DataFrame, fused: str = "lik", from_batch: int = 64, noise: float | None = None) -> str:
    """A fused backend's steady step speed relative to vanilla over every batch and card both trained
    and were timed under the timing rule, in words; with ``noise`` (the regime's run-to-run noise,
    :class:`harness.report.timing.RunNoise`), a ratio is named as a difference only where its whole 95%
    interval lies outside 1 ± that noise (:meth:`harness.report.timing.Ratio.beyond`)."""
    if cells.empty:
        return ""
    ok = timed(cells)
    ok = ok[ok["allocator"] == "default"]
    if ok.empty:
        return ""
    pairs = ok.pivot_table(index=["card", "batch_size"], columns="backend", values="steady_step_time_sec", aggfunc="first")
    if not {"vanilla", fused} <= set(pairs.columns):
        return ""
    ratio = (pairs["vanilla"] / pairs[fused]).dropna()
    if ratio.empty:
        return ""
    large = ratio[ratio.index.get_level_values("batch_size") >= from_batch]

    def span(values: pd.Series) -> str:
        low, high = f"{values.min():.2f}×", f"{values.max():.2f}×"
        return low if low == high else f"{low} to {high}"

    text = f"{fused} runs a step at {span(ratio)} vanilla's speed over the {len(ratio)} batch and card pairs both trained"
    if not large.empty and len(large) < len(ratio):
        text += f" ({span(large)} from B={from_batch} up)"
    times = ok.set_index(["card", "batch_size", "backend"])["steady_times_sec"]
    intervals = {key: timing.ratio(times[(*key, "vanilla")], times[(*key, fused)]) for key in ratio.index}
    beyond = {key: value for key, value in intervals.items() if value.beyond(noise)}
    measurable = [f"B={batch}: {timing.ratio_words(value)}" for (_, batch), value in beyond.items()]
    within = "" if noise is None else f" or reaches into 1 ± the run-to-run noise (±{100 * noise:.1f}%)"
    if not measurable:
        return text + f"; every pair's 95% interval holds 1{within}: no {'' if within else 'measurable '}difference"
    where = " lies wholly outside 1 ± that noise" if within else " excludes 1"
    return text + f"; measurable where the 95% interval{where} — " + ", ".join(measurable)


def fused_failure_places(searches: Sequence[SearchRow]) -> str:
    """Where the batch above a fused backend's ceiling ran out of memory, over every search that has one:
    all outside the MaxSim op, or which searches failed in it."""
    fused = [row for row in searches if row.backend in ("lik", "flash") and row.fails_where is not None]
    if not fused:
        return ""
    inside = [row for row in fused if row.fails_where == "maxsim"]
    if not inside:
        moved = [row for row in fused
                 if (twin := find_search(searches, row.stack, row.regime, "vanilla", row.card, row.allocator)) is not None
                 and twin.fails_where == "maxsim"]  # fmt: skip
        searches_of = f"In all {len(fused)} searches" if len(fused) > 1 else "In the one search"
        text = f"{searches_of} of a fused backend whose next batch has failed, it failed outside the op"
        if not moved:
            return text + "."
        return (text + f"; in {len(moved)} of them vanilla's next batch failed in the op, so there the fused backend "
                "moves the failure out of the score op.")  # fmt: skip
    named = ", ".join(f"{row.stack} · {row.regime} {row.backend} on {card_short(row.card)}" for row in inside)
    return (f"Of the {len(fused)} searches of a fused backend whose next batch has failed, {len(inside)} failed in "
            f"the op: {named}.")  # fmt: skip


def timing_coverage(cells: pd.DataFrame) -> str:
    """How many of a page's trained cells were timed under the timing rule, and why the others are
    not shown (their recorded reason), in words."""
    ok = cells[cells["outcome"] == "ok"] if not cells.empty else cells
    if ok.empty:
        return ""
    shown = timed(ok)
    if len(shown) == len(ok):
        return (f"All {len(ok)} cells that trained here were timed under the timing rule: each had its GPU and its "
                "CPU cores to itself while it trained.")  # fmt: skip
    left = ok.drop(shown.index)
    reasons = left["timing_reason"].fillna("no record").value_counts()
    if shown.empty:
        why = "; ".join(reasons.index) if len(reasons) == 1 else "; ".join(f"{n}: {reason}" for reason, n in reasons.items())
        return f"None of the {len(ok)} cells that trained here was timed under the timing rule yet ({why}), so no time is shown."
    why = "; ".join(f"{count} {reason}" for reason, count in reasons.items())
    return (f"{len(shown)} of the {len(ok)} cells that trained here were timed under the timing rule, and only they "
            f"are shown. The others: {why}.")  # fmt: skip


def op_timing_coverage(ops: pd.DataFrame) -> str:
    """The op page's line under its tables' lead: :func:`timing_coverage` of its op cells, or '' where none
    was timed (:func:`op_tables_lead` says so then, and the 'none was timed' sentence would repeat it)."""
    return "" if timed(ops).empty else timing_coverage(ops)


def published_time_lead(table: pd.DataFrame, published: pd.DataFrame) -> str:
    """The sentence before the published step-time table: what it sets side by side, or — where it is
    empty — why there is none (the published run timed no cell of this regime, or none we timed), so a
    page never shows a heading over an empty table."""
    if not table.empty:
        return ("The published run timed its cells on an H100 80 GB, ours on an H200 capped to that card's memory but "
                "not to its speed. A published time is one figure with no spread to resample, so the interval of ours "
                "÷ published is our median's bootstrap 95% interval alone. The published step times beside ours, for "
                "the cells both runs timed:")  # fmt: skip
    if published.empty or published["step_sec"].isna().all():
        return "The published run gives no step time for this regime, so there is none to set beside ours."
    return "None of the cells the published run timed has a cell of ours timed under the timing rule yet."


def published_time_reading(cells: pd.DataFrame, published: pd.DataFrame, noise: timing.RunNoise | None = None) -> str:
    """The published speed ratios between backends at one batch beside ours (timed cells only), and
    the ratio of the two ratios, in words. A pair is a fused or chunking backend against vanilla,
    or against chunking where vanilla ran out of memory. With ``noise`` (the run-to-run noise), ours
    is named faster or slower only where its interval lies wholly outside 1 ± its regime's noise."""
    ok = timed(cells)
    refs = published.copy()
    if ok.empty or refs.empty:
        return ""
    refs["backend"] = [backend_label(v, c) for v, c in zip(refs["variant"], refs["score_mini_batch_size"], strict=True)]
    parts = []
    for batch, group in refs.dropna(subset=["step_sec"]).groupby("batch_size"):
        theirs = dict(zip(group["backend"], group["step_sec"], strict=True))
        base = "vanilla" if "vanilla" in theirs else next((b for b in theirs if b.startswith("vanilla +")), None)
        mine = {row["backend"]: row["steady_times_sec"] for _, row in ok[ok["batch_size"] == batch].iterrows()}
        if base is None or base not in mine:
            continue
        for backend, seconds in theirs.items():
            if backend == base or backend not in mine:
                continue
            published_speed = theirs[base] / seconds
            ours = timing.ratio(mine[base], mine[backend])
            band = None if noise is None else noise.of(str(group["stack"].iloc[0]), str(group["regime"].iloc[0]))
            of_ratios = timing.Ratio(ours.value / published_speed, ours.low / published_speed, ours.high / published_speed)
            parts.append(f"At B={batch}, {backend} against {base}: published {published_speed:.2f}× (no interval), ours "
                         f"{timing.ratio_words(ours, noise=band)}, "
                         f"ratio of ratios {timing.interval_text(of_ratios)}")  # fmt: skip
    if not parts:
        return ""
    return ("The published run timed its cells on an H100 80 GB, ours on an H200 capped to that card, so only speed "
            "ratios within each run compare. A published ratio is of two single published times, which give no "
            "spread, so it has no interval, and the ratio of ratios carries ours. Each pair sets a backend's speed "
            "against the reference backend's at the same batch. " + ". ".join(parts) + ".")  # fmt: skip


def repeat_reading(pairs: Sequence[tuple[CellResult, CellResult]]) -> str:
    """Whether every repeated cell's two runs agree within 3%, in words, naming those that do not."""
    gaps = [(first.cell_id, gap) for first, _, _, gap in timing.repeat_gaps(pairs)]
    if not gaps:
        return ""
    wide = [f"{cell} ({100 * gap:.1f}%)" for cell, gap in gaps if gap > timing.REPEAT_TOLERANCE]
    if not wide:
        return f"All {len(gaps)} repeated cells' medians agree within {100 * timing.REPEAT_TOLERANCE:.0f}%."
    return (f"{len(gaps) - len(wide)} of the {len(gaps)} repeated cells' medians agree within "
            f"{100 * timing.REPEAT_TOLERANCE:.0f}%; these do not: {', '.join(wide)}.")  # fmt: skip


def pinned_reading(checks: Sequence[timing.PinnedCheck]) -> str:
    """What the pinned check says per stack, and so whether that stack's cells may be timed pinned
    side by side (the timing rule), in words."""
    if not checks:
        return (f"The pinned check (`grids/pinned-check.yaml`: {timing.PINNED_MIN_CELLS} cells per stack timed two at a "
                "time on a two-GPU host, each pinned to its own cores) has no cell yet that ran beside another and has "
                "an alone run on the same host build, so no side-by-side time is published and every time shown here "
                "is of a cell that ran alone.")  # fmt: skip
    parts = []
    for stack, vouched in timing.pinned_verdicts(checks).items():
        mine = [check for check in checks if check.stack == stack]
        widest = max(check.gap for check in mine)
        if vouched:
            parts.append(f"{stack}: all {len(mine)} pinned cells time within {100 * timing.REPEAT_TOLERANCE:.0f}% of "
                         f"alone (widest {100 * widest:.1f}%), so its cells may be timed pinned side by side")  # fmt: skip
        elif len(mine) < timing.PINNED_MIN_CELLS:
            parts.append(f"{stack}: {len(mine)} pinned cells, fewer than the {timing.PINNED_MIN_CELLS} the check needs, "
                         "so its cells are timed alone")  # fmt: skip
        else:
            apart = sum(not check.agrees for check in mine)
            parts.append(f"{stack}: {apart} of {len(mine)} pinned cells time more than "
                         f"{100 * timing.REPEAT_TOLERANCE:.0f}% from alone (widest {100 * widest:.1f}%), so its cells "
                         "are timed alone")  # fmt: skip
    return "The pinned check, per stack — " + "; ".join(parts) + "."


def repeat_hosts(pairs: Sequence[tuple[CellResult, CellResult]]) -> str:
    """Whether each repeated cell's two runs ran on one machine (the same host kernel build in their
    platform string) or on two leased machines, and how far the medians moved in each group, in words."""
    gaps = {first.cell_id: gap for first, _, _, gap in timing.repeat_gaps(pairs)}
    groups: dict[bool, list[float]] = {True: [], False: []}
    for first, second in pairs:
        if first.cell_id in gaps and first.env is not None and second.env is not None:
            groups[timing.same_host_build(first, second)].append(gaps[first.cell_id])
    parts = [f"{len(values)} {'on one host build (the same platform string)' if same else 'on two host builds'}, "
             f"medians apart by up to {100 * max(values):.1f}%" for same, values in groups.items() if values]  # fmt: skip
    if not parts:
        return ""
    return "Where the two runs of a pair ran: " + "; ".join(parts) + "."


def cap_twin_reading(pairs: Sequence[tuple[CellResult, CellResult]]) -> str:
    """Which runs of one cell under two memory caps (:func:`harness.report.data.cap_pairs`) count as
    repeats — those the cap bound in neither run (:func:`harness.report.timing.cap_unbound`) — with the
    rule, how many per stack and regime, the widest gap of each and the pair it comes from, and the pairs
    left out with their step peak against the smaller cap, in words."""
    twins = [pair for pair in pairs if timing.cap_unbound(*pair)]
    bound = [pair for pair in pairs if not timing.cap_unbound(*pair)]
    if not pairs:
        return ""
    devices = sorted({first.env.device_name or first.env.device for first, _ in pairs if first.env is not None})
    text = (f"Two runs of one cell under two memory caps count as repeats too, where the cap bound neither: the "
            f"same recipe, backend, batch, allocator and seed on the same GPU model ({joined(devices)}), both runs' "
            f"step peaks (reserved) at most {100 * timing.CAP_UNBOUND_SHARE:.0f}% of the smaller cap, so that cap "
            "never made the allocator free its cache or fail and the runs differ in nothing that sets the step time")  # fmt: skip
    widest: dict[tuple[str, str], tuple[float, CellResult, CellResult]] = {}
    counts: dict[tuple[str, str], int] = {}
    for (first, second), (_, _, _, gap) in zip(twins, timing.repeat_gaps(twins), strict=True):
        key = (first.stack, first.regime)
        counts[key] = counts.get(key, 0) + 1
        if key not in widest or gap > widest[key][0]:
            widest[key] = (gap, first, second)
    if widest:
        parts = [f"{regime_label(*key)}: {counted(counts[key], 'pair')}, medians apart by up to {100 * gap:.1f}%, at "
                 f"B={first.batch_size} {first.spec.variant} on {card_short(first.card)} against {card_short(second.card)}"
                 for key, (gap, first, second) in sorted(widest.items())]  # fmt: skip
        text += ". Such twins, per recipe — " + "; ".join(parts)
    if bound:
        left = [f"{regime_label(first.stack, first.regime)} B={first.batch_size} {first.spec.variant}: the "
                f"{card_short(first.card)} run reserved {GIB_PER_MIB * (first.step_peak_reserved_mib or 0):.1f} GiB of its "
                f"{GIB_PER_MIB * (timing.cap_mib(first) or 0):.1f} GiB cap, the {card_short(second.card)} run "
                f"{GIB_PER_MIB * (second.step_peak_reserved_mib or 0):.1f} GiB" for first, second in bound]  # fmt: skip
        text += f". Left out, where a cap came near a step peak: {'; '.join(left)}"
    return text + "."


def interval_scope(noise: timing.RunNoise, cells: pd.DataFrame, fused: str = "lik") -> str:
    """What a speed ratio's 95% interval covers, against the run-to-run noise: it resamples the steady
    steps of one run of each cell, so it is the noise within a run; a second run of the same cell (a
    repeat or a cap twin, :class:`harness.report.timing.RunNoise`) moved its median by up to each
    recipe's noise. Says which noise applies to which recipe (a recipe timed here without a pair of its
    own takes the widest), and names the timed ratios of ``fused`` against vanilla whose interval
    excludes 1 but not its recipe's noise band (1 ± noise), computed from the cells."""
    if not noise.by_regime or noise.widest is None:
        return ""
    per = [f"{regime_label(stack, regime)}, {100 * gap:.1f}% over {counted(noise.pairs.get((stack, regime), 0), 'pair')}"
           for (stack, regime), gap in sorted(noise.by_regime.items())]  # fmt: skip
    text = (f"A speed ratio's 95% interval resamples the steady steps of one run of each cell: it is the noise within "
            f"a run, not between runs. Between two runs of the same cell (a repeat or a cap twin) the median moved, per "
            f"recipe, by up to: {'; '.join(per)}")  # fmt: skip
    ok = timed(cells)
    if not ok.empty:
        ok = ok[ok["allocator"] == "default"]
    regimes = set() if ok.empty else {(str(stack), str(regime)) for stack, regime in zip(ok["stack"], ok["regime"], strict=True)}
    few = [f"for {regime_label(*key)} the {counted(pairs, 'pair')} come{'s' if pairs == 1 else ''} from "
           f"{counted(n, 'cell')} ({100 * gap:.1f}%)"
           for key, (gap, pairs, n) in sorted(noise.too_few.items()) if key in regimes]  # fmt: skip
    without = [regime_label(*key) for key in sorted(regimes) if key not in noise.by_regime and key not in noise.too_few]
    if few:
        text += (f". {'; '.join(few)[0].upper()}{'; '.join(few)[1:]}: fewer than {timing.NOISE_MIN_CELLS}: one cell's "
                 f"pairs say how that cell repeats, not its recipe, so {'it takes' if len(few) == 1 else 'they take'} "
                 f"the widest, {100 * noise.widest:.1f}%")  # fmt: skip
    if without:
        text += (f"; {joined(without)}, with no pair of {'its' if len(without) == 1 else 'their'} own, "
                 f"{'takes' if len(without) == 1 else 'take'} the widest, {100 * noise.widest:.1f}%")  # fmt: skip
    text += (". Each recipe's speed ratios are read against its own noise: a ratio is named faster or slower only "
             "where its whole interval lies outside 1 ± that noise, since a second run of either cell could move it "
             "that far however narrow its interval; otherwise it reads no difference")  # fmt: skip
    if ok.empty:
        return text + "."
    within = []
    for (stack, regime, card, batch), group in ok.groupby(["stack", "regime", "card", "batch_size"]):
        times = dict(zip(group["backend"], group["steady_times_sec"], strict=False))
        if "vanilla" in times and fused in times:
            ratio = timing.ratio(list(times["vanilla"]), list(times[fused]))
            if ratio.measurable and not ratio.beyond(noise.of(str(stack), str(regime))):
                within.append(f"{regime_label(str(stack), str(regime))} B={batch} on {card_short(str(card))}, "
                              f"{ratio.value:.2f}× ({ratio.low:.2f}–{ratio.high:.2f})")  # fmt: skip
    if within:
        text += (f". Of the {fused} ratios against vanilla whose interval excludes 1, {len(within)} reach into their "
                 "recipe's noise and so read no difference: " + "; ".join(within))  # fmt: skip
    return text + "."


def _step_shapes(result: CellResult) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    return {call.step: (tuple(call.query_shape), tuple(call.doc_shape)) for call in result.maxsim_calls_in_train
            if call.step is not None}  # fmt: skip


def repeat_spread(pairs: Sequence[tuple[CellResult, CellResult]], cells: pd.DataFrame) -> str:
    """Whether each repeated cell's two runs trained the same batches (the same shapes step by step),
    and how widely the timed cells' steady steps spread per stack (p10–p90 over the median), in words."""
    sentences = []
    if pairs:
        same = []
        for first, second in pairs:
            one, two = _step_shapes(first).items(), _step_shapes(second).items()
            if one and two and (one <= two or two <= one):  # the shorter run's steps are the longer one's
                same.append(first.cell_id)
        if len(same) == len(pairs):
            sentences.append(f"Each of the {len(pairs)} pairs trained the same batches in both runs (the same query and "
                             "document shapes step by step: one seed, one stream), so where two medians differ, the "
                             "runs did, not the data")  # fmt: skip
        else:
            sentences.append(f"{len(same)} of the {len(pairs)} pairs trained the same batches in both runs")
    ok = timed(cells)
    if not ok.empty:
        spread = 100 * (ok["steady_step_p90_sec"] - ok["steady_step_p10_sec"]) / ok["steady_step_time_sec"]
        parts = []
        for stack, values in spread.groupby(ok["stack"]):
            parts.append(f"{stack} {values.median():.0f}% (up to {values.max():.0f}%) over {len(values)} cells")
        sentences.append("The steady steps' p10–p90 spread, as a share of the median, per stack: " + "; ".join(parts))
    return ". ".join(sentences) + "." if sentences else ""


def lik_spike_reading(experiments: Sequence[dict[str, object]], ops: pd.DataFrame, cells: pd.DataFrame) -> str:
    """Why the committed lik op cells at B ≥ 256 read more backward memory than the training cells'
    replays of the same shapes, from the investigation's numbers and the committed results."""
    if not experiments:
        return ""
    matched = all(abs(float(row["first_bwd_mib"]) - float(row["predicted_first_mib"])) <= 1 for row in experiments)  # type: ignore[arg-type]
    tuned = {int(row["batch"]): min(row["repeat_bwd_mib"]) for row in experiments if row["repeat_bwd_mib"]}  # type: ignore[call-overload]
    parts = []
    train = cells[(cells["stack"] == "pylate") & (cells["regime"] == "grad-checkpoint") & (cells["backend"] == "lik")] \
        if not cells.empty else cells
    for batch, value in sorted(tuned.items()):
        replay = pd.Series(dtype=float) if train.empty else \
            train[train["batch_size"] == batch]["op_backward_transient_peak_mib"].dropna()
        op = ops if ops.empty else ops[(ops["stack"] == "op-pylate") & (ops["variant"] == "lik") & (ops["batch_size"] == batch)]
        committed = pd.Series(dtype=float) if op.empty else op["backward_transient_peak_mib"].dropna()
        text = f"B={batch}: tuned {value:.1f} MiB"
        if not replay.empty:
            text += f", the training cells' replays {span(replay.min(), replay.max())} MiB"
        if not committed.empty:
            text += f", the committed op cell {committed.iloc[0]:.1f} MiB"
        parts.append(text)
    lead = ("In a fresh process, late-interaction-kernels' first backward at B ≥ 256 takes a path (lowmem) that the "
            "replay's two-row warm-up never ran, so Triton autotunes its kernels inside the measured bracket, and "
            "every configuration it benchmarks allocates Triton's 256 MiB cache-flush buffer on top of what is live")  # fmt: skip
    check = ("; the first call equals what was live plus that buffer, to the MiB, in every experiment" if matched
             else "; the first call does not always equal what was live plus that buffer")
    return (lead + check + ". Once tuned, the same call takes what a training cell's replay reads (" + "; ".join(parts)
            + "). The harness now measures a call again when an autotuner ran during it; the committed op cells "
            "predate that, so their lik backward spikes at B ≥ 256 include the tuner.")  # fmt: skip


def op_tables_lead(shown: Mapping[str, pd.DataFrame]) -> str:
    """What the op page's per-head tables (:func:`harness.report.tables.op_speed_tables`) show, read from
    their columns: times and the speed relative to vanilla only where a table has them; which heads
    share a table."""
    if not shown:
        return ""
    columns = {column for table in shown.values() for column in table.columns}
    memory = "the head's memory in every cell: what it holds for backward plus its backward spike (MiB)"
    if "median (ms)" in columns:
        negatives = " and negatives" if "negatives" in columns else ""
        text = (f"One table per head: the median forward + backward time (ms) with its 10th–90th percentile spread and "
                f"the speed relative to vanilla at the same batch{negatives} with its bootstrap 95% interval, both only "
                f"for cells timed under the timing rule (see the methodology), and {memory}.")  # fmt: skip
        untimed = [name for name, table in shown.items() if "median (ms)" not in table.columns]
        if untimed:
            text += f" No cell of {' or '.join(untimed)} was timed under that rule, so its table shows memory only."
    else:
        text = (f"One table per head, with {memory}. No cell here was timed under the timing rule (see the "
                "methodology), so the tables show no time and no speed relative to vanilla.")  # fmt: skip
    from harness.report.tables import shared_heads

    for name in shown:
        heads = shared_heads(name)
        if len(heads) > 1:
            text += (f" {' and '.join(heads)} have the same figures in every cell, so one table shows "
                     f"{'both' if len(heads) == 2 else 'them all'}.")  # fmt: skip
    return text


def tuner_legend(ops: pd.DataFrame, tuned_from: int | None, tuned: Mapping[int, float],
                 experiments: Sequence[dict[str, object]]) -> str:  # fmt: skip
    """The legend of :data:`harness.report.tables.TUNER_MARK` on the op page, from the cells it marks
    (:func:`harness.report.tables.tuner_inside`): why their memory includes the autotuner's buffers, at
    which batches the lik-spike record saw it, and for each marked cell its figure, the same call's once
    tuned (``tuned``, :func:`harness.report.tables.tuned_lik_totals`) and the difference. Empty where no
    cell is marked."""
    from harness.report.tables import TUNER_MARK, tuner_inside
    from harness.report.text import mib

    marked = ops[[tuner_inside(row, tuned_from) for _, row in ops.iterrows()]] if not ops.empty else ops
    if marked.empty:
        return ""
    seen = sorted({int(str(row["batch"])) for row in experiments if row.get("swept_in_bwd")})
    batches = sorted(int(batch) for batch in marked["batch_size"])
    unseen = [batch for batch in batches if batch not in seen]
    text = (f"{TUNER_MARK} PyLate's lik head at B ≥ {tuned_from}: measured on the op cell's first call, before the "
            "harness measured again a call during which a kernel autotuned, so the figure is not lik's own memory "
            f"alone. Where the lik-spike record below ran that call (B={' and '.join(str(b) for b in seen)}), Triton "
            "autotuned lik's backward kernels inside it and allocated its cache-flush buffer for every configuration "
            "it timed: the figure includes the autotuner's buffers")  # fmt: skip
    text += (f"; the record did not run B={' or '.join(str(b) for b in unseen)}, where what the first call adds is "
             "not attributed." if unseen else ".")  # fmt: skip
    parts = []
    for _, row in marked.sort_values("batch_size").iterrows():
        batch, total = int(row["batch_size"]), float(row["total_mib"])
        if batch in tuned:
            parts.append(f"B={batch}: {mib(total)} MiB, {mib(tuned[batch])} MiB tuned, {mib(total - tuned[batch])} MiB "
                         "more on the first call")  # fmt: skip
    if parts:
        text += (" In brackets, the same call's memory once its kernels were tuned, as a PyLate training cell's replay "
                 "of the same query and document shapes measured it (the record shows a tuned call reads what that "
                 f"replay reads): {'; '.join(parts)}.")  # fmt: skip
    return text


def stack_page_timing(cells: pd.DataFrame) -> str:
    """What the stack pages' step times were taken beside, from the cells' timing records (the timing
    rule, :mod:`harness.host`): how many trained cells may show times, and why the others may not."""
    # the stack pages' cells: training cells of the grids (op-level cells are the op page's)
    trained = cells[(cells["outcome"] == "ok") & (cells["kind"] == "train")] if not cells.empty else cells
    if trained.empty:
        return "No grid cell has trained yet, so the stack pages show no step time."
    comparable = trained["times_comparable"].astype(bool)
    shown = int(comparable.sum())
    text = (f"The stack pages show step times only for the {shown} of their {len(trained)} trained grid cells "
            "whose timing record says they had their GPU to themselves and no other cell on their CPU cores while "
            "they trained")
    others = trained[~comparable]
    if not others.empty:
        reasons = others["timing_reason"].fillna("no reason recorded").value_counts()
        named = "; ".join(f"{count}: {reason}" for reason, count in reasons.items())
        text += f"; the other {len(others)} show memory only ({named})"
    return text + "."


def _crash_reason(row: SearchRow) -> str:
    """A crash marker's message, or where the host's out-of-memory killer ended the probe its last clause,
    which says so (how the kernel stopped, before it, adds nothing)."""
    message = row.crash_message or ""
    return message.rsplit("; ", 1)[-1] if ran_out_of_host_memory(row) else message


def collate_memory_words(collate: pd.DataFrame, batch_size: int) -> str:
    """What collating ColQwen2 batches asks of the host, from :func:`harness.host_memory.per_page`'s
    rows: the measured peak-memory rise a page (its range over the measured batches) and, at
    ``batch_size``, what the recipe's workers, each collating a whole batch, ask at once. Empty
    without measurements."""
    if collate.empty:
        return ""
    low, high = collate["collate_mib_per_page"].min(), collate["collate_mib_per_page"].max()
    workers = int(collate["workers"].iloc[0])
    batches = ", ".join(str(batch) for batch in collate["batch_size"])
    per_page = f"{span(low, high, '.0f')} MiB"
    gib = f"{span(workers * batch_size * low * GIB_PER_MIB, workers * batch_size * high * GIB_PER_MIB, '.0f')} GiB"
    return (f"Collating a ColQwen2 batch on the CPU raised a process's peak resident memory by {per_page} a page "
            f"(batches of {batches} pages, `tools/collate_host_memory.py`), and each of the recipe's {workers} dataloader "
            f"workers collates a whole batch: at B = {batch_size} that is ≈ {gib} of host memory while all {workers} "
            "collate at once, before the collated batches they hand to the trainer.")  # fmt: skip


def _search_name(row: SearchRow) -> str:
    """A search in words: 'ColQwen2 lik on 141 GB (whole H200)', ', expandable segments' added for that allocator."""
    allocator = "" if row.allocator == "default" else f", {allocator_words(row.allocator)}"
    return f"{STACK_NAMES.get(row.stack, row.stack)} {row.backend} on {card_short(row.card)}{allocator}"


def long_run_note(searches: Sequence[SearchRow]) -> str:
    """The note under the ceiling table for the ceilings marked †: at which step the long run at each
    ran out of memory, and how the run below it (the long-run grid's stated margin) ended, naming the
    GPU where it was not an H200: '† At ColQwen2 lik on 80 GB's ceiling of 160, a long run ran out of
    memory at step 27 of 100; at 144 (90% of it), one trained all 100 steps, on an H100 80GB HBM3 at the
    same cap.' Empty where no long run at a ceiling ran out of memory."""
    said = []
    for row in searches:
        run = row.long_run
        if run is None or not run.ran_out:
            continue
        text = (f"At {_search_name(row)}'s ceiling of {run.batch_size}, a long run ran out of memory at step "
                f"{run.steps_trained + 1} of {run.steps}")  # fmt: skip
        lower = run.below
        if lower is None:
            text += "; no run below it has ended yet"
        else:
            share = f"{lower.batch_size} ({lower.batch_size / run.batch_size:.0%} of it)"
            if lower.held:
                text += f"; at {share}, one trained all {lower.steps} steps"
            elif lower.ran_out:
                text += f"; at {share}, one ran out of memory as well, at step {lower.steps_trained + 1} of {lower.steps}"
            else:
                text += f"; at {share}, one ended {lower.outcome} after {lower.steps_trained} of {lower.steps} steps"
            if other_gpu(lower.device_name):
                text += f", on {a_gpu(lower.device_name)} at the same cap"
        said.append(text + ".")
    if not said:
        return ""
    return f"{LONG_RUN_MARK} {' '.join(said)} The long-run section below follows every step."


def loader_reading(searches: Sequence[SearchRow]) -> str:
    """Which ceilings (marked ‡) come from probes that collated with fewer dataloader workers than the
    recipe's, where the recipe's search of the same setting stands (where the grid has one), and
    whether the workers changed the GPU's bytes: the largest gap between the peaks of the probes
    trained both ways (:attr:`SearchRow.loader_check`). Empty where no such search has probes."""
    from harness.stacks.colpali import DATALOADER_WORKERS

    said = []
    for row in (row for row in searches if row.search.dataloader_workers is not None and row.probes):
        workers = row.search.dataloader_workers
        text = f"{_search_name(row)} trained with {workers} dataloader worker{'' if workers == 1 else 's'}"
        text += (f": with the recipe's {DATALOADER_WORKERS} its search stands at {ceiling_text(row.recipe)}."
                 if row.recipe is not None else f", the recipe's {DATALOADER_WORKERS} never tried.")  # fmt: skip
        if row.loader_check:
            batches = sorted({check.batch_size for check in row.loader_check})
            alloc = max(check.alloc_mib for check in row.loader_check)
            reserved = max(check.reserved_mib for check in row.loader_check)
            seeds = len(row.loader_check)
            probes = f"{seeds} probe{'' if seeds == 1 else 's'}"
            same = round(alloc) == 0 and round(reserved) == 0
            text += (f" At B={', '.join(map(str, batches))}, trained both ways ({probes}), every step's peaks "
                     + ("are the same to the MiB, allocated and reserved." if same else
                        f"differ by at most {alloc:.0f} MiB allocated and {reserved:.0f} MiB reserved."))  # fmt: skip
        else:
            text += " No batch has trained both ways yet: whether the workers change the GPU's bytes is unchecked."
        said.append(text)
    if not said:
        return ""
    return (f"{LOADER_MARK} The dataloader workers collate pages on the host; where the lent host's memory cannot hold "
            f"the recipe's, a search runs with fewer. {' '.join(said)}")  # fmt: skip


def loader_key(shown: str, searches: Sequence[SearchRow], card: str | None = None) -> str:
    """The key to :data:`LOADER_MARK` under a text that shows it: :func:`loader_reading` of the searches
    (those on ``card``, where given), or '' where ``shown`` has no such mark to explain."""
    if LOADER_MARK not in shown:
        return ""
    return loader_reading([row for row in searches if card is None or row.card == card])


def crash_reading(searches: Sequence[SearchRow], collate: pd.DataFrame | None = None) -> str:
    """Why each search stopped by a crashed probe stopped, from the probe's crash marker: 'Stopped by a
    crash: ColQwen2 lik on 141 GB (whole H200), the probe at 320 — RuntimeError: …' and what settles it:
    running it again, or, where the host's out-of-memory killer ended it, a host with more memory or a
    search of its own with fewer dataloader workers;
    where that ended a ColQwen2 probe, what collating its batch asks of the host (``collate``:
    :func:`harness.host_memory.per_page`, :func:`collate_memory_words`). Empty where no search stopped so."""
    stopped = [row for row in searches if row.ceiling.crashed]
    if not stopped:
        return ""
    said = [f"{_search_name(row)}, the probe at {row.ceiling.next_batch}"
            f"{'' if not row.crash_message else f' — {_crash_reason(row)}'}" for row in stopped]  # fmt: skip
    host = [row for row in stopped if ran_out_of_host_memory(row)]
    settle = []
    if len(host) < len(stopped):
        settle.append("`harness ceiling --rerun-crashed` runs a crashed probe again")
    if host:
        settle.append("a probe the host's memory ended is settled on a host with more memory, or by a search of its own "
                      "with fewer dataloader workers")
    reading = f"Stopped by a crash: {'; '.join(said)}. {'; '.join(settle).capitalize()}."
    colpali = [row.ceiling.next_batch for row in host if row.stack == "colpali" and row.ceiling.next_batch]
    words = "" if collate is None or not colpali else collate_memory_words(collate, max(colpali))
    return f"{reading} {words}" if words else reading


def draw_reading(rows: Sequence[SearchRow], check_rows: Sequence[SearchRow] = ()) -> str:
    """Which draw of the synthetic data the ceilings rest on (:attr:`SearchRow.deciding_draws`: the probes at
    the ceiling and at the batch above it), per stack: the searches whose walk ended on probes of the earlier
    draw (``rows``: batch × steps rows per cell, before one stream per seed) and, for a stack whose batch
    shapes follow the data, run those probes again (:attr:`harness.search.Ceiling.earlier_draw`), or, for one
    whose shapes do not, keep them; each named by its setting. Then each search of the cross-card check
    (``check_rows``) that reached another ceiling on another draw than its ceilings-grid twin, with both."""
    parts = []
    for stack in sorted({row.stack for row in rows}):
        name = STACK_NAMES.get(stack, stack)
        again, kept = _rerun_on_current_draw(rows, stack), _kept_on_earlier_draw(rows, stack)
        finished = [row for row in _decided(rows) if row.stack == stack]
        if again:
            parts.append(f"{name}: {len(again)} searches ({_settings(again)}), whose deciding probes run again on the "
                         "current draw, since its batches' shapes follow the drawn images and queries (marked "
                         f"{EARLIER_DRAW_MARK} until they have)")  # fmt: skip
        elif kept:
            parts.append(f"{name}: {len(kept)} of its {len(finished)} finished searches ({_settings(kept)}), kept, since "
                         "it pads every query and document to fixed lengths: the earlier draw drew other tokens in "
                         "the same shapes")  # fmt: skip
        elif finished:
            parts.append(f"{name}: none of its {len(finished)} finished searches")
    if not parts:
        return ""
    text = ("Since one stream per seed replaced the draw of batch × steps rows per cell (the methodology), a ceiling "
            "decided on probes of the earlier draw is the ceiling of other batches. Searches whose ceiling or the batch "
            f"above it rests on a probe of the earlier draw: {'; '.join(parts)}.")
    answered = [row for row in rows if row.fits is not None and (row.ceiling.done or row.ceiling.earlier_draw)]
    twins = {(row.stack, row.regime, row.backend, row.card, row.allocator): row for row in answered}
    moved = [f"{STACK_NAMES.get(row.stack, row.stack)} {row.backend} on {card_short(row.card)} trained up to {row.fits} "
             f"on the {_draws(row)} (on {joined(sorted(a_gpu(name) for name in row.devices))}) "
             f"against {twin.fits} on the {_draws(twin)}"
             + (" (a ceiling whose deciding probes run again on the current draw)" if twin.ceiling.earlier_draw else "")
             for row in _decided(check_rows) if row.devices
             and (twin := twins.get((row.stack, row.regime, row.backend, row.card, row.allocator))) is not None
             and twin.fits != row.fits and twin.deciding_draws != row.deciding_draws]  # fmt: skip
    if moved:
        text += f" In the cross-card check above, {joined(moved)}: the draw, the GPU or both moved that ceiling."
    return text


def _settings(rows: Sequence[SearchRow]) -> str:
    """'vanilla on 24 GB, lik on 80 GB (expandable)': the searches' backends and cards."""
    return joined([f"{row.backend} on {card_short(row.card)}" + ("" if row.allocator == "default" else f" ({row.allocator})")
                   for row in rows])  # fmt: skip


def _rerun_on_current_draw(rows: Sequence[SearchRow], stack: str) -> list[SearchRow]:
    """A stack's searches whose walk ended on probes of the earlier draw, which run again on the current one."""
    return [row for row in rows if row.stack == stack and row.ceiling.earlier_draw]


def _kept_on_earlier_draw(rows: Sequence[SearchRow], stack: str) -> list[SearchRow]:
    """A stack's finished searches resting on a probe of the earlier draw (one whose shapes do not follow the data)."""
    return [row for row in _decided(rows) if row.stack == stack and row.deciding_draws - {CURRENT_DRAW}]


def _draws(row: SearchRow) -> str:
    """'stream draw', 'rows and stream draws': the draws a search's ceiling rests on."""
    return f"{joined(sorted(row.deciding_draws))} draw{'s' if len(row.deciding_draws) > 1 else ''}"


def draw_note(rows: Sequence[SearchRow]) -> str:
    """One line under the ceiling table: per stack, how many searches ended on probes of the earlier draw of
    the data and run them again (marked :data:`EARLIER_DRAW_MARK`), or rest on them, kept (fixed shapes);
    :func:`draw_reading` names them. "" where none does."""
    said = []
    for stack in sorted({row.stack for row in rows}):
        name = STACK_NAMES.get(stack, stack)
        again, kept = _rerun_on_current_draw(rows, stack), _kept_on_earlier_draw(rows, stack)
        if again:
            said.append(f"{len(again)} of the {sum(row.stack == stack and row.probes > 0 for row in rows)} {name} searches "
                        "that have run ended on probes of "
                        f"the data drawn before one stream per seed, whose batches had other shapes: marked "
                        f"{EARLIER_DRAW_MARK}, their deciding probes run again on the current draw")  # fmt: skip
        if kept:
            finished = sum(row.stack == stack for row in _decided(rows))
            said.append(f"{len(kept)} of {name}'s {finished} finished ceilings rest on a probe of that draw, kept since "
                        "its shapes are fixed")  # fmt: skip
    if not said:
        return ""
    return f"Data draw: {'; '.join(said)}. The section on probes on another GPU names them."


GRID_NAMES = {CROSS_CARD: "the cross-card check", SHARED_CHECK: "the shared-GPU check", CEILINGS: "the search"}


def below_ceiling_reading(failures: Sequence[BelowCeiling]) -> str:
    """Under the ceiling table: whether a batch no larger than a finished search's ceiling ran out of memory in a
    grid that runs the search's probes (:func:`harness.report.data.below_ceiling_failures`), each named with its
    seed, step, what its out-of-memory message says was reserved but not allocated, and where it ran. A ceiling says
    which batch trained every seed and that the one above it failed; not that every smaller batch trains, nor that
    the same probe trains again."""
    if not failures:
        return ("Below the ceilings: no probe of a finished search, in any grid that runs its probes, ran out of memory "
                "at its ceiling or below it.")  # fmt: skip
    said = []
    for failure in failures:
        row, result = failure.row, failure.result
        held = oom_held_mib(result.oom_message)
        step = f"at step {failure.failed_step}" if failure.failed_step > 1 else "before it finished its first step"
        where = "a GPU it did not record" if failure.device == UNRECORDED else a_gpu(failure.device)
        said.append(f"{regime_label(row.stack, row.regime)}, {row.backend} on {card_short(row.card)} "
                    f"({allocator_words(row.allocator)}) trained {row.fits} on {counted(len(row.search.seeds), 'seed')}, "
                    f"yet {result.spec.batch_size} ran out of memory on seed {result.spec.seed} {step}"
                    + (f" with {held[1] * GIB_PER_MIB:.2f} GiB reserved but unallocated" if held is not None else "")
                    + f" ({GRID_NAMES.get(str(result.grid), str(result.grid))}'s run of that probe, on {where}, on the "
                    f"draw of the data the ceiling stands on)")  # fmt: skip
    return ("Below the ceilings: a ceiling is the largest batch that trained on every seed of its search, with the batch "
            f"above it failing; a smaller batch can still fail, and so can a probe run again. {'; '.join(said)}.")


def _decided(rows: Sequence[SearchRow]) -> list[SearchRow]:
    """The finished searches with a ceiling whose deciding probes recorded their data draw."""
    return [row for row in rows if row.ceiling.done and row.fits is not None and row.deciding_draws]
