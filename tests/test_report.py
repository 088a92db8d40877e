"""The report's layers: loading by the grid a result embeds (skipping, and naming, every file it cannot
use), tables, figures and sentences from fixture results, ceiling searches as typed rows, a torch-free
import, and a stack page of the committed book shot in headless Chromium."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from harness.report import data, plots, prose, style, tables, text, timing
from harness.results import Timing, load_result, write_result
from test_book import ROOT, committed_book
from test_results import make_call, make_result, on_draw, on_gpu

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
OOM = "CUDA out of memory. Tried to allocate 56.25 GiB. GPU 0 has ..."


def replay(batch, variant, held_mib, oom=False):
    return make_call(
        variant=variant, query_shape=[batch, 48, 128], doc_shape=[batch, 2, 300, 128],
        forward_transient_peak_mib=None if oom else 2 * held_mib, saved_for_backward_mib=None if oom else held_mib,
        backward_transient_peak_mib=None if oom else held_mib, predicted_grid_mib=held_mib,
        predicted_forward_transient_mib=held_mib, predicted_saved_for_backward_mib=held_mib, oom_in_replay=oom,
        oom_message="CUDA out of memory. Tried to allocate 56.25 GiB." if oom else None,
    )  # fmt: skip


TIMED = Timing(gpu="0", cpus="0-15", comparable=True)  # timed under the timing rule (harness.host)


def fixture_results(root: Path) -> Path:
    """A small PyLate grad-checkpoint sweep: vanilla ×4 per doubling and OOM at 1024, lik ×2."""
    common = dict(stack="pylate", regime="grad-checkpoint", card="h100-80gb", steps=3)
    for batch, held in ((256, 100.0), (512, 400.0), (1024, 1600.0)):
        oom = batch == 1024
        cell = make_result(
            **common, batch_size=batch, variant="vanilla", outcome="oom" if oom else "ok", oom_where="maxsim" if oom else None,
            oom_message=OOM if oom else None, step_peak_alloc_mib=batch * 100.0, step_peak_reserved_mib=batch * 110.0,
            step_times_sec=[3.0] if oom else [3.0] + [batch / 400] * 8, steady_steps=[] if oom else list(range(1, 9)),
            steady_step_time_sec=None if oom else batch / 400, timing=TIMED,
            samples_per_sec=None if oom else 400.0, maxsim_calls_isolated=[replay(batch, "vanilla", held, oom=oom)],
        )  # fmt: skip
        write_result(cell, root / f"vanilla-{batch}.json")
        lik = make_result(
            **common, batch_size=batch, variant="lik", step_peak_alloc_mib=batch * 55.0, step_peak_reserved_mib=batch * 58.0,
            step_times_sec=[9.0] + [batch / 450] * 8, autotune_steps=[0], steady_steps=list(range(1, 9)),
            steady_step_time_sec=batch / 450, samples_per_sec=450.0, timing=TIMED,
            maxsim_calls_isolated=[replay(batch, "lik", held / 25 * batch / 256)],
        )  # fmt: skip
        write_result(lik, root / f"lik-{batch}.json")
    return root


def test_the_report_imports_neither_torch_nor_the_orchestration():
    modules = ["harness.report.data", "harness.report.tables", "harness.report.plots", "harness.report.prose",
               "harness.report.display", "harness.results", "harness.search"]  # fmt: skip
    forbidden = ("torch", "harness.orchestrate", "harness.sweep", "harness.ceiling", "harness.cell", "harness.opbench",
                 "harness.stacks", "harness.backends", "harness.cards", "harness.gpu_gate")  # fmt: skip
    code = (f"import sys\nimport {', '.join(modules)}\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith({forbidden!r})))")  # fmt: skip
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert completed.stdout.strip() == "[]"


def test_doubling_factors_are_measured_from_the_points():
    assert plots.doubling_factors(np.array([256, 512, 1024]), np.array([100.0, 400.0, 1600.0])) == pytest.approx(4.0)
    assert plots.doubling_factors(np.array([256, 512]), np.array([4.0, 8.0])) == pytest.approx(2.0)


def test_tables_read_the_results(tmp_path):
    cells, calls = data.load(fixture_results(tmp_path / "results"))
    ceiling = tables.ceiling_table(data.select(cells, "pylate", "grad-checkpoint"))
    assert ceiling.loc[512, "vanilla"] == "50.00 / 55.00"
    assert ceiling.loc[1024, "vanilla"].startswith("OOM in the MaxSim op (Tried to allocate 56.25 GiB; pre-OOM 100.00")
    times = tables.step_time_table(cells)
    speeds = list(times[times["backend"] == "lik"]["speed vs vanilla (95% interval)"])
    assert speeds == ["1.12× faster (1.12–1.12)", "1.12× faster (1.12–1.12)", ""]  # no vanilla at 1024
    ops = tables.op_vram_table(calls)
    assert ops[(ops["batch"] == 1024) & (ops["backend"] == "vanilla")]["held (MiB)"].item() == "OOM in replay"
    vanilla_512 = ops[(ops["batch"] == 512) & (ops["backend"] == "vanilla")]
    assert vanilla_512[tables.PREDICTED].item() == "400 " + text.nowrap("[0 / +400.00]")
    comparison = tables.published_comparison(cells, data.published("pylate", "grad-checkpoint"))
    row = comparison[(comparison["batch"] == 1024) & (comparison["backend"] == "vanilla")].iloc[0]
    assert row["published"] == "OOM (asked 56.25 GiB)" and row["ours"] == "OOM (Tried to allocate 56.25 GiB)"
    assert prose.headline(cells, "pylate", "grad-checkpoint", 512, "lik") == "27.50 GiB allocated at the step peak · 1.14 s/step"
    figure = plots.plot_op_vram(calls, "op")
    assert sorted(line.get_label() for line in figure.axes[0].lines) == ["lik (×8.0 per doubling)", "vanilla (×4.0 per doubling)"]


def _median_and_spread(shown: str) -> tuple[float, float, float]:
    """'0.455 (0.442–0.466)' (with no-break spaces and hyphens as the tables print them) → (median, p10, p90)."""
    found = re.fullmatch(r"([0-9.]+) \(([0-9.]+)[–\u2011]([0-9.]+)\)", shown.replace("\u00a0", " "))
    assert found, shown
    median, p10, p90 = (float(part) for part in found.groups())
    return median, p10, p90


def test_a_median_is_printed_inside_its_printed_spread():
    # two decimals for the spread once read 0.999 (1.00–1.00): the median below its own p10
    assert tables.median_spread(0.9994, 0.9981, 1.0012) == "0.999 (0.998–1.00)"
    assert tables.median_spread(0.4281, 0.4268, 0.4472, "\u2011") == "0.428 (0.427\u20110.447)"
    assert tables.median_spread(None, None, None) == "— (—–—)"
    results = data.results_of(None)
    cells, _ = data.load(results)
    steps = tables.step_time_table(cells)["s / step (p10–p90)"]
    repeats = tables.repeat_table(data.repeats(results))
    shown = [*steps, *repeats["first run, s (p10–p90)"], *repeats["second run, s (p10–p90)"]]
    assert len(shown) == len(tables.timed(cells)) + 2 * len(repeats) > 0
    for printed in shown:
        median, p10, p90 = _median_and_spread(printed)
        assert p10 <= median <= p90, printed
    timed = tables.timed(cells)  # every spread rounded as its median is: three significant digits
    assert sorted(printed.replace("\u00a0", " ") for printed in steps) == sorted(
        f"{text.sig(m)} ({text.sig(p10)}\u2011{text.sig(p90)})" for m, p10, p90 in
        zip(timed["steady_step_time_sec"], timed["steady_step_p10_sec"], timed["steady_step_p90_sec"], strict=True))


def test_a_broken_or_foreign_json_is_skipped_and_named_while_the_rest_load(tmp_path):
    root = fixture_results(tmp_path / "results")
    (root / "broken.json").write_text('{"schema_version": 2, "grid": "ours", "cell_')  # a truncated write
    (root / "stray").mkdir()
    (root / "stray" / "package.json").write_text('{"name": "not-a-result", "version": "1.0.0"}')
    write_result(make_result(grid=None), root / "notebook-run.json")  # a cell run by hand, outside any grid
    write_result(make_result(grid="smoke"), root / "smoke.json")  # a grid the report does not show
    results = data.read(root)
    assert len(results.found) == 6
    reasons = {item.path.relative_to(root).as_posix(): item.reason for item in results.skipped}
    assert sorted(reasons) == ["broken.json", "notebook-run.json", "smoke.json", "stray/package.json"]
    assert reasons["broken.json"].startswith("not JSON") and "no schema_version" in reasons["stray/package.json"]
    assert "outside any grid" in reasons["notebook-run.json"] and "'smoke'" in reasons["smoke.json"]
    cells, _ = data.load(root)
    assert len(cells) == 6
    printed = subprocess.run([sys.executable, "-m", "harness.report.data", "--check", str(root)], capture_output=True,
                             text=True, cwd=ROOT, check=True).stdout  # fmt: skip
    assert "4 files skipped:" in printed and "  broken.json: not JSON" in printed and "  stray/package.json: " in printed
    table = tables.skipped_table(results.skipped, root)
    assert list(table.columns) == ["file", "why it was skipped"] and len(table) == 4
    assert prose.skipped_reading(results.skipped).startswith("**Files not read.** 4 files") and prose.skipped_reading([]) == ""


def test_a_result_belongs_to_the_grid_it_embeds_not_to_its_folder(tmp_path):
    write_result(make_result(grid="ours", batch_size=8), tmp_path / "ceilings" / "colpali" / "plain" / "misplaced.json")
    write_result(make_result(grid="ceilings", batch_size=16, steps=8), tmp_path / "ours" / "probe.json")
    cells, _ = data.load(tmp_path)
    assert list(cells["batch_size"]) == [8] and list(cells["grid"]) == ["ours"]
    probes = data.ceiling_probes(tmp_path)
    assert list(probes["batch_size"]) == [16] and list(probes["backend"]) == ["vanilla"]
    assert list(data.all_cells(tmp_path)["grid"]) == ["ours", "ceilings"]


CEILING_GRID = """
name: ceilings
defaults: {stack: pylate, regime: grad-checkpoint, card: rtx4090-24gb, seeds: [42, 43], steps: 8, start: 4, limit: 16,
           resolution: 4}
