"""The long runs at the 80 GB ceilings (grids/long-run.yaml) as the ceilings page reads them: every
planned cell listed, how each ended, and how reserved memory moved past the ceiling's 8-step horizon."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pandas as pd
import pytest

from harness.grid import load_grid
from harness.report import data, decision, longrun, prose
from harness.report import text as text_module
from harness.report.text import EARLIER_DRAW_MARK
from harness.results import Progress, write_progress, write_result
from harness.search import CeilingSearch
from test_results import make_result, on_gpu

GRID = """name: long-run
defaults: {card: h100-80gb, preset: full, device: cuda, seed: 42}
cells:
  - {stack: colpali, regime: plain, variant: vanilla, batch_size: 120, steps: 20}
  - {stack: colpali, regime: plain, variant: lik, batch_size: 160, steps: 20}
  - {stack: pylate, regime: grad-checkpoint, variant: vanilla, batch_size: 640, steps: 30}
"""


def write_runs(tmp_path):
    grid = tmp_path / "long-run.yaml"
    grid.write_text(GRID)
    cells = load_grid(grid)
    # vanilla: reserved steps up once after the horizon (by 512 MiB) and trains all 20 steps
    reserved = [1000.0] * 8 + [1512.0] * 12
    held = make_result("long-run", stack="colpali", regime="plain", batch_size=120, variant="vanilla", card="h100-80gb",
                       steps=20, step_times_sec=[1.0] * 20, step_peak_reserved_per_step_mib=reserved,
                       step_peak_alloc_per_step_mib=[900.0] * 20)  # fmt: skip
    # lik: out of memory in its 13th step, its cache fragmented: reserved up 300 MiB past the horizon, allocated not
    failed = make_result("long-run", stack="colpali", regime="plain", batch_size=160, variant="lik", card="h100-80gb",
                         steps=20, outcome="oom", step_times_sec=[1.0] * 12,
                         step_peak_reserved_per_step_mib=[2000.0] * 8 + [2300.0] * 4, step_peak_alloc_per_step_mib=[1800.0] * 12,
                         oom_message="CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total capacity of 139.80 GiB "
                                     "of which 61.01 GiB is free. Of the allocated memory 1.50 GiB is allocated by PyTorch, "
                                     "and 512.00 MiB is reserved by PyTorch but unallocated.")  # fmt: skip
    root = tmp_path / "results"
    for result in (held, failed):
        assert result.cell_id in {cell.cell_id for cell in cells}
        write_result(result, root / "long-run" / result.stack / result.regime / f"{result.cell_id}.json")
    return grid, data.read(root)


def test_every_planned_long_run_is_listed_with_how_it_ended(tmp_path):
    grid, results = write_runs(tmp_path)
    runs = longrun.long_runs(results, grid)
    assert [run.cell.spec.batch_size for run in runs] == [120, 160, 640]
    assert [run.held for run in runs] == [True, False, None]
    assert runs[0].after_horizon(runs[0].result.step_peak_reserved_per_step_mib) == 512.0
    assert runs[0].after_horizon(runs[0].result.fragmentation_per_step_mib) == 512.0  # 1512 − 900 past 1000 − 900

    table = longrun.table(runs, searches=[])
    assert list(table[longrun.OUTCOME]) == ["trained all 20 steps", "oom at step 13 of 20", "not run yet (30 steps)"]
    assert list(table[longrun.RUN]) == ["ColQwen2 vanilla, 80 GB, default", "ColQwen2 lik, 80 GB, default",
                                        "PyLate vanilla, 80 GB, default"]  # fmt: skip
    assert list(table[longrun.AFTER]) == ["+512 / +512", "+300 / +300", ""]
    assert list(table[longrun.BATCH]) == ["120 (no search)", "160 (no search)", "640 (no search)"]
    # reserved − allocated over the steps: vanilla 100 MiB, then 612; lik 200, then 500
    assert list(table[longrun.GAP]) == ["0.1–0.6", "0.2–0.5", ""]
    assert longrun.allocator_gap_words(runs) == ""  # one allocator setting: nothing to compare
    expandable = dataclasses.replace(runs[1], cell=dataclasses.replace(
        runs[1].cell, spec=dataclasses.replace(runs[1].cell.spec, allocator="expandable")))  # fmt: skip
    assert longrun.allocator_gap_words([runs[0], expandable, runs[2]]) == (
        "ColQwen2's reserved − allocated at the step peak, step by step, ranged 0.1–0.6 GiB under the default allocator "
        "and 0.2–0.5 GiB under expandable segments")  # fmt: skip

    text = longrun.reading(runs)
    assert text.startswith("ColQwen2 vanilla at B = 120 on 80 GB trained every step at its batch (1 of the 2 long "
                           "runs that ended). ColQwen2 lik at B = 160")  # fmt: skip
    both = longrun.reading([runs[0], runs[0], runs[1]])
    assert both.startswith("ColQwen2 vanilla at B = 120 on 80 GB and ColQwen2 vanilla at B = 120 on 80 GB trained every "
                           "step at their batch (2 of the 3 long runs that ended)")  # fmt: skip
    assert longrun.reading([runs[1], runs[2]]).startswith(
        "ColQwen2 lik at B = 160 on 80 GB ran out of memory")  # fmt: skip
    assert ("ColQwen2 lik at B = 160 on 80 GB ran out of memory after 12 of 20 steps, so its 8-step ceiling does not "
            "hold over a run: after step 8 its reserved peak changed +300 MiB while its allocated peak changed 0 MiB, and "
            "the request that failed (0.25 GiB) found 0.50 GiB reserved but unallocated: the default allocator's cache, "
            "fragmented, could not serve it.") in text  # fmt: skip
    assert "512 MiB (ColQwen2 vanilla at B = 120 on 80 GB)" in text and "1 more has not run yet" in text
    # a search whose ceiling is a long run's batch carries how that run ended
    search = CeilingSearch(stack="colpali", regime="plain", variant="lik", card="h100-80gb", seeds=(42, 43, 44),
                           start=128, limit=512, resolution=8)  # fmt: skip
    long = [result for _, result in results.of("long-run")]
    assert data.long_run_at(search, 160, long) == data.LongRunVerdict(160, 20, 12, "oom")
    assert data.long_run_at(search, 152, long) is None and data.long_run_at(search, None, long) is None
    other = search.model_copy(update={"allocator": "expandable"})
    assert data.long_run_at(other, 160, long) is None  # another allocator is another cell
    assert longrun.plot(runs) is not None


def test_a_single_long_run_that_ended_is_named_not_counted(tmp_path):
    grid, results = write_runs(tmp_path)
    first, _, planned = longrun.long_runs(results, grid)
    flat = first.result.model_copy(update={"step_peak_reserved_per_step_mib": [1000.0] * 20})
    assert longrun.reading([dataclasses.replace(first, result=flat), planned]) == (
        "ColQwen2 vanilla at B = 120 on 80 GB trained all 20 of its steps. It reserved no more after step 8 than "
        "within the first 8 steps. 1 more has not run yet.")  # fmt: skip


def test_the_committed_long_run_grid_reads_with_or_without_results():
    runs = longrun.long_runs(data.read())
    assert len(runs) == len(load_grid(longrun.GRID_FILE)) >= 4
    table = longrun.table(runs, data.ceilings())
    assert len(table) == len(runs) and not table.isna().any().any()
    # the batch each long run trains is its search's settled 80 GB ceiling, or below a ceiling whose own run ran out
    for run, shown in zip(runs, table[longrun.BATCH], strict=True):
        batch = run.cell.spec.batch_size
        if shown not in (f"{batch} ({batch})", f"{batch} ({batch}{EARLIER_DRAW_MARK})", f"{batch} (not settled)"):
            ceiling = int(shown.split("(")[1].rstrip(")").removesuffix(EARLIER_DRAW_MARK))  # (° : of the earlier draw)
            at_ceiling = [other for other in runs if longrun.setting(other) == longrun.setting(run)
                          and other.cell.spec.batch_size == ceiling]  # fmt: skip
            assert batch < ceiling and len(at_ceiling) == 1 and run in longrun.below(at_ceiling[0], runs), shown
            assert at_ceiling[0].held in (False, None), shown  # planned where that run ran out of memory
    if not any(run.result or run.progress for run in runs):
        assert longrun.reading(runs).startswith(f"None of the {len(runs)} long runs has run yet")
    # one panel per stack and allocator setting that ran: no two runs of one backend share a panel
    figure = longrun.plot(runs)
    ran = [run for run in runs if run.reserved_per_step]
    # a panel per stack and allocator setting that ran, and one more there for each further run of one backend
    panels = {(run.cell.spec.stack, run.cell.spec.allocator,
               sum(longrun.setting(other) == longrun.setting(run) for other in ran[:index]))
              for index, run in enumerate(ran)}  # fmt: skip
    assert (figure is None) == (not ran)
    if figure is not None:
        assert len(figure.axes) == len(panels) >= len({(stack, allocator) for stack, allocator, _ in panels})
        for axis in figure.axes:
            shown = [text.get_text().split(":")[0] for text in axis.get_legend().get_texts()]
            backends = {label.split(" B=")[0] for label in shown}
            assert len({label for label in shown}) == len(backends), shown  # one run per backend


def progress(cell, steps_done, reserved=2000.0):
    per_step = [reserved] * 8 + [reserved + 64] * (steps_done - 8)  # reserved and allocated both up 64 MiB
    return Progress(cell_id=cell.cell_id, spec=cell.spec, steps_done=steps_done,
                    step_peak_alloc_per_step_mib=[value - 100 for value in per_step], step_peak_reserved_per_step_mib=per_step,
                    step_times_sec=[2.0] * steps_done, written_at="2026-12-02T19:00:00+00:00")  # fmt: skip


def test_a_run_cut_short_by_its_host_is_read_from_its_progress(tmp_path):
    grid, results = write_runs(tmp_path)
    cells = load_grid(grid)
    pylate = cells[2]
    where = results.root / "long-run" / "pylate" / "grad-checkpoint" / f"{pylate.cell_id}.json"
    # a record of another spec (the grid's batch changed since) is not this run's
    other = dataclasses.replace(pylate, spec=dataclasses.replace(pylate.spec, batch_size=608))
    write_progress(progress(other, 12), where)
    assert longrun.long_runs(results, grid)[2].progress is None
    write_progress(progress(pylate, 20), where)
    run = longrun.long_runs(results, grid)[2]
    assert run.cut and run.held is None and run.steps_trained == 20
    assert run.after_horizon(run.reserved_per_step) == 64.0 and run.after_horizon(run.fragmentation_per_step) == 0.0

    table = longrun.table(longrun.long_runs(results, grid), searches=[])
    assert table[longrun.OUTCOME][2] == "20 of 30 steps, then cut short by its host (no OOM)"
    assert table[longrun.AFTER][2] == "+64 / 0"
    text = longrun.reading(longrun.long_runs(results, grid))
    assert "PyLate vanilla at B = 640 on 80 GB trained 20 of 30 steps before its host was taken back" in text
    assert "more have not run yet" not in text  # every planned run ran, in full or in part
    # the largest rise of reserved memory past the first 8 steps' peak among the runs that held or were
    # cut: vanilla's 512 MiB, not the cut run's 64 nor the OOM run's 300
    assert ("The largest rise of reserved memory after step 8 over the first 8 steps' peak of the runs that did not "
            "run out of memory is 512 MiB (ColQwen2 vanilla at B = 120 on 80 GB)") in text  # fmt: skip
    assert longrun.plot(longrun.long_runs(results, grid)) is not None


def test_what_a_long_run_costs_alone_is_estimated_from_the_cells_timed_alone(tmp_path):
    grid, results = write_runs(tmp_path)
    runs = longrun.long_runs(results, grid)
    timed = pd.DataFrame([
        {"stack": "colpali", "regime": "plain", "backend": "vanilla", "batch_size": 64, "steady_step_time_sec": 4.0},
        {"stack": "colpali", "regime": "plain", "backend": "vanilla", "batch_size": 128, "steady_step_time_sec": 7.5},
        {"stack": "pylate", "regime": "grad-checkpoint", "backend": "vanilla", "batch_size": 512, "steady_step_time_sec": 2.0},
    ])  # fmt: skip
    # a line through two batches: 0.5 + B * 7/128 s a step, 20 steps
    assert longrun.estimated_minutes(runs[0], timed) == pytest.approx(20 * (0.5 + 120 * 3.5 / 64) / 60)
    assert longrun.estimated_minutes(runs[1], timed) is None  # no lik cell timed
    # one batch: in proportion to the batch, 30 steps
    assert longrun.estimated_minutes(runs[2], timed) == pytest.approx(30 * 2.0 * 640 / 512 / 60)
    table = longrun.table(runs, searches=[], timed=timed)
    assert list(table[longrun.MINUTES]) == ["≈ 2", "no timed cell", "≈ 1"]
    # a run that ran reads what it took (its wall time), not the estimate
    took = [dataclasses.replace(runs[0], result=runs[0].result.model_copy(update={"wall_sec": 731.0}))] + runs[1:]
    assert list(longrun.table(took, searches=[], timed=timed)[longrun.MINUTES]) == ["12", "no timed cell", "≈ 1"]
    # no cell timed at all (a checkout with no results): every run says so
    nothing = longrun.table(runs, searches=[], timed=pd.DataFrame())
    assert list(nothing[longrun.MINUTES]) == ["no timed cell"] * 3


def test_a_ceiling_probe_is_costed_from_the_cells_of_its_regime_and_backend():
    from harness.search import CeilingSearch

    search = CeilingSearch(stack="pylate", regime="gradcache", mini_batch_size=64, score_mini_batch_size=16, variant="vanilla",
                           card="rtx4090-24gb", seeds=(42,), start=2048, limit=4096, resolution=128)  # fmt: skip
    probe = search.probe(2048, 42)
    chunked = "vanilla + chunk 16"
    timed = pd.DataFrame([
        {"stack": "pylate", "regime": "gradcache", "backend": chunked, "batch_size": 1024, "steady_step_time_sec": 7.0},
        {"stack": "pylate", "regime": "gradcache", "backend": "vanilla", "batch_size": 1024, "steady_step_time_sec": 9.0},
        {"stack": "pylate", "regime": "grad-checkpoint", "backend": chunked, "batch_size": 1024, "steady_step_time_sec": 1.0},
    ])  # fmt: skip
    # only the chunked gradcache cell counts: 8 steps at twice its batch
    assert longrun.minutes_alone(probe, timed) == pytest.approx(probe.steps * 7.0 * 2 / 60)
    assert longrun.minutes_alone(probe, timed[timed["regime"] == "grad-checkpoint"]) is None  # none of its regime


def test_a_run_below_a_ceiling_whose_run_ran_out_is_read_beside_it_in_a_panel_of_its_own(tmp_path):
    grid, results = write_runs(tmp_path)
    grid.write_text(GRID + "  - {stack: colpali, regime: plain, variant: lik, batch_size: 144, steps: 20}\n")
    lower = make_result("long-run", stack="colpali", regime="plain", batch_size=144, variant="lik", card="h100-80gb",
                        steps=20, step_times_sec=[1.0] * 20, step_peak_reserved_per_step_mib=[1900.0] * 20,
                        step_peak_alloc_per_step_mib=[1700.0] * 20)  # fmt: skip
    write_result(lower, results.root / "long-run" / "colpali" / "plain" / f"{lower.cell_id}.json")
    runs = longrun.long_runs(data.read(results.root), grid)
    failed, planned_pylate, below = runs[1], runs[2], runs[3]
    assert longrun.below(failed, runs) == [below] and longrun.below(below, runs) == []
    assert longrun.below(runs[0], runs) == []  # vanilla: another backend
    text = longrun.reading(runs)
    assert ("ColQwen2 lik at B = 160 on 80 GB ran out of memory after 12 of 20 steps, so its 8-step ceiling does not "
            "hold over a run") in text  # fmt: skip
    assert ". At B = 144, 90% of that batch, a run trained all 20 steps." in text
    # said beside the run it is below, not among the runs at their batch (nor counted there)
    assert text.startswith("ColQwen2 vanilla at B = 120 on 80 GB trained every step at its batch (1 of the 2 long runs "
                           "that ended, besides the one below a batch that ran out of memory). ")  # fmt: skip
    # trained on an H100 at its card's cap: said in its sentence and its row
    h100 = dataclasses.replace(below, result=on_gpu(below.result, "NVIDIA H100 80GB HBM3"))
    on_h100 = longrun.reading([runs[0], failed, planned_pylate, h100])
    assert ". At B = 144, 90% of that batch, a run trained all 20 steps on an H100 80GB HBM3 (its card's cap alike)." in on_h100
    outcome = longrun.table([h100], searches=[])[longrun.OUTCOME][0]
    assert outcome == "trained all 20 steps on an H100 80GB HBM3 (its card's cap alike)"
    # the ceiling's verdict carries the run below it: its table entry, the recommendation and the note under the table
    search = CeilingSearch(stack="colpali", regime="plain", variant="lik", card="h100-80gb", seeds=(42, 43, 44),
                           start=128, limit=512, resolution=8)  # fmt: skip
    long = [result for _, result in data.read(results.root).of("long-run")]
    verdict = data.long_run_at(search, 160, long)
    assert verdict is not None and verdict.below is not None and verdict.below.held
    assert (verdict.batch_size, verdict.below.batch_size, verdict.below.steps) == (160, 144, 20)
    row = SimpleNamespace(long_run=verdict, fits=160, stack="colpali", backend="lik", card="h100-80gb", allocator="default")
    assert text_module.below_words(verdict.below) == "; 144 trained all 20"
    assert prose.long_run_note([row]) == ("† At ColQwen2 lik on 80 GB's ceiling of 160, a long run ran out of memory at "
                                          "step 13 of 20; at 144 (90% of it), one trained all 20 steps. The long-run "
                                          "section below follows every step.")  # fmt: skip
    h100_verdict = dataclasses.replace(verdict, below=dataclasses.replace(verdict.below, device_name="NVIDIA H100 80GB HBM3"))
    assert prose.long_run_note([SimpleNamespace(**{**vars(row), "long_run": h100_verdict})]).endswith(
        "one trained all 20 steps, on an H100 80GB HBM3 at the same cap. The long-run section below follows every step.")
    assert decision.long_run_words([row]).endswith("so that 8-step ceiling is not a batch a run can train at, while 144 "
                                                   "trained all 20 steps")  # fmt: skip
    held = data.LongRunVerdict(120, 20, 20, "ok")
    assert prose.long_run_note([SimpleNamespace(**{**vars(row), "long_run": held})]) == ""  # held: no note
    # cut short instead: said so
    cut = dataclasses.replace(below, result=None, progress=progress(below.cell, 10))
    assert ". At B = 144, 90% of that batch, a run trained 10 of 20 steps before its host was taken back, without " \
           "running out of memory." in longrun.reading([runs[0], failed, planned_pylate, cut])
    # two lik runs of ColQwen2's default setting: the second in a panel of its own, no backend twice in a panel
    figure = longrun.plot(runs)
    titles = [axis.get_title() for axis in figure.axes]
    assert titles == ["ColQwen2, default allocator: step peaks per step",
                      "ColQwen2, default allocator, a further run of a backend: step peaks per step"]  # fmt: skip
    assert [text.get_text() for text in figure.axes[1].get_legend().get_texts()] == [
        "lik B=144: reserved", "lik B=144: allocated"]


def test_a_run_on_another_gpu_than_the_h200_says_which(tmp_path):
    """The book's cards are capped H200s; a long run a lease ran on an H100 (capped alike) says so in the
    table, the reading and the plot's legend, and one on an H200 (or of no recorded GPU) says nothing."""
    grid, results = write_runs(tmp_path)
    pylate = load_grid(grid)[2]
    where = results.root / "long-run" / "pylate" / "grad-checkpoint" / f"{pylate.cell_id}.json"
    write_progress(progress(pylate, 20).model_copy(update={"device_name": "NVIDIA H200"}), where)
    assert longrun.long_runs(results, grid)[2].where == ""
    write_progress(progress(pylate, 21).model_copy(update={"device_name": "NVIDIA H100 80GB HBM3"}), where)
    runs = longrun.long_runs(results, grid)
    assert runs[2].device == "NVIDIA H100 80GB HBM3"
    said = " on an H100 80GB HBM3 (its card's cap alike)"
    assert longrun.table(runs, searches=[])[longrun.OUTCOME][2] == f"21 of 30 steps{said}, then cut short by its host (no OOM)"
    reading = longrun.reading(runs)
    assert f"PyLate vanilla at B = 640 on 80 GB trained 21 of 30 steps{said} before its host was taken back" in reading
    legend = [text.get_text() for axis in longrun.plot(runs).axes for text in axis.get_legend().get_texts()]
    assert "vanilla B=640 (H100): cut short by its host after step 21" in legend


