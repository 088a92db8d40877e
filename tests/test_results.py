import json
import os

import pytest

from harness import results
from harness.results import CellResult, Environment, OpCall, ResultError, load_result, load_results, write_result


def make_result(**overrides):
    call = OpCall(
        call_index=0, variant="vanilla", query_shape=[4, 8, 16], doc_shape=[4, 30, 16], dtype="float32",
        forward_transient_peak_mib=1.5, saved_for_backward_mib=1.25, backward_transient_peak_mib=2.0,
        predicted_grid_mib=1.0, predicted_forward_transient_mib=1.25, predicted_saved_for_backward_mib=1.25,
    )  # fmt: skip
    env = Environment(packages={"torch": "2.13.0"}, python="3.11.7", platform="linux", device="cpu", card="native", seed=42)
    fields = dict(
        stack="colpali", regime="plain", batch_size=4, variant="vanilla", card="native", steps=2, seed=42,
        outcome="ok", step_peak_alloc_mib=100.0, step_peak_reserved_mib=130.0, step_times_sec=[0.5, 0.25],
        maxsim_calls_in_train=[call], maxsim_calls_isolated=[call], env=env,
    )  # fmt: skip
    fields.update(overrides)
    return CellResult(**fields)


def test_round_trip_keeps_every_field(tmp_path):
    original = make_result()
    path = write_result(original, tmp_path / "cell.json")
    assert load_result(path) == original
    keys = json.loads(path.read_text())
    for key in ("batch_size", "variant", "stack", "regime", "outcome", "oom_message", "step_peak_alloc_mib",
                "step_peak_reserved_mib", "step_times_sec", "maxsim_calls_in_train", "maxsim_calls_isolated", "env"):
        assert key in keys
    call = keys["maxsim_calls_isolated"][0]
    for key in ("query_shape", "doc_shape", "dtype", "forward_transient_peak_mib", "saved_for_backward_mib",
                "backward_transient_peak_mib", "predicted_grid_mib"):
        assert key in call
    assert keys["schema_version"] == results.SCHEMA_VERSION


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


def test_invalid_files_are_rejected_with_their_path(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"stack": "colpali", "batch_size": 0}))
    with pytest.raises(ResultError, match="bad.json is not a valid cell result"):
        load_result(bad)
    with pytest.raises(ResultError, match="no result file"):
        load_result(tmp_path / "missing.json")
    unknown = make_result().model_dump()
    unknown["surprise"] = 1
    bad.write_text(json.dumps(unknown))
    with pytest.raises(ResultError):
        load_result(bad)


def test_schema_rejects_an_unknown_outcome_and_a_nonpositive_batch():
    with pytest.raises(ValueError):
        make_result(outcome="maybe")
    with pytest.raises(ValueError):
        make_result(batch_size=0)


def test_load_results_gives_one_row_per_cell_or_per_call(tmp_path):
    write_result(make_result(batch_size=4), tmp_path / "a" / "b4.json")
    write_result(make_result(batch_size=8, outcome="oom", oom_message="CUDA out of memory."), tmp_path / "a" / "b8.json")
    cells = load_results(tmp_path)
    assert list(cells["batch_size"]) == [4, 8]
    assert list(cells["outcome"]) == ["ok", "oom"]
    assert list(cells["fragmentation_mib"]) == [30.0, 30.0]
    assert list(cells["op_saved_for_backward_mib"]) == [1.25, 1.25]
    calls = load_results(tmp_path, level="calls")
    assert len(calls) == 4 and set(calls["kind"]) == {"in_train", "isolated"}
    assert calls.iloc[0]["query_shape"] == [4, 8, 16]


def test_every_result_carries_its_fragmentation_and_older_files_get_it_on_load(tmp_path):
    result = make_result(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[100.0, 130.0])
    path = write_result(result, tmp_path / "cell.json")
    stored = json.loads(path.read_text())
    assert stored["fragmentation_mib"] == 30.0 and stored["fragmentation_per_step_mib"] == [10.0, 30.0]
    assert stored["allocator"] == "default"
    del stored["fragmentation_mib"], stored["fragmentation_per_step_mib"], stored["allocator"]  # a file from before
    path.write_text(json.dumps(stored))
    loaded = load_result(path)
    assert (loaded.fragmentation_mib, loaded.fragmentation_per_step_mib, loaded.allocator) == (30.0, [10.0, 30.0], "default")
    (row,) = load_results(path).to_dict("records")
    assert (row["fragmentation_first_step_mib"], row["fragmentation_last_step_mib"], row["fragmentation_growth_mib"]) == (10.0, 30.0, 20.0)


def test_load_results_of_an_empty_directory_is_an_empty_frame(tmp_path):
    frame = load_results(tmp_path)
    assert frame.empty and "batch_size" in frame.columns