searches:
  - variant: [vanilla, lik]
"""


def probe(variant, batch, seed, oom=False):
    """A ceiling probe's result: 8 steps that trained, or an OOM in the MaxSim op after one."""
    peaks = dict(step_peak_alloc_mib=batch * 1000.0, step_peak_reserved_mib=batch * 1100.0)
    per_step = dict(step_peak_alloc_per_step_mib=[batch * 1000.0] * 8, step_peak_reserved_per_step_mib=[batch * 1050.0] * 7
                    + [batch * 1100.0], step_times_sec=[1.0] * 8)  # fmt: skip
    failed = dict(outcome="oom", oom_where="maxsim", oom_message="CUDA out of memory. Tried to allocate 3.52 GiB. GPU 0",
                  step_times_sec=[1.0], pre_oom_alloc_mib=batch * 1000.0, pre_oom_reserved_mib=batch * 1300.0)  # fmt: skip
    return make_result(grid="ceilings", stack="pylate", regime="grad-checkpoint", card="rtx4090-24gb", steps=8, batch_size=batch,
                       variant=variant, seed=seed, **(failed if oom else peaks | per_step))  # fmt: skip


def test_ceiling_searches_are_read_from_their_probes_as_typed_rows(tmp_path):
    grid = tmp_path / "ceilings.yaml"
    grid.write_text(CEILING_GRID)
    folder = tmp_path / "results" / "anywhere"
    # vanilla: 4 and 8 fit, 16 and then 12 fail, 8 is confirmed with seed 43; lik: 4, 8, 16 fit, 16 awaits seed 43
    for variant, batch, seed, oom in [("vanilla", 4, 42, False), ("vanilla", 8, 42, False), ("vanilla", 16, 42, True),
                                      ("vanilla", 12, 42, True), ("vanilla", 8, 43, False), ("lik", 4, 42, False),
                                      ("lik", 8, 42, False), ("lik", 16, 42, False)]:  # fmt: skip
        write_result(probe(variant, batch, seed, oom), folder / f"{variant}-{batch}-{seed}.json")
    rows = data.ceilings(data.read(tmp_path / "results"), grid)
    vanilla, lik = rows
    assert (vanilla.backend, vanilla.fits, vanilla.fails, vanilla.done, vanilla.probes) == ("vanilla", 8, 12, True, 5)
    assert (lik.fits, lik.fails, lik.done, lik.ceiling.next_batch, lik.settled) == (16, None, False, 16, None)
    assert vanilla.peak_reserved_gib == pytest.approx(8.59375) and vanilla.usable_gib == 22.96
    assert vanilla.fragmentation_growth_mib == pytest.approx(400.0) and vanilla.fails_where == "maxsim"
    card = "24 GB (RTX4090 profile, capped at 22.96 GiB)"
    assert tables.ceiling_grid(rows)[card].to_dict() == {("pylate", "grad-checkpoint", "lik"): "≥ 16*",
                                                        ("pylate", "grad-checkpoint", "vanilla"): "8"}  # fmt: skip
    details = tables.ceiling_details(rows).set_index("backend")
    assert details.loc["vanilla", "next batch failed"] == "in the op, asked 3.52\u00a0GiB"
    assert details.loc["vanilla", "headroom (GiB)"] == f"{22.96 - 8.59375:.2f}"
    binding = f"pylate · grad-checkpoint on {card}: vanilla 8 (the next batch fails in the MaxSim op)."
    assert prose.binding_reading(rows) == [binding]
    assert prose.search_plan(rows, "pylate", "grad-checkpoint", "vanilla", "rtx4090-24gb") == "8 steps and 2 seeds"
    assert prose.ceiling_of(rows, "pylate", "grad-checkpoint", "flash", "rtx4090-24gb") == "not searched"
    assert prose.ceiling_gains(rows, "pylate", "grad-checkpoint", "rtx4090-24gb").startswith("How far each choice")
    figure = plots.plot_ceiling_bars(rows, "ceilings")  # dots and ranges: the running search shows too
    ranges = [line for line in figure.axes[0].lines if len(line.get_xdata()) == 2]
    assert sorted((line.get_color(), line.get_linestyle(), tuple(line.get_ydata())) for line in ranges) == [
        (style.colour("vanilla"), "-", (8.0, 12.0)), (style.colour("lik"), "--", (16.0, 24.0))]  # lik: no failure yet, an arrow
    assert not figure.axes[0].patches  # no bars on a log axis
    probes = data.ceiling_probes(tmp_path / "results")
    assert prose.probe_headline(probes, "pylate", "grad-checkpoint", 8, "vanilla", "rtx4090-24gb") == (
        "trains all 8 steps for each of the 2 seeds run (peak 7.81 GiB allocated, 8.59 GiB reserved)")
    assert prose.seed_reading(probes, "pylate", "grad-checkpoint", 12, "vanilla", "rtx4090-24gb").startswith(
        "The ceiling search ran B=12 for 8 steps, with 1 seed (each seed draws other data and lengths): seed 42 runs out of "
        "memory in the MaxSim op after 1 of 8 steps (Tried to allocate 3.52 GiB; 11.72 GiB allocated, 15.23 GiB reserved "
        "at the peak before it)")


