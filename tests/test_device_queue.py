"""tools/device_queue.sh's `pack` on a leased machine: it never waits on a queue that is not there (a
machine given back between two calls comes back bare), and packs what a queue finished."""

from __future__ import annotations

import re
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "device_queue.sh"


def pack(where: Path, seconds: int) -> subprocess.CompletedProcess[str]:
    out = where / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), "pack", str(seconds)], cwd=where, env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def queue_ran(where: Path, marker: str | None, log: str) -> None:
    """A machine's device-log/ as a started queue leaves it: its pid (1: alive), ``marker`` (queue.done or
    queue.failed, None while it runs) and its log."""
    folder = where / "device-log"
    folder.mkdir()
    (folder / "queue.pid").write_text("1\n")
    if marker is not None:
        (folder / marker).touch()
    (folder / "queue.log").write_text(log)


def test_pack_on_a_bare_machine_says_so_at_once(tmp_path):
    began = time.perf_counter()
    run = pack(tmp_path, 30)
    assert run.returncode == 1 and "no queue was started on this machine" in run.stdout
    assert time.perf_counter() - began < 10  # not the 30 seconds it was asked to wait
    assert not (tmp_path / "out" / "results.tar.gz").exists()


def test_pack_packs_what_a_finished_queue_wrote(tmp_path):
    queue_ran(tmp_path, "queue.done", "== queue done\n")
    result = tmp_path / "device-results" / "ceilings" / "pylate" / "plain" / "cell.json"
    result.parent.mkdir(parents=True)
    result.write_text("{}\n")
    run = pack(tmp_path, 30)
    assert run.returncode == 0 and "QUEUE DONE" in run.stdout
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as packed:
        assert "device-results/ceilings/pylate/plain/cell.json" in packed.getnames()
    assert (tmp_path / "out" / "queue.log").read_text() == "== queue done\n"  # the queue's log comes back beside it


