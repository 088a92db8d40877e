"""The parity page's data: op parity records and traced training cells, read and judged."""

from __future__ import annotations

import json
import math

from harness.report import agreement
from harness.report.text import nowrap
from harness.results import Parity, write_result
from test_results import make_result


def test_the_op_table_is_the_committed_records_worst_errors():
    frame = agreement.op_parity()
    documents = [json.loads(path.read_text()) for path in agreement.op_parity_files()]
    by_library: dict[str, list] = {}
    for document in documents:
        if document["kind"] == agreement.OP_PARITY:
            by_library.setdefault(document["records"][0]["library"], []).extend(document["records"])
    for library, records in by_library.items():
        table = agreement.op_parity_table(frame, library)
        assert sum(int(cell.split("\u00a0/\u00a0")[1]) for cell in table["passed"]) == len(records)
        scores = max(e["max_rel_error"] for r in records for e in r["errors"] if e["quantity"].startswith("scores"))
        assert nowrap(f"{scores:.1e}" if math.isfinite(scores) else "not finite") in set(table["scores"])
        verdict = agreement.op_verdict(frame, library, agreement.library_backends(library))
        assert ("every one within its bound" in verdict) == all(r["passed"] for r in records)
        assert ("not checked yet: " in verdict) == (not {"lik"} <= {r["variant"] for r in records})


def test_an_op_check_outside_its_bound_is_named():
    frame = agreement.op_parity()
    if frame.empty:
        return
    library = frame.iloc[0]["library"]
    broken = frame.copy()
    broken.loc[broken.index[0], "passed"] = False
    verdict = agreement.op_verdict(broken, library, ("vanilla",))
    first = broken.iloc[0]
    mine = broken[broken["library"] == library]
    group = mine[(mine["backend"] == first["backend"]) & (mine["device"] == first["device"])]
    assert f"{first['backend']} on {first['device']} {int(group['passed'].sum())} of {len(group)}" in verdict
    assert f"Outside it: {first['backend']} {first['dtype']} on {first['device']} ({first['head']}" in verdict
    assert first["case"] in verdict.split("Outside it:")[1]


def test_training_verdicts_compare_each_backend_with_vanillas_cell(tmp_path):
    def traced(variant, losses, parity):
        return make_result(grid="parity", stack="pylate", regime="grad-checkpoint", batch_size=128, variant=variant,
                           trace=True, loss_per_step=losses, grad_norm_per_step=[1.0] * len(losses), parity=parity)  # fmt: skip

    vanilla = traced("vanilla", [0.70, 0.69, 0.68], Parity(reference="r", reference_cell_id="v"))
    close = traced("lik", [0.70, 0.691, 0.679], Parity(reference="r", reference_cell_id="v", first_grad_cosine=0.999876,
                                                        final_weight_rel_diff=2e-4))  # fmt: skip
    waiting = traced("flash", [0.70, 0.69, 0.68], Parity(reference="r", note="no reference at x"))
    lines = agreement.training_verdicts([vanilla, close, waiting], published_max_gap=0.0039)
    assert lines[0] == ("pylate · grad-checkpoint · B=128 · **lik**: **the same model** — largest |Δloss| against "
                        "vanilla over 3 steps 0.0010 (mean 0.0007), within the noise floor 0.0039 (the published run's "
                        "lik against torch); first-step gradient cosine 0.999876; final weights 2.0e-04 of their norm "
                        "apart.")  # fmt: skip
    assert lines[1] == "pylate · grad-checkpoint · B=128 · **flash**: not compared (no reference at x)."
    far = traced("lik", [0.70, 0.75, 0.80], close.parity)
    assert "**not the same model** — largest |Δloss| against vanilla over 3 steps 0.1200" in \
        agreement.training_verdicts([vanilla, far], 0.0039)[0]
    # where chunked vanilla ran, its drift is the floor: a gap of 0.0010 is above a floor of 0.0005
    chunked = make_result(grid="parity", stack="pylate", regime="grad-checkpoint", batch_size=128, variant="vanilla",
                          score_mini_batch_size=64, trace=True, loss_per_step=[0.70, 0.6905, 0.68],
                          grad_norm_per_step=[1.0] * 3, parity=close.parity)  # fmt: skip
    ((key, (floor, what)),) = agreement.noise_floors([vanilla, chunked, close], 0.0039).items()
    assert key == ("pylate", "grad-checkpoint", 128) and abs(floor - 0.0005) < 1e-12 and what == "vanilla chunked by 64"
    judged = agreement.training_verdicts([vanilla, chunked, close], 0.0039)
    assert "the same sums in another order — this batch's noise floor" in judged[0]
    assert "**not the same model**" in judged[1] and "2× the noise floor 0.0005 (vanilla chunked by 64)" in judged[1]
    assert [len(curves) for _, curves in agreement.loss_curves([vanilla, chunked, close])] == [3]
    caveat = agreement.training_caveat([vanilla, chunked, close], "pylate", "grad-checkpoint", 0.0039)
    assert caveat.startswith("**lik does not train the same model as vanilla here**: at B=128 its first step's "
                             "gradient has cosine 1.000 with vanilla's, and its largest loss gap is 2× the noise floor")
    assert agreement.training_caveat([vanilla, close], "pylate", "grad-checkpoint", 0.0039) == ""
    table = agreement.training_table([vanilla, close], 0.0039)
    assert [v.replace("\u00a0", " ") for v in table["|Δloss| max / mean"]] == ["", "0.0010 / 0.0007"]
    assert list(table["step-1 grad. cosine"]) == ["", "0.999876"]
    assert [v.replace("\u00a0", " ") for v in table["verdict"]] == ["the reference", "same model"]
    table = agreement.training_table([vanilla, chunked, close], 0.0039)
    assert [v.replace("\u00a0", " ") for v in table["verdict"]] == ["the reference", "not the same", "noise floor"]
    # through the loader: the parity grid's results are the traced cells
    for result in (vanilla, close):
        write_result(result, tmp_path / "parity" / f"{result.cell_id}.json")
    assert {r.variant for r in agreement.traced_cells(tmp_path)} == {"vanilla", "lik"}