def shared_check_results(root, timings):
    """Ceiling probes at B = 8, 16 and 24 (0.25 s a step, the twin's record of what ran beside it:
    ``timings[batch]``) and the same probes run again on a shared GPU (0.75, 0.5 and 1.0 s a step; B = 16
    reserved 2 MiB more at its last step), plus a shared probe at B = 32 with no twin."""
    per_step = dict(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[120.0, 130.0])
    for batch, shared_reserved, shared_time in ((8, 130.0, 0.75), (16, 132.0, 0.5), (24, 130.0, 1.0)):
        write_result(make_result(grid="ceilings", batch_size=batch, **per_step, steady_step_time_sec=0.25,
                                 timing=timings.get(batch)), root / "ceilings" / f"b{batch}.json")  # fmt: skip
        shared = make_result(grid=data.SHARED_CHECK, batch_size=batch, step_peak_reserved_mib=shared_reserved,
                             **{**per_step, "step_peak_reserved_per_step_mib": [120.0, shared_reserved]},
                             steady_step_time_sec=shared_time, gpu_share_gib=24.96)  # fmt: skip
        write_result(shared, root / "check" / f"b{batch}.json")
    write_result(make_result(grid=data.SHARED_CHECK, batch_size=32), root / "check" / "b32.json")  # no twin: left out
    return data.shared_checks(root)


def test_the_shared_gpu_check_sets_each_probe_beside_its_run_alone(tmp_path):
    beside = Timing(gpu="0", cpus="0-7", neighbours=1, comparable=True)  # another cell on the host's other cores
    # B = 8 and 16 recorded alone on their host; B = 24 has no record, so its time is never compared
    checks = shared_check_results(tmp_path / "two", {8: TIMED, 16: TIMED})
    assert [check.timed_alone for check in checks] == [True, False, True]  # path order: b16, b24, b8
    assert [check.slowdown for check in checks] == [2.0, None, 3.0]
    check = tables.sharing_check(checks).set_index("probe")
    same, moved, untimed = (f"colpali-plain-b{batch}-vanilla-native" for batch in (8, 16, 24))
    assert sorted(check.index) == sorted([same, moved, untimed])
    assert check.loc[same, "identical"] == "yes" and check.loc[moved, "identical"] == "no"
    assert check.loc[moved, "peak reserved MiB alone · shared"] == "130 · 132"
    assert check.loc[same, "GiB given on the shared GPU"] == "24.96"
    assert check.loc[same, "steps compared"] == 2
    assert check.loc[same, "s / step alone · shared"] == "0.25 · 0.75"
    assert check.loc[untimed, "s / step alone · shared"] == "no record of its host"
    assert prose.sharing_reading(checks) == (
        "3 probes of one search (colpali · recipe (grad-checkpointed), vanilla, the whole H200, default allocator) run "
        "again on a shared GPU, beside other probes, gave the same outcome and peaks for only 2 of them, as the same "
        "probes run without `--share-gpu`. Against the 2 of those runs that record having their GPU and host to "
        "themselves, the shared runs' steady step times were 2.0× to 3.0×, depending on what ran beside them.")  # fmt: skip
    # one twin recorded alone (B = 16: another beside B = 8 on the host) is too few: bytes only, no time column
    checks = shared_check_results(tmp_path / "one", {8: beside, 16: TIMED})
    assert sum(check.timed_alone for check in checks) == 1 < data.TIMED_TWINS_NEEDED
    assert data.timed_checks(checks) == []
    assert "s / step alone · shared" not in tables.sharing_check(checks)
    assert prose.sharing_reading(checks).endswith(
        "as the same probes run without `--share-gpu`. Step times may be compared only between cells that owned their "
        "host, and only 1 of those 3 runs without `--share-gpu` records that it had its GPU and host to itself (a "
        "comparison needs at least 2 such runs with step times): the check compares bytes only, not step times.")
    # no twin with a record (every committed one today): bytes only
    checks = shared_check_results(tmp_path / "none", {})
    assert [check.slowdown for check in checks] == [None, None, None]
    assert list(tables.sharing_check(checks).columns)[-1] == "identical"
    assert prose.sharing_reading(checks).endswith(
        "none of those 3 runs without `--share-gpu` records that it had its GPU and host to itself: the check "
        "compares bytes only, not step times.")
    assert prose.sharing_reading(data.shared_checks(tmp_path / "nothing")) == "No shared-GPU check has been committed yet."


def test_the_committed_shared_gpu_check_compares_times_only_against_twins_recorded_alone():
    checks = data.shared_checks()
    recorded = [check for check in checks if check.alone.timed_alone]
    table = tables.sharing_check(checks)
    text = prose.sharing_reading(checks)
    assert len(table) == len(checks) > 0 and (table["identical"] == "yes").sum() == sum(c.identical for c in checks)
    if len(recorded) < data.TIMED_TWINS_NEEDED:
        assert "s / step alone · shared" not in table and "×" not in text
        assert text.endswith("the check compares bytes only, not step times.")
    else:
        slowdowns = [check.shared.steady_step_time_sec / check.alone.steady_step_time_sec for check in recorded
                     if check.shared.steady_step_time_sec and check.alone.steady_step_time_sec]  # fmt: skip
        assert f"{min(slowdowns):.1f}× to {max(slowdowns):.1f}×" in text


def test_the_cross_card_check_sets_each_probe_beside_its_h200_twin(tmp_path):
    per_step = dict(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[120.0, 130.0])
    for batch, reserved in ((8, 130.0), (16, 136.0)):
        write_result(on_gpu(make_result(grid="ceilings", batch_size=batch, **per_step), "NVIDIA H200"),
                     tmp_path / "ceilings" / f"b{batch}.json")  # fmt: skip
        other = make_result(grid=data.CROSS_CARD, batch_size=batch, step_peak_reserved_mib=reserved,
                            **{**per_step, "step_peak_reserved_per_step_mib": [120.0, reserved]})  # fmt: skip
        write_result(on_gpu(other, "NVIDIA H100 80GB HBM3"), tmp_path / "check" / f"b{batch}.json")
    write_result(on_gpu(make_result(grid=data.CROSS_CARD, batch_size=32), "NVIDIA H100 80GB HBM3"),
                 tmp_path / "check" / "b32.json")  # no twin: left out
    checks = data.cross_card_checks(tmp_path)
    table = tables.card_check(checks).set_index("probe")
    same, moved = "colpali-plain-b8-vanilla-native", "colpali-plain-b16-vanilla-native"
    assert sorted(table.index) == sorted([same, moved])
    assert table.loc[same, "same as the H200"] == "to the byte" and table.loc[moved, "same as the H200"] == "no"
    assert table.loc[moved, "largest gap at a step, MiB (alloc · reserved)"] == "0 · 6"
    assert table.loc[same, "other GPU"] == "H100 80GB HBM3"
    devices = data.probe_devices(tmp_path)
    assert devices == {"NVIDIA H200": 2}
    assert prose.cross_card_reading(checks, devices) == (
        "Of the 2 committed ceiling probes, 2 ran on an H200. 2 probes of 1 search (colpali · recipe (grad-checkpointed), "
        "vanilla, the whole H200, default allocator) run again on an H100 80GB HBM3 under the same caps gave the same "
        "outcome and peaks for only 1 of them (at most 0 MiB allocated and 6 MiB reserved apart at a step): a probe's "
        "bytes depend on the GPU, so the ceiling searches take probes from an H200 only.")  # fmt: skip
    identical = [check for check in checks if check.identical]
    assert prose.cross_card_reading(identical, devices).endswith(
        "gave the same outcome and the same peaks to the byte, step by step, as on the H200. Until the check has finished "
        "each of its searches on the H100 80GB HBM3, with such a twin for each, the capped searches take no probe from it.")
    assert prose.cross_card_reading(identical, devices, vouched=frozenset({"NVIDIA H100 80GB HBM3"})).endswith(
        "as on the H200: the check vouches for the H100 80GB HBM3, so the capped searches take probes from it too.")
    assert prose.cross_card_reading([], devices).startswith("Of the 2 committed ceiling probes, 2 ran on an H200. No probe has")
    cells, _ = data.load(tmp_path)  # the check's results are not cells of any stack page
    assert cells.empty


