#!/usr/bin/env python3
"""Write the top-level ``_config.yml`` and ``_toc.yml`` from the book's own (``book/``).

The book is ``book/``: ``jupyter-book build book`` builds it from ``book/_config.yml`` and
``book/_toc.yml``, the one hand-kept page list. The design's top-level files describe the same
book for ``jupyter-book build .`` run from the repository root: they are generated here (paths
prefixed with ``book/``, the repository's other folders excluded), never edited, and a test checks
they match. Standard library plus PyYAML (the report's environment has it).

    python tools/book_config.py          # write them
    python tools/book_config.py --check  # exit 1 if they are stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
HEADER = "# Generated from book/{name} by tools/book_config.py: edit that file, then run this tool.\n"
ROOT_EXCLUDES = [
    ".*", ".venvs/*", "_build/*", "book/_build/*", "book/data/*", "book/_static/*", "envs/*", "harness/*", "notebooks/*",
    "results/*", "runs/*", "tests/*", "tools/*", "wheelhouse/*", "device-results/*", "device-cells/*", "README.md",
    "CHANGELOG.md",
]  # fmt: skip


def prefixed(entry: Any) -> Any:
    """A toc entry with every ``file``/``glob``/``root`` path under ``book/``."""
    if isinstance(entry, list):
        return [prefixed(item) for item in entry]
    if not isinstance(entry, dict):
        return entry
    return {key: f"book/{value}" if key in ("file", "glob", "root") else prefixed(value) for key, value in entry.items()}


def root_toc() -> str:
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text())
    return HEADER.format(name="_toc.yml") + yaml.safe_dump(prefixed(toc), sort_keys=False, allow_unicode=True)


def root_config() -> str:
    config = yaml.safe_load((BOOK / "_config.yml").read_text())
    config["exclude_patterns"] = ROOT_EXCLUDES
    sphinx = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx["html_static_path"] = ["book/_static"]  # book/_static is found by itself only when book/ is the root
    return HEADER.format(name="_config.yml") + yaml.safe_dump(config, sort_keys=False, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the top-level files are stale; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, text in (("_toc.yml", root_toc()), ("_config.yml", root_config())):
        path = ROOT / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python tools/book_config.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
