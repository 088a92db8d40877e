"""Ceiling searches: the bracket-and-bisect walk (:mod:`harness.search`), resuming from the probes'
results — found by the spec each result embeds —, the grid, the report's reading of them, and a
real probe through papermill (pylate environment, CPU) run by :mod:`harness.orchestrate.ceiling`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from harness import cli
from harness.grid import GridCell, GridError
from harness.orchestrate import ceiling as orchestrate
from harness.orchestrate import pool
from harness.orchestrate.launcher import CellRun, Layout
from harness.report import data, decision, plots, prose, tables, text
from harness.results import CellResult, load_result, write_result
from harness.search import Ceiling, CeilingSearch, ProbeMismatch, Probes, describe, load_searches, plan_search, search_state
from harness.search import walk as walk_search
from harness.spec import with_fields
from test_results import on_draw, on_gpu

pytestmark = [pytest.mark.pylate, pytest.mark.usefixtures("own_gates")]
ROOT = Path(__file__).resolve().parent.parent



@pytest.fixture
def layout(tmp_path) -> Layout:
    return Layout(tmp_path / "results", tmp_path / "cells")


def search(**fields) -> CeilingSearch:
    base = {"stack": "pylate", "regime": "grad-checkpoint", "variant": "vanilla", "card": "h100-80gb",
            "seeds": [42, 43], "start": 256, "limit": 8192, "resolution": 32}  # fmt: skip
    return CeilingSearch(**base | fields)


def walk(s: CeilingSearch, true_ceiling: int) -> tuple[Ceiling, list[int]]:
    asked: list[int] = []

    def decide(batch: int) -> bool:
        asked.append(batch)
        return batch <= true_ceiling

    return walk_search(s, decide), asked


def grid_file(path: Path, *searches: CeilingSearch) -> Path:
    """A ceiling grid of ``searches`` (grid ``ceilings``, where their probes' results are)."""
    entries = [s.model_dump(mode="json", exclude={"grid"}) for s in searches]
    path.write_text(yaml.safe_dump({"name": "ceilings", "searches": entries}))
    return path


def test_the_search_doubles_then_bisects_to_its_resolution():
    result, asked = walk(search(), 700)
    assert asked == [256, 512, 1024, 768, 640, 704, 672]
    assert (result.fits, result.fails, result.done) == (672, 704, True)


def test_a_start_that_fails_halves_down_and_a_search_can_end_at_either_bound():
    result, asked = walk(search(start=1024), 300)
    assert asked == [1024, 512, 256, 384, 320, 288]
    assert (result.fits, result.fails) == (288, 320)
    top, asked = walk(search(limit=1024), 10**6)
    assert (top.fits, top.fails, asked) == (1024, None, [256, 512, 1024])
    bottom, asked = walk(search(start=64), 0)
    assert (bottom.fits, bottom.fails, asked) == (None, 32, [64, 32])


def test_a_step_gallops_from_a_good_start_and_brackets_in_two_probes():
    result, asked = walk(search(start=640, step=64), 700)
    assert asked == [640, 704, 672]  # one step up fails: one bisection to the resolution
    assert (result.fits, result.fails, result.done) == (672, 704, True)
    far, asked = walk(search(start=640, step=64), 1000)
    assert asked == [640, 704, 768, 896, 1152, 1024, 960, 992]  # the step doubles while everything fits
    assert (far.fits, far.fails) == (992, 1024)
    low, asked = walk(search(start=640, step=64), 450)
    assert asked == [640, 576, 512, 384, 448, 480]  # and the same downwards
    assert (low.fits, low.fails) == (448, 480)
    top, asked = walk(search(start=640, step=64, limit=800), 10**6)
    assert (top.fits, top.fails, asked) == (800, None, [640, 704, 768, 800])  # clamped to the limit, then over
    floor, asked = walk(search(start=128, step=64), 0)
    assert (floor.fits, floor.fails, asked) == (None, 32, [128, 64, 32])
    with pytest.raises(ValueError, match="step 48 must be a multiple of resolution 32"):
        search(step=48)


def test_the_ceiling_is_confirmed_on_every_seed_and_a_failing_seed_sends_the_search_below():
    per_seed = {42: 700, 43: 650, 44: 700}  # seed 43 meets longer queries: a lower ceiling
    failed: set[int] = set()
    asked: list[tuple[int, str]] = []

    def screen(batch: int) -> bool:
        asked.append((batch, "42"))
        return batch not in failed and batch <= per_seed[42]

    def confirm(batch: int) -> bool:
        asked.append((batch, "all"))
        if all(batch <= limit for limit in per_seed.values()):
            return True
        failed.add(batch)
        return False

    result = plan_search(search(), screen, confirm)
    assert (result.fits, result.fails, result.done) == (640, 672, True)
    confirmations = [batch for batch, seeds in asked if seeds == "all"]
    assert confirmations == [672, 640]  # only the candidate ceilings ran on every seed


def test_searches_are_validated_before_anything_runs(tmp_path):
    with pytest.raises(ValidationError, match="steps 4 is below the 8 a grad-checkpoint probe trains at least"):
        search(steps=4)
    # a GradCache probe may train 4 (its steps repeat: harness.search.MIN_STEPS_OF), not fewer
    gradcache = {"regime": "gradcache", "mini_batch_size": 64, "start": 2048, "resolution": 128}
    assert search(steps=4, **gradcache).probe(2048, 42).steps == 4
    with pytest.raises(ValidationError, match="steps 3 is below the 4 a gradcache probe trains at least"):
        search(steps=3, **gradcache)
    with pytest.raises(ValidationError, match="multiples of resolution"):
        search(start=100)
    with pytest.raises(ValidationError, match="seeds repeat"):
        search(seeds=[1, 1])
    with pytest.raises(ValidationError, match="unknown regime for pylate 'sideways'"):  # a probe it cannot make
        search(regime="sideways")
    grid = tmp_path / "bad.yaml"
    base = {"stack": "pylate", "regime": "plain", "variant": "vanilla", "seeds": [1], "start": 8, "limit": 64, "resolution": 8}
    entries = [base | {"card": "h100-40gb"}, base | {"card": "native", "allocator": "huge-pages"}]
    grid.write_text(yaml.safe_dump({"searches": entries}))
    with pytest.raises(GridError) as error:
        load_searches(grid)
    assert "unknown card 'h100-40gb'" in str(error.value) and "unknown allocator 'huge-pages'" in str(error.value)
    assert cli.main(["ceiling", str(grid), "--dry-run", "--results-dir", str(tmp_path / "results")]) == 2
    assert not (tmp_path / "results").exists()


def test_the_committed_ceiling_grid_covers_every_card_backend_and_allocator():
    searches = load_searches(ROOT / "grids" / "ceilings.yaml")
    cards = {s.card for s in searches}
    assert cards == {"rtx4090-24gb", "a100-40gb", "l40s-48gb", "h100-80gb", "native"}
    assert {s.allocator for s in searches if s.stack == "colpali"} == {"default", "expandable"}
    assert {(s.variant, s.score_mini_batch_size) for s in searches if s.stack == "pylate" and s.regime != "gradcache"} == {
        ("vanilla", None), ("lik", None), ("flash", None), ("vanilla", 64)}
    gradcache = [s for s in searches if s.regime == "gradcache"]  # every backend, and vanilla's own score chunk
    assert {(s.variant, s.score_mini_batch_size, s.mini_batch_size) for s in gradcache} == {
        ("vanilla", None, 64), ("vanilla", 16, 64), ("lik", None, 64), ("flash", None, 64)}
    assert {s.card for s in gradcache} == {"rtx4090-24gb", "h100-80gb", "native"}
    # where the grid plans no search (GradCache on 40 and 48 GB) the page's table says so with a dash, not a blank
    table = tables.ceiling_grid(data.ceilings())
    forty = next(column for column in table.columns if column.startswith("40 GB"))
    assert table.loc[("pylate", "gradcache", "vanilla"), forty] == tables.NO_SEARCH
    assert (table != "").all().all() and (table == tables.NO_SEARCH).sum().sum() == 2 * 4
    assert all(s.steps == (4 if s.regime == "gradcache" else 8) and s.grid == "ceilings" for s in searches)
    # three seeds each, but GradCache's, whose probes take up to a quarter of an hour: one seed (the
    # ceilings page computes why), and three for one search, the regime's own check
    assert all(len(s.seeds) >= 3 for s in searches if s.regime != "gradcache")
    assert sorted(len(s.seeds) for s in gradcache) == [1] * (len(gradcache) - 1) + [3]
    assert len({s.search_id for s in searches}) == len(searches) == 83
    assert [s.search_id for s in load_searches(ROOT / "grids" / "ceilings.yaml", ["colpali-plain-*-h100-80gb*"])] == [
        "colpali-plain-vanilla-h100-80gb", "colpali-plain-lik-h100-80gb",
        "colpali-plain-vanilla-h100-80gb-expandable", "colpali-plain-lik-h100-80gb-expandable"]  # fmt: skip


def fake_probe(true_ceiling: int | dict[int, int], crash_at: int | None = None, calls: list | None = None,
               reserved: float = 110.0):  # fmt: skip
    """A stand-in for :func:`harness.orchestrate.launcher.launch`: writes the schema-2 result an H100
    with this true ceiling would give (100 MiB allocated and ``reserved`` MiB reserved per sample at
    the step peak), embedding the probe's spec as a GPU run resolves it."""

    def launch(cell: GridCell, layout: Layout, gpu: str | None, gate: pool.Gate | None = None) -> CellRun:
        planned = cell.spec
        if calls is not None:
            calls.append((planned.batch_size, planned.seed))
        spec = with_fields(planned, preset="full", device="cuda")
        batch = spec.batch_size
        limit = true_ceiling[spec.seed] if isinstance(true_ceiling, dict) else true_ceiling
        if batch == crash_at:
            result = CellResult.crashed(spec, cell.grid, "kernel_died", "…", 1.0, "the kernel stopped in the middle of a cell")
        else:
            outcome = "ok" if batch <= limit else "oom"
            result = CellResult(
                grid=cell.grid, cell_id=spec.cell_id, spec=spec, outcome=outcome,
                oom_message="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0" if outcome == "oom" else None,
                oom_where="maxsim" if outcome == "oom" else None,
                pre_oom_alloc_mib=batch * 100.0 if outcome == "oom" else None,
                pre_oom_reserved_mib=batch * reserved if outcome == "oom" else None,
                step_times_sec=[1.0] * (spec.steps if outcome == "ok" else 1),
                step_peak_alloc_mib=batch * 100.0, step_peak_reserved_mib=batch * reserved,
                step_peak_alloc_per_step_mib=[batch * 100.0] * 2,
                step_peak_reserved_per_step_mib=[batch * (reserved - 5.0), batch * reserved],
            )  # fmt: skip
        write_result(result, layout.result_path(cell))
        return CellRun(cell, result.outcome, 0.0, gpu or "-", failure=result.failure)

    return launch


def run_search(s: CeilingSearch, layout: Layout, **options) -> Ceiling:
    return orchestrate.run_search(s, layout, None, None, echo=lambda line: None, **options)


def test_a_search_runs_its_probes_lazily_and_resumes_from_its_results(tmp_path, layout, monkeypatch):
    calls: list = []
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700, calls=calls))
    s = search(limit=1024)
    result = run_search(s, layout)
    assert (result.fits, result.fails) == (672, 704)
    # the walk runs on the first seed; only the ceiling it ends on runs on every seed
    assert calls == [(256, 42), (512, 42), (1024, 42), (768, 42), (640, 42), (704, 42), (672, 42), (672, 43)]
    assert describe(s, result) == "pylate-grad-checkpoint-vanilla-h100-80gb: 672 fits, 704 does not"
    # resume: nothing is re-run
    monkeypatch.setattr(orchestrate, "launch", lambda *a, **k: pytest.fail("a finished search ran a probe"))
    assert run_search(s, layout).fits == 672
    # the report reads the same state from the same files
    grid = grid_file(tmp_path / "grid.yaml", s)
    (row,) = data.ceilings(layout.results_dir, grid)
    assert (row.fits, row.fails, row.probes, row.fails_where) == (672, 704, len(calls), "maxsim")
    assert row.peak_reserved_gib == pytest.approx(672 * 110 / 1024)
    assert row.headroom_gib == pytest.approx(78.43 - 672 * 110 / 1024)
    assert row.fragmentation_growth_mib == pytest.approx(672 * 5.0)
    assert text.ceiling_text(row) == "672" and row.settled == 672
    probes = data.ceiling_probes(layout.results_dir)
    assert prose.probe_headline(probes, "pylate", "grad-checkpoint", 704, "vanilla", "h100-80gb") == (
        "runs out of memory in the MaxSim op after 1 of 8 steps "
        "(Tried to allocate 2.00 GiB; 68.75 GiB allocated, 75.62 GiB reserved at the peak before it)")
    assert prose.probe_headline(probes, "pylate", "grad-checkpoint", 672, "vanilla", "h100-80gb") == (
        "trains all 8 steps for each of the 2 seeds run (peak 65.62 GiB allocated, 72.19 GiB reserved)")
    assert prose.probe_headline(probes, "pylate", "plain", 672, "vanilla", "h100-80gb") == "not probed yet"
    assert prose.binding_reading(data.ceilings(layout.results_dir, grid)) == [
        "pylate · grad-checkpoint on 80 GB (H100 profile, capped at 78.43 GiB): "
        "vanilla 672 (the next batch fails in the MaxSim op)."]
    table = tables.ceiling_grid(data.ceilings(layout.results_dir, grid))
    assert table.loc[("pylate", "grad-checkpoint", "vanilla"), "80 GB (H100 profile, capped at 78.43 GiB)"] == "672"