def test_a_cross_card_gap_within_what_one_gpu_repeats_counts_as_the_same(tmp_path):
    """A GPU can be asked to agree with the H200 no better than the H200 agrees with itself: a check pair whose
    peaks differ by no more than two runs of a probe of the same stack and backend on one GPU (two grids' runs of
    one cell, same draw) measured the same; wider, or another outcome, it did not. The verdict and the page agree."""
    from harness.search import CROSS_CARD, repeat_spreads, vouched_devices

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    per_step = dict(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[120.0, 130.0])
    per_step["steps"] = 8  # (a ceiling probe's)
    write_result(on_gpu(make_result(grid="ceilings", batch_size=8, **per_step), h200), tmp_path / "ceilings" / "b8.json")
    moved = {**per_step, "step_peak_alloc_per_step_mib": [90.0, 101.0]}  # 1 MiB more allocated at one step
    write_result(on_gpu(make_result(grid=CROSS_CARD, batch_size=8, **moved), h100), tmp_path / CROSS_CARD / "b8.json")
    grid = tmp_path / "cross-card-check.yaml"
    grid.write_text(yaml.safe_dump({"name": CROSS_CARD, "searches": [
        {"stack": "colpali", "regime": "plain", "variant": "vanilla", "card": "native", "seeds": [42], "steps": 8,
         "start": 8, "step": 8, "limit": 8, "resolution": 4}]}))  # fmt: skip

    def verdict():
        (check,) = data.cross_card_checks(tmp_path)
        return check, vouched_devices(tmp_path, grid)

    check, vouched = verdict()
    assert not check.identical and not check.matches and vouched == frozenset()  # no repeat known: to the byte
    assert tables.card_check([check])["same as the H200"].tolist() == ["no"]
    # the same vanilla probe (another batch) run twice on the H200, by two grids, 0.5 MiB apart: still too narrow
    for name, alloc in (("published", 60.0), ("repeat", 60.5)):
        write_result(on_gpu(make_result(grid=name, batch_size=4, step_peak_alloc_per_step_mib=[50.0, alloc],
                                        step_peak_reserved_per_step_mib=[64.0, 64.0]), h200),
                     tmp_path / name / "b4.json")  # fmt: skip
    check, vouched = verdict()
    (spread,) = check.spreads.values()  # its runs tuned no kernel: a steady spread only
    assert (spread.alloc_mib, spread.reserved_mib, spread.grids, spread.phase) == (0.5, 0.0, ("published", "repeat"), "steady")
    assert not check.matches and vouched == frozenset()
    wider = make_result(grid="repeat", batch_size=4, step_peak_alloc_per_step_mib=[50.0, 62.0],
                        step_peak_reserved_per_step_mib=[64.0, 64.0])  # fmt: skip
    write_result(on_gpu(wider, h200), tmp_path / "repeat" / "b4.json")
    check, vouched = verdict()  # 2 MiB apart on one H200: the H100's 1 MiB is within it
    assert check.matches and vouched == {h100}
    assert repeat_spreads(result for _, result in data.read(tmp_path).found)[("colpali", "vanilla", "steady")].alloc_mib == 2.0
    assert tables.card_check([check])["same as the H200"].tolist() == ["within a repeat (2.0 · 0)"]
    text = prose.cross_card_reading([check], data.probe_devices(tmp_path), vouched=vouched)
    assert ("gave the same outcome as on the H200; its peaks (ColQwen2 vanilla on 141 GB (whole H200) at B=8, seed 42) "
            "differ by at most 1.0 MiB "
            "allocated and 0 MiB reserved at a step, no further than the same stack and backend's probe "
            "colpali-plain-b4-vanilla-native measured in two runs on an H200 (2.0 MiB allocated and 0 MiB reserved apart "
            "at the steps that tuned no kernel, grids published and repeat): within what one GPU repeats, so the check "
            "counts it as the same. The check vouches for the H100 80GB HBM3") in text  # fmt: skip
    # another outcome is never within a repeat
    failed = make_result(grid=CROSS_CARD, batch_size=8, outcome="oom", **moved)
    write_result(on_gpu(failed, h100), tmp_path / CROSS_CARD / "b8.json")
    check, vouched = verdict()
    assert not check.matches and vouched == frozenset()


def test_a_gap_at_a_kernel_tuning_step_licenses_no_gap_at_a_steady_step(tmp_path):
    """A fused kernel's autotuning allocates differently run to run: two runs of a lik probe on one H200 that differ
    by 48 MiB at the step that tuned the kernel (step 0) and not at all after it bound a cross-card pair's gap at
    such a step, never at a step that tuned nothing, which is then held to equality to the byte."""
    from harness.search import CROSS_CARD, phase_gaps, repeat_spreads, vouched_devices

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    tuned = dict(variant="lik", autotune_steps=[0], steps=8)
    for name, first in (("published", 50.0), ("repeat", 98.0)):  # 48 MiB apart at the tuning step, equal after it
        write_result(on_gpu(make_result(grid=name, batch_size=4, step_peak_alloc_per_step_mib=[first, 60.0],
                                        step_peak_reserved_per_step_mib=[64.0, 64.0], **tuned), h200),
                     tmp_path / name / "b4.json")  # fmt: skip
    per_step = dict(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[120.0, 130.0], **tuned)
    write_result(on_gpu(make_result(grid="ceilings", batch_size=8, **per_step), h200), tmp_path / "ceilings" / "b8.json")
    grid = tmp_path / "cross-card-check.yaml"
    grid.write_text(yaml.safe_dump({"name": CROSS_CARD, "searches": [
        {"stack": "colpali", "regime": "plain", "variant": "lik", "card": "native", "seeds": [42], "steps": 8,
         "start": 8, "step": 8, "limit": 8, "resolution": 4}]}))  # fmt: skip
    traced = make_result(grid="parity", batch_size=4, step_peak_alloc_per_step_mib=[50.0, 70.0], trace=True,
                         step_peak_reserved_per_step_mib=[64.0, 64.0], **tuned)  # fmt: skip
    write_result(on_gpu(traced, h200), tmp_path / "parity" / "b4.json")  # a traced run keeps more: no repeat
    spreads = repeat_spreads(result for _, result in data.read(tmp_path).found)
    assert {key: spread.alloc_mib for key, spread in spreads.items() if key[1] == "lik"} == {
        ("colpali", "lik", "autotune"): 48.0, ("colpali", "lik", "steady"): 0.0}

    def check_with(alloc):
        write_result(on_gpu(make_result(grid=CROSS_CARD, batch_size=8, **{**per_step, "step_peak_alloc_per_step_mib": alloc}),
                            h100), tmp_path / CROSS_CARD / "b8.json")  # fmt: skip
        (check,) = data.cross_card_checks(tmp_path)
        return check, vouched_devices(tmp_path, grid)

    check, vouched = check_with([110.0, 100.0])  # 20 MiB more at the tuning step: within its 48
    assert phase_gaps(check.other, check.h200) == {"autotune": (20.0, 0.0), "steady": (0.0, 0.0)}
    assert check.matches and vouched == {h100}
    assert tables.card_check([check])["same as the H200"].tolist() == ["within a repeat (48.0 · 0 at tuning)"]
    check, vouched = check_with([90.0, 101.0])  # 1 MiB more at a step that tuned nothing: held to the byte
    assert not check.matches and vouched == frozenset()
    assert tables.card_check([check])["same as the H200"].tolist() == ["no"]


