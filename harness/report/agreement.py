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
import math
from pathlib import Path
from typing import Any

import pandas as pd

from harness.grid import ROOT
from harness.report import style
from harness.report.data import PARITY as PARITY_GRID
from harness.report.data import Results, backend_label, results_of
from harness.report.text import nowrap, regime_label, sig
from harness.results import OTHER_RECORDS, default_results_dir
from harness.spec import BACKENDS

OP_PARITY = "op-parity"  # results/op-parity/: one file per library and device
MASK_READINGS_KIND = "mask-readings"  # harness.parity.write_mask_readings (its MASK_READINGS_KIND)

PUBLISHED_PARITY = ROOT / "book" / "data" / "published_parity.csv"
assert OP_PARITY in OTHER_RECORDS


# ---- at the op ---------------------------------------------------------------------------------


def op_parity_files(results_dir: Path | None = None) -> list[Path]:
    root = Path(results_dir) if results_dir is not None else default_results_dir()
    return sorted((root / OP_PARITY).glob("*.json"))


def _documents(kind: str, results_dir: Path | None = None) -> list[dict[str, Any]]:
    """The files of ``results/op-parity/`` of one ``kind``: op-parity records, or the mask readings
    kept beside them."""
    documents = [json.loads(path.read_text()) for path in op_parity_files(results_dir)]
    return [document for document in documents if document.get("kind") == kind]


def op_parity(results_dir: Path | None = None) -> pd.DataFrame:
    """One row per checked (library, head, backend, dtype, case, score chunk, device): the largest
    relative error of each quantity kind (scores, loss, gradients) and the worst error as a fraction
    of its bound."""
    rows = []
    for document in _documents(OP_PARITY, results_dir):
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


SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}  # in the op table


