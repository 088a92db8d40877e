"""The top-level _config.yml and _toc.yml are generated from the book's own: one hand-kept page list."""

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_the_top_level_book_files_are_the_book_s_own_under_book():
    checked = subprocess.run([sys.executable, "tools/book_config.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    root, book = (yaml.safe_load((folder / "_toc.yml").read_text()) for folder in (ROOT, ROOT / "book"))
    assert root["root"] == f"book/{book['root']}"
    assert [chapter["file"] for chapter in root["chapters"]] == [f"book/{chapter['file']}" for chapter in book["chapters"]]
    # every page the toc names exists, so both builds find the same pages
    for chapter in book["chapters"]:
        assert (ROOT / "book" / f"{chapter['file']}.md").exists()