def test_the_cross_card_check_leaves_out_a_twin_of_the_other_data_draw(tmp_path):
    """A probe's H200 twin that trained on the other draw of the data saw other batches: the pair compares
    draws as well as GPUs, so it is named apart and left out of the verdict."""
    def drawn(result, draw, gpu):
        return on_draw(result, f"synthetic:colpali_train_set:seed=42:{draw}", gpu)

    write_result(drawn(make_result(grid="ceilings", batch_size=8), "rows=64", "NVIDIA H200"), tmp_path / "ceilings" / "b8.json")
    write_result(drawn(make_result(grid="ceilings", batch_size=16), "stream=1048576", "NVIDIA H200"),
                 tmp_path / "ceilings" / "b16.json")  # fmt: skip
    for batch, outcome in ((8, "oom"), (16, "ok")):
        other = drawn(make_result(grid=data.CROSS_CARD, batch_size=batch, outcome=outcome), "stream=1048576",
                      "NVIDIA H100 80GB HBM3")  # fmt: skip
        write_result(other, tmp_path / "check" / f"b{batch}.json")
    checks, other_draws = data.cross_card_checks(tmp_path), data.cross_card_other_draws(tmp_path)
    assert [check.probe for check in checks] == ["colpali-plain-b16-vanilla-native"] and checks[0].identical
    assert [check.probe for check in other_draws] == ["colpali-plain-b8-vanilla-native"]
    gap = tables.card_check(checks)["largest gap at a step, MiB (alloc · reserved)"]
    assert list(gap) == ["no step both finished"]  # these records keep no per-step peaks
    text = prose.cross_card_reading(checks, data.probe_devices(tmp_path), other_draws)
    assert text.endswith("1 more probe of the check has an H200 twin only on the other draw of the data (stream against "
                         "rows), so it compares draws as well as GPUs and is left out of the verdict (ColQwen2: 0 of 1 the "
                         "same to the byte, and 1 of them another outcome).")  # fmt: skip
    assert "gave the same outcome and the same peaks to the byte" in text
    assert prose.cross_card_reading([], data.probe_devices(tmp_path), other_draws).split(". ")[1].startswith(
        "No probe has run again on another GPU on the same draw of the data yet")


def test_seeds_of_a_batch_run_beside_others_are_compared_per_backend():
    def probe(backend, seed, alloc, shared=24.96, batch=352, outcome="ok"):
        return {"stack": "pylate", "regime": "grad-checkpoint", "backend": backend, "card": "rtx4090-24gb",
                "allocator": "default", "batch_size": batch, "seed": seed, "outcome": outcome, "gpu_share_gib": shared,
                "step_peak_alloc_mib": alloc, "step_peak_reserved_mib": 22408.0}  # fmt: skip

    probes = pd.DataFrame([
        probe("lik", 42, 21526.9), probe("lik", 43, 21526.9), probe("lik", 44, 21526.9),
        probe("flash", 42, 21526.1), probe("flash", 43, 21526.2),  # a byte apart: they disagree
        probe("vanilla", 42, 1.0, shared=None), probe("vanilla", 43, 1.0, shared=None),  # alone: not this comparison
        probe("lik", 42, 1.0, batch=384, outcome="oom"), probe("lik", 43, 1.0, batch=384),  # not every seed trained
    ])  # fmt: skip
    assert prose.shared_seed_agreement(probes) == (
        "PyLate batches whose seeds all trained on a shared GPU (same shapes, run at different moments beside "
        "different neighbours) with identical allocated and reserved peaks for every seed: flash 0 of 1, lik 1 of 1.")
    assert prose.shared_seed_agreement(probes.iloc[5:7]) == ""
    assert prose.shared_probe_count(probes) == (
        "7 of the 9 committed probes were run under `--share-gpu`, beside whatever else fitted at the time. Of the "
        "other 2, 2 have no record of what ran beside them (they predate that record).")  # no timing columns: no record
    recorded = probes.assign(timing_recorded=[True] * 5 + [True, False] + [True] * 2,
                             timed_alone=[False] * 5 + [True, False] + [False] * 2)  # fmt: skip
    assert prose.shared_probe_count(recorded).endswith(
        "Of the other 2, 1 records that it had the GPU and the host to itself and 1 has no record of what ran beside it "
        "(it predates that record).")


@pytest.mark.pylate
def test_op_level_cells_give_a_speed_table_and_a_speedup_plot(tmp_path):
    from harness.opbench import run_op_cell
    from harness.spec import OpSpec, with_fields

    folder = tmp_path / "anywhere"
    expected, ratios = set(), []
    for batch in (2, 4):
        spec = OpSpec(stack="op-pylate", head="inbatch", batch_size=batch, reps=4, warmup=1, rotate=2, query_length=6,
                      doc_length=10, device="cpu")  # fmt: skip
        vanilla = run_op_cell(spec, folder / f"b{batch}-vanilla.json", grid="op")
        # times on the CPU are never the card's; marked as met (what a GPU cell alone on its host records),
        # the table shows them
        assert vanilla.timing is not None and not vanilla.timing.comparable
        # alone, too: a neighbour the host happened to show while the test ran would demote it (pinned check)
        alone = {"comparable": True, "reason": None, "neighbours": 0, "neighbours_on_own_cpus": 0, "gpu_shared": False}
        # and steady times of its own: a loaded CI host's CPU times can spread past a clear 2× interval
        times = [0.02] + [0.010 + 0.0002 * (k % 3) for k in range(len(vanilla.step_times_sec) - 1)]
        steady_steps = list(range(1, len(times)))  # the first step warms up; none retunes
        median = float(np.median([times[i] for i in steady_steps]))
        vanilla = vanilla.model_copy(update={"timing": vanilla.timing.model_copy(update=alone), "step_times_sec": times,
                                             "steady_steps": steady_steps, "autotune_steps": [0],
                                             "steady_step_time_sec": median})  # fmt: skip
        write_result(vanilla, folder / f"b{batch}-vanilla.json")
        # a fused cell cannot run on the CPU: the same record relabelled, twice as fast, stands in for it
        lik = with_fields(vanilla.spec, variant="lik")
        fused = vanilla.model_copy(update={
            "spec": lik, "cell_id": lik.cell_id, "steady_step_time_sec": vanilla.steady_step_time_sec / 2,
            "step_times_sec": [t / 2 for t in vanilla.step_times_sec],
            "maxsim_calls_isolated": [c.model_copy(update={"variant": "lik"}) for c in vanilla.maxsim_calls_isolated],
        })  # fmt: skip
        write_result(fused, folder / f"b{batch}-lik.json")
        steady = [vanilla.step_times_sec[i] for i in vanilla.steady_steps]
        ratio = timing.ratio(steady, [t / 2 for t in steady])
        assert ratio.value == pytest.approx(2.0)
        ratios.append(ratio)
        expected.add(timing.ratio_words(ratio, compact=True))  # the speed with its bootstrap 95% interval
    cells, calls = data.load(tmp_path)
    ops = data.op_level(cells, calls)
    table = tables.op_speed_table(ops)
    assert len(table) == 4 and set(table[tables.SPEED]) == {"", *expected}
    assert all(words.startswith("2.00× faster (") for words in expected)
    assert all(table["held + bwd spike (MiB)"] != "")
    assert list(tables.op_speed_tables(ops)) == ["pylate · inbatch"]
    untimed = ops.assign(times_comparable=False)  # measured before the timing rule: memory only
    assert set(tables.op_speed_table(untimed)["median (ms)"]) == {""} and tables.timed(untimed).empty
    assert plots.plot_op_speedup(untimed, "op") is None  # no time to draw: the op page shows nothing there
    assert plots.plot_op_speedup(pd.DataFrame(), "op") is None  # no op cell committed: nothing to draw
    figure = plots.plot_op_speedup(ops, "op")
    (bars,) = figure.axes[0].containers  # the lik speedup line with its intervals; the 1× reference beside it
    line, _, (spans,) = bars
    assert line.get_color() == style.colour("lik") and list(line.get_ydata()) == pytest.approx([2.0, 2.0])
    drawn = sorted(float(end) for (_, low), (_, high) in spans.get_segments() for end in (low, high))
    assert drawn == pytest.approx(sorted(end for r in ratios for end in (r.low, r.high)))  # each bootstrap 95% interval