def op_parity_table(frame: pd.DataFrame, library: str) -> pd.DataFrame:
    """Per head, backend and dtype over every case: the largest relative error of the scores, the loss
    and the input gradients, the worst error as a fraction of its bound, and how many cases passed."""
    mine = frame[frame["library"] == library] if not frame.empty else frame
    if mine.empty:
        return pd.DataFrame()
    rows = []
    for (head, backend, dtype, device), group in mine.groupby(["head", "backend", "dtype", "device"], sort=False):
        rows.append({
            # the head may break at its hyphens ('pairwise-negative-ce'): the widest column
            "head": str(head), "backend": nowrap(str(backend)), "dtype": SHORT_DTYPES.get(str(dtype), dtype), "device": device,
            "scores": nowrap(_error(group["scores_rel"])), "loss": nowrap(_error(group["loss_rel"])),
            "gradients": nowrap(_error(group["grad_rel"])), "worst / bound": of_bound(group["of_bound"].max()),
            "passed": nowrap(f"{int(group['passed'].sum())} / {len(group)}"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _error(values: pd.Series) -> str:
    present = values.dropna()
    if present.empty:
        return "—"
    return "not finite" if not math.isfinite(present.max()) else f"{present.max():.1e}"


def of_bound(value: float) -> str:
    """The worst error as a fraction of its bound, so that a failure always reads as one: '0.56', '1.01 (out)'
    — never '1.0' for an error just outside its bound — and 'not finite (out)' rather than 'inf'."""
    if pd.isna(value):
        return "—"
    if not math.isfinite(value):
        return "not finite (out)"
    if value <= 1:
        return sig(value, 2)
    shown = sig(value, 2)
    if float(shown) <= 1:  # 1.004 would round to '1.0': show the digits that put it outside
        shown = f"{value:.3f}" if f"{value:.2f}" == "1.00" else f"{value:.2f}"
    return f"{shown} (out)"


def op_verdict(frame: pd.DataFrame, library: str, library_backends: tuple[str, ...]) -> str:
    """How many checks of each backend (per device) held their bound, the ones outside it grouped by
    backend, dtype and device (heads, cases and how far out), and which backends of the library have
    not been checked yet (the fused kernels need a GPU)."""
    mine = frame[frame["library"] == library] if not frame.empty else frame
    if mine.empty:
        return f"No op parity check of {library} has been committed yet (`tools/op_parity.py {library}`)."
    counts = []
    for backend in style.in_order(set(mine["backend"])):
        for device, group in mine[mine["backend"] == backend].groupby("device"):
            counts.append(f"{backend} on {device} {int(group['passed'].sum())} of {len(group)}")
    failed = mine[~mine["passed"]]
    text = f"Within the bound: {', '.join(counts)}"
    if failed.empty:
        text += " — every check"
    else:
        groups = []
        for keys, group in failed.groupby(["backend", "dtype", "device"], sort=False):
            backend, dtype, device = (str(key) for key in keys)
            heads, cases = ", ".join(dict.fromkeys(group["head"])), ", ".join(dict.fromkeys(group["case"]))
            low, high = group["of_bound"].min(), group["of_bound"].max()
            if not math.isfinite(high):  # a non-finite error (a NaN or inf output) is no multiple of the bound
                finite = group["of_bound"][group["of_bound"].map(math.isfinite)]
                far = ("errors not finite" if finite.empty else
                       f"up to {sig(finite.max(), 3)}× its bound, and errors not finite")  # fmt: skip
            else:
                far = (f"{sig(low, 3)}×" if sig(low, 3) == sig(high, 3) else f"{sig(low, 3)}–{sig(high, 3)}×") + " its bound"
            groups.append(f"{backend} {dtype} on {device} ({heads}; {cases}: {far})")
        text += f". Outside it: {'; '.join(groups)}"
        if set(failed["backend"]) == {"vanilla"}:
            text += (". Only the reference implementation itself exceeds it there, so those cases question the bound, "
                     "not a backend")  # fmt: skip
    missing = [name for name in library_backends if name not in set(mine["backend"])]
    if missing:
        text += f"; not checked yet: {', '.join(missing)} (fused kernels, which run only on a GPU)"
    return text + "."


def op_errors(results_dir: Path | None = None) -> pd.DataFrame:
    """Every compared quantity of every op-parity record: library, head, backend, dtype, case, device,
    quantity, its max absolute error and whether it held its bound."""
    rows = []
    for document in _documents(OP_PARITY, results_dir):
        for record in document.get("records", []):
            for error in record["errors"]:
                rows.append({key: record[key] for key in ("library", "head", "variant", "dtype", "case", "device")}
                            | {"chunk": record["score_mini_batch_size"], "quantity": error["quantity"],
                               "max_abs_error": float(error["max_abs_error"]), "passed": bool(error["passed"])})  # fmt: skip
    return pd.DataFrame(rows)


def mask_readings(results_dir: Path | None = None) -> pd.DataFrame:
    """Each fused backend's errors on the GPU (PyLate's scores head, padded cases) beside the
    differences its reading of the masks makes on the CPU (:func:`harness.parity.masks_read_as`):
    one row per backend, case, dtype and quantity, with their relative difference. Empty until both
    are committed."""
    read = [row for document in _documents(MASK_READINGS_KIND, results_dir) for row in document["rows"]]
    errors = op_errors(results_dir)
    if not read or errors.empty:
        return pd.DataFrame()
    scores_head = errors[(errors["library"] == "pylate") & (errors["head"] == "scores")]
    failed = {(r.variant, r.case) for r in errors[(errors["library"] == "pylate") & ~errors["passed"]].itertuples()}
    rows = []
    for row in read:
        if (row["variant"], row["case"]) not in failed:
            continue  # only what a backend got wrong needs explaining
        for quantity in ("scores", "grad:query", "grad:doc"):
            recorded = "scores:scores" if quantity == "scores" else quantity
            match = scores_head[(scores_head["variant"] == row["variant"]) & (scores_head["case"] == row["case"])
                                & (scores_head["dtype"] == row["dtype"]) & (scores_head["quantity"] == recorded)]  # fmt: skip
            if match.empty:
                continue
            measured = float(match["max_abs_error"].iloc[0])
            if quantity == "scores" and row["scores_not_finite"]:
                continue  # a score that is not finite is compared by its count, not its size
            rows.append({"backend": row["variant"], "reading": row["reading"], "case": row["case"], "dtype": row["dtype"],
                         "quantity": quantity, "measured": measured, "read": row[quantity],
                         "relative_difference": (abs(measured - row[quantity]) / row[quantity] if row[quantity]
                                                 else float("inf")),
                         "not_finite": int(row["scores_not_finite"]),
                         "empty_documents": int(row["empty_documents"])})  # fmt: skip
    return pd.DataFrame(rows)


READING_WORDS = {
    "lengths": ("hands flash-maxsim each document's bool mask as a length (`mask.sum(-1)`, in "
                "`pylate/scores/_flash_backend.py`), so the first *length* tokens count whatever the mask said of "
                "them: a skiplist hole inside a passage (masked punctuation, as in the recipe's documents) moves the "
                "counted tokens"),
    "excluded": ("leaves masked tokens out of each maximum, where PyLate's vanilla math multiplies by the mask so "
                 "that they enter it as zeros: the two differ only where every real token of a document scores "
                 "below 0 for some query token, which short documents make likely"),
}


def mask_explanations(read: pd.DataFrame, errors: pd.DataFrame) -> list[str]:
    """Per fused backend whose PyLate op checks fail: which cases fail, what it reads the masks as, and
    how closely that reading reproduces its recorded errors, all computed."""
    if read.empty or errors.empty:
        return []
    lines = []
    for backend, mine in read.groupby("backend", sort=False):
        checks = errors[(errors["library"] == "pylate") & (errors["variant"] == backend)]
        failed = sorted(set(checks[~checks["passed"]]["case"]))
        held = sorted(set(checks["case"]) - set(failed))
        if not failed:
            continue
        reading = str(mine["reading"].iloc[0])
        worst = float(mine["relative_difference"].max())
        words = (f"**{backend}** holds its bound on {', '.join(held)} and fails it on {', '.join(failed)}. Through "
                 f"PyLate it {READING_WORDS.get(reading, reading)}. The vanilla math with the masks read so "
                 f"(`harness.parity.masks_read_as`, on the CPU) differs from vanilla by what {backend} differs on the "
                 f"GPU, within {worst:.2%} in every one of {len(mine)} comparisons")  # fmt: skip
        scores = checks[checks["quantity"].str.startswith("scores") & checks["case"].isin(failed)]
        if reading == "lengths" and len(scores) and bool((scores["max_abs_error"] == float("inf")).any()):
            words += "; the fully masked slot, a length of 0, gets a score that is not finite"
        lines.append(words + ". The difference is not rounding: the masks mean something else to it.")
    return lines


def mask_table(read: pd.DataFrame) -> pd.DataFrame:
    """The comparison behind :func:`mask_explanations`, for the page."""
    return pd.DataFrame({
        "backend": read["backend"], "masks read as": read["reading"], "case": read["case"], "dtype": read["dtype"],
        "quantity": read["quantity"],
        "on the GPU, max |error|": [f"{v:.6g}" for v in read["measured"]],
        "read so on the CPU, max |difference|": [f"{v:.6g}" for v in read["read"]],
        "relative difference": [f"{v:.1e}" for v in read["relative_difference"]],
    })  # fmt: skip


def library_backends(library: str) -> tuple[str, ...]:
    """The backends a library dispatches to (the registry's), in the legend's order."""
    return tuple(style.in_order({name for name, backend in BACKENDS.items() if library in backend.libraries}))


# ---- in training -----------------------------------------------------------------------------------


def traced_cells(source: Results | None = None) -> list[Any]:
    """The parity grid's traced results."""
    return [result for _, result in results_of(source).of(PARITY_GRID) if getattr(result.spec, "trace", False)]


def loss_gaps(result: Any, vanilla: Any) -> list[float]:
    """|loss − vanilla's loss| at every step both cells trained; infinite where either loss is not
    finite (a run that diverged cannot be within any noise floor)."""
    return [abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
            for a, b in zip(result.loss_per_step, vanilla.loss_per_step, strict=False)]  # fmt: skip


def training_table(traced: list[Any], published_max_gap: float | None = None) -> pd.DataFrame:
    """Per stack, regime, batch and backend: the first and last loss, the largest and mean |Δloss|
    against vanilla over the steps both trained, the first gradients' cosine, the final weights'
    relative difference (both against vanilla's cell) and the verdict of :func:`training_rows`."""
    judged = {(r["stack"], r["regime"], r["batch"], r["backend"]): r for r in training_rows(traced, published_max_gap)}
    by_key: dict[tuple[str, str, int], dict[str, Any]] = {}
    for result in traced:
        key = (result.stack, result.regime, result.batch_size)
        by_key.setdefault(key, {})[backend_label(result.variant, result.score_mini_batch_size)] = result
    rows = []
    for (stack, regime, batch), backends in sorted(by_key.items()):
        for backend in style.in_order(set(backends)):
            result = backends[backend]
            losses = result.loss_per_step
            parity = result.parity
            row = judged.get((stack, regime, batch, backend), {})  # its gaps over the steps both trained
            verdict = ("the reference" if backend == "vanilla" else "not compared" if "why" in row
                       else "noise floor" if row.get("is_floor") else "same model" if row.get("same")
                       else "not the same" if row.get("floor") is not None else "")  # fmt: skip
            finite = finite_steps(result)
            last = "—" if not finite else f"{losses[finite - 1]:.4f}"  # the last loss before it diverged
            if finite and finite < len(losses):  # the loss after it is another reading (finite_loss_after_divergence)
                last += f" (step {finite})"
            weights = None if parity is None else parity.final_weight_rel_diff
            rows.append({
                "stack · regime": regime_label(stack, regime), "batch": batch, "backend": nowrap(style.short(backend)),
                "loss, first → last compared": "—" if not losses else nowrap(f"{losses[0]:.4f} → {last}"),
                "|Δloss| max / mean": nowrap(f"{row['max_gap']:.4f} / {row['mean_gap']:.4f}") if "max_gap" in row else "",
                "step-1 grad. cosine": "" if parity is None or parity.first_grad_cosine is None
                else f"{parity.first_grad_cosine:.6f}",
                "final ‖Δθ‖/‖θ‖": "" if weights is None else _exponent(weights) if math.isfinite(weights) else "—",
                "verdict": (nowrap(verdict) if verdict else "")
                + (f" (diverges after step {finite})" if losses and finite < len(losses) else ""),
            })  # fmt: skip
    return pd.DataFrame(rows)


def _exponent(value: float) -> str:
    """1.2e-05 → '1.2e−5' on one line (a minus sign, which a table does not break at)."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}".replace("-", "\u2212")


def training_tables(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """:func:`training_table` split by stack and regime (one table each, without that column)."""
    if table.empty:
        return {}
    return {str(key): group.drop(columns="stack · regime").reset_index(drop=True)
            for key, group in table.groupby("stack · regime", sort=False)}  # fmt: skip


def loss_curves(traced: list[Any]) -> list[tuple[str, dict[str, list[float]]]]:
    """Per stack, regime and batch (a panel title), every backend's loss at each step."""
    panels: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    diverged: dict[tuple[str, str, int], int] = {}
    for result in traced:
        if result.outcome == "ok" and result.loss_per_step:
            key = (result.stack, result.regime, result.batch_size)
            finite = finite_steps(result)  # a curve stops where its run diverged
            panels.setdefault(key, {})[backend_label(result.variant, result.score_mini_batch_size)] = \
                result.loss_per_step[:finite]
            if finite < len(result.loss_per_step):
                diverged[key] = min(diverged.get(key, finite), finite)
    titled = []
    for (stack, regime, batch), curves in sorted(panels.items()):
        after = diverged.get((stack, regime, batch))
        title = f"{regime_label(stack, regime)} · B={batch}" + (f" · diverges after step {after}" if after else "")
        titled.append((title, curves))
    return titled


def published_gap(published: pd.DataFrame) -> float | None:
    """The published run's largest |Δloss| between its backends (lik against torch)."""
    gap = published[published["quantity"] == "max_abs_loss_difference_vs_torch"]["value"]
    return None if gap.empty else float(gap.max())


def times_floor(row: dict[str, Any]) -> str:
    """How many times its noise floor a backend's largest loss gap is ("91×"); a floor of exactly 0
    (the chunked sums came out bit-equal) gives no ratio, so the gap is said to be "above" it. Gaps
    are finite here: rows whose losses are not finite carry a ``why`` instead."""
    if not row["floor"]:
        return "above" if row["max_gap"] > 0 else "at"
    return f"{row['max_gap'] / row['floor']:.0f}×"


def noise_floors(traced: list[Any], published_max_gap: float | None) -> dict[tuple[str, str, int], tuple[float, str]]:
    """Per stack, regime and batch: how far two computations of the same math drift apart in 50 steps,
    and what that is. Where PyLate's chunking ran (the same sums in another order), its largest
    |Δloss| against vanilla; otherwise the published run's largest gap between its two backends."""
    floors: dict[tuple[str, str, int], tuple[float, str]] = {}
    vanilla = _vanilla_cells(traced)
    for result in traced:
        key = (result.stack, result.regime, result.batch_size)
        base = vanilla.get(key)
        if result.score_mini_batch_size and result.variant == "vanilla" and base is not None and result.outcome == "ok":
            gap = max(loss_gaps(result, base))
            if not math.isfinite(gap):  # a run that diverged measures no noise floor
                continue
            if key not in floors or gap > floors[key][0]:  # the widest drift, named by the chunk that drifted so
                floors[key] = (gap, f"vanilla chunked by {result.score_mini_batch_size}")
    for result in traced:
        key = (result.stack, result.regime, result.batch_size)
        if key not in floors and published_max_gap is not None:
            floors[key] = (published_max_gap, "the published run's lik against torch")
    return floors


def _vanilla_cells(traced: list[Any]) -> dict[tuple[str, str, int], Any]:
    return {(r.stack, r.regime, r.batch_size): r for r in traced
            if r.variant == "vanilla" and r.score_mini_batch_size is None and r.outcome == "ok"}  # fmt: skip


def _first_non_finite(values: list[float]) -> int | None:
    """The first step (1-based) whose value is NaN or infinite; None when every value is finite."""
    return next((step for step, value in enumerate(values, start=1) if not math.isfinite(value)), None)


def finite_steps(result: Any) -> int:
    """How many leading steps of a traced run trained on finite weights and gave a finite loss: up to
    and including the first step whose gradient is not finite (its loss was computed before the
    update), and before the first step whose loss is not finite."""
    losses, grads = result.loss_per_step, result.grad_norm_per_step
    bad_loss, bad_grad = _first_non_finite(losses), _first_non_finite(grads)
    return min(len(losses), (bad_loss - 1) if bad_loss else len(losses), bad_grad or len(losses))


def divergence(result: Any) -> str:
    """Where a traced run diverged ("gradient not finite from step 29, loss from step 30"); empty when
    every loss and gradient norm it recorded is finite."""
    parts = [f"{what} from step {step}" for what, values in
             (("gradient", result.grad_norm_per_step), ("loss", result.loss_per_step))
             if (step := _first_non_finite(values)) is not None]  # fmt: skip
    return parts[0].replace(" from", " not finite from", 1) + "".join(f", {part}" for part in parts[1:]) if parts else ""


def finite_loss_after_divergence(result: Any) -> str:
    """Where a run's gradient stopped being finite but its loss did not: "its loss stays finite after
    that (0.6931 = ln 2 at every step from step 30)" — a divergence a check on the loss alone would
    miss; empty otherwise (a loss that also went non-finite, or no divergence)."""
    losses, bad_grad = result.loss_per_step, _first_non_finite(result.grad_norm_per_step)
    if bad_grad is None:
        return ""
    after = losses[bad_grad:]  # the losses computed with the weights that update made
    if not after or not all(math.isfinite(value) for value in after):
        return ""
    values = f"{after[0]:.4f}" + (" = ln 2" if abs(after[0] - math.log(2)) < 1e-4 else "")
    if max(after) - min(after) < 1e-6:
        return f"its loss stays finite after that ({values} at every step from step {bad_grad + 1})"
    return f"its loss stays finite after that ({values} at step {bad_grad + 1}, then {min(after):.4f}–{max(after):.4f})"


def training_rows(traced: list[Any], published_max_gap: float | None) -> list[dict[str, Any]]:
    """One row per backend and batch compared with vanilla's cell: its largest |Δloss| over the steps
    both trained, the noise floor of that batch (:func:`noise_floors`), the first-gradient cosine and
    ``same``: whether the largest gap is within the floor. Cells that cannot be compared carry ``why``."""
    vanilla, floors = _vanilla_cells(traced), noise_floors(traced, published_max_gap)
    rows = []
    for result in traced:
        backend = backend_label(result.variant, result.score_mini_batch_size)
        if backend == "vanilla":
            continue
        key = (result.stack, result.regime, result.batch_size)
        row: dict[str, Any] = {"stack": result.stack, "regime": result.regime, "batch": result.batch_size, "backend": backend}
        base, parity = vanilla.get(key), result.parity
        if result.outcome != "ok" or base is None or parity is None or parity.first_grad_cosine is None:
            row["why"] = (result.outcome if result.outcome != "ok" else "vanilla's cell is missing" if base is None
                          else parity.note if parity is not None else "no comparison recorded")  # fmt: skip
            rows.append(row)
            continue
        mine, theirs = finite_steps(result), finite_steps(base)
        steps = min(mine, theirs)  # the steps both trained on finite weights: their losses compare
        if steps < len(result.loss_per_step) and mine < theirs:  # it diverged where vanilla did not
            row["diverged"] = f"It diverges where vanilla does not ({divergence(result)})."
        elif steps < len(result.loss_per_step):  # vanilla diverged too: the recipe at this batch, not the backend
            row["diverged"] = (f"Vanilla diverges too, at the same step ({divergence(base)}): compared over the "
                               f"{steps} steps before." if mine == theirs else
                               f"Vanilla diverges first ({divergence(base)}): compared over the {steps} steps before.")
        if "diverged" in row and (hidden := finite_loss_after_divergence(result)) and _first_non_finite(base.loss_per_step):
            row["diverged"] += (f" Its gradient is not finite from step {_first_non_finite(result.grad_norm_per_step)}, "
                                f"but {hidden}, where vanilla's loss is not: a check on the loss alone would not see "
                                "this run diverge.")  # fmt: skip
        if steps == 0:
            row["why"] = row.pop("diverged").rstrip(".")
            rows.append(row)
            continue
        gaps = loss_gaps(result, base)[:steps]
        floor, floor_is = floors.get(key, (None, ""))
        weights = parity.final_weight_rel_diff
        row |= {"steps": steps, "max_gap": max(gaps), "mean_gap": sum(gaps) / len(gaps), "floor": floor,
                "floor_is": floor_is, "cosine": parity.first_grad_cosine,
                "weights": weights if weights is not None and math.isfinite(weights) else None,
                "is_floor": result.variant == "vanilla" and bool(result.score_mini_batch_size) and "diverged" not in row,
                "same": floor is not None and max(gaps) <= floor and mine >= theirs}  # fmt: skip
        rows.append(row)
    return rows


def training_verdicts(traced: list[Any], published_max_gap: float | None) -> list[str]:
    """One line per backend and batch: the same model as vanilla (its loss stays within the noise floor
    of that batch) or not, with the numbers; or why it cannot be said yet."""
    lines = []
    for row in training_rows(traced, published_max_gap):
        where = f"{regime_label(row['stack'], row['regime'])} · B={row['batch']} · **{row['backend']}**"
        if "why" in row:
            lines.append(f"{where}: not compared ({row['why']}).")
            continue
        lines.append(_judged(row, where))
    for result in _vanilla_cells(traced).values():  # a reference that diverged is a finding of its own
        if (where := divergence(result)):
            lines.append(f"{regime_label(result.stack, result.regime)} · B={result.batch_size} · **vanilla** (the reference) "
                         f"diverges: {where}.")
    return lines


def _judged(row: dict[str, Any], where: str) -> str:
    """The verdict line of one compared row of :func:`training_rows`, and where its run diverged."""
    gap = f"largest |Δloss| against vanilla over {row['steps']} steps {row['max_gap']:.4f} (mean {row['mean_gap']:.4f})"
    rest = (f"first-step gradient cosine {row['cosine']:.6f}; final weights "
            + ("not finite" if row["weights"] is None else f"{row['weights']:.1e} of their norm apart"))  # fmt: skip
    floor = "" if row["floor"] is None else f"the noise floor {row['floor']:.4f} ({row['floor_is']})"
    if row["is_floor"]:
        line = f"{where}: the same sums in another order — this batch's noise floor: {gap}; {rest}."
    elif row["floor"] is None:
        line = f"{where}: {gap}; {rest}; no noise floor to judge it by."
    elif row["same"]:
        line = f"{where}: **the same model** — {gap}, within {floor}; {rest}."
    elif row["max_gap"] <= row["floor"]:  # within the floor, but it diverged where vanilla did not
        line = f"{where}: **not the same model** — {gap}, within {floor}; {rest}."
    else:
        line = f"{where}: **not the same model** — {gap}: {times_floor(row)} {floor}; {rest}."
    return f"{line} {row['diverged']}" if "diverged" in row else line


READING_SHORT = {"lengths": "PyLate hands it each document mask as a length, so masked punctuation inside a passage "
                            "moves the tokens it counts",
                 "excluded": "it leaves masked tokens out of each maximum where vanilla counts them as zeros"}


def training_caveat(traced: list[Any], stack: str, regime: str, published_max_gap: float | None,
                    read: pd.DataFrame | None = None) -> str:  # fmt: skip
    """A sentence for a backend that does not train the same model as vanilla in this stack and regime
    (its loss outside the noise floor of a traced batch), with the numbers and, where the op checks
    explain it, why; empty when every compared backend trains the same model."""
    rows = [row for row in training_rows(traced, published_max_gap)
            if row["stack"] == stack and row["regime"] == regime and "why" not in row and row["floor"] is not None
            and not row["is_floor"] and not row["same"]]  # fmt: skip
    sentences = []
    for backend in style.in_order({row["backend"] for row in rows}):
        mine = sorted((row for row in rows if row["backend"] == backend), key=lambda row: row["batch"])
        batches = _and([f"B={row['batch']}" for row in mine])
        cosines = _and([f"{row['cosine']:.3f}" for row in mine])
        ratios = _and([times_floor(row) for row in mine])
        text = (f"**{backend} does not train the same model as vanilla here**: at {batches} its first step's gradient "
                f"has cosine {cosines} with vanilla's, and its largest loss gap is {ratios} the noise floor")  # fmt: skip
        readings = read[read["backend"] == backend]["reading"] if read is not None and not read.empty else pd.Series()
        if not readings.empty and str(readings.iloc[0]) in READING_SHORT:
            text += f", because {READING_SHORT[str(readings.iloc[0])]}"
        sentences.append(text + " (see *Do the backends train the same model?*).")
    return " ".join(sentences)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


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