def test_probes_are_found_by_the_spec_their_results_embed_not_by_file_name(layout, monkeypatch):
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700))
    s = search(limit=1024)
    finished = run_search(s, layout)
    # every probe's file renamed and moved: the search still reads them all
    for index, path in enumerate(sorted((layout.results_dir / "ceilings").rglob("*.json"))):
        path.rename(layout.results_dir / "ceilings" / f"probe-{index}.json")
    assert search_state(s, layout.results_dir) == (finished, None)
    # a result of the same spec in another grid's folder, or of another grid, is no probe of it
    probe = load_result(layout.results_dir / "ceilings" / "probe-0.json")
    write_result(probe.model_copy(update={"grid": "ours"}), layout.results_dir / "ceilings" / "foreign.json")
    write_result(probe, layout.results_dir / "ours" / "pylate" / "grad-checkpoint" / "copy.json")
    assert search_state(s, layout.results_dir) == (finished, None)


def test_a_seed_that_fails_at_the_candidate_is_read_back_from_disk(layout, monkeypatch):
    calls: list = []
    monkeypatch.setattr(orchestrate, "launch", fake_probe({42: 700, 43: 650}, calls=calls))
    result = run_search(search(limit=1024), layout)
    assert (result.fits, result.fails) == (640, 672)
    assert calls[-3:] == [(672, 42), (672, 43), (640, 43)]
    assert search_state(search(limit=1024), layout.results_dir) == (result, None)


