"""Rewrite results of an older schema as the current one, keeping every measured number.

Schema 1 carried a cell's identity as loose fields and its grid only in its file path; schema 2
embeds the spec, the cell id, the grid and the provenance. Migration is the one place a grid is
read from a path — once, when the file is rewritten; from then on the file says it. The original
``git_commit`` moves to ``provenance.commit`` with ``migrated_from_schema = 1``. Each file is
checked before it is written: its spec's cell id must be its file name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.results import SCHEMA_VERSION, CellResult, Provenance, result_paths, write_result
from harness.spec import STACKS, make_spec


class MigrationError(ValueError):
    """A schema-1 file that cannot be rewritten faithfully."""


def spec_fields_v1(document: dict[str, Any]) -> dict[str, Any]:
    """The schema-2 spec fields of a schema-1 result."""
    env = document.get("env") or {}
    device = "cpu" if str(env.get("device", "cuda")).startswith("cpu") else "cuda"
    if STACKS[document["stack"]].kind == "op":
        return {
            "stack": document["stack"], "head": document["regime"], "batch_size": document["batch_size"],
            "variant": document["variant"], "negatives": document.get("negatives"), "reps": document["steps"],
            "seed": document["seed"], "device": device,
        }  # fmt: skip
    return {
        "stack": document["stack"], "regime": document["regime"], "batch_size": document["batch_size"],
        "variant": document["variant"], "score_mini_batch_size": document.get("score_mini_batch_size"),
        "card": document["card"], "allocator": document.get("allocator", "default"), "steps": document["steps"],
        "seed": document["seed"], "preset": document.get("preset") or "full", "device": device,
    }  # fmt: skip


IDENTITY_V1 = ("stack", "regime", "batch_size", "variant", "score_mini_batch_size", "negatives", "card", "allocator",
               "steps", "seed", "preset", "schema_version")  # fmt: skip


def migrate_v1(document: dict[str, Any], grid: str) -> CellResult:
    spec = make_spec(spec_fields_v1(document))
    body = {key: value for key, value in document.items() if key not in IDENTITY_V1}
    env = body.get("env")
    commit = None
    if env is not None:
        body["env"] = env = dict(env)  # a copy: the caller's document keeps its git_commit
        commit = env.pop("git_commit", None)
    return CellResult.model_validate(
        body | {"grid": grid, "cell_id": spec.cell_id, "spec": spec,
                "provenance": Provenance(commit=commit, migrated_from_schema=1)}  # fmt: skip
    )


def migrate(root: Path, dry_run: bool = False) -> tuple[list[Path], list[str]]:
    """Rewrite every schema-1 result under ``root`` (the results folder: grid = first folder below it)."""
    rewritten, problems = [], []
    for path in result_paths(root):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            problems.append(f"{path}: cannot be read ({error})")
            continue
        if not isinstance(document, dict) or document.get("schema_version") != 1:
            continue
        grid = path.relative_to(root).parts[0]
        try:
            result = migrate_v1(document, grid)
        except ValueError as error:
            problems.append(f"{path}: {str(error).splitlines()[0]}")
            continue
        if result.cell_id != path.stem:
            problems.append(f"{path}: its spec's id is {result.cell_id!r}, not its file name")
            continue
        if not dry_run:
            write_result(result, path)
        rewritten.append(path)
    return rewritten, problems


assert SCHEMA_VERSION == 2, "migrate.py rewrites schema 1 as schema 2; teach it the new schema"
