"""The parity page's data: op parity records and traced training cells, read and judged."""

from __future__ import annotations

import json

from harness.report import agreement
from harness.results import Parity, write_result
from test_results import make_result


def test_the_op_table_is_the_committed_records_worst_errors():
    frame = agreement.op_parity()
    for path in agreement.op_parity_files():
        records = json.loads(path.read_text())["records"]
        library = records[0]["library"]
        table = agreement.op_parity_table(frame, library)
        assert sum(int(cell.split("\u00a0/\u00a0")[1]) for cell in table["within bound"]) == len(records)
        scores = max(e["max_rel_error"] for r in records for e in r["errors"] if e["quantity"].startswith("scores"))
        assert f"{scores:.1e}" in set(table["scores"])
        verdict = agreement.op_verdict(frame, library, agreement.library_backends(library))
        assert ("every one within its bound" in verdict) == all(r["passed"] for r in records)
        assert ("not checked yet: " in verdict) == (not {"lik"} <= {r["variant"] for r in records})


def test_an_op_check_outside_its_bound_is_named():
    frame = agreement.op_parity()
    if frame.empty:
        return
    library = frame.iloc[0]["library"]
    before = int((~frame[frame["library"] == library]["passed"]).sum())
    broken = frame.copy()
    broken.loc[broken.index[0], "passed"] = False
    after = before + bool(frame.iloc[0]["passed"])
    verdict = agreement.op_verdict(broken, library, ("vanilla",))
    assert f"{after} outside the bound derived for them" in verdict
    first = broken.iloc[0]
    assert f"{first['backend']} {first['head']} {first['dtype']} on {first['case']}" in verdict


def test_training_verdicts_compare_each_backend_with_vanillas_cell(tmp_path):
    def traced(variant, losses, parity):
        return make_result(grid="parity", stack="pylate", regime="grad-checkpoint", batch_size=128, variant=variant,
                           trace=True, loss_per_step=losses, grad_norm_per_step=[1.0] * len(losses), parity=parity)  # fmt: skip

    vanilla = traced("vanilla", [0.70, 0.69, 0.68], Parity(reference="r", reference_cell_id="v"))
    close = traced("lik", [0.70, 0.691, 0.679], Parity(reference="r", reference_cell_id="v", first_grad_cosine=0.999876,
                                                        final_weight_rel_diff=2e-4))  # fmt: skip
    waiting = traced("flash", [0.70, 0.69, 0.68], Parity(reference="r", note="no reference at x"))
    lines = agreement.training_verdicts([vanilla, close, waiting], published_max_gap=0.0039)
    assert lines[0] == ("pylate · grad-checkpoint · B=128 · lik: largest |Δloss| against vanilla over 3 steps 0.0010, "
                        "within the published run's 0.0039; first-step gradient cosine 0.999876; final weights 2.0e-04 "
                        "of their norm apart.")  # fmt: skip
    assert lines[1] == "pylate · grad-checkpoint · B=128 · flash: not compared (no reference at x)."
    far = traced("lik", [0.70, 0.75, 0.80], close.parity)
    assert "0.1200, above the published run's" in agreement.training_verdicts([vanilla, far], 0.0039)[0]
    table = agreement.training_table([vanilla, close])
    assert list(table["max |Δloss|"]) == ["", "0.0010"] and list(table["first-gradient cosine"]) == ["", "0.999876"]
    # through the loader: the parity grid's results are the traced cells
    for result in (vanilla, close):
        write_result(result, tmp_path / "parity" / f"{result.cell_id}.json")
    assert {r.variant for r in agreement.traced_cells(tmp_path)} == {"vanilla", "lik"}


def test_the_published_run_is_read_as_filed():
    published = agreement.published_run()
    table = agreement.published_table(published)
    assert list(table["backend"]) == ["main", "torch", "lik"]
    assert table.set_index("backend").loc["lik", "max |Δloss| vs torch"] == "0.0039"
    assert agreement.published_gap(published) == 0.0039