def test_a_start_that_a_later_seed_fails_leaves_probes_off_the_walk_that_still_count(layout, monkeypatch):
    # seed 42 fits at the start, 672; seed 43 does not: the walk read back now goes down from the
    # start and never meets the batches above it that seed 42 failed, which stay on disk
    monkeypatch.setattr(orchestrate, "launch", fake_probe({42: 700, 43: 650}))
    s = search(start=672, limit=2048)
    result = run_search(s, layout)
    assert (result.fits, result.fails) == (640, 672)
    assert sorted(Probes.read(s, layout.results_dir).batches()) == [320, 480, 576, 608, 640, 672, 704, 736, 832, 992, 1344]
    assert search_state(s, layout.results_dir) == (result, None)


def test_a_search_edited_after_its_probes_ran_is_refused(tmp_path, layout, monkeypatch, capsys):
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700))
    run_search(search(limit=1024), layout)
    edited = search(start=512, limit=1024)  # its walk no longer passes the probe at 256
    with pytest.raises(ProbeMismatch, match=r"probes at B=\[256\] are not on this search's walk"):
        search_state(edited, layout.results_dir)
    assert search_state(search(limit=1024, resolution=16), layout.results_dir)[0].next_batch == 688  # finer: goes on
    grid = grid_file(tmp_path / "grid.yaml", edited)
    assert cli.main(["ceiling", str(grid), "--dry-run", "--results-dir", str(layout.results_dir)]) == 1
    out, err = capsys.readouterr()
    assert out == "1 searches, 0 unfinished, 1 refused\n"  # the refused search is neither costed nor counted open
    assert err.startswith("pylate-grad-checkpoint-vanilla-h100-80gb: stopped, "
                          "pylate-grad-checkpoint-vanilla-h100-80gb: probes at B=[256]")  # fmt: skip
    (stopped,) = orchestrate.run_searches([edited], layout, echo=lambda line: None)
    assert stopped.stopped.startswith("ProbeMismatch")  # reported, and the other searches go on


def test_a_crashed_probe_stops_its_search(layout, monkeypatch):
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700, crash_at=512))
    s = search()
    result = run_search(s, layout)
    assert result.stopped == "probe pylate-grad-checkpoint-b512-vanilla-h100-80gb crashed" and result.fits == 256
    assert (result.crashed, result.next_batch) == ("pylate-grad-checkpoint-b512-vanilla-h100-80gb", 512)
    assert describe(s, result) == f"pylate-grad-checkpoint-vanilla-h100-80gb: stopped, {result.stopped}"


def on(name: str, launch):
    """``launch`` on the GPU ``name``: its results record that device."""
    def run(cell, layout, gpu, gate=None):
        done = launch(cell, layout, gpu, gate)
        path = layout.result_path(cell)
        write_result(on_gpu(load_result(path), name), path)
        return done

    return run


