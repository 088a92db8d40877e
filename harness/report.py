"""What the book's summary pages show, computed from the committed results (never typed in).

Every function takes the frames :func:`harness.results.load_results` returns and one stack and
regime, and gives a table (pandas) or a figure (matplotlib). Figures annotate slopes measured from
the data, so a figure can never assert a scaling its points do not show.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness.cards import CARDS
from harness.results import default_results_dir, load_result, load_results, result_paths

PUBLISHED = Path(__file__).resolve().parent.parent / "book" / "data" / "published.csv"
GIB_PER_MIB = 1 / 1024


def show(item) -> None:  # type: ignore[no-untyped-def]
    """Display a table (full cell text, no row numbers) or a figure (then close it) in a page."""
    from IPython.display import display

    if isinstance(item, pd.DataFrame):
        with pd.option_context("display.max_colwidth", None):
            display(item.style.hide(axis="index") if item.index.name is None and item.index.nlevels == 1 else item)
        return
    display(item)
    plt.close(item)


def per_card(frame: pd.DataFrame, *renderers: Callable[[pd.DataFrame], object]) -> None:
    """For each card in ``frame``: a heading, then every renderer's table or figure for that card."""
    from IPython.display import Markdown, display

    keys = ["card", "allocator"] if "allocator" in frame.columns else ["card"]
    for key, group in frame.groupby(keys):
        card, allocator = (key + ("default",))[:2] if isinstance(key, tuple) else (key, "default")
        described = f" — {CARDS[card].description}" if card in CARDS else ""
        allocated = "" if allocator == "default" else f" · allocator: {allocator}"
        display(Markdown(f"**Card: {card}**{described}{allocated}"))
        for render in renderers:
            item = render(group)
            if not (isinstance(item, pd.DataFrame) and item.empty):
                show(item)


def failed_request(message: object) -> str:
    """The failed request of an OOM message: "CUDA out of memory. Tried to allocate X GiB. ..." → its 2nd sentence."""
    sentences = str(message).split(". ")
    return sentences[1] if len(sentences) > 1 else str(message)


def backend_label(variant: str, chunk: float | None) -> str:
    """vanilla, lik, flash, or 'vanilla + chunk 64' for PyLate's own mitigation."""
    if chunk is None or (isinstance(chunk, float) and math.isnan(chunk)):
        return variant
    return f"{variant} + chunk {int(chunk)}"


CEILINGS_GRID = Path(__file__).resolve().parent.parent / "grids" / "ceilings.yaml"


def with_backend(frame: pd.DataFrame) -> pd.DataFrame:
    """Add the ``backend`` column (variant, or 'vanilla + chunk N') to a results frame, in place."""
    if not frame.empty:
        frame["backend"] = [backend_label(v, c) for v, c in zip(frame["variant"], frame["score_mini_batch_size"])]
    return frame


SHARED_CHECK = "shared-gpu-check"


def load(results_dir: Path | None = None, leave_out: tuple[str, ...] = ("ceilings", SHARED_CHECK)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, isolated calls) with a ``backend`` column, from every grid folder of the results
    directory but ``leave_out``: ceiling probes have their own page, and the shared-GPU check its
    own table (:func:`sharing_check`)."""
    root = Path(results_dir or default_results_dir())
    sources = [path for path in result_paths(root) if path.relative_to(root).parts[0] not in leave_out]
    cells = load_results(sources)
    calls = load_results(sources, level="calls")
    for frame in (cells, calls):
        with_backend(frame)
    if not calls.empty:
        calls = calls[calls["kind"] == "isolated"]
    return cells, calls


def select(frame: pd.DataFrame, stack: str, regime: str, card: str | None = None) -> pd.DataFrame:
    if frame.empty:
        return frame
    chosen = frame[(frame["stack"] == stack) & (frame["regime"] == regime)]
    return chosen if card is None else chosen[chosen["card"] == card]


def op_vram_table(calls: pd.DataFrame) -> pd.DataFrame:
    """Isolated-replay op memory per batch size and backend (largest recorded shape of each cell).

    ``total`` is held + backward spike: the op's own footprint at its backward peak.
    """
    if calls.empty:
        return pd.DataFrame()
    rows = []
    for (batch, backend), group in calls.groupby(["batch_size", "backend"]):
        ok = group[~group["oom_in_replay"]]
        if ok.empty:
            rows.append({"batch": batch, "backend": backend, "held MiB": "OOM in replay",
                         "backward spike MiB": "", "forward transient MiB": "", "total MiB": "",
                         "predicted vanilla held MiB": f"{group['predicted_saved_for_backward_mib'].max():.1f}"})  # fmt: skip
            continue
        call = ok.loc[ok["saved_for_backward_mib"].idxmax()]
        rows.append({
            "batch": batch, "backend": backend,
            "held MiB": f"{call['saved_for_backward_mib']:.1f}",
            "backward spike MiB": f"{call['backward_transient_peak_mib']:.1f}",
            "forward transient MiB": f"{call['forward_transient_peak_mib']:.1f}",
            "total MiB": f"{call['saved_for_backward_mib'] + call['backward_transient_peak_mib']:.1f}",
            "predicted vanilla held MiB": f"{call['predicted_saved_for_backward_mib']:.1f}",
            "vanilla − prediction (held / fwd MiB)": _prediction_gap(call) if backend == "vanilla" else "",
        })  # fmt: skip
    return pd.DataFrame(rows)


def _prediction_gap(call: pd.Series) -> str:
    """Measured minus predicted vanilla bytes: tensor bytes are exact, the CUDA caching allocator
    may add up to 1 MiB per large block it does not split (allocations round up to 2 MiB segments)."""
    held = call["saved_for_backward_mib"] - call["predicted_saved_for_backward_mib"]
    forward = call["forward_transient_peak_mib"] - call["predicted_forward_transient_mib"]
    return f"{held:+.2f} / {forward:+.2f}"


def ceiling_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Step peak allocated / reserved (GiB) per batch size and backend; an OOM shows its failed request."""
    if cells.empty:
        return pd.DataFrame()

    def describe(row: pd.Series) -> str:
        alloc, reserved = row["step_peak_alloc_mib"] * GIB_PER_MIB, row["step_peak_reserved_mib"] * GIB_PER_MIB
        if row["outcome"] == "ok":
            return f"{alloc:.2f} / {reserved:.2f}"
        if row["outcome"] == "oom":
            where = "in the MaxSim op" if row["oom_where"] == "maxsim" else "outside the op"
            return f"OOM {where} ({failed_request(row['oom_message'])}; pre-OOM {alloc:.2f} / {reserved:.2f})"
        return "crashed"

    table = cells.assign(cell=cells.apply(describe, axis=1)).pivot_table(
        index="batch_size", columns="backend", values="cell", aggfunc="first"
    )
    return table.rename_axis(index="batch", columns=None).fillna("")