def test_a_diverged_run_is_judged_before_it_diverged_and_measures_no_noise_floor():
    """A loss or gradient that became NaN or infinite: the losses compare over the steps both runs
    trained on finite weights; a backend that diverges where vanilla does not is not the same model; a
    vanilla that diverges is said, and at the same step as the backend the backend is still judged; a
    diverged chunked vanilla sets no floor, and a floor of exactly 0 gives no ratio."""
    nan, inf = float("nan"), float("inf")

    def traced(variant, losses, chunk=None, grads=None, weights=1e-4):
        parity = Parity(reference="r", reference_cell_id="v", first_grad_cosine=0.99, final_weight_rel_diff=weights)
        return make_result(grid="parity", stack="pylate", regime="grad-checkpoint", batch_size=128, variant=variant,
                           score_mini_batch_size=chunk, trace=True, loss_per_step=losses,
                           grad_norm_per_step=grads or [1.0] * len(losses), parity=parity)  # fmt: skip

    vanilla = traced("vanilla", [0.70, 0.69, 0.68])
    diverged = traced("lik", [0.70, nan, nan])
    chunked_nan = traced("vanilla", [0.70, inf, 0.68], chunk=64)
    assert agreement.finite_steps(diverged) == 1 and agreement.finite_steps(vanilla) == 3
    assert agreement.noise_floors([vanilla, chunked_nan, diverged], None) == {}
    lines = agreement.training_verdicts([vanilla, chunked_nan, diverged], published_max_gap=0.0039)
    assert lines[1].startswith("pylate · grad-checkpoint · B=128 · **lik**: **not the same model** — largest |Δloss| "
                               "against vanilla over 1 steps 0.0000 (mean 0.0000), within the noise floor 0.0039")
    assert lines[1].endswith("It diverges where vanilla does not (loss not finite from step 2).")
    assert "**not the same model**" in lines[0] and "noise floor:" not in lines[0]  # the chunked cell is no floor
    # vanilla's gradient turns NaN at step 2 (its loss at step 3), lik's gradient too: the same step
    both_v = traced("vanilla", [0.70, 0.69, nan], grads=[1.0, nan, nan], weights=None)
    both_l = traced("lik", [0.70, 0.6905, 0.6931], grads=[1.0, nan, nan], weights=nan)
    assert agreement.divergence(both_v) == "gradient not finite from step 2, loss from step 3"
    judged = agreement.training_verdicts([both_v, both_l], published_max_gap=0.0039)
    assert judged[0] == ("pylate · grad-checkpoint · B=128 · **lik**: **the same model** — largest |Δloss| against "
                         "vanilla over 2 steps 0.0005 (mean 0.0003), within the noise floor 0.0039 (the published run's "
                         "lik against torch); first-step gradient cosine 0.990000; final weights not finite. Vanilla "
                         "diverges too, at the same step (gradient not finite from step 2, loss from step 3): compared "
                         "over the 2 steps before. Its gradient is not finite from step 2, but its loss stays finite "
                         "after that (0.6931 = ln 2 at every step from step 3), where vanilla's loss is not: a check on "
                         "the loss alone would not see this run diverge.")  # fmt: skip
    assert agreement.finite_loss_after_divergence(both_v) == "" and agreement.finite_loss_after_divergence(vanilla) == ""
    drifting = traced("lik", [0.70, 0.6905, 0.6931, 0.70], grads=[1.0, nan, nan, nan])
    assert agreement.finite_loss_after_divergence(drifting) == ("its loss stays finite after that (0.6931 = ln 2 at step 3, "
                                                                "then 0.6931–0.7000)")  # fmt: skip
    assert judged[1] == ("pylate · grad-checkpoint · B=128 · **vanilla** (the reference) diverges: gradient not finite "
                         "from step 2, loss from step 3.")  # fmt: skip
    table = agreement.training_table([both_v, both_l], 0.0039)
    assert [v.replace("\u00a0", " ") for v in table["loss, first → last compared"]] == ["0.7000 → 0.6900 (step 2)",
                                                                                     "0.7000 → 0.6905 (step 2)"]
    assert list(table["final ‖Δθ‖/‖θ‖"]) == ["", "—"]
    assert [v.replace("\u00a0", " ") for v in table["verdict"]] == ["the reference (diverges after step 2)",
                                                                     "same model (diverges after step 2)"]
    ((title, curves),) = agreement.loss_curves([both_v, both_l])
    assert title.endswith("B=128 · diverges after step 2") and {len(c) for c in curves.values()} == {2}
    equal = traced("vanilla", [0.70, 0.69, 0.68], chunk=64)
    far = traced("flash", [0.70, 0.70, 0.70])
    judged = agreement.training_verdicts([vanilla, equal, far], published_max_gap=0.0039)
    assert "**not the same model** — " in judged[1] and ": above the noise floor 0.0000 (vanilla chunked by 64);" in judged[1]