def test_a_search_of_the_whole_device_does_not_mix_gpus(layout, monkeypatch):
    """Card ``native`` is whatever GPU runs the probe: probes that ran on an H200 and a next one on an
    H100 would read as one ceiling of neither, so the search stops, saying why, before any probe runs."""
    from harness import gpu_gate

    s = search(card="native", start=512, limit=1024)
    monkeypatch.setattr(gpu_gate, "device_name", lambda gpu: "NVIDIA H200")
    monkeypatch.setattr(orchestrate, "launch", on("NVIDIA H200", fake_probe(700, calls=(h200 := []))))
    first = run_search(s, layout)
    assert (first.fits, first.fails, first.stopped) == (672, 704, None) and h200[-1] == (672, 43)
    # the search gains a seed while an H100 is what the host lends
    monkeypatch.setattr(gpu_gate, "device_name", lambda gpu: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(orchestrate, "launch", lambda *a, **k: pytest.fail("a probe ran on another GPU"))
    s = search(card="native", start=512, limit=1024, seeds=[42, 43, 44])
    stopped = run_search(s, layout)
    assert stopped.stopped == ("its probes ran on the whole NVIDIA H200; this GPU is NVIDIA H100 80GB HBM3, "
                               "and a search of the whole device does not mix devices")  # fmt: skip
    assert not stopped.done and stopped.next_batch == 672  # unfinished, as its probes leave it: seed 44 to run
    # nor does a search of the whole device that has no probe yet run on any GPU but the H200 the pages name
    fresh = run_search(search(card="native", variant="lik", start=512, limit=1024), layout)
    assert fresh.stopped == "its card is the whole H200 the pages name; this GPU is NVIDIA H100 80GB HBM3"


def test_a_capped_search_takes_another_gpu_only_where_the_cross_card_check_vouches_for_it(layout, monkeypatch, tmp_path):
    """A capped probe on an H100 joins a search (of H200 probes, or none yet) only once the cross-card check (its
    searches run again on the H100, every probe's outcome and step peaks equal to its H200 twin's) is
    finished and matched; the check's own searches run on the other GPU by design."""
    from harness import gpu_gate
    from harness.search import CROSS_CARD, vouched_devices

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    monkeypatch.setattr(gpu_gate, "device_name", lambda gpu: h200)
    monkeypatch.setattr(orchestrate, "launch", on(h200, fake_probe(700)))
    assert run_search(search(), layout).done  # the ceilings grid's search, on the H200
    check_grid = tmp_path / "cross-card-check.yaml"
    check_grid.write_text(yaml.safe_dump({"name": CROSS_CARD, "searches": [search().model_dump(mode="json", exclude={"grid"})]}))
    monkeypatch.setattr(orchestrate, "CROSS_CARD_GRID", check_grid)
    (check,) = load_searches(check_grid)
    more = search(seeds=[42, 43, 44])  # the search gains a seed while an H100 is what the host lends
    monkeypatch.setattr(gpu_gate, "device_name", lambda gpu: h100)
    monkeypatch.setattr(orchestrate, "launch", lambda *a, **k: pytest.fail("a probe ran on an unvouched GPU"))
    stopped = run_search(more, layout)
    assert stopped.stopped == (f"this GPU is {h100}, which the cross-card check (grids/{CROSS_CARD}.yaml) has not "
                               "shown to measure the same bytes under a cap as the H200")  # fmt: skip
    assert run_search(search(card="rtx4090-24gb"), layout).stopped == stopped.stopped  # a search with no probe yet alike
    # the check runs there, and its probes match their twins to the byte: the H100 is vouched for
    monkeypatch.setattr(orchestrate, "launch", on(h100, fake_probe(700)))
    assert run_search(check, layout).done
    assert vouched_devices(layout.results_dir, check_grid) == {h100}
    seeds = run_search(more, layout)
    assert seeds.done and not seeds.stopped and (seeds.fits, seeds.fails) == (672, 704)
    assert run_search(search(card="rtx4090-24gb"), layout).done  # and a fresh capped search
    # a twin of another draw of the data compares draws, not GPUs: its probe is left out, and a search left with
    # no twin on its draw vouches for nothing
    checked = {path.name for path in (layout.results_dir / CROSS_CARD).rglob("*.json")}
    twins = sorted(path for path in (layout.results_dir / "ceilings").rglob("*.json") if path.name in checked)
    assert len(twins) == len(checked) > 1
    def redraw(path: Path) -> None:
        result = load_result(path)
        assert result.env is not None
        write_result(result.model_copy(update={"env": result.env.model_copy(update={"data_source": "synthetic:x:rows=8"})}), path)

    redraw(twins[0])
    assert vouched_devices(layout.results_dir, check_grid) == {h100}
    for twin in twins[1:]:
        redraw(twin)
    assert vouched_devices(layout.results_dir, check_grid) == frozenset()
    for twin in twins:
        result = load_result(twin)
        assert result.env is not None
        write_result(result.model_copy(update={"env": result.env.model_copy(update={"data_source": None})}), twin)
    assert vouched_devices(layout.results_dir, check_grid) == {h100}
    # one probe of the check that measured other bytes withdraws it
    path = next((layout.results_dir / CROSS_CARD).rglob("*.json"))
    moved = load_result(path)
    write_result(moved.model_copy(update={"step_peak_reserved_per_step_mib": [1.0, 2.0]}), path)
    assert vouched_devices(layout.results_dir, check_grid) == frozenset()
    assert vouched_devices(layout.results_dir, tmp_path / "no-grid.yaml") == frozenset()
    # 2 MiB more reserved at every step, where the committed results (not a device's results directory, which
    # holds only the grids its jobs resume from) hold the same probe run twice on one GPU 4 MiB apart: vouched,
    # by the search run on the device too, which reads how a GPU repeats itself from the committed results
    write_result(moved.model_copy(update={"step_peak_reserved_per_step_mib": [
        value + 2.0 for value in moved.step_peak_reserved_per_step_mib]}), path)  # fmt: skip
    assert vouched_devices(layout.results_dir, check_grid) == frozenset()
    committed = tmp_path / "committed"
    for grid, apart in (("published", 0.0), ("repeat", 4.0)):
        write_result(moved.model_copy(update={"grid": grid, "step_peak_reserved_per_step_mib": [
            value + apart for value in moved.step_peak_reserved_per_step_mib]}), committed / grid / path.name)  # fmt: skip
    assert vouched_devices(layout.results_dir, check_grid, repeats_dir=committed) == {h100}
    assert run_search(more, layout).stopped  # (the committed results are elsewhere)
    monkeypatch.setenv("MAXSIM_RESULTS_DIR", str(committed))
    assert not run_search(more, layout).stopped


def test_a_crashed_probe_runs_again_once_with_rerun_crashed(layout, monkeypatch):
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700, crash_at=512))
    s = search(limit=1024)
    assert run_search(s, layout).stopped
    again: list = []
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700, crash_at=512, calls=again))  # it crashes again
    assert run_search(s, layout, rerun_crashed=True).stopped and again == [(512, 42)]  # once, not again and again
    calls: list = []
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700, calls=calls))  # the crash was transient
    result = run_search(s, layout, rerun_crashed=True)
    assert calls[0] == (512, 42) and (result.fits, result.fails) == (672, 704)


def test_a_real_probe_runs_as_a_cell_with_its_allocator_in_its_environment(layout):
    s = CeilingSearch(stack="pylate", regime="plain", variant="vanilla", card="native", allocator="expandable", seeds=[42],
                      steps=8, start=2, limit=2, resolution=2, preset="tiny", device="cpu", kernel="python3")  # fmt: skip
    lines: list[str] = []
    result = orchestrate.run_searches([s], layout, echo=lines.append, share_gib={None: 50.0})
    assert (result[0].fits, result[0].fails, result[0].done) == (2, None, True)
    probe = load_result(layout.result_path(GridCell("ceilings", s.probe(2, 42))))
    assert (probe.grid, probe.cell_id, probe.outcome, probe.allocator) == (
        "ceilings", "pylate-plain-b2-vanilla-native-expandable", "ok", "expandable")  # fmt: skip
    assert s.owns(probe.spec) and len(probe.step_times_sec) == 8
    assert probe.gpu_share_gib is None  # an uncapped card measures alone even on a shared GPU
    assert probe.env.pytorch_cuda_alloc_conf == "expandable_segments:True"
    assert len(probe.step_peak_reserved_per_step_mib) == 8
    assert s.probe(2, 43).cell_id == "pylate-plain-b2-vanilla-native-expandable-s43"
    assert lines[-1].endswith("pylate-plain-vanilla-native-expandable: ≥ 2 (the limit)")


def test_probes_get_their_gpus_share_budget(layout, monkeypatch, tmp_path):
    gates = []
    honest = fake_probe(700)

    def launch(cell, layout, gpu, gate=None):
        gates.append((gpu, gate.share_gib, gate.path))
        return honest(cell, layout, gpu, gate)

    monkeypatch.setattr(orchestrate, "launch", launch)
    orchestrate.run_searches([search(limit=1024)], layout, gpus=["3"], echo=lambda line: None, share_gib={"3": 120.5})
    assert gates and set(gates) == {("3", 120.5, tmp_path / "gates" / "maxsim-gpu-3.gate")}
    assert orchestrate.share_budgets("60", ["0", "1"]) == {"0": 60.0, "1": 60.0}
    with pytest.raises(ValueError, match="GiB or nothing"):
        orchestrate.share_budgets("half", ["0"])
    with pytest.raises(ValueError, match="positive"):
        orchestrate.share_budgets("0", None)
    with pytest.raises(ValueError, match="too little for any capped probe"):
        orchestrate.share_budgets("1.5", ["0"])
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    with pytest.raises(ValueError, match="pass --share-gpu GIB"):
        orchestrate.share_budgets("free", ["0"])