def test_a_stack_page_screenshot_shows_its_table_and_plot(tmp_path, tmp_path_factory):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian's chromium (see .ci/run)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    page = committed_book(tmp_path_factory) / "pylate-grad-checkpoint.html"
    text = page.read_text()
    assert "per doubling" not in text  # legends live in the PNG, not the HTML
    assert text.count("<img") >= 2 and "Tried to allocate" in text
    shot = tmp_path / "page.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium'}", "--hide-scrollbars", "--window-size=1280,3200",
         f"--screenshot={shot}", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    ink = (pixels.sum(axis=2) < 600).mean()  # share of non-white pixels
    assert ink > 0.03, "the page looks blank"
    # the plots drew: pixels in matplotlib's first four colours (one per backend), which text never uses;
    # flash's blue may sit under lik's orange, whose points it equals, so three of the four must show
    backends = {"C0": (31, 119, 180), "C1": (255, 127, 14), "C2": (44, 160, 44), "C3": (214, 39, 40)}
    shown = {name: int((np.abs(pixels - np.array(rgb)).sum(axis=2) < 60).sum()) for name, rgb in backends.items()}
    assert sum(count >= 250 for count in shown.values()) >= 3, f"plot colours on the page (pixels): {shown}"


def test_a_backend_has_one_colour_in_every_figure_whatever_the_order(tmp_path):
    cells, calls = data.load(fixture_results(tmp_path / "results"))
    op = plots.plot_op_vram(calls, "op")
    only_lik = plots.plot_op_vram(calls[calls["backend"] == "lik"], "lik alone")  # lik is drawn first here
    steps = plots.plot_ceilings(cells, "peaks")

    def colour_of(figure, backend):
        found = {line.get_color() for line in figure.axes[0].lines if line.get_label().startswith(backend)}
        found |= {tuple(bar.patches[0].get_facecolor()[:3]) for bar in figure.axes[0].containers if bar.get_label() == backend}
        return found

    from matplotlib.colors import to_rgb

    assert colour_of(op, "lik") == colour_of(only_lik, "lik") == {style.colour("lik")}
    assert {to_rgb(c) for c in colour_of(steps, "lik")} == {to_rgb(style.colour("lik"))}
    assert style.colour("vanilla") != style.colour("lik") != style.colour("flash") != style.colour("vanilla + chunk 64")
    assert style.look("lik").marker != style.look("flash").marker  # equal points stay visible
    assert style.short("vanilla + chunk 64") == "chunk 64" and style.in_order(["flash", "vanilla", "lik"])[0] == "vanilla"


def test_numbers_never_read_minus_zero_and_cards_are_named_as_measured():
    assert text.percent(-0.04) == "0%" and text.percent(2.34) == "+2.3%"
    assert text.signed(-0.001) == "0" and text.sig(41) == "41.0" and text.sig(0.5644) == "0.564"
    assert text.mib(7195.5) == "7196" and text.mib(1.2558) == "1.26"
    assert text.card_label("h100-80gb") == "80 GB (H100 profile, capped at 78.43 GiB)"
    assert text.card_label("native") == "141 GB (the whole H200)"


def test_the_compact_ceiling_grid_heads_each_card_short_and_the_page_gives_every_cap_in_words():
    """ceilings.md's main tables head a column '80 GB (H100)' (a heading with its cap ran to six lines); the caps
    are said once above them, each card's from harness.spec.CARDS, and the grid's entries do not change."""
    from harness.spec import CARDS

    cards = ["native", "h100-80gb", "rtx4090-24gb"]
    assert [text.card_column(card) for card in cards] == ["141 GB (whole H200)", "80 GB (H100)", "24 GB (RTX4090)"]
    words = text.caps_words(cards)
    assert words.endswith("22.96 GiB for the 24 GB (RTX4090) and 78.43 GiB for the 80 GB (H100); "
                          "the 141 GB (whole H200) is uncapped")  # fmt: skip
    assert all(f"{CARDS[card].usable_gib:.2f} GiB" in words for card in cards[1:]) and text.caps_words(["native"]) == ""
    searches = data.ceilings()
    full, compact = tables.ceiling_grid(searches), tables.ceiling_grid(searches, compact=True)
    assert list(compact.columns) == [text.card_column(card) for card in text.cards_in_order(row.card for row in searches)]
    assert (full.to_numpy() == compact.to_numpy()).all() and max(len(column) for column in compact.columns) <= 19
    page = (Path(__file__).parents[1] / "book" / "ceilings.md").read_text()
    assert page.count("compact=True") == 2 and "caps_words(" in page


def test_card_labels_name_the_gpu_the_harness_admits_for_capped_probes(monkeypatch):
    """The GPU in every card label and heading is harness.search.REFERENCE_GPU, the one the ceiling searches admit
    for a capped probe, never a literal of its own: another reference GPU renames every label, and no 'H200' is left."""
    from harness.report import display
    from harness.search import REFERENCE_GPU

    assert REFERENCE_GPU == "H200"  # what the labels pinned above say
    monkeypatch.setattr(text, "REFERENCE_GPU", "H300")
    monkeypatch.setattr(display, "REFERENCE_GPU", "H300")
    shown = [text.card_label("h100-80gb"), text.card_label("native"), text.card_label("native", lines=True),
             text.card_short("native"), display.card_heading("h100-80gb"), display.card_heading("native")]  # fmt: skip
    assert shown[:4] == ["80 GB (H100 profile, capped at 78.43 GiB)", "141 GB (the whole H300)", "141 GB\nthe whole\nH300",
                         "141 GB (whole H300)"]  # fmt: skip
    assert shown[5] == "**141 GB card: the whole H300**, uncapped"
    assert "measured on an H300 whose allocator" in shown[4] and not any("H200" in label for label in shown)


def test_a_capped_cards_heading_names_every_gpu_its_rows_ran_on():
    """A capped card's label names no GPU (its probes may come from a GPU the cross-card check vouches for); its
    heading over a table names the GPUs the table's rows ran on, the reference GPU first, and an H200 where they
    name none."""
    from harness.report.display import card_heading

    assert "(H100 profile, capped at 78.43 GiB)" in text.card_label("h100-80gb") and "H200" not in text.card_label("h100-80gb")
    both = card_heading("rtx4090-24gb", gpus=["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H200"])
    assert both.startswith("**24 GB card (RTX4090 profile)** — measured on an H200 or an H100 80GB HBM3 whose allocator is "
                           "capped at 22.96 GiB")  # fmt: skip
    assert "measured on an H200 whose" in card_heading("rtx4090-24gb", gpus=[])


def test_no_table_built_from_the_committed_results_shows_nan_none_or_minus_zero():
    results = data.read()
    cells, calls = data.load(results)
    searches = data.ceilings(results)
    built = [tables.ceiling_grid(searches), tables.ceiling_grid(searches, "expandable"), tables.ceiling_details(searches),
             *tables.ceiling_details_by_stack(searches).values(),
             tables.op_speed_table(data.op_level(cells, calls)), *tables.op_speed_tables(data.op_level(cells, calls)).values()]
    for stack, regime in (("colpali", "plain"), ("pylate", "grad-checkpoint"), ("pylate", "plain")):
        mine, replays = data.select(cells, stack, regime), data.select(calls, stack, regime)
        for _card, group in mine.groupby("card"):
            built += [tables.ceiling_table(group), tables.fragmentation_table(group), tables.step_time_table(group)]
        for _card, group in replays.groupby("card"):
            built.append(tables.op_vram_table(group))
        built.append(tables.published_comparison(mine, data.published(stack, regime)))
        if not data.published_op(data.published(stack, regime)).empty:
            built.append(tables.published_op_comparison(replays, data.published(stack, regime)))
    assert len(built) > 10
    for table in built:
        shown = [str(v) for v in table.to_numpy().ravel()] + [str(c) for c in table.columns]
        # minus zero ("-0.0", "-0.00 GiB", "-0%"), not a small negative such as a headroom of "-0.01"
        minus_zero = re.compile(r"(?<![\d.])-0(?:\.0+)?(?![.\d])")
        assert not [v for v in shown if v in ("nan", "NaN", "None", "<NA>") or minus_zero.search(v)], table