def test_a_pack_killed_at_its_calls_limit_still_leaves_what_finished(tmp_path):
    """A device call whose budget is shorter than the wait it was asked is killed (SIGTERM) before the
    end of its wait: what finished so far must still be packed under $OUT, never lost with the machine."""
    queue_ran(tmp_path, None, "== harness sweep grids/long-run.yaml\n")  # a queue still running
    result = tmp_path / "device-results" / "long-run" / "colpali" / "plain" / "cell.progress"
    result.parent.mkdir(parents=True)
    result.write_text("{}\n")
    out = tmp_path / "out"
    out.mkdir()
    waiting = subprocess.Popen(["bash", str(SCRIPT), "pack", "300"], cwd=tmp_path, env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(2)
    assert not (out / "results.tar.gz").exists()  # still waiting: the first periodic pack is a minute away
    waiting.terminate()
    assert waiting.wait(timeout=30) == 124
    with tarfile.open(out / "results.tar.gz") as packed:
        assert "device-results/long-run/colpali/plain/cell.progress" in packed.getnames()
    assert (out / "queue.log").exists()


def test_a_fresh_machine_is_seeded_with_the_committed_results_its_jobs_resume_from(tmp_path):
    """`start` (through `seed`) copies the committed results of the grids whose jobs resume from them
    into device-results/, once: what a warm machine measured since is never overwritten."""
    for grid in ("ceilings", "cross-card-check", "long-run", "gradcache", "published"):
        committed = tmp_path / "results" / grid / "pylate" / "plain" / "cell.json"
        committed.parent.mkdir(parents=True)
        committed.write_text(f'{{"grid": "{grid}"}}\n')
    (tmp_path / "device-results").mkdir()
    run = subprocess.run(["bash", str(SCRIPT), "seed"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    device = tmp_path / "device-results"
    seeded = sorted(path.relative_to(device).parts[0] for path in device.rglob("*.json"))
    assert seeded == ["ceilings", "cross-card-check", "gradcache", "long-run"]  # not the published grid: no job resumes from it
    measured = tmp_path / "device-results" / "ceilings" / "pylate" / "plain" / "new.json"
    measured.write_text("{}\n")
    (tmp_path / "results" / "ceilings" / "pylate" / "plain" / "new.json").write_text('{"stale": true}\n')
    subprocess.run(["bash", str(SCRIPT), "seed"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, check=True, timeout=60)
    assert measured.read_text() == "{}\n"


def test_start_refuses_a_checkout_without_the_wheelhouse_before_anything_runs(tmp_path):
    """The environments install offline from ./wheelhouse, which git ignores: a device call that did not carry
    it once built nothing and waited out its lease. `start` now says so in one line and starts no queue."""
    queue = tmp_path / "queue.txt"
    queue.write_text("sweep grids/op.yaml\n")
    run = subprocess.run(["bash", str(SCRIPT), "start", str(queue)], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and run.stdout.startswith("no wheels under ./wheelhouse") and len(run.stdout.splitlines()) == 1
    assert not (tmp_path / "device-log" / "queue.pid").exists()


def test_pack_stops_waiting_on_a_queue_whose_environments_failed(tmp_path):
    queue_ran(tmp_path, "queue.failed", "== environments failed: the queue stops\n")
    began = time.perf_counter()
    run = pack(tmp_path, 30)
    assert run.returncode == 1 and "QUEUE FAILED" in run.stdout
    assert time.perf_counter() - began < 10  # not the 30 seconds it was asked to wait
    assert (tmp_path / "out" / "queue.log").exists()


def test_a_seeded_device_reaches_the_cross_card_verdict_the_committed_results_reach(tmp_path):
    """What `harness ceiling` decides on a fresh device must be what the committed results decide: a device's
    results directory is seeded (``seed``) with the grids its jobs resume from only, and the search reads how a
    GPU repeats itself from the committed results beside it. (On 2026-12-07 it read no repeats there, fell back
    to equality to the byte, and stopped every capped search on the H100 the committed results vouch for.)"""
    import shutil

    import pytest

    from harness.search import CROSS_CARD_GRID, vouched_devices

    results = ROOT / "results"
    if not (results / "cross-card-check").is_dir():
        pytest.skip("no cross-card check is committed: nothing to compare")
    checkout = tmp_path / "checkout"
    shutil.copytree(results, checkout / "results")  # a checkout's committed results, as a device call carries them
    subprocess.run(["bash", str(SCRIPT), "seed"], cwd=checkout, env={"PATH": "/usr/bin:/bin"}, check=True, timeout=120)
    device = checkout / "device-results"
    assert (device / "cross-card-check").is_dir() and not (device / "published").exists()
    committed = vouched_devices(results, CROSS_CARD_GRID)
    assert vouched_devices(device, CROSS_CARD_GRID, repeats_dir=results) == committed


def checkout_with_fakes(where: Path) -> Path:
    """A checkout as `start` needs it, with its environments marked made and a harness that only logs the jobs it
    is given (to where/jobs.log): what the queue runs, not what a GPU measures."""
    (where / "wheelhouse").mkdir()
    (where / "wheelhouse" / "torch-0-py3-none-any.whl").touch()
    for env in ("pylate", "colpali"):
        (where / ".venvs" / env / "bin").mkdir(parents=True)
        (where / ".venvs" / env / ".device-ready").touch()
    harness = where / ".venvs" / "pylate" / "bin" / "harness"
    harness.write_text(f'#!/bin/sh\necho "$@" >> {where / "jobs.log"}\n')
    harness.chmod(0o755)
    (where / "tools").mkdir()
    return where / "jobs.log"


def run_queue_to_its_end(where: Path, queue: str, deadline: int | None) -> str:
    (where / "queue.txt").write_text(queue)
    env = {"PATH": "/usr/bin:/bin"} | ({} if deadline is None else {"DEADLINE": str(deadline)})
    started = subprocess.run(["bash", str(SCRIPT), "start", "queue.txt"], cwd=where, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    for _ in range(200):
        if (where / "device-log" / "queue.done").exists():
            break
        time.sleep(0.1)
    return (where / "device-log" / "queue.log").read_text()


QUEUE = "needs 20 sweep grids/long-run.yaml --match long\nceiling grids/ceilings.yaml --match short\n"


def test_a_job_that_needs_more_minutes_than_are_left_is_skipped_and_the_queue_goes_on(tmp_path):
    """A long run begun too late is cut by the budget and runs again from step 0 in a later lease, so it is
    worth nothing: with 10 minutes left, the job that needs 20 is skipped, said in the log, and the next runs."""
    jobs = checkout_with_fakes(tmp_path)
    log = run_queue_to_its_end(tmp_path, QUEUE, deadline=int(time.time()) + 600)
    assert jobs.read_text().splitlines() == [
        "ceiling grids/ceilings.yaml --results-dir device-results --notebooks-dir device-cells --match short"]
    assert re.search(r"skipped \(needs 20 min, (9|10) min left\): sweep grids/long-run.yaml --match long\n", log)


def test_a_job_that_needs_minutes_runs_where_they_are_left_or_no_deadline_was_given(tmp_path):
    for deadline, where in ((int(time.time()) + 1500, tmp_path / "in-time"), (None, tmp_path / "no-deadline")):
        where.mkdir()
        jobs = checkout_with_fakes(where)
        run_queue_to_its_end(where, QUEUE, deadline)
        assert [line.split()[1] for line in jobs.read_text().splitlines()] == ["grids/long-run.yaml", "grids/ceilings.yaml"]


def test_pack_never_waits_past_the_deadline(tmp_path):
    """Asked to wait 300 s with 45 s of device time left, `pack` waits 5 and packs, so the call ends, and brings its
    files back, before the budget does."""
    queue_ran(tmp_path, None, "== harness sweep grids/long-run.yaml\n")  # still running
    (tmp_path / "device-log" / "deadline").write_text(f"{int(time.time()) + 45}\n")
    began = time.perf_counter()
    run = pack(tmp_path, 300)
    assert run.returncode == 0 and "queue still running" in run.stdout
    assert run.stdout.startswith("waiting 5 s: device time ends in 45 s") or run.stdout.startswith("waiting 4 s")
    assert time.perf_counter() - began < 20
    assert (tmp_path / "out" / "results.tar.gz").exists()


def test_start_refuses_a_deadline_that_is_not_a_time(tmp_path):
    checkout_with_fakes(tmp_path)
    (tmp_path / "queue.txt").write_text(QUEUE)
    env = {"PATH": "/usr/bin:/bin", "DEADLINE": "in 20 min"}
    run = subprocess.run(["bash", str(SCRIPT), "start", "queue.txt"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and run.stdout == "DEADLINE must be whole seconds since the epoch, not 'in 20 min'\n"
    assert not any((tmp_path / "device-log" / name).exists() for name in ("queue.pid", "deadline"))