def test_a_probe_the_device_starved_beside_others_runs_again_alone(layout, monkeypatch, tmp_path):
    runs = []
    honest = fake_probe(700)

    def launch(cell, layout, gpu, gate=None):
        runs.append((cell.spec.batch_size, gate.share_gib))
        if gate.share_gib is not None and cell.spec.batch_size == 512:  # starved on the shared GPU: a crash marker
            marker = CellResult.crashed(cell.spec, cell.grid, "device_out_of_memory", "…", 1.0,
                                        "DeviceOutOfMemory: the device, not the cap, refused memory")  # fmt: skip
            write_result(marker, layout.result_path(cell))
            return CellRun(cell, "crashed", 0.0, gpu or "-", failure="device_out_of_memory")
        return honest(cell, layout, gpu, gate)

    monkeypatch.setattr(orchestrate, "launch", launch)
    lines: list[str] = []
    gate = pool.Gate(tmp_path / "gpu.lock", share_gib=100.0)
    result = orchestrate.run_search(search(limit=1024), layout, "0", gate, echo=lines.append)
    assert (result.fits, result.fails, result.stopped) == (672, 704, None)
    assert runs[:3] == [(256, 100.0), (512, 100.0), (512, None)]  # the starved probe ran again, alone
    assert any("the device, not the card's cap, ran out beside other probes; running it alone" in line for line in lines)


def test_an_unfinished_search_reads_as_its_bracket():
    row = data.SearchRow(search=search(), ceiling=Ceiling(fits=256, fails=512, next_batch=384), probes=5, usable_gib=78.43)
    assert text.ceiling_text(row) == "256–511 (searching)" and row.settled is None
    assert text.ceiling_text(dataclasses.replace(row, ceiling=Ceiling(fits=256, next_batch=512))) == "≥ 256 (searching)"
    assert text.ceiling_text(dataclasses.replace(row, probes=0)) == "not run"
    assert text.card_label("native") == "141 GB (the whole H200)"
    # a table marks it as every page's key does; a sentence that says "still searching" takes the bare range
    assert text.ceiling_entry(row) == "256–511*" and text.ceiling_text(row, running_note="") == "256–511"
    assert text.ceiling_entry(dataclasses.replace(row, ceiling=Ceiling(fits=256, next_batch=512))) == "≥ 256*"
    assert row.running and not dataclasses.replace(row, probes=0).running
    assert text.ceiling_entry(dataclasses.replace(row, ceiling=Ceiling(fits=256, fails=512))) == "256"


def test_a_result_run_with_other_settings_is_not_taken_for_a_probe(layout, monkeypatch):
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700))
    s = search(limit=256)
    run_search(s, layout)
    edited = s.model_copy(update={"steps": 12})  # the grid changed since: its probes must run again
    with pytest.raises(ProbeMismatch, match="result of pylate-grad-checkpoint-b256-vanilla-h100-80gb ran as .*, but the probe"):
        search_state(edited, layout.results_dir)
    (stopped,) = orchestrate.run_searches([edited], layout, echo=lambda line: None)
    assert stopped.stopped.startswith("ProbeMismatch")  # reported, and the other searches go on
    assert cli.main(["ceiling", str(ROOT / "grids" / "ceilings.yaml"), "--match", "no-such-search*"]) == 2


def test_the_reading_compares_the_fused_ceiling_with_vanillas(tmp_path, layout, monkeypatch):
    vanilla, fused = search(limit=2048), search(variant="lik", limit=2048)
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700))
    run_search(vanilla, layout)
    monkeypatch.setattr(orchestrate, "launch", fake_probe(1400))
    run_search(fused, layout)
    (line,) = prose.binding_reading(data.ceilings(layout.results_dir, grid_file(tmp_path / "grid.yaml", vanilla, fused)))
    assert line.startswith(
        "pylate · grad-checkpoint on 80 GB (H100 profile, capped at 78.43 GiB): "
        "vanilla 672 (the next batch fails in the MaxSim op); lik 1376")
    assert line.endswith("the fused kernels train 2.05× vanilla's batch.")


def test_the_allocator_reading_sets_each_ceiling_beside_its_fragmentation(tmp_path, layout, monkeypatch):
    default, expandable, alone = search(limit=2048), search(allocator="expandable", limit=2048), search(variant="lik", limit=2048)
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700, reserved=110.0))  # 10 MiB a sample reserved, unused
    run_search(default, layout)
    monkeypatch.setattr(orchestrate, "launch", fake_probe(760, reserved=101.0))
    run_search(expandable, layout)
    searches = data.ceilings(layout.results_dir, grid_file(tmp_path / "grid.yaml", default, expandable, alone))
    (line,) = prose.allocator_reading(searches)  # lik ran under one allocator only: no line
    assert line == (
        "pylate · grad-checkpoint, vanilla on 80 GB (H100 profile, capped at 78.43 GiB): "
        "672 with the default allocator, 736 with expandable "
        f"segments (reserved − allocated at the ceiling: {672 * 10 / 1024:.2f} → {736 * 1 / 1024:.2f} GiB).")
    assert prose.ceiling_of(searches, "pylate", "grad-checkpoint", "vanilla", "h100-80gb", "expandable") == "736"
    assert prose.ceiling_of(searches, "pylate", "grad-checkpoint", "lik", "h100-80gb") == "not run"
    assert prose.ceiling_of(searches, "pylate", "plain", "vanilla", "h100-80gb") == "not searched"
    assert data.find_search(searches, "pylate", "grad-checkpoint", "vanilla", "h100-80gb").settled == 672
    assert data.find_search(searches, "pylate", "grad-checkpoint", "lik", "h100-80gb").settled is None
    assert data.find_search(searches, "pylate", "plain", "vanilla", "h100-80gb") is None
    probes = data.ceiling_probes(layout.results_dir)
    assert prose.probe_seeds(probes, "pylate", "grad-checkpoint", 672, "vanilla", "h100-80gb") == [
        "seed 42 trains all 8 steps (peak 65.62 GiB allocated, 72.19 GiB reserved)",
        "seed 43 trains all 8 steps (peak 65.62 GiB allocated, 72.19 GiB reserved)"]
    assert prose.probe_seeds(probes, "pylate", "grad-checkpoint", 704, "vanilla", "h100-80gb") == [
        "seed 42 runs out of memory in the MaxSim op after 1 of 8 steps "
        "(Tried to allocate 2.00 GiB; 68.75 GiB allocated, 75.62 GiB reserved at the peak before it)"]


