"""Bring what a device call packed (``$OUT/results.tar.gz`` of ``tools/device_queue.sh pack``) into this checkout.

    .venvs/pylate/bin/python tools/ingest_device.py /work/.device/N/results.tar.gz [--root .] [--dry-run]

The archive holds ``device-results/`` (results, logs, progress records) and ``device-cells/`` (executed
notebooks), seeded on the device from the committed results. Each file goes to ``results/`` or
``book/cells/`` by the same relative path:

- a file not here yet is copied (a new probe, cell or progress record);
- a file equal to the committed one is left alone;
- a probe the ceiling search ran again on the current draw of the data — the device set its earlier run aside
  as ``<name>.json.<draw>-draw`` — replaces the committed result, whose run (result, notebook and log) is kept
  beside it under the same suffix, as the search did on the device;
- a progress record replaces the committed one only where it has trained more steps;
- anything else that differs is left as committed and named, as are the papermill notebooks of cells still
  running (``*.running.ipynb``) and logs of cells that left no result (a progress record at most), which are skipped.

It prints one line per file it changes, and what to run next.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from harness.orchestrate.launcher import set_aside

ROOT = Path(__file__).resolve().parent.parent
TREES = {"device-results": Path("results"), "device-cells": Path("book/cells")}
SET_ASIDE = re.compile(r"\.(?P<draw>[a-z]+)-draw$")  # harness.orchestrate.ceiling: '<name>.json.rows-draw'


def _steps_done(path: Path) -> int:
    try:
        return int(json.loads(path.read_text()).get("steps_done", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def ingest(archive: Path, root: Path, dry_run: bool = False, say: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Bring ``archive`` into ``root``; returns what happened to each file, by kind."""
    done: dict[str, list[str]] = {"new": [], "redrawn": [], "progress": [], "kept": [], "skipped": []}
    with tempfile.TemporaryDirectory() as temporary:
        unpacked = Path(temporary)
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        # the results the ceiling search ran again on the current draw, '<name>.json' → the earlier draw: the
        # device set the earlier run aside, and it is the one committed here (an older set-aside, seeded from
        # the commit and packed again, or one whose committed twin has moved on since, is not)
        redrawn: dict[Path, str] = {}
        for aside in (unpacked / "device-results").rglob("*.json.*-draw*"):
            match = SET_ASIDE.search(re.sub(r"-\d+$", "", aside.name))
            if not match:
                continue
            result = aside.with_name(aside.name[: match.start()])
            relative = TREES["device-results"] / result.relative_to(unpacked / "device-results")
            committed = root / relative
            if committed.is_file() and committed.read_bytes() == aside.read_bytes():
                redrawn[relative] = match["draw"]
        for tree, target_tree in TREES.items():
            source_root = unpacked / tree
            for source in sorted(path for path in source_root.rglob("*") if path.is_file()):
                relative = source.relative_to(source_root)
                target = root / target_tree / relative
                name = str(target_tree / relative)
                if SET_ASIDE.search(re.sub(r"-\d+$", "", source.name)) or source.name.endswith(".running.ipynb"):
                    continue  # an earlier run set aside (its committed twin moves below), or a cell still running
                if source.suffix == ".log" and not source.with_suffix(".json").exists():
                    done["skipped"].append(name)
                    continue
                if target.exists() and target.read_bytes() == source.read_bytes():
                    continue
                result_twin = (target_tree / relative).with_suffix(".json")
                if tree == "device-cells":  # a notebook follows its cell's result
                    result_twin = Path("results") / relative.with_suffix(".json")
                draw = redrawn.get(result_twin)
                if target.exists() and draw is not None:
                    if not dry_run:
                        set_aside(target, f"{draw}-draw")  # as the search did on the device
                    done["redrawn"].append(name)
                elif target.exists() and source.suffix == ".progress":
                    if _steps_done(source) <= _steps_done(target):
                        done["kept"].append(name)
                        continue
                    done["progress"].append(name)
                elif target.exists():
                    done["kept"].append(name)
                    continue
                else:
                    done["new"].append(name)
                if not dry_run:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target)
    for kind, words in (("new", "new"), ("redrawn", "ran again on the current draw (the earlier run kept beside it)"),
                        ("progress", "progress record that trained more steps"),
                        ("kept", "differs from the committed file; left as committed"),
                        ("skipped", "log of a cell that left no result; skipped")):  # fmt: skip
        for name in done[kind]:
            say(f"{words}: {name}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    args = parser.parse_args(argv)
    if not args.archive.is_file():
        print(f"ingest_device: {args.archive} is not a file", file=sys.stderr)
        return 2
    missing = [str(tree) for tree in TREES.values() if not (args.root / tree).is_dir()]
    if missing:  # (moved aside for a device call's size limit?) a notebook re-run would be copied as new, not set aside
        verb, them = ("is", "it") if len(missing) == 1 else ("are", "them")
        print(f"ingest_device: {' and '.join(missing)} {verb} missing under {args.root}: put {them} back first", file=sys.stderr)
        return 2
    done = ingest(args.archive, args.root, args.dry_run)
    if any(done[kind] for kind in ("new", "redrawn", "progress")) and not args.dry_run:
        print("next: harness cellbook refresh; harness predict --validate; harness ceiling grids/ceilings.yaml --dry-run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
