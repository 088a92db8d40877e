"""Provenance: the checkout's commit and dirty flag, only where the harness is the top of a git checkout;
content hashes that name the same code wherever it runs; the environment stamp tools/envs.py writes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import provenance

ROOT = Path(__file__).resolve().parent.parent


def git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True).stdout.strip()


def fresh_repository(folder):
    """A new git repository with one commit (so a naive lookup would find a commit to name)."""
    folder.mkdir(parents=True, exist_ok=True)
    git(folder, "init", "-q")
    (folder / "README").write_text("another project\n")
    git(folder, "add", "README")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "first")
    return git(folder, "rev-parse", "HEAD")


def copy_harness(target):
    shutil.copytree(ROOT / "harness", target / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    return target


def provenance_from(tree, notebook=None):
    """``provenance.collect()`` run by the harness copied into ``tree`` (in a process of its own)."""
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "import harness, harness.provenance as p\n"
        "assert Path(harness.__file__).resolve().parent == Path.cwd().resolve() / 'harness', harness.__file__\n"
        "notebook = Path(sys.argv[1]) if len(sys.argv) > 1 else None\n"
        "print(p.collect(notebook).model_dump_json())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GIT_DIR", "GIT_WORK_TREE")}
    completed = subprocess.run([sys.executable, "-c", script, *([str(notebook)] if notebook else [])], cwd=tree, env=env,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout)


def test_this_checkout_records_its_commit_and_whether_it_is_dirty():
    commit, dirty = provenance.checkout()
    assert commit == git(ROOT, "rev-parse", "HEAD") and len(commit) == 40
    assert dirty == bool(git(ROOT, "status", "--porcelain", "--untracked-files=no"))
    recorded = provenance.collect()
    assert (recorded.commit, recorded.dirty, recorded.migrated_from_schema) == (commit, dirty, None)
    assert recorded.harness_sha256 == provenance.tree_sha256(ROOT / "harness")
    assert recorded.notebook_sha256 is None


def test_the_notebook_that_ran_is_hashed_by_its_content(tmp_path):
    recorded = provenance.collect(Path("notebooks/pylate.ipynb"))  # relative to the checkout
    assert recorded.notebook_sha256 == provenance.file_sha256(ROOT / "notebooks" / "pylate.ipynb")
    copy = tmp_path / "elsewhere.ipynb"
    shutil.copy(ROOT / "notebooks" / "pylate.ipynb", copy)
    assert provenance.collect(copy).notebook_sha256 == recorded.notebook_sha256  # same content, same hash
    assert provenance.collect(tmp_path / "missing.ipynb").notebook_sha256 is None


def test_a_copied_harness_inside_another_repository_names_no_commit_but_the_same_code(tmp_path):
    outer = tmp_path / "other-project"
    fresh_repository(outer)
    tree = copy_harness(outer / "vendored")
    expected = provenance.tree_sha256(ROOT / "harness")
    recorded = provenance_from(tree)
    assert (recorded["commit"], recorded["dirty"]) == (None, None)  # not the enclosing repository's commit
    assert recorded["harness_sha256"] == expected == provenance.tree_sha256(tree / "harness")
    # outside any repository too
    loose = copy_harness(tmp_path / "loose")
    assert provenance_from(loose)["commit"] is None and provenance_from(loose)["harness_sha256"] == expected


def test_a_copy_that_is_its_own_checkout_names_its_commit_and_dirty_flag(tmp_path):
    tree = copy_harness(tmp_path / "checkout")
    fresh_repository(tree)
    git(tree, "add", "harness")
    git(tree, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "harness")
    recorded = provenance_from(tree)
    assert (recorded["commit"], recorded["dirty"]) == (git(tree, "rev-parse", "HEAD"), False)
    (tree / "untracked.txt").write_text("not part of any commit\n")
    assert provenance_from(tree)["dirty"] is False  # untracked files change no code that ran
    with (tree / "harness" / "__init__.py").open("a") as handle:
        handle.write("# edited\n")
    recorded = provenance_from(tree)
    assert recorded["dirty"] is True
    assert recorded["harness_sha256"] != provenance.tree_sha256(ROOT / "harness")  # the edit is in the hash


def test_the_hash_covers_sources_and_shipped_configs_not_caches(tmp_path):
    tree = copy_harness(tmp_path)
    before = provenance.tree_sha256(tree / "harness")
    (tree / "harness" / "__pycache__").mkdir(exist_ok=True)
    (tree / "harness" / "__pycache__" / "cell.cpython-311.pyc").write_bytes(b"\0")
    (tree / "harness" / "notes.md").write_text("not code")
    assert provenance.tree_sha256(tree / "harness") == before
    config = next((tree / "harness" / "stacks" / "configs").rglob("*.json"))
    config.write_text(config.read_text() + " ")
    assert provenance.tree_sha256(tree / "harness") != before
    # a renamed file is another tree, even with the same bytes
    config.write_text(config.read_text()[:-1])
    assert provenance.tree_sha256(tree / "harness") == before
    config.rename(config.with_name("renamed.json"))
    assert provenance.tree_sha256(tree / "harness") != before


def test_the_environment_stamp_is_read(tmp_path):
    stamp = {"environment": "pylate", "lock_file": "envs/pylate/constraints.txt", "lock_sha256": "ab" * 32, "created": "x"}
    (tmp_path / provenance.ENVIRONMENT_STAMP).write_text(json.dumps(stamp))
    assert provenance.environment_stamp(tmp_path) == {k: v for k, v in stamp.items() if k != "created"}
    (tmp_path / provenance.ENVIRONMENT_STAMP).write_text("{not json")
    assert provenance.environment_stamp(tmp_path) == {}
    assert provenance.environment_stamp(tmp_path / "nowhere") == {}
    # this environment's own stamp goes into every result it makes
    own = provenance.environment_stamp()
    recorded = provenance.collect()
    assert (recorded.environment, recorded.lock_file, recorded.lock_sha256) == (
        own.get("environment"), own.get("lock_file"), own.get("lock_sha256"))  # fmt: skip


def test_an_environment_made_by_tools_envs_carries_its_stamp():
    stamp = Path(sys.prefix) / provenance.ENVIRONMENT_STAMP
    if not stamp.exists():
        pytest.skip(f"{sys.prefix} was not made by tools/envs.py")
    own = provenance.environment_stamp()
    assert own["environment"] == Path(sys.prefix).name and (ROOT / own["lock_file"]).exists()
    assert len(own["lock_sha256"]) == 64
