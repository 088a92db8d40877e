"""The pinned side-by-side check (grids/pinned-check.yaml) and the timing rule it decides: a cell timed
pinned to its own cores beside other cells is published only in a stack whose check vouches for it."""

from __future__ import annotations

from harness.grid import load_grid
from harness.report import data, prose, tables, timing
from harness.results import Timing, load_result, write_result
from test_results import make_result

ALONE = Timing(gpu="0", cpus="0-15", comparable=True)
PINNED = Timing(gpu="1", cpus="8-15", pinned=True, neighbours=1, comparable=True)


def cell(grid, stack, batch, variant, seconds, timing_record, **fields):
    regime = "plain"
    spec = dict(stack=stack, regime=regime, batch_size=batch, variant=variant, card="h100-80gb", steps=4, min_steady_steps=8)
    return make_result(grid, **spec, **fields, step_times_sec=[5.0] + [seconds] * 8, steady_steps=list(range(1, 9)),
                       timing=timing_record)  # fmt: skip


def write(root, result):
    return write_result(result, root / result.grid / result.stack / result.regime / f"{result.cell_id}.json")


def committed_like(root, pylate_pinned_seconds):
    """Four PyLate cells timed alone (published) and pinned (the check), and one of our cells that
    ran pinned beside another."""
    for batch, variant in [(64, "vanilla"), (64, "lik"), (128, "vanilla"), (128, "lik")]:
        write(root, cell("published", "pylate", batch, variant, 1.0, ALONE))
        write(root, cell("pinned-check", "pylate", batch, variant, pylate_pinned_seconds, PINNED))
    return write(root, cell("ours", "pylate", 256, "vanilla", 2.0, PINNED))


def test_a_stack_whose_pinned_cells_time_as_alone_may_be_timed_side_by_side(tmp_path):
    ours = committed_like(tmp_path, 1.02)  # 2% from alone: within the 3% the rule asks
    checks = data.pinned(tmp_path)
    assert len(checks) == 4 and all(check.alone == (1.0,) and check.agrees for check in checks)
    assert timing.pinned_verdicts(checks) == {"pylate": True}
    cells, _ = data.load(tmp_path)
    assert bool(cells[cells["path"] == str(ours)]["times_comparable"].iloc[0])
    assert "pylate: all 4 pinned cells time within 3% of alone (widest 2.0%)" in prose.pinned_reading(checks)
    assert list(tables.pinned_table(checks)["within 3%"]) == ["yes"] * 4


def test_a_stack_whose_pinned_cells_drift_keeps_its_pinned_times_unpublished(tmp_path):
    ours = committed_like(tmp_path, 1.05)  # 5% from alone
    checks = data.pinned(tmp_path)
    assert timing.pinned_verdicts(checks) == {"pylate": False}
    cells, _ = data.load(tmp_path)
    row = cells[cells["path"] == str(ours)].iloc[0]
    assert not row["times_comparable"]
    assert row["timing_reason"] == ("timed beside 1 other cell(s) on other cores, which the pinned check has not shown "
                                    "to time as alone for pylate")  # fmt: skip
    assert "pylate: 4 of 4 pinned cells time more than 3% from alone (widest 5.0%), so its cells are timed alone" in (
        prose.pinned_reading(checks))  # fmt: skip
    # alone cells keep their times whatever the check says
    alone = cells[(cells["grid"] == "published")]
    assert alone["times_comparable"].all()


def test_without_a_pinned_check_no_pinned_time_is_published(tmp_path):
    ours = write(tmp_path, cell("ours", "pylate", 256, "vanilla", 2.0, PINNED))
    # on other cores but not pinned by the launcher (two sweeps started by hand): the same rule
    unpinned = write(tmp_path, cell("ours", "pylate", 512, "vanilla", 4.0, PINNED.model_copy(update={"pinned": False})))
    cells, _ = data.load(tmp_path)
    assert not cells[cells["path"].isin([str(ours), str(unpinned)])]["times_comparable"].any()
    assert data.pinned(tmp_path) == [] and prose.pinned_reading([]).startswith("The pinned check")


def test_only_alone_runs_on_the_same_host_build_vouch(tmp_path):
    """Alone twins from another leased machine (another platform string) are not set beside a
    pinned run: another machine moves medians by more than the 3% the check asks."""
    committed_like(tmp_path, 1.02)
    for path in (tmp_path / "published").rglob("*.json"):
        result = load_result(path)
        write_result(result.model_copy(update={"env": result.env.model_copy(update={"platform": "another-host"})}), path)
    assert data.pinned(tmp_path) == []


def test_the_pinned_check_grid_holds_four_repeat_cells_per_stack():
    pinned = {c.cell_id: c.spec for c in load_grid(data.ROOT / "grids" / "pinned-check.yaml")}
    repeat = {c.cell_id: c.spec for c in load_grid(data.ROOT / "grids" / "repeat.yaml")}
    assert pinned == repeat
    for stack in ("colpali", "pylate"):
        assert sum(spec.stack == stack for spec in pinned.values()) >= timing.PINNED_MIN_CELLS