def test_the_long_run_lead_and_draw_words_follow_the_grid_and_the_searches():
    """The lead's steps per stack come from grids/long-run.yaml; the draw words name exactly the runs made at a
    ceiling whose search ended on probes of the data's earlier draw."""
    results = data.read()
    runs, searches = longrun.long_runs(results), data.ceilings(results)
    by_stack: dict[str, set[int]] = {}
    for run in runs:
        by_stack.setdefault(run.cell.spec.stack, set()).add(run.cell.spec.steps)
    assert by_stack and all(len(steps) == 1 for steps in by_stack.values())
    assert longrun.steps_words(runs) == f"{by_stack['colpali'].pop()} steps (ColQwen2) or {by_stack['pylate'].pop()} (PyLate)"
    words = longrun.draw_words(runs, searches)
    for run in runs:
        spec = run.cell.spec
        row = data.find_search(searches, spec.stack, spec.regime, run.backend, spec.card, spec.allocator)
        ran = run.result is not None or run.progress is not None
        assert (run.name in words) == bool(ran and row is not None and row.ceiling.earlier_draw), run.name
    assert longrun.draw_words(runs, [dataclasses.replace(row, ceiling=dataclasses.replace(row.ceiling, earlier_draw=False))
                                     for row in searches]) == ""  # fmt: skip
