"""Op parity on the CPU: vanilla and PyLate's chunking against the fp64 reference, within the bound
argued from the dtype, and a wrong backend caught (run in each stack's environment)."""

import dataclasses
import importlib.util
import json

import pytest
import torch

from harness import backends, ops, parity
from harness.parity import CPU_CASES, check_parity

CASES = {case.name: case for case in CPU_CASES}


def _mean_instead_of_max(query, doc, q_mask, d_mask):
    scores = torch.einsum("ash,bth->abst", query, doc)
    if d_mask is not None:
        scores = scores * d_mask.unsqueeze(0).unsqueeze(2)
    return scores.mean(dim=-1).sum(dim=-1)


def _minus_infinity_masking(query, doc, q_mask, d_mask):
    """A kernel's masking (-inf before the max) instead of PyLate's multiply-by-mask."""
    scores = torch.einsum("ash,bth->abst", query, doc)
    scores = scores.masked_fill(~d_mask.unsqueeze(0).unsqueeze(2), float("-inf"))
    return scores.max(dim=-1).values.sum(dim=-1)


# --- PyLate (the scores head needs only harness.ops; the loss needs pylate) ---------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda case: case.name)
def test_pylate_vanilla_scores_are_the_exact_math_within_the_dtypes_bound(dtype, case):
    record = check_parity("pylate", "scores", "vanilla", dtype, case)
    assert record.passed, record
    scores = record.error("scores:scores")
    assert scores.max_abs_error > 0  # the comparison is real: the dtype rounds
    u = parity.UNIT_ROUNDOFF[dtype]
    assert scores.max_rel_error < 4 * u + 1e-6  # far inside the worst case (Lq + d terms of u)
    assert record.error("grad:query").error_to_bound <= 1 and record.error("grad:doc").error_to_bound <= 1


def test_pylate_fully_padded_document_scores_zero_as_pylate_does():
    case = CASES["padded"]
    inputs = parity.make_inputs("pylate", "scores", case, "float32")
    assert not inputs["doc_mask"][1, 1].any()  # document 1's second slot is all padding
    scores = ops.PylateColbertScores().forward("vanilla", {k: v.clone() for k, v in inputs.items()})
    column = 1 * 2 + 1  # query-major: document 1, slot 1
    assert torch.equal(scores[:, column], torch.zeros(case.batch))
    reference = parity.reference("pylate", "scores", inputs, weights=parity.upstream_weights(case))
    assert torch.equal(reference.scores["scores"][:, column], torch.zeros(case.batch, dtype=torch.float64))
    assert torch.equal(reference.grads["doc"][1, 1], torch.zeros_like(reference.grads["doc"][1, 1]))


@pytest.mark.parametrize(
    "wrong, case, dtype",
    [(_mean_instead_of_max, "aligned", "bfloat16"), (_minus_infinity_masking, "padded", "float32")],
    ids=["mean-for-max", "minus-inf-masking"],
)
def test_a_wrong_scores_backend_fails(monkeypatch, wrong, case, dtype):
    monkeypatch.setattr(ops, "_pylate_slot_vanilla", wrong)
    record = check_parity("pylate", "scores", "vanilla", dtype, CASES[case])
    assert not record.passed and not record.error("scores:scores").passed
    assert record.error("scores:scores").error_to_bound > 10


def test_a_perturbed_gradient_fails_in_fp32():
    def perturb(observed):
        grads = dict(observed.grads, query=observed.grads["query"] * (1 + 1e-3))
        return dataclasses.replace(observed, grads=grads)

    record = check_parity("pylate", "scores", "vanilla", "float32", CASES["odd-lengths"], tamper=perturb)
    assert not record.error("grad:query").passed and record.error("grad:doc").passed and record.error("scores:scores").passed