def test_the_published_run_is_read_as_filed():
    published = agreement.published_run()
    table = agreement.published_table(published)
    assert list(table["backend"]) == ["main", "torch", "lik"]
    assert table.set_index("backend").loc["lik", "max |Δloss| vs torch"] == "0.0039"
    assert agreement.published_gap(published) == 0.0039


def test_fused_backends_fail_on_pylates_masks_because_they_read_them_otherwise():
    """The committed mask readings recompute on the CPU, and their differences from the vanilla math
    equal the fused backends' errors on the GPU (their own rounding apart): a test of the page's
    explanation, which names only what these numbers show."""
    import pytest

    parity = pytest.importorskip("harness.parity")
    read = agreement.mask_readings()
    if read.empty:
        pytest.skip("no fused-backend op-parity record committed")
    assert set(read["backend"]) == {"flash", "lik"} and set(read["case"]) == {"padded", "pylate-train"}
    assert (read["relative_difference"] < 1e-2).all()  # the backends' own rounding (TF32, float16, bfloat16)
    exact = read[(read["dtype"] == "float32") & (read["quantity"] != "scores")]
    assert (exact["relative_difference"] < 1e-5).all()
    committed = {(r.backend, r.dtype, r.quantity): r.read for r in read[read["case"] == "padded"].itertuples()}
    padded = next(case for case in parity.CPU_CASES if case.name == "padded")
    for backend, reading in parity.MASK_READINGS.items():
        again = parity.masks_read_as(padded, reading, "float32")
        for quantity in ("grad:query", "grad:doc"):
            assert again[quantity] == pytest.approx(committed[(backend, "float32", quantity)], rel=1e-12)
    lines = agreement.mask_explanations(read, agreement.op_errors())
    flash = next(line for line in lines if line.startswith("**flash**"))
    assert "fails it on padded, pylate-train" in flash and "a length of 0" in flash
    lik = next(line for line in lines if line.startswith("**lik**"))
    assert "fails it on padded." in lik and "pylate-train" in lik.split("fails")[0]


def test_an_error_outside_its_bound_always_reads_as_outside():
    """parity.md's op tables: '1.01× its bound' must not print as '1.0', nor a non-finite error as 'inf'."""
    assert agreement.of_bound(0.56) == "0.56"
    assert agreement.of_bound(1.0) == "1.0"  # at its bound: within it
    assert agreement.of_bound(1.01) == "1.01 (out)" and agreement.of_bound(1.004) == "1.004 (out)"
    assert agreement.of_bound(26.7) == "27 (out)"
    assert agreement.of_bound(float("inf")) == "not finite (out)"