def test_the_colqwen2_op_table_says_why_two_rows_of_one_batch_predict_different_memory():
    cells, calls = data.load()
    sentence = prose.prediction_shapes(data.select(calls, "colpali", "plain"))
    assert sentence.startswith("**Why two rows of one batch predict different vanilla memory.**")
    # the vanilla B=128 cell on the 80 GB card ran out of memory early: it recorded fewer calls than lik's
    oom = cells.query("stack == 'colpali' and batch_size == 128 and backend == 'vanilla' and card == 'h100-80gb'").iloc[0]
    assert oom["outcome"] == "oom"
    count = int(oom["n_calls_in_train"])
    assert f"at B=128 on 80 GB: vanilla's cell {count} call{'s' if count > 1 else ''}, the largest" in sentence


def test_the_ceilings_figure_shows_every_search_that_ran_finished_or_not():
    searches = [row for row in data.ceilings(data.read()) if row.stack == "colpali" and row.allocator == "default"]
    running = [row for row in searches if not row.done and (row.fits or row.fails)]
    assert running, "the committed results have a running colpali search"
    figure = plots.plot_ceiling_bars(searches, "colpali")
    ranges = [line for line in figure.axes[0].lines if len(line.get_xdata()) == 2]
    assert len(ranges) == len([row for row in searches if row.fits or row.fails])
    assert sum(line.get_linestyle() == "--" for line in ranges) == len(running)


HELD_OOM = ("CUDA out of memory. Tried to allocate {request}. GPU 0 has a total capacity of 139.80 GiB of which 62.35 GiB "
            "is free. Including non-PyTorch memory, this process has 77.43 GiB memory in use. 78.43 GiB allowed; Of the "
            "allocated memory 52.06 GiB is allocated by PyTorch, and 24.61 GiB is reserved by PyTorch but unallocated.")


def test_an_oom_cell_is_marked_in_the_fragmentation_table_and_card_headings_say_the_h200(tmp_path):
    from harness.report.display import card_heading

    cells, _ = data.load(fixture_results(tmp_path / "results"))
    table = tables.fragmentation_table(data.select(cells, "pylate", "grad-checkpoint"))
    assert table.loc[1024, "vanilla"] == "10.00 (OOM)" and table.loc[512, "vanilla"] == "5.00"
    assert card_heading("h100-80gb").startswith("**80 GB card (H100 profile)** — measured on an H200 whose allocator is "
                                                "capped at 78.43 GiB")  # fmt: skip
    assert card_heading("native") == "**141 GB card: the whole H200**, uncapped"


def test_what_fails_first_and_why_is_read_from_the_results(tmp_path):
    cells, _ = data.load(fixture_results(tmp_path / "results"))
    assert prose.peaks_compared(cells, "pylate", "grad-checkpoint", 512, ["vanilla", "lik"]) == (
        "lik's step peak allocated is 22.50 GiB below vanilla's")
    small = pd.Series({"oom_message": HELD_OOM.format(request="1.79 GiB")})
    assert prose.oom_cause(small).startswith("the 1.79 GiB request failed with more than that free in reserved blocks — "
                                             "its error message, written when the request failed, counts ")
    large = pd.Series({"oom_message": HELD_OOM.format(request="30.00 GiB")})
    assert prose.oom_cause(large).startswith("the 30.00 GiB request was larger than all the reserved memory free")
    assert prose.oom_cause(pd.Series({"oom_message": OOM})) == ""  # the message does not say: no cause claimed


def test_the_allocator_verdict_follows_the_probes():
    def probe(allocator, seed, outcome):
        return {"stack": "pylate", "regime": "grad-checkpoint", "backend": "vanilla", "card": "rtx4090-24gb",
                "allocator": allocator, "batch_size": 256, "seed": seed, "outcome": outcome}  # fmt: skip

    differ = pd.DataFrame([probe("default", 42, "oom"), *(probe("expandable", s, "ok") for s in (42, 43, 44))])
    same = pd.DataFrame([probe("default", 42, "ok"), probe("expandable", 42, "ok")])
    args = ("pylate", "grad-checkpoint", 256, "vanilla", "rtx4090-24gb")
    decides = "at that batch the allocator setting alone decides whether vanilla scoring trains"
    assert prose.allocator_verdict(differ, *args) == decides
    unchanged = "at that batch the allocator setting does not change the outcome (it trains under both)"
    assert prose.allocator_verdict(same, *args) == unchanged
    assert prose.allocator_verdict(differ[differ["allocator"] == "default"], *args) == ""  # one setting not probed


def test_the_published_op_figures_stay_apart_and_are_compared_with_ours(tmp_path):
    for variant, held, spike in (("vanilla", 2509.0, 5645.0), ("lik", 4.0, 53.0)):
        call = make_call(variant=variant, query_shape=[128, 52, 128], doc_shape=[128, 771, 128], saved_for_backward_mib=held,
                         backward_transient_peak_mib=spike, forward_transient_peak_mib=held, predicted_grid_mib=2506.0,
                         predicted_saved_for_backward_mib=2509.0)  # fmt: skip
        write_result(make_result(stack="colpali", regime="plain", batch_size=128, variant=variant, card="h100-80gb",
                                 maxsim_calls_isolated=[call]), tmp_path / f"{variant}.json")  # fmt: skip
    _, calls = data.load(tmp_path)
    published = data.published("colpali", "plain")
    table = tables.published_op_comparison(calls, published).set_index(["batch", "backend", "run"])
    assert list(table.columns) == ["query × doc tokens", "held", "backward spike", "total", "spike ÷ held"]
    published_row, ours = table.loc[(128, "vanilla", "published")], table.loc[(128, "vanilla", "ours")]
    assert [published_row[c] for c in ("held", "backward spike", "total", "spike ÷ held")] == [
        text.nowrap("2.40 GiB"), text.nowrap("5.41 GiB"), text.nowrap("7.81 GiB"), "2.25×"]
    assert [ours[c] for c in ("query × doc tokens", "held", "backward spike", "total", "spike ÷ held")] == [
        text.nowrap("52 × 771"), text.nowrap("2.45 GiB"), text.nowrap("5.51 GiB"), text.nowrap("7.96 GiB"), "2.25×"]
    assert table.loc[(64, "vanilla", "ours"), "total"] == "—"  # no cell of ours at 64
    reading = prose.published_op_reading(calls, published)
    assert "at B=128 the published figure is 2.40 GiB held + 5.41 GiB backward spike = 7.81 GiB, ours 2.45 GiB + " \
           "5.51 GiB = 7.96 GiB (+2.0%)" in reading
    assert "In both runs the backward spike is 2.25× the held memory" in reading