def test_the_gains_over_vanilla_are_stated_only_for_finished_searches(tmp_path, layout, monkeypatch):
    vanilla, fused, expandable = search(limit=2048), search(variant="lik", limit=2048), search(allocator="expandable", limit=2048)
    grid = grid_file(tmp_path / "grid.yaml", vanilla, fused, expandable)
    for s, true_ceiling in ((vanilla, 700), (fused, 1400)):
        monkeypatch.setattr(orchestrate, "launch", fake_probe(true_ceiling))
        run_search(s, layout)
    waiting = prose.ceiling_gains(data.ceilings(layout.results_dir, grid), "pylate", "grad-checkpoint", "h100-80gb")
    assert waiting == "How far each choice moves the ceiling is stated once those searches have finished."
    monkeypatch.setattr(orchestrate, "launch", fake_probe(600))
    run_search(expandable, layout)
    assert prose.ceiling_gains(data.ceilings(layout.results_dir, grid), "pylate", "grad-checkpoint", "h100-80gb") == (
        "Against vanilla scoring under the default allocator, the fused kernel trains 704 more (1376 against 672); "
        "expandable segments, with vanilla scoring kept, 96 fewer (576 against 672).")
    capped = search(variant="lik", limit=1024)  # a fused search that stops at its limit: a lower bound
    elsewhere = Layout(tmp_path / "capped", layout.notebooks_dir)
    for s, true_ceiling in ((vanilla, 700), (capped, 1400), (expandable, 600)):
        monkeypatch.setattr(orchestrate, "launch", fake_probe(true_ceiling))
        run_search(s, elsewhere)
    grid = grid_file(grid, vanilla, capped, expandable)
    rows = data.ceilings(elsewhere.results_dir, grid)
    assert data.find_search(rows, "pylate", "grad-checkpoint", "lik", "h100-80gb").settled == 1024
    gains = prose.ceiling_gains(rows, "pylate", "grad-checkpoint", "h100-80gb")
    assert "the fused kernel trains at least 352 more (≥ 1024 against 672)" in gains
    with pytest.raises(ProbeMismatch):  # the limit edited under the first folder's probes
        data.ceilings(layout.results_dir, grid)
    row = data.find_search(rows, "pylate", "grad-checkpoint", "vanilla", "h100-80gb")
    stopped = dataclasses.replace(row, ceiling=dataclasses.replace(row.ceiling, stopped="probe x crashed"))
    assert stopped.settled is None and text.ceiling_text(stopped) == "stopped (probe x crashed)"
    # stopped by a crashed probe: what trained, and where it crashed; a decision table marks it unfinished
    at_1088 = dataclasses.replace(row.ceiling, stopped="probe x crashed", crashed="x", next_batch=1088)
    crashed = dataclasses.replace(row, ceiling=at_1088)
    assert crashed.settled is None and text.ceiling_text(crashed) == f"≥ {row.fits} (the probe at 1088 crashed)"
    assert decision.entry(crashed) == f"≥\u00a0{row.fits}*"


def test_each_seed_of_a_probed_batch_is_read_out(layout, monkeypatch):
    monkeypatch.setattr(orchestrate, "launch", fake_probe({42: 700, 43: 650}))
    run_search(search(limit=1024), layout)
    probes = data.ceiling_probes(layout.results_dir)
    assert prose.seed_reading(probes, "pylate", "grad-checkpoint", 672, "vanilla", "h100-80gb") == (
        "The ceiling search ran B=672 for 8 steps, with 2 seeds (each seed draws other data and lengths): "
        "seed 42 trains all 8 steps (peak 65.62 GiB allocated, 72.19 GiB reserved); seed 43 runs out of memory in the "
        "MaxSim op after 1 of 8 steps (Tried to allocate 2.00 GiB; 65.62 GiB allocated, 72.19 GiB reserved at the peak "
        "before it). "
        "Same batch, card and backend: whether it trains is decided by the draw.")
    assert prose.seed_reading(probes, "pylate", "grad-checkpoint", 640, "vanilla", "h100-80gb").endswith("reserved).")
    assert prose.seed_reading(probes, "pylate", "grad-checkpoint", 999, "vanilla", "h100-80gb") == ""


def test_every_probe_is_plotted_at_its_peaks_one_panel_per_allocator(tmp_path, layout, monkeypatch):
    default, expandable = search(limit=2048), search(allocator="expandable", limit=2048)
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700, reserved=110.0))
    run_search(default, layout)
    monkeypatch.setattr(orchestrate, "launch", fake_probe(760, reserved=101.0))
    run_search(expandable, layout)
    probes = data.ceiling_probes(layout.results_dir)
    figure = plots.plot_probe_peaks(probes, "pylate · grad-checkpoint on 80 GB")
    left, right = figure.axes
    assert (left.get_title(), right.get_title()) == ("default allocator", "expandable allocator")
    allocated, reserved, failed, ring = left.collections  # one backend: its kinds of marker (a failure: × in a ring)
    fits = probes[(probes["allocator"] == "default") & (probes["outcome"] == "ok")]
    assert sorted(allocated.get_offsets()[:, 1]) == pytest.approx(sorted(fits["batch_size"] * 100 / 1024))
    assert sorted(reserved.get_offsets()[:, 1]) == pytest.approx(sorted(fits["batch_size"] * 110 / 1024))
    for drawn in (allocated, reserved):  # every marker at its probe's own batch: nothing moved sideways
        assert sorted(drawn.get_offsets()[:, 0]) == sorted(fits["batch_size"])
    fails = probes[(probes["allocator"] == "default") & (probes["outcome"] == "oom")]
    assert sorted(failed.get_offsets()[:, 0]) == sorted(ring.get_offsets()[:, 0]) == sorted(fails["batch_size"])
    assert data.ceiling_probes(tmp_path / "nothing").empty


def test_a_broken_file_at_a_probe_path_is_kept_aside_said_and_the_probe_runs(tmp_path, layout, monkeypatch):
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700))
    s = search(limit=1024)
    first = GridCell(s.grid, s.probe(s.start, s.seeds[0]))
    path = layout.result_path(first)
    path.parent.mkdir(parents=True)
    path.write_text('{"schema_version": 2, "grid": "ceil')  # a write cut short
    lines: list[str] = []
    result = orchestrate.run_search(s, layout, None, None, echo=lines.append)
    assert (result.fits, result.fails) == (672, 704)
    assert path.with_name(path.name + ".broken").read_text().startswith('{"schema_version": 2')
    assert any(line.endswith(f"kept aside as {path.name}.broken") for line in lines)


