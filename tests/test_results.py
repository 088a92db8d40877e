"""The result schema (2): the spec a cell ran is embedded, its id checked against it, atomic writes, loads."""

import json
import os
import stat

import pytest

from harness import results
from harness.results import (
    CellResult,
    Environment,
    OpCall,
    Provenance,
    ResultError,
    load_result,
    load_results,
    read_results,
    write_result,
)
from harness.spec import STACKS, OpSpec, TrainSpec, make_spec, spec_fields

# what a result built by make_result ran, unless told otherwise (a CUDA cell, so any card is allowed)
TRAIN_DEFAULTS = dict(stack="colpali", regime="plain", batch_size=4, variant="vanilla", card="native", steps=2, seed=42,
                      preset="full", device="cuda")  # fmt: skip
OP_DEFAULTS = dict(head="inbatch", batch_size=4, variant="vanilla", reps=2, seed=42, device="cuda")


def make_call(**overrides):
    fields = dict(
        call_index=0, variant="vanilla", query_shape=[4, 8, 16], doc_shape=[4, 30, 16], dtype="float32",
        forward_transient_peak_mib=1.5, saved_for_backward_mib=1.25, backward_transient_peak_mib=2.0,
        predicted_grid_mib=1.0, predicted_forward_transient_mib=1.25, predicted_saved_for_backward_mib=1.25,
    )  # fmt: skip
    return OpCall(**(fields | overrides))


def make_result(grid="ours", **overrides):
    """A valid result; ``overrides`` are spec fields (``stack``, ``batch_size``, ``card``, ...) or result fields.

    Shared with test_report and test_book, which build report inputs with it."""
    kind = STACKS[overrides.get("stack", "colpali")].kind
    names = {field.name for field in spec_fields(kind)}
    spec_values = (TRAIN_DEFAULTS if kind == "train" else OP_DEFAULTS) | {k: v for k, v in overrides.items() if k in names}
    spec = make_spec(spec_values)
    call = make_call()
    env = Environment(packages={"torch": "2.13.0"}, python="3.11.7", platform="linux", device="cuda:0", card=spec.card,
                      seed=spec.seed)  # fmt: skip
    fields = dict(
        outcome="ok", step_peak_alloc_mib=100.0, step_peak_reserved_mib=130.0, step_times_sec=[0.5, 0.25],
        maxsim_calls_in_train=[call], maxsim_calls_isolated=[call], env=env,
        provenance=Provenance(commit="0" * 40, dirty=False, harness_sha256="f" * 64),
    )  # fmt: skip
    fields.update({k: v for k, v in overrides.items() if k not in names})
    return CellResult(grid=grid, cell_id=spec.cell_id, spec=spec, **fields)


def on_gpu(result, name):
    """``result`` as measured on the GPU ``name`` (its environment names that device; one is made where
    the result has none). Shared with test_report, test_ceiling and test_longrun."""
    env = result.env or Environment(packages={}, python="3.12", platform="linux", device="cuda:0",
                                    card=result.spec.card, seed=result.spec.seed)  # fmt: skip
    return result.model_copy(update={"env": env.model_copy(update={"device_name": name})})


def on_draw(result, source, name="NVIDIA H200"):
    """``result`` as trained on the synthetic data ``source`` ('synthetic:x:seed=42:stream=1': its draw, as
    :attr:`CellResult.data_draw` reads it) on the GPU ``name``. Shared with test_report and test_ceiling."""
    env = on_gpu(result, name).env
    return result.model_copy(update={"env": env.model_copy(update={"data_source": source})})


def test_round_trip_keeps_every_field(tmp_path):
    original = make_result()
    path = write_result(original, tmp_path / "cell.json")
    assert load_result(path) == original
    stored = json.loads(path.read_text())
    for key in ("schema_version", "grid", "cell_id", "spec", "provenance", "outcome", "oom_message", "step_peak_alloc_mib",
                "step_peak_reserved_mib", "step_times_sec", "maxsim_calls_in_train", "maxsim_calls_isolated", "env"):  # fmt: skip
        assert key in stored
    assert stored["schema_version"] == results.SCHEMA_VERSION == 2
    assert (stored["grid"], stored["cell_id"]) == ("ours", "colpali-plain-b4-vanilla-native")
    # the cell's identity lives in the spec only, every field of it, read through by the result
    assert stored["spec"] == {"kind": "train", "stack": "colpali", "regime": "plain", "batch_size": 4, "variant": "vanilla",
                              "score_mini_batch_size": None, "mini_batch_size": None, "card": "native",
                              "allocator": "default", "steps": 2,
                              "warmup_steps": 1, "min_steady_steps": 0, "seed": 42, "preset": "full", "device": "cuda",
                              "model_source": None,
                              "data_source": None, "trace": False, "world_size": 1, "gather": False, "ranks_share_gpu": False,
                              "dataloader_workers": None}  # fmt: skip
    assert "batch_size" not in stored and "stack" not in stored
    loaded = load_result(path)
    assert isinstance(loaded.spec, TrainSpec)
    assert (loaded.stack, loaded.regime, loaded.batch_size, loaded.variant, loaded.card, loaded.allocator, loaded.preset) == (
        "colpali", "plain", 4, "vanilla", "native", "default", "full")  # fmt: skip
    assert stored["provenance"]["commit"] == "0" * 40 and stored["provenance"]["harness_sha256"] == "f" * 64
    call = stored["maxsim_calls_isolated"][0]
    for key in ("query_shape", "doc_shape", "dtype", "forward_transient_peak_mib", "saved_for_backward_mib",
                "backward_transient_peak_mib", "predicted_grid_mib"):  # fmt: skip
        assert key in call


