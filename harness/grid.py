"""Grid files: YAML in ``grids/`` whose entries expand into cell specs (or ceiling searches).

A grid has a ``name``, ``defaults`` for every entry and a list of entries (``cells``, or
``searches`` for a ceiling grid). An entry's list-valued spec fields expand as a product; each
combination becomes one :class:`harness.spec.TrainSpec` or :class:`harness.spec.OpSpec` (the
stack's kind decides). Besides spec fields an entry may name the Jupyter ``kernel`` to run in and the
``notebook`` to run (launcher settings, not part of what the cell is). Every problem of a grid is named before any cell
starts. Torch-free: the report reads the grids too.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from harness.spec import STACKS, CellSpec, SpecError, choose, make_spec

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
GRIDS_DIR = ROOT / "grids"
# a grid entry's fields that may list values, expanded as a product
EXPANDABLE = ("batch_size", "variant", "regime", "head", "score_mini_batch_size", "negatives", "card", "allocator", "seed",
              "world_size")
LAUNCH_FIELDS = ("kernel", "notebook")


class GridError(ValueError):
    """A grid that cannot run; raised before any cell starts."""


@dataclasses.dataclass(frozen=True)
class GridCell:
    """One cell of a grid: its spec, the grid it belongs to, and how to launch it."""

    grid: str
    spec: CellSpec
    kernel: str | None = None  # default: the stack environment's kernel
    notebook: str | None = None  # default: the stack's notebook (tests run variants of it)

    @property
    def cell_id(self) -> str:
        return self.spec.cell_id


def read_grid(path: str | os.PathLike[str], key: str) -> tuple[str, dict[str, Any], list[Any]]:
    """A grid file's (name, defaults, entries under ``key``); :class:`GridError` if it cannot be read."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise GridError(f"cannot read grid {path}: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get(key), list):
        raise GridError(f"grid {path} needs a `{key}` list (and optional `name`, `defaults`).")
    return document.get("name", path.stem), document.get("defaults") or {}, document[key]


def grid_names(folder: Path = GRIDS_DIR) -> dict[str, Path]:
    """Every grid of ``folder`` by its name (a grid's ``name``, else its file's stem)."""
    names = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        names[document.get("name", path.stem) if isinstance(document, dict) else path.stem] = path
    return names


def expand(fields: Mapping[str, Any], expandable: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Every combination of ``fields``' list-valued ``expandable`` keys, one dict each (a product)."""
    lists = {key: value for key, value in fields.items() if key in expandable and isinstance(value, list)}
    for combination in itertools.product(*lists.values()):
        yield {**fields, **dict(zip(lists, combination, strict=True))}


def repeats(ids: Sequence[str]) -> list[str]:
    return sorted({i for i in ids if ids.count(i) > 1})


def build_grid(path: str | os.PathLike[str], key: str, expandable: Sequence[str], build: Callable[[str, dict[str, Any]], T],
               identify: Callable[[T], str], keep: Callable[[dict[str, Any]], bool] = lambda fields: True,
               title: str = "grid") -> list[T]:  # fmt: skip
    """The items of a grid file: each entry under ``key`` (over the file's ``defaults``, those ``keep``
    accepts) expanded over its list-valued ``expandable`` keys, one ``build(grid_name, fields)`` per
    combination. Raises :class:`GridError` naming every combination refused and every repeated id."""
    name, defaults, entries = read_grid(path, key)
    items, problems = [], []
    for index, entry in enumerate(entries):
        if entry is not None and not isinstance(entry, dict):
            problems.append(f"{key}[{index}]: an entry must be a mapping of fields, got {entry!r}")
            continue
        merged = {**defaults, **(entry or {})}
        if not keep(merged):
            continue
        for fields in expand(merged, expandable):
            try:
                items.append(build(name, fields))
            except (SpecError, ValueError, TypeError) as error:
                described = " ".join(f"{k}={v}" for k, v in fields.items() if k not in defaults or k == "stack")
                problems.append(f"{key}[{index}] ({described}): {error}")
    repeated = repeats([identify(item) for item in items])
    if repeated:
        problems.append(f"{key} repeat: {', '.join(repeated)}")
    if problems:
        raise GridError(f"{title} {path} is invalid:\n  " + "\n  ".join(problems))
    return items


def grid_cell(grid: str, fields: Mapping[str, Any]) -> GridCell:
    """One expanded grid entry as a cell: the spec fields, and the launcher's."""
    launch = {key: fields[key] for key in LAUNCH_FIELDS if key in fields}
    return GridCell(grid, make_spec({k: v for k, v in fields.items() if k not in LAUNCH_FIELDS}), **launch)


def load_grid(path: str | os.PathLike[str], stacks: Sequence[str] | None = None) -> list[GridCell]:
    """Expand and validate a grid file (only ``stacks``' cells, if given); raise :class:`GridError`
    naming every problem."""
    for name in stacks or ():
        choose("stack", name, STACKS)  # an unknown stack raises, with the closest name
    return build_grid(path, "cells", EXPANDABLE, grid_cell, lambda cell: cell.cell_id,
                      keep=lambda fields: not stacks or fields.get("stack") in stacks)  # fmt: skip