def test_a_data_parallel_search_probes_world_size_cells_on_a_gpu_set_after_the_others(layout, monkeypatch, tmp_path):
    wide = search(world_size=2, gather=True, limit=1024)
    assert wide.search_id == "pylate-grad-checkpoint-vanilla-h100-80gb-w2-gather" != search().search_id
    assert (wide.probe(256, 42).world_size, wide.probe(256, 42).gather) == (2, True)
    assert wide.probe(256, 42).cell_id == "pylate-grad-checkpoint-b256-vanilla-h100-80gb-w2-gather"
    order = []
    honest = fake_probe(700)

    def launch(cell, layout, gpu, gate=None):
        order.append((cell.spec.world_size, gpu))
        return honest(cell, layout, gpu, gate)

    monkeypatch.setattr(orchestrate, "launch", launch)
    one, two = orchestrate.run_searches([wide, search(limit=1024)], layout, gpus=["0", "1"], echo=lambda line: None)
    assert (one.fits, one.fails, two.fits, two.fails) == (672, 704, 672, 704)
    worlds = [world for world, _ in order]
    assert worlds == sorted(worlds) and worlds[-1] == 2  # the one-GPU search's probes first
    assert {gpu for world, gpu in order if world == 2} == {"0,1"}
    # without enough GPUs a data-parallel search is stopped, with the reason, and runs nothing
    monkeypatch.setattr(orchestrate, "launch", lambda *a, **k: pytest.fail("a probe ran without its GPUs"))
    lines: list[str] = []
    (stopped,) = orchestrate.run_searches([search(world_size=2, gather=True, limit=2048)], layout, gpus=["0"], echo=lines.append)
    assert stopped.stopped == "world size 2 needs 2 GPUs, one per rank; this search was given 1"
    assert lines == [describe(search(world_size=2, gather=True, limit=2048), stopped)]


def test_the_committed_multi_gpu_ceilings_search_per_rank_at_world_size_8_with_gathering():
    searches = load_searches(ROOT / "grids" / "multi-gpu-ceilings.yaml")
    assert searches and all(s.world_size == 8 and s.gather and s.card == "h100-80gb" for s in searches)
    assert {(s.stack, s.variant) for s in searches} == {("pylate", "vanilla"), ("pylate", "lik"), ("pylate", "flash"),
                                                        ("colpali", "vanilla"), ("colpali", "lik")}  # fmt: skip
    single = {s.search_id for s in load_searches(ROOT / "grids" / "ceilings.yaml")}
    assert not single & {s.search_id for s in searches}


def drawn(draw: str, launch):
    """``launch`` training on the ``draw`` draw of ColQwen2's synthetic data: its results record that source."""
    def run(cell, layout, gpu, gate=None):
        done = launch(cell, layout, gpu, gate)
        path = layout.result_path(cell)
        result = on_gpu(load_result(path), "NVIDIA H200")
        assert result.env is not None
        seed, rows = result.spec.seed, result.spec.batch_size * result.spec.steps
        source = f"synthetic:colpali_train_set:seed={seed}:" + ("stream=1048576" if draw == "stream" else f"rows={rows}")
        write_result(result.model_copy(update={"env": result.env.model_copy(update={"data_source": source})}), path)
        return done

    return run


def colpali_search(**fields) -> CeilingSearch:
    base = {"stack": "colpali", "regime": "plain", "variant": "vanilla", "card": "rtx4090-24gb", "seeds": [42, 43],
            "start": 32, "step": 8, "limit": 512, "resolution": 4}  # fmt: skip
    return CeilingSearch(**base | fields)


def test_a_colpali_ceiling_decided_on_the_earlier_data_draw_runs_its_deciding_probes_again(tmp_path, layout, monkeypatch):
    """ColQwen2's batch shapes follow the drawn images and queries, so a probe of the earlier draw (batch × steps
    rows per cell) ran other shapes than the probe runs now: it steers the walk but decides no ceiling. The
    probes deciding a finished walk run again on the current draw, the ceiling first, and the walk goes on from
    what they measure; the earlier runs are kept beside the new ones, notebooks and logs included."""
    s = colpali_search()
    earlier = drawn("rows", fake_probe(36))
    for batch, seed in [(32, 42), (40, 42), (36, 42), (36, 43)]:  # the search as it ran on the earlier draw
        earlier(GridCell("ceilings", s.probe(batch, seed)), layout, None)
    at_ceiling = GridCell("ceilings", s.probe(36, 42))  # its executed notebook and log, as a launch leaves them
    layout.notebook_path(at_ceiling).parent.mkdir(parents=True, exist_ok=True)
    layout.notebook_path(at_ceiling).write_text("{}")
    layout.log_path(at_ceiling).write_text("the earlier run's log")
    # read on the current draw: the walk is over, but its ceiling rests on the earlier draw
    ceiling, next_probe = search_state(s, layout.results_dir)
    assert (ceiling.fits, ceiling.fails, ceiling.done, ceiling.earlier_draw) == (36, 40, False, True)
    assert next_probe is not None and (next_probe.batch_size, next_probe.seed) == (36, 42)
    assert describe(s, ceiling) == ("colpali-plain-vanilla-rtx4090-24gb: next B=36 runs again on the current data "
                                    "draw a probe of an earlier one (fits 36, fails 40)")  # fmt: skip
    (row,) = data.ceilings(layout.results_dir, grid_file(tmp_path / "grid.yaml", s))
    assert row.settled is None and not row.done and row.ceiling.earlier_draw
    # on the current draw the batches are others, and the ceiling 28
    calls: list = []
    monkeypatch.setattr(orchestrate, "launch", drawn("stream", fake_probe(28, calls=calls)))
    result = run_search(s, layout)
    # 36 fails on seed 42; the walk's confirmation of 32 (seed 43 had no probe) then fails on the current draw
    assert calls == [(36, 42), (32, 43), (24, 42), (28, 42), (28, 43)]
    assert (result.fits, result.fails, result.done, result.earlier_draw) == (28, 32, True, False)
    folder = layout.results_dir / "ceilings" / "colpali" / "plain"
    kept = load_result(folder / "colpali-plain-b36-vanilla-rtx4090-24gb.json.rows-draw")
    assert kept.data_draw == "rows" and kept.outcome == "ok"
    assert load_result(folder / "colpali-plain-b36-vanilla-rtx4090-24gb.json").data_draw == "stream"
    assert (folder / "colpali-plain-b36-vanilla-rtx4090-24gb.log.rows-draw").read_text() == "the earlier run's log"
    notebooks = layout.notebooks_dir / "ceilings" / "colpali" / "plain"
    assert (notebooks / "colpali-plain-b36-vanilla-rtx4090-24gb.ipynb.rows-draw").read_text() == "{}"
    assert not (folder / "colpali-plain-b32-vanilla-rtx4090-24gb.json.rows-draw").exists()  # 32's seed 42 never ran again
    (row,) = data.ceilings(layout.results_dir, grid_file(tmp_path / "grid.yaml", s))
    assert (row.settled, row.fails, row.deciding_draws) == (28, 32, frozenset({"stream"}))


