"""Schema 1 → 2: a migrated result keeps every measured number, takes its grid from its folder once and
its original commit into the provenance; the committed results are all schema 2."""

import copy
import json
import subprocess
from pathlib import Path

import pytest

from harness.cli import main
from harness.migrate import migrate, migrate_v1, spec_fields_v1
from harness.results import ResultError, load_result, result_paths
from harness.spec import OpSpec, TrainSpec

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
# the last commit whose results were schema 1
V1_COMMIT = "37ed41e"
V1_FILES = {
    "op": "results/op/op-pylate/inbatch/op-pylate-inbatch-b64-vanilla-native.json",
    "train": "results/published/pylate/grad-checkpoint/pylate-grad-checkpoint-b1024-vanilla-chunk64-h100-80gb.json",
}
# the result keys of schema 1 that schema 2 moved into the spec
IDENTITY_V1 = {"stack", "regime", "batch_size", "variant", "score_mini_batch_size", "negatives", "card", "allocator", "steps",
               "seed", "preset"}  # fmt: skip


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def migrated_version(path):
    """The file at ``path`` as its latest migration to schema 2 committed it: a cell measured again later
    (a schema-2 result of its own) replaces it in the working tree, not in history."""
    for commit in git("log", "--format=%H", f"{V1_COMMIT}..HEAD", "--", path).stdout.split():  # newest first
        shown = git("show", f"{commit}:{path}")
        if shown.returncode == 0 and '"migrated_from_schema": 1' in shown.stdout:
            return shown.stdout
    return (ROOT / path).read_text()  # not committed yet: the working tree's migration


@pytest.fixture(scope="module")
def v1_documents():
    documents = {}
    for kind, path in V1_FILES.items():
        shown = git("show", f"{V1_COMMIT}:{path}")
        if shown.returncode != 0:
            pytest.skip(f"this checkout has no history back to {V1_COMMIT} ({shown.stderr.strip()})")
        documents[kind] = json.loads(shown.stdout)
    return documents


def v1_training_cell():
    """A schema-1 training cell as the harness wrote it before schema 2 (no file of git history needed)."""
    call = {"call_index": 0, "variant": "lik", "query_shape": [128, 48, 128], "doc_shape": [128, 2, 300, 128],
            "doc_mask_shape": [128, 2, 300], "dtype": "float32", "forward_transient_peak_mib": 12.5,
            "saved_for_backward_mib": 3.25, "predicted_grid_mib": 1800.0, "entry_point_calls": 2, "step": 1}  # fmt: skip
    return {
        "schema_version": 1, "stack": "pylate", "regime": "grad-checkpoint", "batch_size": 128, "variant": "lik",
        "score_mini_batch_size": None, "card": "rtx4090-24gb", "allocator": "expandable", "steps": 8, "seed": 43,
        "preset": "full", "outcome": "ok", "step_peak_alloc_mib": 18000.5, "step_peak_reserved_mib": 19000.0,
        "step_times_sec": [3.0, 1.5, 1.25], "steady_steps": [1, 2], "steady_step_time_sec": 1.375, "samples_per_sec": 93.09,
        "step_peak_alloc_per_step_mib": [17000.0, 18000.5], "step_peak_reserved_per_step_mib": [18000.0, 19000.0],
        "backend_entry_point_calls": 4, "maxsim_calls_in_train": [call], "maxsim_calls_isolated": [call],
        "env": {"packages": {"torch": "2.9.0"}, "python": "3.12.3", "platform": "linux", "device": "cuda:0",
                "device_name": "NVIDIA H200", "card": "rtx4090-24gb", "card_cap_mib": 23511.04, "seed": 43,
                "git_commit": "a" * 40},
        "wall_sec": 120.0,
    }  # fmt: skip


def holds(migrated, original):
    """Whether ``migrated`` holds every value of ``original`` (fields schema 2 added may be there too)."""
    if isinstance(original, dict):
        return isinstance(migrated, dict) and all(
            key in migrated and holds(migrated[key], value) for key, value in original.items()
        )
    if isinstance(original, list):
        return isinstance(migrated, list) and len(migrated) == len(original) and all(map(holds, migrated, original))
    return migrated == original and type(migrated) is type(original)


def assert_same_numbers(v1, v2):
    """Every value of the schema-1 document is in the migrated result, unchanged, but its identity (now the
    spec's) and env.git_commit (now provenance.commit)."""
    migrated = v2.model_dump(mode="json")
    for key, value in v1.items():
        if key in IDENTITY_V1 or key == "schema_version":
            continue
        if key == "env":
            value = {k: v for k, v in value.items() if k != "git_commit"}
            assert "git_commit" not in migrated["env"]
        assert holds(migrated[key], value), key
    for key in IDENTITY_V1 - {"regime", "preset", "steps"}:
        if key in v1:
            assert getattr(v2, key) == v1[key], key
    assert (v2.regime, v2.preset, v2.steps) == (v1["regime"], v1["preset"], v1["steps"])  # an op cell's steps are its reps