def test_an_op_result_embeds_its_op_spec(tmp_path):
    original = make_result(grid="op", stack="op-colpali", head="negative-ce", negatives=8, batch_size=64, variant="lik")
    loaded = load_result(write_result(original, tmp_path / "op.json"))
    assert isinstance(loaded.spec, OpSpec) and loaded == original
    assert loaded.cell_id == "op-colpali-negative-ce-b64-n8-lik-native"
    assert (loaded.kind, loaded.regime, loaded.negatives, loaded.card, loaded.preset, loaded.steps) == (
        "op", "negative-ce", 8, "native", "op", 2)  # fmt: skip


def test_a_result_file_is_readable_by_all(tmp_path):
    old = os.umask(0o077)  # even under a private umask: results are shared data
    try:
        path = write_result(make_result(), tmp_path / "cell.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    path.chmod(0o600)
    write_result(make_result(), path)  # rewriting replaces the file, mode included
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_an_interrupted_write_leaves_the_previous_result_intact(tmp_path, monkeypatch):
    path = write_result(make_result(batch_size=4), tmp_path / "cell.json")
    before = path.read_bytes()

    def interrupted(source, target):
        raise KeyboardInterrupt  # the process is stopped between writing and renaming

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_result(make_result(batch_size=8), path)
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]  # no temporary left behind


def test_invalid_files_are_rejected_with_their_path_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    cases = [
        ("{", "bad.json: not JSON (Expecting property name enclosed in double quotes at line 1; a truncated write?)"),
        (json.dumps({"stack": "colpali", "batch_size": 4}), "bad.json: not a cell result (no schema_version)"),
        (json.dumps([1, 2]), "bad.json: not a cell result (no schema_version)"),
        (json.dumps({"schema_version": 3}), "bad.json: schema 3, this harness reads 2"),
    ]
    good = make_result().model_dump(mode="json")
    zero = json.loads(json.dumps(good))
    zero["spec"]["batch_size"] = 0
    cases.append((json.dumps(zero), "bad.json: not a valid cell result (1 problems; first: spec.train: Value error, "
                                    "batch_size must be an integer of at least 1, got 0.)"))  # fmt: skip
    unknown = good | {"surprise": 1}
    cases.append(
        (json.dumps(unknown), "bad.json: not a valid cell result (1 problems; first: surprise: Extra inputs are not permitted)")
    )
    for text, reason in cases:
        bad.write_text(text)
        with pytest.raises(ResultError) as caught:
            load_result(bad)
        assert str(caught.value) == f"{tmp_path}/{reason}" and "\n" not in str(caught.value)
    with pytest.raises(ResultError, match="no result file at .*missing.json"):
        load_result(tmp_path / "missing.json")


def test_a_schema_1_file_is_refused_with_the_migration_hint(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 1, "stack": "colpali", "batch_size": 4}))
    with pytest.raises(ResultError, match=r"old.json: schema 1, this harness reads 2; run `harness migrate` to rewrite it$"):
        load_result(old)


def test_schema_rejects_an_unknown_outcome_a_nonpositive_batch_and_a_foreign_cell_id():
    with pytest.raises(ValueError):
        make_result(outcome="maybe")
    with pytest.raises(ValueError, match="batch_size must be an integer of at least 1"):
        make_result(batch_size=0)
    document = make_result().model_dump(mode="json") | {"cell_id": "colpali-plain-b8-vanilla-native"}
    with pytest.raises(
        ValueError, match="cell_id 'colpali-plain-b8-vanilla-native' is not its spec's id 'colpali-plain-b4-vanilla-native'"
    ):
        CellResult.model_validate(document)


def test_load_results_gives_one_row_per_cell_or_per_call(tmp_path):
    write_result(make_result(batch_size=4), tmp_path / "a" / "b4.json")
    write_result(make_result(batch_size=8, outcome="oom", oom_message="CUDA out of memory."), tmp_path / "a" / "b8.json")
    cells = load_results(tmp_path)
    assert list(cells["batch_size"]) == [4, 8]
    assert list(cells["cell_id"]) == ["colpali-plain-b4-vanilla-native", "colpali-plain-b8-vanilla-native"]
    assert list(cells["grid"]) == ["ours", "ours"] and list(cells["preset"]) == ["full", "full"]
    assert list(cells["outcome"]) == ["ok", "oom"]
    assert list(cells["fragmentation_mib"]) == [30.0, 30.0]
    assert list(cells["op_saved_for_backward_mib"]) == [1.25, 1.25]
    calls = load_results(tmp_path, level="calls")
    assert len(calls) == 4 and set(calls["call_kind"]) == {"in_train", "isolated"}
    assert set(calls["kind"]) == {"train"}  # the cell's kind; the call's is call_kind
    assert calls.iloc[0]["query_shape"] == [4, 8, 16]