def fragmentation_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Reserved − allocated at the step peak (GiB) per batch and backend, and how the per-step
    difference moved from the first step to the last (MiB; cells that recorded per-step peaks)."""
    if cells.empty:
        return pd.DataFrame()

    def describe(row: pd.Series) -> str:
        if _missing(row["fragmentation_mib"]):
            return ""
        text = f"{row['fragmentation_mib'] * GIB_PER_MIB:.2f}"
        if not _missing(row.get("fragmentation_growth_mib")):
            text += f" ({row['fragmentation_first_step_mib']:.0f} → {row['fragmentation_last_step_mib']:.0f} MiB over {row['n_steps_done']} steps)"
        return text

    table = cells.assign(cell=cells.apply(describe, axis=1)).pivot_table(
        index="batch_size", columns="backend", values="cell", aggfunc="first"
    )
    return table.rename_axis(index="batch", columns=None).fillna("")


def step_time_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Steady seconds per step and samples/s, with the speed relative to vanilla at the same batch."""
    ok = cells[cells["outcome"] == "ok"] if not cells.empty else cells
    if ok.empty:
        return pd.DataFrame()
    vanilla = ok[ok["backend"] == "vanilla"].set_index("batch_size")["steady_step_time_sec"]
    rows = []
    for _, row in ok.sort_values(["batch_size", "backend"]).iterrows():
        base = vanilla.get(row["batch_size"])
        rows.append({
            "batch": row["batch_size"], "backend": row["backend"],
            "s / step": _number(row["steady_step_time_sec"], ".3f"), "samples / s": _number(row["samples_per_sec"], ".1f"),
            "speed vs vanilla": "" if _missing(base) or _missing(row["steady_step_time_sec"])
            else f"{base / row['steady_step_time_sec']:.2f}×",
            "steady steps (range, s)": _steady_range(row),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _matching(frame: pd.DataFrame, **values: object) -> pd.DataFrame:
    """The rows of ``frame`` whose columns equal ``values`` (column=value for each)."""
    keep = np.ones(len(frame), dtype=bool)
    for column, value in values.items():
        keep &= (frame[column] == value).to_numpy()
    return frame[keep]


def _missing(value: object) -> bool:
    return value is None or bool(pd.isna(value))


def _number(value: object, spec: str) -> str:
    """A table number, or a dash where the cell has none (e.g. every step was warm-up)."""
    return "—" if _missing(value) else format(value, spec)


def _steady_range(row: pd.Series) -> str:
    """How many steps the median is over and how far they spread: few or spread steps mean noise."""
    if not row["n_steady_steps"]:
        return "0"
    return f"{row['n_steady_steps']} ({row['steady_step_min_sec']:.2f}–{row['steady_step_max_sec']:.2f})"


def doubling_factors(batches: np.ndarray, values: np.ndarray) -> float:
    """Measured growth per batch doubling: the log-log slope fitted through the points, as a factor."""
    slope = np.polyfit(np.log2(batches), np.log2(values), 1)[0]
    return float(2**slope)


def plot_op_vram(calls: pd.DataFrame, title: str):  # type: ignore[no-untyped-def]
    """Log-log op memory (held + backward spike) vs batch per backend, each with its measured factor."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for backend, group in calls[~calls["oom_in_replay"]].groupby("backend"):
        per_batch = group.groupby("batch_size")[["saved_for_backward_mib", "backward_transient_peak_mib"]].max()
        total = per_batch.sum(axis=1).sort_index()
        if total.empty:
            continue
        label = backend
        if len(total) >= 2:
            label += f" (×{doubling_factors(total.index.to_numpy(float), total.to_numpy(float)):.1f} per doubling)"
        axis.plot(total.index, total.values, marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("batch size")
    axis.set_ylabel("MaxSim op memory, held + backward spike (MiB)")
    axis.set_title(title)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return figure


def plot_ceilings(cells: pd.DataFrame, title: str):  # type: ignore[no-untyped-def]
    """Step peak allocated per batch and backend; OOM cells hatched at their pre-OOM peak."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    done = cells[cells["outcome"].isin(["ok", "oom"])]
    batches = sorted(done["batch_size"].unique())
    backends = sorted(done["backend"].unique())
    width = 0.8 / max(len(backends), 1)
    for i, backend in enumerate(backends):
        labelled = False
        for j, batch in enumerate(batches):
            row = done[(done["backend"] == backend) & (done["batch_size"] == batch)]
            if row.empty:
                continue
            row = row.iloc[0]
            oom = row["outcome"] == "oom"
            axis.bar(j + i * width, row["step_peak_alloc_mib"] * GIB_PER_MIB, width, color=f"C{i}",
                     hatch="//" if oom else None, edgecolor="black" if oom else None, alpha=0.6 if oom else 1.0,
                     label=None if labelled else backend)  # fmt: skip
            labelled = True
    caps = {CARDS[c].usable_gib for c in done["card"].unique() if CARDS[c].usable_gib}
    for cap in caps:
        axis.axhline(cap, color="grey", linestyle="--", linewidth=1)
        axis.text(len(batches) - 0.5, cap, f"card: {cap} GiB", va="bottom", ha="right", fontsize=8)
    axis.set_xticks([j + width * (len(backends) - 1) / 2 for j in range(len(batches))], [str(b) for b in batches])
    axis.set_xlabel("batch size (hatched: out of memory, bar at the pre-OOM peak)")
    axis.set_ylabel("step peak allocated (GiB)")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    return figure


def published_comparison(cells: pd.DataFrame, stack: str, regime: str) -> pd.DataFrame:
    """Our step peaks and times beside the published ones for the same cells."""
    published = pd.read_csv(PUBLISHED)
    published = published[(published["stack"] == stack) & (published["regime"] == regime)]
    rows = []
    for _, ref in published.iterrows():
        backend = backend_label(ref["variant"], ref["score_mini_batch_size"])
        ours = cells[(cells["batch_size"] == ref["batch_size"]) & (cells["backend"] == backend)
                     & (cells["card"] == ref["card"])] if not cells.empty else cells  # fmt: skip
        mine = ours.iloc[0] if len(ours) else None
        rows.append({
            "batch": ref["batch_size"], "backend": backend,
            "published": _published_text(ref),
            "ours": "not run" if mine is None else _our_text(mine),
            "Δ step peak": _peak_difference(ref, mine),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _peak_difference(ref: pd.Series, mine: pd.Series | None) -> str:
    """Our allocated step peak relative to the published one, when both cells trained."""
    if mine is None or mine["outcome"] != "ok" or ref["outcome"] != "ok" or pd.isna(ref["step_peak_alloc_gib"]):
        return "—"
    ours = mine["step_peak_alloc_mib"] * GIB_PER_MIB
    return f"{100 * (ours - ref['step_peak_alloc_gib']) / ref['step_peak_alloc_gib']:+.1f}%"


def _published_text(ref: pd.Series) -> str:
    if ref["outcome"] == "oom":
        request = f" (asked {ref['oom_request_gib']} GiB)" if not pd.isna(ref["oom_request_gib"]) else ""
        return "OOM" + request
    text = f"{ref['step_peak_alloc_gib']:.2f} GiB"
    return text + (f" · {ref['steady_step_time_sec']:.2f} s/step" if not pd.isna(ref["steady_step_time_sec"]) else "")


def _our_text(row: pd.Series) -> str:
    if row["outcome"] == "oom":
        return f"OOM ({failed_request(row['oom_message'])})"
    if row["outcome"] != "ok":
        return row["outcome"]
    return f"{row['step_peak_alloc_mib'] * GIB_PER_MIB:.2f} GiB · {row['steady_step_time_sec']:.2f} s/step"


def headline(cells: pd.DataFrame, stack: str, regime: str, batch: int, backend: str, card: str = "h100-80gb") -> str:
    """One measured cell in words, for the introduction: its step peak, or the request it died on."""
    if cells.empty:
        return "not measured yet"
    row = _matching(cells, stack=stack, regime=regime, batch_size=batch, backend=backend, card=card, allocator="default")
    if row.empty:
        return "not measured yet"
    return _our_text(row.iloc[0])


def _probes(results_dir: Path | None, stack: str, regime: str, batch: int, backend: str, card: str,
            allocator: str) -> pd.DataFrame:  # fmt: skip
    """The committed ceiling probes of one batch (every seed run), sorted by seed."""
    probes = ceiling_probes(results_dir)
    if probes.empty:
        return probes
    chosen = _matching(probes, stack=stack, regime=regime, batch_size=batch, backend=backend, card=card, allocator=allocator)
    return chosen.sort_values("seed")


def _oom_words(row: pd.Series) -> str:
    where = "in the MaxSim op" if row["oom_where"] == "maxsim" else "outside the op"
    return (f"runs out of memory {where} after {row['n_steps_done']} of {row['steps']} steps "
            f"({failed_request(row['oom_message'])}; {row['pre_oom_alloc_mib'] * GIB_PER_MIB:.2f} GiB allocated, "
            f"{row['pre_oom_reserved_mib'] * GIB_PER_MIB:.2f} GiB reserved)")  # fmt: skip


def _ok_words(steps: int, alloc_mib: float, reserved_mib: float, seeds: str = "") -> str:
    return (f"trains all {steps} steps{seeds} (peak {alloc_mib * GIB_PER_MIB:.2f} GiB allocated, "
            f"{reserved_mib * GIB_PER_MIB:.2f} GiB reserved)")  # fmt: skip


def probe_headline(results_dir: Path | None, stack: str, regime: str, batch: int, backend: str, card: str,
                   allocator: str = "default") -> str:  # fmt: skip
    """The ceiling probes of one batch in words: every seed's 8 steps trained (with the peaks), or
    the first seed that ran out of memory, where, after how many steps and on what request."""
    chosen = _probes(results_dir, stack, regime, batch, backend, card, allocator)
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


def probe_seeds(results_dir: Path | None, stack: str, regime: str, batch: int, backend: str, card: str,
                allocator: str = "default") -> list[str]:  # fmt: skip
    """Each seed's probe of one batch in words: 'seed 42 trains all 8 steps (…)', 'seed 43 runs out
    of memory outside the op after 3 of 8 steps (…)'."""
    lines = []
    for _, row in _probes(results_dir, stack, regime, batch, backend, card, allocator).iterrows():
        if row["outcome"] == "oom":
            words = _oom_words(row)
        elif row["outcome"] == "ok":
            words = _ok_words(row["steps"], row["step_peak_alloc_mib"], row["step_peak_reserved_mib"])
        else:
            words = "crashed (see its cell notebook)"
        lines.append(f"seed {row['seed']} {words}")
    return lines


def seed_reading(results_dir: Path | None, stack: str, regime: str, batch: int, backend: str, card: str,
                 allocator: str = "default") -> str:  # fmt: skip
    """The ceiling probes of one batch as a paragraph: steps, cap and seeds run, each seed's outcome,
    and — where one seed trained and another ran out of memory — that the draw decided it. Empty
    where the batch was not probed."""
    probes = _probes(results_dir, stack, regime, batch, backend, card, allocator)
    if probes.empty:
        return ""
    cap = probes["memory_limit_mib"].max() * GIB_PER_MIB
    under = "" if _missing(cap) else f" under a {cap:.2f} GiB cap"
    seeds = len(probes)
    text = (f"The ceiling search ran B={batch} for {probes['steps'].max()} steps{under}, "
            f"with {seeds} seed{'s' if seeds > 1 else ''} (each seed draws other data and lengths): "
            + "; ".join(probe_seeds(results_dir, stack, regime, batch, backend, card, allocator)) + ".")  # fmt: skip
    if (probes["outcome"] == "ok").any() and (probes["outcome"] == "oom").any():
        text += " Same batch, card and backend: whether it trains is decided by the draw."
    return text


def op_level(cells: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Op-level cells (a loss head alone), one row each, with the head's isolated memory joined in."""
    if cells.empty or "negatives" not in cells:
        return pd.DataFrame()
    ops = cells[cells["stack"].str.startswith("op-")].copy()
    if ops.empty:
        return ops
    ops["negatives"] = ops["negatives"].astype("Int64")
    memory = calls[calls["stack"].str.startswith("op-")] if not calls.empty else calls
    keys = ["stack", "regime", "batch_size", "negatives", "variant"]
    if not memory.empty:
        memory = memory.assign(negatives=memory["negatives"].astype("Int64"))
        footprint = memory.assign(total_mib=memory["saved_for_backward_mib"] + memory["backward_transient_peak_mib"])
        ops = ops.merge(footprint[keys + ["saved_for_backward_mib", "backward_transient_peak_mib", "total_mib"]], on=keys, how="left")
    return ops


def op_speed_table(ops: pd.DataFrame) -> pd.DataFrame:
    """Median forward + backward time per head, batch and negatives: each backend beside vanilla."""
    if ops.empty:
        return pd.DataFrame()
    rows = []
    for (stack, head, batch, negatives), group in ops.groupby(["stack", "regime", "batch_size", "negatives"], dropna=False):
        by_variant = group.set_index("variant")
        base = by_variant["steady_step_time_sec"].get("vanilla")
        for variant, row in by_variant.iterrows():
            oom = row["outcome"] == "oom"
            rows.append({
                "head": f"{stack.removeprefix('op-')} {head}", "batch": batch,
                "negatives": "" if pd.isna(negatives) else int(negatives), "backend": variant,
                "ms (median)": "OOM" if oom else _number(1000 * row["steady_step_time_sec"], ".2f"),
                "p10–p90 ms": "" if oom else _spread_ms(row),
                "speedup vs vanilla": "" if oom or _missing(base) or variant == "vanilla"
                else f"{base / row['steady_step_time_sec']:.2f}×",
                "held + bwd spike MiB": "" if _missing(row.get("total_mib")) else f"{row['total_mib']:.1f}",
            })  # fmt: skip
    return pd.DataFrame(rows)


def _spread_ms(row: pd.Series) -> str:
    if _missing(row["steady_step_p10_sec"]):
        return ""
    return f"{1000 * row['steady_step_p10_sec']:.2f}–{1000 * row['steady_step_p90_sec']:.2f}"


def plot_op_speedup(ops: pd.DataFrame, title: str):  # type: ignore[no-untyped-def]
    """Fused speedup over vanilla vs batch size, one line per head × negatives × backend."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    done = ops[ops["outcome"] == "ok"]
    for (stack, head, negatives, variant), group in done.groupby(["stack", "regime", "negatives", "variant"], dropna=False):
        if variant == "vanilla":
            continue
        vanilla = done[(done["stack"] == stack) & (done["regime"] == head) & (done["variant"] == "vanilla")
                       & (done["negatives"].fillna(-1) == (-1 if pd.isna(negatives) else negatives))]  # fmt: skip
        joined = group.merge(vanilla[["batch_size", "steady_step_time_sec"]], on="batch_size", suffixes=("", "_vanilla"))
        if joined.empty:
            continue
        joined = joined.sort_values("batch_size")
        label = f"{stack.removeprefix('op-')} {head}" + ("" if pd.isna(negatives) else f" N={int(negatives)}") + f" · {variant}"
        axis.plot(joined["batch_size"], joined["steady_step_time_sec_vanilla"] / joined["steady_step_time_sec"], marker="o", label=label)
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("batch size")
    axis.set_ylabel("speedup over vanilla (forward + backward)")
    axis.set_title(title)
    if axis.lines[1:]:
        axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


# ---- batch-size ceilings (harness.ceiling, grids/ceilings.yaml) -------------------------------------


def ceilings(results_dir: Path | None = None, grid: Path = CEILINGS_GRID) -> pd.DataFrame:
    """One row per ceiling search of ``grid``: where it stands (read back from its probes exactly as
    the search itself decides), and what the probes measured at the ceiling and just above it."""
    from harness.ceiling import load_searches, search_state

    root = results_dir or default_results_dir()
    searches = load_searches(grid)
    folders = [root / name for name in sorted({s.grid for s in searches}) if (root / name).exists()]
    probes = load_results(folders) if folders else pd.DataFrame()
    rows = []
    for search in searches:
        ceiling, _ = search_state(search, root)
        key = (probes["stack"] == search.stack) & (probes["regime"] == search.regime) if not probes.empty else None
        mine = pd.DataFrame()
        if key is not None:
            chunk = probes["score_mini_batch_size"].fillna(0) == (search.score_mini_batch_size or 0)
            mine = probes[key & chunk & (probes["variant"] == search.variant) & (probes["card"] == search.card)
                          & (probes["allocator"] == search.allocator) & probes["seed"].isin(search.seeds)]  # fmt: skip
        at_fit = mine[mine["batch_size"] == ceiling.fits] if ceiling.fits is not None else mine.iloc[0:0]
        at_fail = mine[(mine["batch_size"] == ceiling.fails) & (mine["outcome"] == "oom")] if ceiling.fails is not None else mine.iloc[0:0]
        # the cap the probes actually ran under (the whole device for the native card); the profile's
        # value only for a search with no probe yet
        limit = mine["memory_limit_mib"].max() * GIB_PER_MIB if not mine.empty else None
        if limit is None or math.isnan(limit):
            limit = CARDS[search.card].usable_gib if search.card in CARDS else None
        failure = at_fail.iloc[0] if not at_fail.empty else None
        rows.append({
            "stack": search.stack, "regime": search.regime, "backend": backend_label(search.variant, search.score_mini_batch_size),
            "card": search.card, "allocator": search.allocator, "usable GiB": limit,
            "fits": ceiling.fits, "fails": ceiling.fails, "done": ceiling.done, "stopped": ceiling.stopped,
            "limit": search.limit, "resolution": search.resolution, "steps": search.steps, "seeds": len(search.seeds),
            "probes": len(mine),
            "peak alloc GiB": at_fit["step_peak_alloc_mib"].max() * GIB_PER_MIB if not at_fit.empty else None,
            "peak reserved GiB": at_fit["step_peak_reserved_mib"].max() * GIB_PER_MIB if not at_fit.empty else None,
            "fragmentation GiB": at_fit["fragmentation_mib"].max() * GIB_PER_MIB if not at_fit.empty else None,
            "fragmentation growth MiB": at_fit["fragmentation_growth_mib"].max() if not at_fit.empty else None,
            "op held MiB": at_fit["op_saved_for_backward_mib"].max() if not at_fit.empty else None,
            "fails where": None if failure is None else failure["oom_where"],
            "failed request": None if failure is None else failed_request(failure["oom_message"]),
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["headroom GiB"] = frame["usable GiB"] - frame["peak reserved GiB"]
    return frame


def ceiling_text(row: pd.Series) -> str:
    """A search's answer in words: '672' (the next probe, 704, failed), '≥ 8192', '< 32', 'running'."""
    if isinstance(row["stopped"], str):
        return f"stopped ({row['stopped']})"
    if row["probes"] == 0:
        return "not run"
    if not row["done"]:
        fits, fails = (None if _missing(row[k]) else int(row[k]) for k in ("fits", "fails"))
        if fits and fails:
            return f"{fits}–{fails - 1} (searching)"
        if fits or fails:
            return f"≥ {fits} (searching)" if fits else f"< {fails} (searching)"
        return "searching"
    if _missing(row["fails"]):
        return f"≥ {int(row['fits'])}"
    if _missing(row["fits"]):
        return f"< {int(row['fails'])}"
    return f"{int(row['fits'])}"


def ceiling_grid(searches: pd.DataFrame, allocator: str = "default") -> pd.DataFrame:
    """What fits on my card: the ceiling per stack/regime/backend (rows) and card (columns)."""
    chosen = searches[searches["allocator"] == allocator] if not searches.empty else searches
    if chosen.empty:
        return pd.DataFrame()
    order = [name for name in sorted(CARDS, key=lambda n: CARDS[n].nominal_gb or 0) if name in set(chosen["card"])]
    table = chosen.assign(ceiling=chosen.apply(ceiling_text, axis=1)).pivot_table(
        index=["stack", "regime", "backend"], columns="card", values="ceiling", aggfunc="first"
    )
    return table.reindex(columns=order).rename(columns=card_label).rename_axis(columns=None).fillna("")


def card_label(name: str) -> str:
    profile = CARDS.get(name)
    if profile is None or profile.nominal_gb is None:
        return name
    usable = f"{profile.usable_gib:.2f} GiB" if profile.usable_gib is not None else "whole device"
    return f"{profile.nominal_gb} GB ({usable})"


def ceiling_details(searches: pd.DataFrame) -> pd.DataFrame:
    """Per search that ran: the ceiling, the headroom left at it, its fragmentation, and what failed above it."""
    ran = searches[searches["probes"] > 0] if not searches.empty else searches
    if ran.empty:
        return pd.DataFrame()
    rows = []
    for _, row in ran.iterrows():
        binds = {"maxsim": "the MaxSim op (B² grid)", "elsewhere": "outside the op (encoder, optimizer)"}.get(row["fails where"], "")
        rows.append({
            "stack · regime": f"{row['stack']} · {row['regime']}", "backend": row["backend"], "card": row["card"],
            "allocator": row["allocator"], "ceiling": ceiling_text(row),
            "peak alloc / reserved GiB": "" if _missing(row["peak alloc GiB"]) else f"{row['peak alloc GiB']:.2f} / {row['peak reserved GiB']:.2f}",
            "headroom GiB": _number(row["headroom GiB"], ".2f"),
            "reserved − alloc GiB": _number(row["fragmentation GiB"], ".2f"),
            "its growth over steps MiB": _number(row["fragmentation growth MiB"], "+.0f"),
            "next batch failed in": binds, "failed request": "" if _missing(row["failed request"]) else row["failed request"],
            "probes": int(row["probes"]),
        })  # fmt: skip
    return pd.DataFrame(rows)


def binding_reading(searches: pd.DataFrame, allocator: str = "default") -> list[str]:
    """Per stack, regime and card with finished searches: each backend's ceiling and where the batch
    above it failed — in the MaxSim op (vanilla's B² grid binds) or outside it (the encoder binds) —
    and how far the largest fused ceiling goes beyond vanilla's."""
    if searches.empty:
        return []
    done = searches[(searches["allocator"] == allocator) & searches["done"] & searches["fits"].notna()]
    lines = []
    for (stack, regime, card), group in done.groupby(["stack", "regime", "card"], sort=False):
        parts = []
        for _, row in group.iterrows():
            where = {"maxsim": "fails in the MaxSim op", "elsewhere": "fails outside the op"}.get(row["fails where"], "")
            parts.append(f"{row['backend']} {ceiling_text(row)}" + (f" (the next batch {where})" if where else ""))
        text = f"{stack} · {regime} on {card_label(card)}: " + "; ".join(parts)
        vanilla = group[group["backend"] == "vanilla"]
        fused = group[group["backend"].isin(["lik", "flash"])]
        if not vanilla.empty and not fused.empty:
            ratio = fused["fits"].max() / vanilla["fits"].iloc[0]
            text += f" — the fused kernels train {ratio:.2f}× vanilla's batch"
        lines.append(text + ".")
    return lines


def allocator_reading(searches: pd.DataFrame) -> list[str]:
    """Per stack, regime, backend and card searched under both allocator settings: the two ceilings,
    and reserved − allocated at each ceiling's step peak (the memory fragmentation kept from use)."""
    if searches.empty:
        return []
    ran = searches[searches["probes"] > 0]
    lines = []
    for (stack, regime, backend, card), group in ran.groupby(["stack", "regime", "backend", "card"], sort=False):
        rows = {row["allocator"]: row for _, row in group.iterrows()}
        if not {"default", "expandable"} <= rows.keys():
            continue
        default, expandable = rows["default"], rows["expandable"]
        text = (f"{stack} · {regime}, {backend} on {card_label(card)}: {ceiling_text(default)} with the default "
                f"allocator, {ceiling_text(expandable)} with expandable segments")  # fmt: skip
        if not (_missing(default["fragmentation GiB"]) or _missing(expandable["fragmentation GiB"])):
            where = "the ceiling" if default["done"] and expandable["done"] else "the largest batch trained so far"
            text += (f" (reserved − allocated at {where}: {default['fragmentation GiB']:.2f} → "
                     f"{expandable['fragmentation GiB']:.2f} GiB)")  # fmt: skip
        lines.append(text + ".")
    return lines


def ceiling_row(searches: pd.DataFrame, stack: str, regime: str, backend: str, card: str,
                allocator: str = "default") -> pd.Series | None:  # fmt: skip
    """One search's row of ``ceilings()``; None where the grid has no such search."""
    if searches.empty:
        return None
    chosen = _matching(searches, stack=stack, regime=regime, backend=backend, card=card, allocator=allocator)
    return None if chosen.empty else chosen.iloc[0]


def ceiling_of(searches: pd.DataFrame, stack: str, regime: str, backend: str, card: str, allocator: str = "default") -> str:
    """One search's ceiling in words (``ceiling_text``), or 'not searched' where the grid has no such search."""
    row = ceiling_row(searches, stack, regime, backend, card, allocator)
    return "not searched" if row is None else ceiling_text(row)


def settled_ceiling(row: pd.Series | None) -> int | None:
    """The batch a finished search found to fit on every seed (for a search that reached its limit,
    a lower bound); None while it runs, once it stopped, or where nothing fit."""
    if row is None or not row["done"] or isinstance(row["stopped"], str) or _missing(row["fits"]):
        return None
    return int(row["fits"])


def ceiling_gains(searches: pd.DataFrame, stack: str, regime: str, card: str, fused: str = "lik") -> str:
    """How far the fused backend and, separately, expandable segments move vanilla's default-allocator
    ceiling on one card, in words; a note that the comparison waits while any of the three searches
    is unfinished."""
    rows = {
        "base": ceiling_row(searches, stack, regime, "vanilla", card),
        "fused": ceiling_row(searches, stack, regime, fused, card),
        "expandable": ceiling_row(searches, stack, regime, "vanilla", card, "expandable"),
    }
    settled = {name: settled_ceiling(row) for name, row in rows.items()}
    if None in settled.values():
        return "How far each choice moves the ceiling is stated once those searches have finished."

    def change(name: str) -> str:
        difference = settled[name] - settled["base"]
        at_least = "at least " if _missing(rows[name]["fails"]) else ""
        more = "more" if difference >= 0 else "fewer"
        return f"{at_least}{abs(difference)} {more} ({ceiling_text(rows[name])} against {settled['base']})"

    if _missing(rows["base"]["fails"]):
        return f"Vanilla scoring reached the search's limit ({ceiling_text(rows['base'])}), so there is nothing to compare."
    return (f"Against vanilla scoring under the default allocator, the fused kernel trains {change('fused')}; "
            f"expandable segments, with vanilla scoring kept, {change('expandable')}.")


def ceiling_probes(results_dir: Path | None = None) -> pd.DataFrame:
    """Every committed ceiling probe, one row each, with its backend label."""
    root = Path(results_dir or default_results_dir())
    if not (root / "ceilings").exists():
        return pd.DataFrame()
    return with_backend(load_results(root / "ceilings"))


def plot_probe_peaks(probes: pd.DataFrame, title: str):  # type: ignore[no-untyped-def]
    """One card's probes, a panel per allocator: each probe's step peak allocated (filled) and
    reserved (open) against its batch, a probe that ran out of memory at its pre-OOM reserved peak
    (×), and the card's usable memory. The gap between a probe's two markers is its fragmentation.
    Each backend has its own marker and a small sideways offset, so equal peaks stay visible."""
    done = probes[probes["outcome"].isin(["ok", "oom"])]
    allocators = [name for name in ("default", "expandable") if (done["allocator"] == name).any()]
    panels = max(len(allocators), 1)
    figure, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 4.6), sharex=True, sharey=True, squeeze=False)
    backends = sorted(done["backend"].unique())
    markers = ["o", "s", "^", "D"]
    spread = 0.012 * (done["batch_size"].max() if not done.empty else 1)
    for axis, allocator_name in zip(axes[0], allocators):
        mine = done[done["allocator"] == allocator_name]
        for i, backend in enumerate(backends):
            rows = mine[mine["backend"] == backend]
            ok, oom = rows[rows["outcome"] == "ok"], rows[rows["outcome"] == "oom"]
            shift = (i - (len(backends) - 1) / 2) * spread
            style = {"color": f"C{i}", "marker": markers[i % len(markers)]}
            axis.scatter(ok["batch_size"] + shift, ok["step_peak_alloc_mib"] * GIB_PER_MIB, **style, label=f"{backend}: allocated")
            axis.scatter(ok["batch_size"] + shift, ok["step_peak_reserved_mib"] * GIB_PER_MIB, facecolors="none",
                         edgecolors=f"C{i}", marker=style["marker"], label=f"{backend}: reserved")  # fmt: skip
            axis.scatter(oom["batch_size"] + shift, oom["pre_oom_reserved_mib"] * GIB_PER_MIB, color=f"C{i}", marker="x",
                         label=f"{backend}: out of memory (reserved before it)")  # fmt: skip
        cap = mine["memory_limit_mib"].max() * GIB_PER_MIB
        if not _missing(cap):
            axis.axhline(cap, color="grey", linestyle="--", linewidth=1, label=f"usable {cap:.2f} GiB")
        axis.set_title(f"{allocator_name} allocator")
        axis.set_xlabel("batch size")
        axis.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("step peak (GiB)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8, frameon=False)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.06 * (1 + len(labels) // 4), 1, 1))
    return figure


def plot_ceiling_bars(searches: pd.DataFrame, title: str):  # type: ignore[no-untyped-def]
    """Ceiling per card and backend (default allocator); a whisker up to the first batch that failed."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    if searches.empty:
        return figure
    done = searches[(searches["allocator"] == "default") & searches["done"] & searches["fits"].notna()]
    cards = [name for name in sorted(CARDS, key=lambda n: CARDS[n].nominal_gb or 0) if name in set(done["card"])]
    backends = sorted(done["backend"].unique())
    width = 0.8 / max(len(backends), 1)
    for i, backend in enumerate(backends):
        mine = done[done["backend"] == backend].set_index("card")
        xs = [k + i * width for k, card in enumerate(cards) if card in mine.index]
        fits = [mine.loc[card, "fits"] for card in cards if card in mine.index]
        above = [(mine.loc[card, "fails"] - mine.loc[card, "fits"]) if not _missing(mine.loc[card, "fails"]) else 0
                 for card in cards if card in mine.index]  # fmt: skip
        axis.bar(xs, fits, width, label=backend, yerr=[[0] * len(above), above], capsize=3)
    axis.set_xticks([k + width * (len(backends) - 1) / 2 for k in range(len(cards))], [card_label(c) for c in cards])
    axis.set_yscale("log", base=2)
    axis.set_ylabel("largest batch that trains (log₂)")
    axis.set_title(title)
    axis.grid(True, axis="y", alpha=0.3)
    if backends:
        axis.legend()
    figure.tight_layout()
    return figure


def sharing_check(results_dir: Path | None = None) -> pd.DataFrame:
    """Ceiling probes run again on a shared GPU (``results/shared-gpu-check``, a results directory of
    its own) beside the same probes committed from a GPU they had alone: outcome, peaks and step
    times side by side, and whether every step's peaks are the same to the byte."""
    root = Path(results_dir or default_results_dir())
    rows = []
    for shared_path in result_paths(root / SHARED_CHECK):
        alone_path = root / shared_path.relative_to(root / SHARED_CHECK)
        if not alone_path.exists():
            continue
        shared, alone = load_result(shared_path), load_result(alone_path)
        same_steps = (shared.step_peak_alloc_per_step_mib, shared.step_peak_reserved_per_step_mib) == (
            alone.step_peak_alloc_per_step_mib, alone.step_peak_reserved_per_step_mib)  # fmt: skip
        same = same_steps and (shared.outcome, shared.step_peak_alloc_mib, shared.step_peak_reserved_mib) == (
            alone.outcome, alone.step_peak_alloc_mib, alone.step_peak_reserved_mib)  # fmt: skip
        rows.append({
            "probe": shared_path.stem, "GiB given on the shared GPU": _number(shared.gpu_share_gib, ".2f"),
            "outcome alone · shared": f"{alone.outcome} · {shared.outcome}",
            "peak alloc MiB alone · shared": f"{_number(alone.step_peak_alloc_mib, '.2f')} · {_number(shared.step_peak_alloc_mib, '.2f')}",
            "peak reserved MiB alone · shared": f"{_number(alone.step_peak_reserved_mib, '.0f')} · {_number(shared.step_peak_reserved_mib, '.0f')}",
            "steps compared": len(alone.step_peak_alloc_per_step_mib),
            "identical": "yes" if same else "no",
            "s / step alone · shared": f"{_number(alone.steady_step_time_sec, '.2f')} · {_number(shared.steady_step_time_sec, '.2f')}",
            "slowdown": None if _missing(alone.steady_step_time_sec) or _missing(shared.steady_step_time_sec)
            else shared.steady_step_time_sec / alone.steady_step_time_sec,
        })  # fmt: skip
    return pd.DataFrame(rows)


def sharing_reading(check: pd.DataFrame) -> str:
    """The shared-GPU check in words, from its table."""
    if check.empty:
        return "No shared-GPU check has been committed yet."
    same = int((check["identical"] == "yes").sum())
    verdict = "the same outcome and the same peaks to the byte, step by step," if same == len(check) else (
        f"the same outcome and peaks for only {same} of them,")  # fmt: skip
    text = f"{len(check)} probes run again on a shared GPU, beside other probes, gave {verdict} as on a GPU they had alone."
    slowdown = check["slowdown"].dropna()
    if not slowdown.empty:
        text += (f" Their steady step times were {slowdown.min():.1f}× to {slowdown.max():.1f}× those they had alone, "
                 "depending on what ran beside them.")  # fmt: skip
    return text


def shared_probe_count(probes: pd.DataFrame) -> str:
    """How many committed probes ran under ``--share-gpu``, in words."""
    if probes.empty:
        return ""
    shared = int(probes["gpu_share_gib"].notna().sum())
    return (f"{shared} of the {len(probes)} committed probes were run under `--share-gpu`, beside whatever "
            "else fitted at the time; the others had the GPU alone.")


def shared_seed_agreement(probes: pd.DataFrame) -> str:
    """For batches whose every seed ran on a shared GPU with the same shapes (PyLate's are fixed
    lengths), whether the seeds' peaks agree to the byte — per backend, so the fused backends,
    whose Triton kernels are chosen by timing, are checked beside whatever else ran."""
    if probes.empty:
        return ""
    shared = probes[(probes["stack"] == "pylate") & probes["gpu_share_gib"].notna()]
    keys = ["backend", "card", "allocator", "batch_size", "regime"]
    parts = []
    for backend, group in shared.groupby("backend"):
        batches = [g for _, g in group.groupby(keys[1:]) if g["seed"].nunique() > 1 and (g["outcome"] == "ok").all()]
        if batches:
            agree = sum(g["step_peak_alloc_mib"].nunique() == 1 and g["step_peak_reserved_mib"].nunique() == 1 for g in batches)
            parts.append(f"{backend} {agree} of {len(batches)}")
    if not parts:
        return ""
    return ("PyLate batches whose seeds all trained on a shared GPU (same shapes, run at different moments beside "
            "different neighbours) with identical allocated and reserved peaks for every seed: " + ", ".join(parts) + ".")