def test_an_earlier_draw_ceiling_the_current_draw_confirms_runs_only_its_deciding_probes(layout, monkeypatch):
    """Where the current draw measures what the earlier one did, the re-run is the ceiling's seeds and the
    failure above it, no walk; PyLate (fixed shapes: every query and document padded) keeps its earlier probes."""
    s = colpali_search()
    earlier = drawn("rows", fake_probe(36))
    for batch, seed in [(32, 42), (40, 42), (36, 42), (36, 43)]:
        earlier(GridCell("ceilings", s.probe(batch, seed)), layout, None)
    # a launcher that trains the earlier draw again stops the search, saying so, rather than loop
    monkeypatch.setattr(orchestrate, "launch", earlier)
    assert run_search(s, layout).stopped == (
        "probe colpali-plain-b36-vanilla-rtx4090-24gb ran again on the rows draw of the data")
    calls: list = []
    monkeypatch.setattr(orchestrate, "launch", drawn("stream", fake_probe(36, calls=calls)))
    assert (run_search(s, layout).fits, calls) == (36, [(36, 42), (40, 42), (36, 43)])
    pylate = search(card="rtx4090-24gb", start=256, limit=1024)
    monkeypatch.setattr(orchestrate, "launch", drawn("rows", fake_probe(300)))
    assert run_search(pylate, layout).done
    assert search_state(pylate, layout.results_dir) == (Ceiling(fits=288, fails=320), None)


def test_a_colpali_ceiling_the_current_draw_moves_up_goes_on_from_its_re_run_probes(layout, monkeypatch):
    """Where the current draw fits a batch the earlier draw failed, the walk goes up from there: the probes run
    again below the new ceiling lie off its walk and agree with it, so they are kept, not taken for an edit."""
    s = colpali_search()
    earlier = drawn("rows", fake_probe(36))
    for batch, seed in [(32, 42), (40, 42), (36, 42), (36, 43)]:
        earlier(GridCell("ceilings", s.probe(batch, seed)), layout, None)
    calls: list = []
    monkeypatch.setattr(orchestrate, "launch", drawn("stream", fake_probe(48, calls=calls)))
    result = run_search(s, layout)
    assert (result.fits, result.fails, result.done, result.stopped) == (48, 52, True, None)
    assert calls[:2] == [(36, 42), (40, 42)] and calls[-1] == (48, 43)
    assert search_state(s, layout.results_dir) == (Ceiling(fits=48, fails=52), None)


def test_a_failure_below_a_ceiling_in_a_grid_that_runs_its_probes_again_is_named_under_the_table(tmp_path, layout, monkeypatch):
    """A ceiling says its batch trained every seed and the one above failed, not that every smaller batch trains,
    nor that the same probe trains again: a probe of the same search (same stack, backend, card, allocator and
    seeds) that ran out of memory at or below the ceiling in a grid that runs the search's probes again — here the
    cross-card check, on an H100 — is found and named with its seed, step and what its message says was reserved
    but unallocated. One above the ceiling, of another search, of a grid that runs no search's probes, of an
    unfinished search or of another data draw is not."""
    default, expandable = search(limit=2048), search(allocator="expandable", limit=2048)
    monkeypatch.setattr(orchestrate, "launch", fake_probe(700))
    run_search(default, layout)
    grid = grid_file(tmp_path / "grid.yaml", default, expandable)
    assert data.below_ceiling_failures(data.ceilings(layout.results_dir, grid), layout.results_dir) == []
    assert prose.below_ceiling_reading([]).startswith("Below the ceilings: no probe of a finished search")
    for path in layout.results_dir.rglob("*.json"):  # the search's probes trained on the stream draw, on an H200
        write_result(on_draw(load_result(path), "synthetic:x:seed=42:stream=1"), path)
    fits = load_result(next(layout.results_dir.rglob(f"{default.probe(640, 42).cell_id}.json")))
    message = ("CUDA out of memory. Tried to allocate 574.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which "
               "1.00 GiB is free. Of the allocated memory 58.59 GiB is allocated by PyTorch, and 6.22 GiB is reserved by "
               "PyTorch but unallocated.")  # fmt: skip

    def failed_again(s: CeilingSearch, batch: int, grid: str = data.CROSS_CARD, steps: int = 2, draw: str | None = None):
        spec = with_fields(fits.spec, batch_size=batch, allocator=s.allocator)
        result = fits if draw is None else on_draw(fits, f"synthetic:x:seed=42:{draw}")
        result = result.model_copy(update={"grid": grid, "cell_id": spec.cell_id, "spec": spec, "outcome": "oom",
                                         "step_peak_alloc_per_step_mib": fits.step_peak_alloc_per_step_mib[:steps],
                                         "step_peak_reserved_per_step_mib": fits.step_peak_reserved_per_step_mib[:steps],
                                         "oom_message": message})  # fmt: skip
        write_result(on_gpu(result, "NVIDIA H100 80GB HBM3"), tmp_path / "results" / grid / f"{spec.cell_id}.json")
        return result

    below = failed_again(default, 608)
    at = failed_again(default, 672, steps=0)  # the ceiling itself, run again: it failed in its first step
    failed_again(default, 736)  # above the ceiling: what the search says already
    failed_again(expandable, 608)  # another search's probe (its allocator), which has no ceiling yet
    failed_again(default, 576, grid="ours")  # a grid cell of the same spec: no search's probe run again
    failed_again(default, 544, draw="rows=4")  # trained on another draw of the data than the ceiling's probes
    rows = data.ceilings(layout.results_dir, grid)
    assert fits.data_draw == "stream" and next(row for row in rows if row.search == default).deciding_draws == {"stream"}
    first, second = data.below_ceiling_failures(rows, layout.results_dir)
    assert (first.result.cell_id, second.result.cell_id, first.row.fits) == (below.cell_id, at.cell_id, 672)
    assert (first.failed_step, second.failed_step, first.device) == (3, 1, "NVIDIA H100 80GB HBM3")
    assert prose.below_ceiling_reading([first, second]) == (
        "Below the ceilings: a ceiling is the largest batch that trained on every seed of its search, with the batch "
        "above it failing; a smaller batch can still fail, and so can a probe run again. pylate · grad-checkpoint, "
        "vanilla on 80 GB (default allocator) trained 672 on 2 seeds, yet 608 ran out of memory on seed 42 at step 3 "
        "with 6.22 GiB reserved but unallocated (the cross-card check's run of that probe, on an H100 80GB HBM3, on the "
        "draw of the data the ceiling stands on); pylate · grad-checkpoint, vanilla on 80 GB (default allocator) trained "
        "672 on 2 seeds, yet 672 ran out of memory on seed 42 before it finished its first step with 6.22 GiB reserved "
        "but unallocated (the cross-card check's run of that probe, on an H100 80GB HBM3, on the draw of the data the "
        "ceiling stands on).")  # fmt: skip