def test_read_results_keeps_the_grids_asked_for_and_says_why_it_skipped_the_rest(tmp_path):
    write_result(make_result(batch_size=4), tmp_path / "ours" / "b4.json")
    write_result(make_result(grid="published", batch_size=8), tmp_path / "published" / "b8.json")
    write_result(make_result(grid=None, batch_size=16), tmp_path / "runs" / "b16.json")
    (tmp_path / "ours" / "old.json").write_text(json.dumps({"schema_version": 1}))
    (tmp_path / "ours" / ".b4.json.tmp").write_text("{")  # a write in progress is no result at all
    kept, skipped = read_results(tmp_path, grids={"ours"})
    assert [(path.name, result.batch_size) for path, result in kept] == [("b4.json", 4)]
    reasons = {item.path.name: item.reason for item in skipped}
    assert reasons == {
        "b8.json": "cell of grid 'published', not one of the report's grids (ours)",
        "old.json": "schema 1, this harness reads 2; run `harness migrate` to rewrite it",
        "b16.json": "a cell run outside any grid (a notebook's or `harness cell`'s own output)",
    }
    everything, skipped = read_results([tmp_path / "ours", tmp_path / "published", tmp_path / "runs"])
    assert sorted(result.batch_size for _, result in everything) == [4, 8, 16] and len(skipped) == 1
    # strict (the default): a file the report cannot use stops it, named; otherwise it is left out
    with pytest.raises(ResultError, match=r"old.json: schema 1"):
        load_results(tmp_path, grids={"ours", "published"})
    frame = load_results(tmp_path, grids={"ours", "published"}, strict=False)
    assert sorted(frame["batch_size"]) == [4, 8]


def test_every_result_carries_its_fragmentation_and_it_is_derived_again_on_load(tmp_path):
    result = make_result(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[100.0, 130.0])
    path = write_result(result, tmp_path / "cell.json")
    stored = json.loads(path.read_text())
    assert stored["fragmentation_mib"] == 30.0 and stored["fragmentation_per_step_mib"] == [10.0, 30.0]
    assert stored["spec"]["allocator"] == "default"
    del stored["fragmentation_mib"], stored["fragmentation_per_step_mib"], stored["spec"]["allocator"]
    path.write_text(json.dumps(stored))
    loaded = load_result(path)
    assert (loaded.fragmentation_mib, loaded.fragmentation_per_step_mib, loaded.allocator) == (30.0, [10.0, 30.0], "default")
    (row,) = load_results(path).to_dict("records")
    assert (row["fragmentation_first_step_mib"], row["fragmentation_last_step_mib"], row["fragmentation_growth_mib"]) == (
        10.0,
        30.0,
        20.0,
    )


def test_a_crash_marker_names_its_spec_and_why_it_has_no_measurement(tmp_path):
    spec = TrainSpec(stack="pylate", regime="grad-checkpoint", batch_size=512, variant="lik", card="h100-80gb", device="cuda")
    marker = CellResult.crashed(spec, "published", "kernel_died", "Killed", 12.5)
    loaded = load_result(write_result(marker, tmp_path / f"{spec.cell_id}.json"))
    assert (loaded.outcome, loaded.failure, loaded.crash_log_tail, loaded.grid) == (
        "crashed",
        "kernel_died",
        "Killed",
        "published",
    )
    assert loaded.cell_id == "pylate-grad-checkpoint-b512-lik-h100-80gb" and loaded.spec == spec


def test_load_results_of_an_empty_directory_is_an_empty_frame(tmp_path):
    frame = load_results(tmp_path)
    assert frame.empty and "batch_size" in frame.columns and "cell_id" in frame.columns


def test_a_non_finite_measurement_survives_the_round_trip(tmp_path):
    """A gradient norm that overflowed (inf) and a loss that became NaN are written as JSON's
    Infinity / NaN constants and read back as such: pydantic's default (null) would make the whole
    result unreadable, and its cell would pass for crashed (what ColQwen2's traced B=64 cell did)."""
    original = make_result(loss_per_step=[0.7, float("nan")], grad_norm_per_step=[0.5, float("inf")])
    path = write_result(original, tmp_path / "cell.json")
    assert '"grad_norm_per_step": [\n    0.5,\n    Infinity\n  ]' in path.read_text()
    loaded = load_result(path)
    assert loaded.grad_norm_per_step == [0.5, float("inf")]
    assert loaded.loss_per_step[0] == 0.7 and loaded.loss_per_step[1] != loaded.loss_per_step[1]  # NaN
