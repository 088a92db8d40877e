"""The long runs at the 80 GB ceilings (grids/long-run.yaml) as the ceilings page reads them: every
planned cell listed, how each ended, and how reserved memory moved past the ceiling's 8-step horizon."""

from __future__ import annotations

from harness.grid import load_grid
from harness.report import data, longrun
from harness.results import write_result
from test_results import make_result

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
    # lik: out of memory in its 13th step
    failed = make_result("long-run", stack="colpali", regime="plain", batch_size=160, variant="lik", card="h100-80gb",
                         steps=20, outcome="oom", step_times_sec=[1.0] * 12, step_peak_reserved_per_step_mib=[2000.0] * 12,
                         step_peak_alloc_per_step_mib=[1800.0] * 12)  # fmt: skip
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
    assert list(table["outcome"]) == ["trained every step", "oom at step 13", "not run yet"]
    assert list(table["steps"]) == ["20 of 20", "12 of 20", "0 of 30"]
    assert list(table["after step 8: reserved / reserved − alloc (MiB)"]) == ["+512 / +512", "+0 / +0", ""]
    assert list(table["batch (search's ceiling)"]) == ["120 (no search)", "160 (no search)", "640 (no search)"]

    text = longrun.reading(runs)
    assert text.startswith("1 of the 2 long runs that ran trained every step at their batch")
    assert "colpali-plain-b160-lik-h100-80gb ran out of memory after 12 of 20 steps, so its 8-step ceiling" in text
    assert "512 MiB (colpali-plain-b120-vanilla-h100-80gb)" in text and "1 more have not run yet" in text
    assert longrun.plot(runs) is not None


def test_the_committed_long_run_grid_reads_with_or_without_results():
    runs = longrun.long_runs(data.read())
    assert len(runs) == len(load_grid(longrun.GRID_FILE)) >= 4
    table = longrun.table(runs, data.ceilings())
    assert len(table) == len(runs) and not table.isna().any().any()
    # the batch each long run trains is its search's settled 80 GB ceiling
    for run, shown in zip(runs, table["batch (search's ceiling)"], strict=True):
        assert shown in (f"{run.cell.spec.batch_size} ({run.cell.spec.batch_size})", f"{run.cell.spec.batch_size} (not settled)")
    if not any(run.result for run in runs):
        assert longrun.reading(runs).startswith(f"None of the {len(runs)} long runs has run yet")