def test_a_schema_1_training_cell_migrates_with_the_same_numbers():
    document = v1_training_cell()
    original = copy.deepcopy(document)
    result = migrate_v1(document, "ceilings")
    assert document == original  # the caller's document is left as it was
    assert result.schema_version == 2 and result.grid == "ceilings"
    assert result.spec == TrainSpec(stack="pylate", regime="grad-checkpoint", batch_size=128, variant="lik", card="rtx4090-24gb",
                                    allocator="expandable", steps=8, seed=43, preset="full", device="cuda")  # fmt: skip
    assert result.cell_id == "pylate-grad-checkpoint-b128-lik-rtx4090-24gb-expandable-s43"
    assert (result.provenance.commit, result.provenance.migrated_from_schema) == ("a" * 40, 1)
    assert result.provenance.harness_sha256 is None  # not known for code that ran before hashes were recorded
    assert_same_numbers(original, result)
    assert result.fragmentation_mib == 999.5 and result.fragmentation_per_step_mib == [1000.0, 999.5]


def test_committed_schema_1_files_migrate_to_what_is_committed_now(v1_documents, tmp_path):
    for kind, path in V1_FILES.items():
        document = v1_documents[kind]
        assert document["schema_version"] == 1
        result = migrate_v1(copy.deepcopy(document), Path(path).parts[1])
        assert result.cell_id == Path(path).stem and result.grid == Path(path).parts[1]
        assert isinstance(result.spec, OpSpec if kind == "op" else TrainSpec)
        assert result.provenance.commit == document["env"]["git_commit"] and result.provenance.migrated_from_schema == 1
        assert_same_numbers(document, result)
        migrated = tmp_path / Path(path).name
        migrated.write_text(migrated_version(path))
        assert result == load_result(migrated)  # the committed schema-2 file is this migration, exactly
    op = migrate_v1(copy.deepcopy(v1_documents["op"]), "op")
    assert op.spec == OpSpec(stack="op-pylate", head="inbatch", batch_size=64, reps=50, device="cuda")
    assert len(op.step_times_sec) == 50 and op.step_peak_alloc_mib == v1_documents["op"]["step_peak_alloc_mib"]


def test_spec_fields_of_a_cpu_cell_say_cpu():
    document = v1_training_cell() | {"card": "native", "preset": "tiny", "allocator": "default"}
    document["env"] = document["env"] | {"device": "cpu"}
    assert spec_fields_v1(document)["device"] == "cpu"
    assert migrate_v1(document, "ours").spec.device == "cpu"


def test_a_schema_1_file_is_refused_with_the_hint_to_migrate(tmp_path, v1_documents):
    path = tmp_path / "op-pylate-inbatch-b64-vanilla-native.json"
    path.write_text(json.dumps(v1_documents["op"]))
    with pytest.raises(ResultError) as refused:
        load_result(path)
    assert str(refused.value) == f"{path}: schema 1, this harness reads 2; run `harness migrate` to rewrite it"


def test_migrate_rewrites_a_results_folder_in_place(tmp_path, capsys):
    root = tmp_path / "results"
    cell = v1_training_cell()
    good = root / "ceilings" / "pylate" / "grad-checkpoint" / "pylate-grad-checkpoint-b128-lik-rtx4090-24gb-expandable-s43.json"
    misnamed = root / "ceilings" / "pylate" / "grad-checkpoint" / "pylate-b128.json"
    broken = root / "ours" / "broken.json"
    for path, text in ((good, json.dumps(cell)), (misnamed, json.dumps(cell)), (broken, "{")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    before = good.read_text()
    assert main(["migrate", str(root), "--dry-run"]) == 1  # a problem: exit 1, nothing written
    out, err = capsys.readouterr()
    assert out == f"would rewrite 1 schema-1 results under {root}\n" and good.read_text() == before
    wrong_name = f"{misnamed}: its spec's id is 'pylate-grad-checkpoint-b128-lik-rtx4090-24gb-expandable-s43', not its file name"
    assert f"not migrated: {wrong_name}" in err
    assert f"not migrated: {broken}: cannot be read" in err
    rewritten, problems = migrate(root)
    assert rewritten == [good] and len(problems) == 2
    result = load_result(good)
    assert result.grid == "ceilings" and result.provenance.migrated_from_schema == 1
    assert_same_numbers(cell, result)
    assert good.stat().st_mode & 0o777 == 0o644
    assert migrate(root) == ([], problems)  # schema-2 files are left alone: migrating twice changes nothing
    assert load_result(good) == result


# --- the committed results ---------------------------------------------------------------------------------


def test_every_committed_result_is_schema_2_with_a_known_commit_or_marked_migrated():
    paths = result_paths(RESULTS)
    assert len(paths) > 200
    commits = set()
    for path in paths:
        assert json.loads(path.read_text())["schema_version"] == 2, path
        result = load_result(path)
        assert result.provenance is not None, path
        if result.provenance.migrated_from_schema is None:
            assert result.provenance.commit is not None and result.provenance.harness_sha256, path
            commits.add(result.provenance.commit)
        else:
            assert result.provenance.migrated_from_schema == 1, path
            if result.provenance.commit is not None:
                commits.add(result.provenance.commit)
    for commit in sorted(commits):  # every recorded commit is one of this project's
        assert git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0, f"commit {commit} is not in this repository"