@pytest.mark.pylate
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda case: case.name)
def test_pylate_contrastive_loss_chunked_or_whole_matches_the_reference(dtype, case):
    whole = check_parity("pylate", "contrastive", "vanilla", dtype, case)
    chunked = check_parity("pylate", "contrastive", "vanilla", dtype, case, score_mini_batch_size=3)
    assert whole.passed and chunked.passed, (whole, chunked)
    assert whole.hyper == {"temperature": 1.0}
    loss, chunked_loss = whole.error("loss"), chunked.error("loss")
    assert abs(loss.max_abs_error - chunked_loss.max_abs_error) <= loss.bound_max  # same loss within the bound
    if dtype == "bfloat16":
        assert loss.max_abs_error > 0


def test_fused_backends_are_refused_on_the_cpu():
    with pytest.raises(backends.BackendUnavailable, match="runs only on CUDA"):
        check_parity("pylate", "scores", "flash", "float32", CASES["aligned"])
    with pytest.raises(ValueError, match="chunking"):
        check_parity("pylate", "scores", "vanilla", "float32", CASES["aligned"], score_mini_batch_size=2)


def test_a_parity_file_is_written_with_env_provenance_and_records(tmp_path):
    record = check_parity("pylate", "scores", "vanilla", "float32", CASES["single-query-token"])
    path = parity.write_parity([record], tmp_path / "parity" / "pylate-op-parity-cpu.json", "cpu")
    document = json.loads(path.read_text())
    assert document["schema_version"] == 1 and document["kind"] == "op-parity" and document["passed"] is True
    assert document["env"]["device"] == "cpu" and document["provenance"]["harness_sha256"]
    (saved,) = document["records"]
    assert saved["head"] == "scores" and saved["query_shape"] == [4, 1, 128] and saved["doc_shape"] == [4, 2, 45, 128]
    assert {e["quantity"] for e in saved["errors"]} == {"scores:scores", "grad:query", "grad:doc"}


# --- colpali-engine's loss heads ---------------------------------------------------------------------


@pytest.mark.colpali
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("head", parity.HEADS["colpali"])
def test_colpali_vanilla_losses_are_the_exact_math_within_the_dtypes_bound(head, dtype):
    for case in CPU_CASES:
        record = check_parity("colpali", head, "vanilla", dtype, case)
        assert record.passed, record
        inbatch = record.error("scores:inbatch")
        assert inbatch.max_rel_error < 4 * parity.UNIT_ROUNDOFF[dtype] + 1e-6
        if dtype == "bfloat16":
            assert inbatch.max_abs_error > 0 and record.error("loss").max_abs_error > 0


@pytest.mark.colpali
def test_colpali_all_padding_document_scores_zero():
    case = CASES["padded"]
    inputs = parity.make_inputs("colpali", "inbatch", case, "bfloat16")
    assert not inputs["doc"][1].any()
    reference = parity.reference("colpali", "inbatch", inputs)
    assert torch.equal(reference.scores["inbatch"][:, 1], torch.zeros(case.batch, dtype=torch.float64))
    record = check_parity("colpali", "inbatch", "vanilla", "bfloat16", case)
    assert record.passed and record.hyper == {"temperature": 1.0}


@pytest.mark.colpali
def test_a_wrong_colpali_gradient_fails(monkeypatch):
    def perturb(observed):
        grads = dict(observed.grads, doc=observed.grads["doc"].flip(0))  # gradients of the wrong documents
        return dataclasses.replace(observed, grads=grads)

    record = check_parity("colpali", "negative-ce", "vanilla", "float32", CASES["aligned"], tamper=perturb)
    assert not record.error("grad:doc").passed and record.error("grad:query").passed


# --- the fused kernels, on a GPU ---------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda case: case.name)
def test_fused_backends_against_the_reference_on_the_gpu(case):
    library = "colpali" if importlib.util.find_spec("colpali_engine") else "pylate"
    failures = []
    for variant in parity.VARIANTS[library][1:]:
        for head in parity.HEADS[library]:
            for dtype in parity.DEFAULT_DTYPES[library]:
                record = check_parity(library, head, variant, dtype, case, device="cuda")
                if not record.passed:
                    worst = [(e.quantity, e.error_to_bound) for e in record.errors if not e.passed]
                    failures.append((head, variant, dtype, worst))
    assert not failures, failures
