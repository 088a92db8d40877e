"""Which code produced a result: the checkout's commit and dirty flag, content hashes of the harness
and the notebook that ran, and the lock file the environment was created from.

A commit alone does not identify code: a run from a copied tree (no ``.git``) would record the
commit of whatever repository encloses it, and a dirty checkout runs code no commit holds. So the
commit is recorded only when the harness sits at the top of a git checkout, with a dirty flag, and
the sources themselves are hashed, which names the same code wherever it runs. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from harness.results import Provenance

ROOT = Path(__file__).resolve().parent.parent
ENVIRONMENT_STAMP = "maxsim-env.json"  # written into each environment by tools/envs.py


def _git(*args: str) -> str | None:
    try:
        completed = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() if completed.returncode == 0 else None


def checkout() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the project checkout the harness runs from; (None, None) outside one."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != ROOT:
        return None, None  # a copied tree inside another repository names no commit
    status = _git("status", "--porcelain", "--untracked-files=no")
    return _git("rev-parse", "HEAD"), None if status is None else bool(status)


def tree_sha256(folder: Path, suffixes: tuple[str, ...] = (".py", ".json", ".yaml", ".txt")) -> str:
    """A hash of every source file under ``folder`` (relative path and bytes, in path order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def environment_stamp(prefix: Path | None = None) -> dict[str, str]:
    """What ``tools/envs.py`` wrote into this environment: its name, lock file and the lock's hash."""
    stamp = Path(prefix or sys.prefix) / ENVIRONMENT_STAMP
    try:
        document = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return {}
    return {key: str(value) for key, value in document.items() if key in ("environment", "lock_file", "lock_sha256")}


def collect(notebook: Path | None = None, prefix: Path | None = None) -> Provenance:
    """The provenance of a cell run now from this checkout (``notebook``: the notebook that ran it;
    ``prefix``: the environment it ran in, by default this process's)."""
    commit, dirty = checkout()
    notebook_path = None if notebook is None else (notebook if notebook.is_absolute() else ROOT / notebook)
    stamp = environment_stamp(prefix)
    return Provenance(
        commit=commit,
        dirty=dirty,
        harness_sha256=tree_sha256(ROOT / "harness"),
        notebook_sha256=file_sha256(notebook_path) if notebook_path is not None and notebook_path.exists() else None,
        environment=stamp.get("environment"),
        lock_file=stamp.get("lock_file"),
        lock_sha256=stamp.get("lock_sha256"),
    )
