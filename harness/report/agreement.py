"""Do the backends train the same model? The page's data: op parity against an fp64 reference
(``results/op-parity/*.json``, :mod:`harness.parity`), traced training cells (the ``parity`` grid,
:mod:`harness.trace`) and the published reviewer run (``book/data/published_parity.csv``), as
tables and computed verdicts. Torch-free, like the rest of the report.

A training verdict compares a backend with vanilla on the same batches from the same weights: the
loss over every step (its largest gap against vanilla, against the largest gap the published run
saw between its two backends), with the first step's gradient cosine and the final weights'
difference stated beside it. No threshold on the cosine is claimed: bf16 scores flip near-tied
maxima, so how far rounding alone turns a gradient is what these runs measure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.grid import ROOT
from harness.report import style
from harness.report.data import Results, backend_label, results_of
from harness.report.text import nowrap, sig
from harness.results import OTHER_RECORDS, default_results_dir
from harness.spec import BACKENDS

OP_PARITY = "op-parity"  # results/op-parity/: one file per library and device
PARITY_GRID = "parity"  # grids/parity.yaml: traced training cells
PUBLISHED_PARITY = ROOT / "book" / "data" / "published_parity.csv"
assert OP_PARITY in OTHER_RECORDS


# ---- at the op ---------------------------------------------------------------------------------


def op_parity_files(results_dir: Path | None = None) -> list[Path]:
    root = Path(results_dir) if results_dir is not None else default_results_dir()
    return sorted((root / OP_PARITY).glob("*.json"))


def op_parity(results_dir: Path | None = None) -> pd.DataFrame:
    """One row per checked (library, head, backend, dtype, case, score chunk, device): the largest
    relative error of each quantity kind (scores, loss, gradients) and the worst error as a fraction
    of its bound."""
    rows = []
    for path in op_parity_files(results_dir):
        document: dict[str, Any] = json.loads(path.read_text())
        for record in document.get("records", []):
            kinds: dict[str, float] = {}
            for error in record["errors"]:
                kind = error["quantity"].split(":")[0]
                kinds[kind] = max(kinds.get(kind, 0.0), float(error["max_rel_error"]))
            rows.append({
                "library": record["library"], "head": record["head"], "dtype": record["dtype"], "case": record["case"],
                "device": record["device"],
                "backend": backend_label(record["variant"], record["score_mini_batch_size"]).split(" + chunk")[0]
                + (" + chunk" if record["score_mini_batch_size"] else ""),
                "scores_rel": kinds.get("scores"), "loss_rel": kinds.get("loss"), "grad_rel": kinds.get("grad"),
                "of_bound": max(float(error["error_to_bound"]) for error in record["errors"]),
                "passed": bool(record["passed"]),
            })  # fmt: skip
    return pd.DataFrame(rows)


def op_parity_table(frame: pd.DataFrame, library: str) -> pd.DataFrame:
    """Per head, backend and dtype over every case: the largest relative error of the scores, the loss
    and the input gradients, the worst error as a fraction of its bound, and how many cases passed."""
    mine = frame[frame["library"] == library] if not frame.empty else frame
    if mine.empty:
        return pd.DataFrame()
    rows = []
    for (head, backend, dtype), group in mine.groupby(["head", "backend", "dtype"], sort=False):
        rows.append({
            "head": head, "backend": nowrap(str(backend)), "dtype": dtype,
            "scores": _error(group["scores_rel"]), "loss": _error(group["loss_rel"]),
            "gradients": _error(group["grad_rel"]), "worst / bound": sig(group["of_bound"].max(), 2),
            "within bound": nowrap(f"{int(group['passed'].sum())} / {len(group)}"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _error(values: pd.Series) -> str:
    present = values.dropna()
    return "—" if present.empty else f"{present.max():.1e}"


def op_verdict(frame: pd.DataFrame, library: str, library_backends: tuple[str, ...]) -> str:
    """Which backends were checked at the op, whether every check held its bound, and which backends
    of the library have not been checked yet (the fused kernels need a GPU)."""
    mine = frame[frame["library"] == library] if not frame.empty else frame
    if mine.empty:
        return f"No op parity check of {library} has been committed yet (`tools/op_parity.py {library}`)."
    checked = style.in_order(set(mine["backend"]))
    failed = mine[~mine["passed"]]
    text = f"{len(mine)} checks of {', '.join(checked)} ({', '.join(sorted(set(mine['device'])))}): "
    if failed.empty:
        text += "every one within its bound"
    else:
        named = "; ".join(f"{r.backend} {r.head} {r.dtype} on {r.case} ({sig(r.of_bound, 3)}× its bound)"
                          for r in failed.itertuples())  # fmt: skip
        text += (f"{len(failed)} outside the bound derived for them — {named}. Where the reference implementation "
                 "itself exceeds it, the bound, not the backend, is what those cases question")
        if set(failed["backend"]) - {"vanilla"}:
            text = text.removesuffix("Where the reference implementation itself exceeds it, the bound, not the "
                                     "backend, is what those cases question")  # fmt: skip
    missing = [name for name in library_backends if name not in set(mine["backend"])]
    if missing:
        text += f"; not checked yet: {', '.join(missing)} (fused kernels, which run only on a GPU)"
    return text + "."


def library_backends(library: str) -> tuple[str, ...]:
    """The backends a library dispatches to (the registry's), in the legend's order."""
    return tuple(style.in_order({name for name, backend in BACKENDS.items() if library in backend.libraries}))


# ---- in training -----------------------------------------------------------------------------------


def traced_cells(source: Results | None = None) -> list[Any]:
    """The parity grid's traced results."""
    return [result for _, result in results_of(source).of(PARITY_GRID) if getattr(result.spec, "trace", False)]


def loss_gaps(result: Any, vanilla: Any) -> list[float]:
    """|loss − vanilla's loss| at every step both cells trained."""
    return [abs(a - b) for a, b in zip(result.loss_per_step, vanilla.loss_per_step, strict=False)]


def training_table(traced: list[Any]) -> pd.DataFrame:
    """Per stack, regime, batch and backend: steps trained, the first and last loss, the largest and
    mean |Δloss| against vanilla over the steps both trained, the first gradients' cosine and the
    final weights' relative difference (both against vanilla's cell)."""
    by_key: dict[tuple[str, str, int], dict[str, Any]] = {}
    for result in traced:
        key = (result.stack, result.regime, result.batch_size)
        by_key.setdefault(key, {})[backend_label(result.variant, result.score_mini_batch_size)] = result
    rows = []
    for (stack, regime, batch), backends in sorted(by_key.items()):
        vanilla = backends.get("vanilla")
        for backend in style.in_order(set(backends)):
            result = backends[backend]
            losses = result.loss_per_step
            gaps = loss_gaps(result, vanilla) if vanilla is not None and backend != "vanilla" else []
            parity = result.parity
            rows.append({
                "stack · regime": f"{stack} · {regime}", "batch": batch, "backend": nowrap(backend),
                "outcome": result.outcome, "steps": len(losses),
                "loss, first → last": "—" if not losses else f"{losses[0]:.4f} → {losses[-1]:.4f}",
                "max |Δloss|": f"{max(gaps):.4f}" if gaps else "", "mean |Δloss|": f"{sum(gaps) / len(gaps):.4f}" if gaps else "",
                "first-gradient cosine": "" if parity is None or parity.first_grad_cosine is None
                else f"{parity.first_grad_cosine:.6f}",
                "final weights ‖Δ‖/‖θ‖": "" if parity is None or parity.final_weight_rel_diff is None
                else f"{parity.final_weight_rel_diff:.1e}",
                "note": "" if parity is None or parity.note is None or backend == "vanilla" else parity.note,
            })  # fmt: skip
    return pd.DataFrame(rows)


def published_gap(published: pd.DataFrame) -> float | None:
    """The published run's largest |Δloss| between its backends (lik against torch)."""
    gap = published[published["quantity"] == "max_abs_loss_difference_vs_torch"]["value"]
    return None if gap.empty else float(gap.max())


def training_verdicts(traced: list[Any], published_max_gap: float | None) -> list[str]:
    """One line per backend and batch: its largest |Δloss| against vanilla's cell, within the published
    run's largest gap or not, with the first gradients' cosine and the final weights' difference; or
    why it cannot be said yet."""
    vanilla = {(r.stack, r.regime, r.batch_size): r for r in traced
               if r.variant == "vanilla" and r.score_mini_batch_size is None and r.outcome == "ok"}  # fmt: skip
    lines = []
    for result in traced:
        backend = backend_label(result.variant, result.score_mini_batch_size)
        if backend == "vanilla":
            continue
        where = f"{result.stack} · {result.regime} · B={result.batch_size} · {backend}"
        base, parity = vanilla.get((result.stack, result.regime, result.batch_size)), result.parity
        if result.outcome != "ok" or base is None or parity is None or parity.first_grad_cosine is None:
            reason = (result.outcome if result.outcome != "ok" else "vanilla's cell is missing" if base is None
                      else parity.note if parity is not None else "no comparison recorded")  # fmt: skip
            lines.append(f"{where}: not compared ({reason}).")
            continue
        gaps = loss_gaps(result, base)
        gap = max(gaps)
        within = "within" if published_max_gap is not None and gap <= published_max_gap else "above"
        against = "" if published_max_gap is None else f", {within} the published run's {published_max_gap:.4f}"
        lines.append(f"{where}: largest |Δloss| against vanilla over {len(gaps)} steps {gap:.4f}{against}; first-step "
                     f"gradient cosine {parity.first_grad_cosine:.6f}; final weights {parity.final_weight_rel_diff:.1e} "
                     "of their norm apart.")  # fmt: skip
    return lines


def published_run(path: Path = PUBLISHED_PARITY) -> pd.DataFrame:
    return pd.read_csv(path, comment="#")


def published_table(published: pd.DataFrame) -> pd.DataFrame:
    """The published reviewer run: the loss at its first and last step per backend, and its lik-vs-torch gap."""
    loss = published[published["quantity"] == "loss"]
    rows = []
    for backend, group in loss.groupby("backend", sort=False):
        steps = group.sort_values("step")
        rows.append({"backend": backend, "loss, first → last":
                     f"{steps['value'].iloc[0]:.4f} → {steps['value'].iloc[-1]:.4f}"})  # fmt: skip
    table = pd.DataFrame(rows)
    for quantity, column in (("max_abs_loss_difference_vs_torch", "max |Δloss| vs torch"),
                             ("mean_abs_loss_difference_vs_torch", "mean |Δloss| vs torch")):  # fmt: skip
        values = published[published["quantity"] == quantity].set_index("backend")["value"]
        table[column] = [f"{values[b]:.4f}" if b in values else "" for b in table["backend"]]
    return table