def test_show_shows_nothing_for_a_missing_figure_or_an_empty_table_and_no_page_decides_that_itself(monkeypatch):
    """A page calls ``show`` unconditioned (op.md's speedup figure, the gathered and GradCache figures, the
    long-run figure, the stack pages' published step times): the report function returns None where it has
    nothing to draw, and ``show`` shows nothing for None or an empty table, as ``markdown`` does for ''."""
    import IPython.display

    from harness.report import display

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    for nothing in (None, pd.DataFrame(), pd.DataFrame(columns=["batch", "backend"])):
        display.show(nothing)
    assert shown == []
    display.show(pd.DataFrame({"batch": [64]}))
    assert len(shown) == 1
    guarded = re.compile(r"^if (?:not )?(.*?)(?: is not None|\.empty):\n\s+(?:display\.)?show\(", re.M)
    for page in sorted((ROOT / "book").glob("*.md")):
        assert not guarded.findall(page.read_text()), f"{page.name}: show() decides what to show, not the page"


def test_the_pages_say_which_gpus_the_capped_probes_ran_on(tmp_path):
    """intro.md, ceilings.md and methodology.md: 'capped to what PyTorch can use on such a card, on an H200, or for
    1 of the 3 capped probes on an H100 80GB HBM3, which the cross-card check has not vouched for' — counted from the
    ceiling probes of capped cards (a whole-H200 probe and another grid's result are not), with the check's verdict."""
    for batch, card, gpu in ((8, "h100-80gb", "NVIDIA H200"), (16, "h100-80gb", "NVIDIA H200"),
                             (24, "rtx4090-24gb", "NVIDIA H100 80GB HBM3"), (32, "native", "NVIDIA H200")):  # fmt: skip
        probe = on_gpu(make_result(grid="ceilings", batch_size=batch, card=card), gpu)
        write_result(probe, tmp_path / "ceilings" / f"b{batch}.json")
    write_result(on_gpu(make_result(grid="ours", batch_size=8, card="a100-40gb"), "NVIDIA A100"), tmp_path / "ours" / "b8.json")
    gpus = data.capped_probe_gpus(tmp_path)
    assert gpus.probes == {"NVIDIA H100 80GB HBM3": 1, "NVIDIA H200": 2} and gpus.vouched == frozenset()
    assert prose.capped_gpus_words(gpus) == (
        "on an H200, or for 1 of the 3 capped probes on an H100 80GB HBM3, which the cross-card check has not vouched for")
    vouched = data.CappedGpus(gpus.probes, frozenset({"NVIDIA H100 80GB HBM3"}))
    assert prose.capped_gpus_words(vouched).endswith("which the cross-card check vouches for")
    assert prose.capped_gpus_words(data.CappedGpus({"NVIDIA H200": 2}, frozenset())) == "on an H200"
    two = data.CappedGpus({"NVIDIA A100-SXM4-80GB": 3, "NVIDIA H100 80GB HBM3": 1, "NVIDIA H200": 2}, vouched.vouched)
    assert prose.capped_gpus_words(two) == (
        "on an H200, or for 3 of the 6 capped probes on an A100-SXM4-80GB, which the cross-card check has not vouched for; "
        "or for 1 of the 6 capped probes on an H100 80GB HBM3, which the cross-card check vouches for")
    assert prose.capped_gpus_words(data.CappedGpus({"NVIDIA GeForce RTX 4090": 2}, frozenset())) == (
        "on a GeForce RTX 4090 (2 of the 2 capped probes), which the cross-card check has not vouched for")
    assert prose.cross_card_intro(vouched).startswith(
        "The capped ceiling searches' probes ran on an H200, or for 1 of the 3 capped probes on an H100")


def test_the_check_says_which_settings_it_compared_and_which_probes_did_not_repeat_on_one_gpu(tmp_path, monkeypatch):
    """ceilings.md: 'The check compared ColQwen2 under expandable segments. Of the 2 capped probes the searches took
    from an H100 80GB HBM3, 1 is of a setting it did not compare: ColQwen2 under the default allocator.' and a probe
    the check and the search both ran on that GPU, on one draw, that ended at another step in each is named."""
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    steps = dict(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[120.0, 130.0])

    def probe(grid: str, batch: int, allocator: str, gpu: str, **fields):
        result = on_gpu(make_result(grid=grid, batch_size=batch, card="rtx4090-24gb", allocator=allocator, **fields), gpu)
        write_result(result, tmp_path / grid / f"{result.cell_id}-{gpu[-4:]}.json")

    probe("ceilings", 8, "expandable", h200, **steps)
    probe("cross-card-check", 8, "expandable", h100, **steps)  # the check's pair: equal to the byte
    probe("ceilings", 16, "expandable", h100, **steps)  # taken from the H100, a setting the check compared
    probe("ceilings", 40, "default", h100, outcome="oom", step_peak_alloc_per_step_mib=[90.0, 100.0, 110.0],
          step_peak_reserved_per_step_mib=[120.0, 130.0, 140.0])  # fmt: skip
    probe("cross-card-check", 40, "default", h100, outcome="oom", **steps)  # the same probe on the same GPU, a step sooner
    monkeypatch.setattr(data, "vouched_devices", lambda *_: frozenset({h100}))
    scope, reruns = data.vouch_scope(tmp_path), data.same_gpu_reruns(tmp_path)
    assert scope.compared == {("colpali", "expandable")}
    assert scope.admitted == {(h100, "colpali", "default"): 1, (h100, "colpali", "expandable"): 1}
    assert [(rerun.first.spec.batch_size, rerun.identical) for rerun in reruns] == [(40, False)]
    assert prose.vouch_scope_reading(scope, reruns) == (
        "The check compared ColQwen2 under expandable segments. Of the 2 capped probes the searches took from an H100 "
        "80GB HBM3, 1 is of a setting it did not compare: ColQwen2 under the default allocator. 1 probe ran twice on the "
        "same GPU and the same draw of the data (the check's run and the search's): ColQwen2 vanilla on 24 GB (default "
        "allocator) at B=40, seed 42, on an H100 80GB HBM3, ran out of memory at step 3 in the check's run and ran out "
        "of memory at step 4 in the search's: the same GPU did not repeat it to the byte.")  # fmt: skip
    monkeypatch.setattr(data, "vouched_devices", lambda *_: frozenset())
    assert prose.vouch_scope_reading(data.vouch_scope(tmp_path), reruns) == ""


def test_a_step_time_of_another_gpu_names_its_model_in_its_row_and_compares_only_with_that_gpu(tmp_path):
    """A step-time table holding a time of a GPU other than the H200 names every row's GPU by its model (the card's
    heading names it in full), and a backend's speed is its time against vanilla's on the same GPU, never across."""
    from harness.report.text import gpu_short

    assert [gpu_short(name) for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GeForce RTX 4090", "NVIDIA L40S")] == [
        "H100", "H200", "RTX\u00a04090", "L40S"]  # fmt: skip
    steady = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0]
    for variant, gpu, scale in (("vanilla", "NVIDIA H200", 1.0), ("lik", "NVIDIA H100 80GB HBM3", 0.5)):
        result = make_result(grid="ours", batch_size=8, variant=variant, step_times_sec=[5.0] + [t * scale for t in steady],
                             steady_steps=list(range(1, 9)), steady_step_time_sec=scale, samples_per_sec=8 / scale,
                             timing=TIMED)  # fmt: skip
        write_result(on_gpu(result, gpu), tmp_path / f"{variant}.json")
    cells, _ = data.load(tmp_path)
    table = tables.step_time_table(cells)
    assert len(table) == 2  # both timed under the timing rule
    assert table.set_index("backend")["GPU"].to_dict() == {"vanilla": "H200", "lik": "H100"}
    assert table.set_index("backend")["speed vs vanilla (95% interval)"]["lik"] == ""  # vanilla ran on another GPU
    write_result(on_gpu(load_result(tmp_path / "vanilla.json"), "NVIDIA H100 80GB HBM3"), tmp_path / "vanilla.json")
    table = tables.step_time_table(data.load(tmp_path)[0]).set_index("backend")
    assert "GPU" in table and table["speed vs vanilla (95% interval)"]["lik"].startswith("2")  # one GPU: 2× faster
