"""tools/ingest_device.py: what a device call packed comes into the checkout without losing a measured file."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import ingest_device  # noqa: E402


def pack(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_new_files_come_in_a_redrawn_probe_replaces_its_earlier_run_kept_beside_it_and_nothing_else_is_overwritten(tmp_path):
    root = tmp_path / "repo"
    folder, cells = root / "results/ceilings/colpali/plain", root / "book/cells/ceilings/colpali/plain"
    folder.mkdir(parents=True)
    cells.mkdir(parents=True)
    (folder / "b36.json").write_text('{"draw": "rows"}')
    (folder / "b36.log").write_text("rows log")
    (cells / "b36.ipynb").write_text("rows notebook")
    (folder / "b40.json").write_text('{"draw": "rows", "committed": true}')
    progress = root / "results/long-run/pylate/run.progress"
    progress.parent.mkdir(parents=True)
    progress.write_text(json.dumps({"steps_done": 70}))
    archive = pack(tmp_path / "results.tar.gz", {
        "device-results/ceilings/colpali/plain/b36.json": '{"draw": "stream"}',
        "device-results/ceilings/colpali/plain/b36.json.rows-draw": '{"draw": "rows"}',
        "device-results/ceilings/colpali/plain/b36.log": "stream log",
        "device-cells/ceilings/colpali/plain/b36.ipynb": "stream notebook",
        "device-results/ceilings/colpali/plain/b40.json": '{"draw": "rows", "other": true}',
        "device-results/ceilings/colpali/plain/b44.json": '{"new": true}',
        "device-results/ceilings/colpali/plain/b44.log": "new log",
        "device-results/ceilings/colpali/plain/b48.log": "a cell that left no result",
        "device-results/ceilings/colpali/plain/b48.running.ipynb": "still running",
        "device-results/long-run/pylate/run.progress": json.dumps({"steps_done": 190}),
    })  # fmt: skip
    planned = ingest_device.ingest(archive, root, dry_run=True, say=lambda line: None)
    assert (folder / "b36.json").read_text() == '{"draw": "rows"}' and not (folder / "b44.json").exists()  # dry run
    done = ingest_device.ingest(archive, root, say=lambda line: None)
    assert done == planned
    assert sorted(done["new"]) == ["results/ceilings/colpali/plain/b44.json", "results/ceilings/colpali/plain/b44.log"]
    assert sorted(done["redrawn"]) == ["book/cells/ceilings/colpali/plain/b36.ipynb", "results/ceilings/colpali/plain/b36.json",
                                       "results/ceilings/colpali/plain/b36.log"]  # fmt: skip
    assert (folder / "b36.json").read_text() == '{"draw": "stream"}'
    assert (folder / "b36.json.rows-draw").read_text() == '{"draw": "rows"}'
    assert (folder / "b36.log.rows-draw").read_text() == "rows log" and (folder / "b36.log").read_text() == "stream log"
    assert (cells / "b36.ipynb.rows-draw").read_text() == "rows notebook"
    assert (cells / "b36.ipynb").read_text() == "stream notebook"
    assert done["kept"] == ["results/ceilings/colpali/plain/b40.json"]  # another run of a committed probe: not overwritten
    assert (folder / "b40.json").read_text() == '{"draw": "rows", "committed": true}'
    assert done["skipped"] == ["results/ceilings/colpali/plain/b48.log"] and not (folder / "b48.running.ipynb").exists()
    assert done["progress"] == ["results/long-run/pylate/run.progress"] and json.loads(progress.read_text())["steps_done"] == 190
    # brought in twice, nothing changes
    again = ingest_device.ingest(archive, root, say=lambda line: None)
    assert not again["new"] and not again["redrawn"] and not again["progress"]
    assert not (folder / "b36.json.rows-draw-1").exists()


def test_an_earlier_run_set_aside_before_is_no_sign_of_a_re_run_now(tmp_path):
    """A set-aside of an earlier ingest comes back in every archive (the device seeds its results from the
    commit): it marks no re-run, so another run of a probe committed since (a crashed one run again, a log
    caught part way) is named and left as committed, never set aside as of the earlier draw."""
    root = tmp_path / "repo"
    folder = root / "results/ceilings/colpali/plain"
    folder.mkdir(parents=True)
    (folder / "b36.json").write_text('{"draw": "stream", "crashed": true}')
    (folder / "b36.json.rows-draw").write_text('{"draw": "rows"}')
    archive = pack(tmp_path / "results.tar.gz", {
        "device-results/ceilings/colpali/plain/b36.json": '{"draw": "stream", "ran again": true}',
        "device-results/ceilings/colpali/plain/b36.json.rows-draw": '{"draw": "rows"}',
    })  # fmt: skip
    done = ingest_device.ingest(archive, root, say=lambda line: None)
    assert done["kept"] == ["results/ceilings/colpali/plain/b36.json"] and not done["redrawn"]
    assert (folder / "b36.json").read_text() == '{"draw": "stream", "crashed": true}'
    assert sorted(path.name for path in folder.iterdir()) == ["b36.json", "b36.json.rows-draw"]


def test_ingest_refuses_a_checkout_whose_notebooks_are_moved_aside(tmp_path, capsys):
    """book/cells moved aside for a device call's size limit: a re-run probe's notebook would come in as new beside
    no earlier run to set aside, so the tool stops with its reason and changes nothing."""
    root = tmp_path / "repo"
    (root / "results/ceilings").mkdir(parents=True)
    archive = pack(tmp_path / "results.tar.gz", {"device-results/ceilings/b36.json": "{}"})
    assert ingest_device.main([str(archive), "--root", str(root)]) == 2
    assert capsys.readouterr().err.strip() == f"ingest_device: book/cells is missing under {root}: put it back first"
    assert not (root / "results/ceilings/b36.json").exists()
