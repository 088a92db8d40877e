"""Ceiling searches: the bracket-and-bisect walk, resuming from result files, the grid, and a real
probe through papermill (pylate environment, CPU)."""

from pathlib import Path

import pytest
import yaml

from harness import ceiling, report, sweep
from harness.ceiling import CeilingSearch, plan_search
from harness.ceiling import walk as walk_search
from harness.results import CellResult, load_result, write_result
from harness.sweep import CellRun, GridError

pytestmark = pytest.mark.pylate
ROOT = Path(__file__).resolve().parent.parent


def search(**fields) -> CeilingSearch:
    base = {"stack": "pylate", "regime": "grad-checkpoint", "variant": "vanilla", "card": "h100-80gb",
            "seeds": [42, 43], "start": 256, "limit": 8192, "resolution": 32}  # fmt: skip
    return CeilingSearch(**base | fields)


def walk(s: CeilingSearch, true_ceiling: int) -> tuple[ceiling.Ceiling, list[int]]:
    asked: list[int] = []

    def decide(batch: int) -> bool:
        asked.append(batch)
        return batch <= true_ceiling

    return walk_search(s, decide), asked


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
    with pytest.raises(ValueError, match="greater than or equal to 8"):
        search(steps=4)
    with pytest.raises(ValueError, match="multiples of resolution"):
        search(start=100)
    with pytest.raises(ValueError, match="seeds repeat"):
        search(seeds=[1, 1])
    grid = tmp_path / "bad.yaml"
    grid.write_text(yaml.safe_dump({"searches": [
        {"stack": "pylate", "regime": "plain", "variant": "vanilla", "card": "h100-40gb", "seeds": [1], "start": 8, "limit": 64, "resolution": 8},
        {"stack": "pylate", "regime": "plain", "variant": "vanilla", "card": "native", "allocator": "huge-pages", "seeds": [1], "start": 8, "limit": 64, "resolution": 8},
    ]}))  # fmt: skip
    with pytest.raises(GridError) as error:
        ceiling.load_searches(grid)
    assert "unknown card 'h100-40gb'" in str(error.value) and "unknown allocator 'huge-pages'" in str(error.value)


def test_the_committed_ceiling_grid_covers_every_card_backend_and_allocator():
    searches = ceiling.load_searches(ROOT / "grids" / "ceilings.yaml")
    cards = {s.card for s in searches}
    assert cards == {"rtx4090-24gb", "a100-40gb", "l40s-48gb", "h100-80gb", "native"}
    assert {s.allocator for s in searches if s.stack == "colpali"} == {"default", "expandable"}
    assert {(s.variant, s.score_mini_batch_size) for s in searches if s.stack == "pylate"} == {
        ("vanilla", None), ("lik", None), ("flash", None), ("vanilla", 64)}
    assert all(s.steps >= 8 and len(s.seeds) >= 3 for s in searches)
    assert len({s.search_id for s in searches}) == len(searches) == 70


def fake_probe(true_ceiling: int, crash_at: int | None = None, calls: list | None = None, reserved: float = 110.0):
    """A stand-in for the papermill run: writes the result an H100 with this true ceiling would give
    (100 MiB allocated and ``reserved`` MiB reserved per sample at the step peak)."""

    def run_one(plan, results_dir, notebooks_dir, gpu, gate=None):
        if calls is not None:
            calls.append((plan.batch_size, plan.seed))
        limit = true_ceiling[plan.seed] if isinstance(true_ceiling, dict) else true_ceiling
        outcome = "crashed" if plan.batch_size == crash_at else ("ok" if plan.batch_size <= limit else "oom")
        result = CellResult(
            stack=plan.stack, regime=plan.regime, batch_size=plan.batch_size, variant=plan.variant, card=plan.card,
            allocator=plan.allocator, steps=plan.steps, seed=plan.seed, preset=plan.preset, outcome=outcome,
            oom_message="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0" if outcome == "oom" else None,
            oom_where="maxsim" if outcome == "oom" else None,
            pre_oom_alloc_mib=plan.batch_size * 100.0 if outcome == "oom" else None,
            pre_oom_reserved_mib=plan.batch_size * reserved if outcome == "oom" else None,
            step_times_sec=[1.0] * (plan.steps if outcome == "ok" else 1),
            step_peak_alloc_mib=plan.batch_size * 100.0, step_peak_reserved_mib=plan.batch_size * reserved,
            step_peak_alloc_per_step_mib=[plan.batch_size * 100.0] * 2,
            step_peak_reserved_per_step_mib=[plan.batch_size * (reserved - 5.0), plan.batch_size * reserved],
        )  # fmt: skip
        write_result(result, plan.result_path(results_dir))
        return CellRun(plan, outcome, 0.0, gpu or "-")

    return run_one


def test_a_search_runs_its_probes_lazily_and_resumes_from_its_results(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700, calls=calls))
    s = search(limit=1024)
    result = ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    assert (result.fits, result.fails) == (672, 704)
    # the walk runs on the first seed; only the ceiling it ends on runs on every seed
    assert calls == [(256, 42), (512, 42), (1024, 42), (768, 42), (640, 42), (704, 42), (672, 42), (672, 43)]
    # resume: nothing is re-run
    monkeypatch.setattr(ceiling, "run_one", lambda *a, **k: pytest.fail("a finished search ran a probe"))
    assert ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None).fits == 672
    # the report reads the same state from the same files
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "ceilings", "searches": [s.model_dump(exclude={"grid"})]}))
    (row,) = report.ceilings(tmp_path, grid).to_dict("records")
    assert (row["fits"], row["fails"], row["probes"], row["fails where"]) == (672, 704, len(calls), "maxsim")
    assert row["peak reserved GiB"] == pytest.approx(672 * 110 / 1024)
    assert row["headroom GiB"] == pytest.approx(78.43 - 672 * 110 / 1024)
    assert row["fragmentation growth MiB"] == pytest.approx(672 * 5.0)
    assert report.ceiling_text(row) == "672"
    assert report.probe_headline(tmp_path, "pylate", "grad-checkpoint", 704, "vanilla", "h100-80gb") == (
        "runs out of memory in the MaxSim op after 1 of 8 steps (Tried to allocate 2.00 GiB; 68.75 GiB allocated, 75.62 GiB reserved)")
    assert report.probe_headline(tmp_path, "pylate", "grad-checkpoint", 672, "vanilla", "h100-80gb") == (
        "trains all 8 steps for each of the 2 seeds run (peak 65.62 GiB allocated, 72.19 GiB reserved)")
    assert report.probe_headline(tmp_path, "pylate", "plain", 672, "vanilla", "h100-80gb") == "not probed yet"
    assert report.binding_reading(report.ceilings(tmp_path, grid)) == [
        "pylate · grad-checkpoint on 80 GB (78.43 GiB): vanilla 672 (the next batch fails in the MaxSim op)."]
    table = report.ceiling_grid(report.ceilings(tmp_path, grid))
    assert table.loc[("pylate", "grad-checkpoint", "vanilla"), "80 GB (78.43 GiB)"] == "672"


def test_a_seed_that_fails_at_the_candidate_is_read_back_from_disk(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(ceiling, "run_one", fake_probe({42: 700, 43: 650}, calls=calls))
    result = ceiling.run_search(search(limit=1024), tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    assert (result.fits, result.fails) == (640, 672)
    assert calls[-3:] == [(672, 42), (672, 43), (640, 43)]
    assert ceiling.search_state(search(limit=1024), tmp_path) == (result, None)


def test_a_start_that_a_later_seed_fails_leaves_probes_off_the_walk_that_still_count(tmp_path, monkeypatch):
    # seed 42 fits at the start, 672; seed 43 does not: the walk read back now goes down from the
    # start and never meets the batches above it that seed 42 failed, which stay on disk
    monkeypatch.setattr(ceiling, "run_one", fake_probe({42: 700, 43: 650}))
    s = search(start=672, limit=2048)
    result = ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    assert (result.fits, result.fails) == (640, 672)
    assert sorted(ceiling.probed_batches(s, tmp_path)) == [320, 480, 576, 608, 640, 672, 704, 736, 832, 992, 1344]
    assert ceiling.search_state(s, tmp_path) == (result, None)


def test_a_search_edited_after_its_probes_ran_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700))
    ceiling.run_search(search(limit=1024), tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    edited = search(start=512, limit=1024)  # its walk no longer passes the probe at 256
    with pytest.raises(ceiling.ProbeMismatch, match=r"probes at B=\[256\] are not on this search's walk"):
        ceiling.search_state(edited, tmp_path)
    assert ceiling.search_state(search(limit=1024, resolution=16), tmp_path)[0].next_batch == 688  # finer: goes on
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "ceilings", "searches": [edited.model_dump(exclude={"grid"})]}))
    assert ceiling.main([str(grid), "--dry-run", "--results-dir", str(tmp_path)]) == 1


def test_a_crashed_probe_stops_its_search(tmp_path, monkeypatch):
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700, crash_at=512))
    s = search()
    result = ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    assert result.stopped == "probe pylate-grad-checkpoint-b512-vanilla-h100-80gb crashed" and result.fits == 256
    assert "stopped" in ceiling.describe(s, result)


def test_a_real_probe_runs_as_a_cell_with_its_allocator_in_its_environment(tmp_path):
    s = CeilingSearch(stack="pylate", regime="plain", variant="vanilla", card="native", allocator="expandable",
                      seeds=[42], steps=8, start=2, limit=2, resolution=2, preset="tiny", device="cpu", kernel="python3")  # fmt: skip
    result = ceiling.run_searches([s], tmp_path / "results", tmp_path / "cells", echo=lambda line: None, share_gib={None: 50.0})
    assert (result[0].fits, result[0].fails, result[0].done) == (2, None, True)
    probe = load_result(s.probe(2, 42).result_path(tmp_path / "results"))
    assert probe.outcome == "ok" and probe.allocator == "expandable" and len(probe.step_times_sec) == 8
    assert probe.gpu_share_gib is None  # an uncapped card measures alone even on a shared GPU
    assert probe.env.pytorch_cuda_alloc_conf == "expandable_segments:True"
    assert len(probe.step_peak_reserved_per_step_mib) == 8
    assert s.probe(2, 42).cell_id == "pylate-plain-b2-vanilla-native-expandable"
    assert s.probe(2, 43).cell_id == "pylate-plain-b2-vanilla-native-expandable-s43"


def test_probes_get_their_gpus_share_budget(tmp_path, monkeypatch):
    gates = []

    def run_one(plan, results_dir, notebooks_dir, gpu, gate=None):
        gates.append((gpu, gate.share_gib))
        return fake_probe(700)(plan, results_dir, notebooks_dir, gpu, gate)

    monkeypatch.setattr(ceiling, "run_one", run_one)
    monkeypatch.setattr(sweep, "gate_path", lambda gpu: tmp_path / f"gpu-{gpu}.lock")
    ceiling.run_searches([search(limit=1024)], tmp_path, tmp_path / "cells", gpus=["3"], echo=lambda line: None,
                         share_gib={"3": 120.5})  # fmt: skip
    assert gates and set(gates) == {("3", 120.5)}
    assert ceiling.share_budgets("60", ["0", "1"]) == {"0": 60.0, "1": 60.0}
    with pytest.raises(ValueError, match="GiB or nothing"):
        ceiling.share_budgets("half", ["0"])
    with pytest.raises(ValueError, match="positive"):
        ceiling.share_budgets("0", None)
    with pytest.raises(ValueError, match="too little for any capped probe"):
        ceiling.share_budgets("1.5", ["0"])
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    with pytest.raises(ValueError, match="pass --share-gpu GIB"):
        ceiling.share_budgets("free", ["0"])


def test_a_probe_the_device_starved_beside_others_runs_again_alone(tmp_path, monkeypatch):
    runs = []
    honest = fake_probe(700)

    def run_one(plan, results_dir, notebooks_dir, gpu, gate=None):
        runs.append((plan.batch_size, gate.share_gib))
        if gate.share_gib is not None and plan.batch_size == 512:  # starved on the shared GPU: a crash marker
            write_result(CellResult(stack=plan.stack, regime=plan.regime, batch_size=512, variant=plan.variant,
                                    card=plan.card, steps=plan.steps, seed=plan.seed, outcome="crashed"),
                         plan.result_path(results_dir))  # fmt: skip
            plan.log_path(results_dir).write_text("harness.cell.DeviceOutOfMemory: the device, not the cap, refused memory")
            return CellRun(plan, "crashed", 0.0, gpu or "-")
        return honest(plan, results_dir, notebooks_dir, gpu, gate)

    monkeypatch.setattr(ceiling, "run_one", run_one)
    s = search(limit=1024)
    gate = sweep.Gate(tmp_path / "gpu.lock", share_gib=100.0)
    result = ceiling.run_search(s, tmp_path, tmp_path / "cells", "0", gate, echo=lambda line: None)
    assert (result.fits, result.fails, result.stopped) == (672, 704, None)
    assert runs[:3] == [(256, 100.0), (512, 100.0), (512, None)]  # the starved probe ran again, alone


def test_an_unfinished_search_reads_as_its_bracket():
    row = {"stopped": None, "probes": 5, "done": False, "fits": 256, "fails": 512}
    assert report.ceiling_text(row) == "256–511 (searching)"
    assert report.ceiling_text(row | {"fails": None}) == "≥ 256 (searching)"
    assert report.ceiling_text(row | {"probes": 0}) == "not run"
    assert report.card_label("native") == "141 GB (whole device)"


def test_a_result_run_with_other_settings_is_not_taken_for_a_probe(tmp_path, monkeypatch):
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700))
    s = search(limit=256)
    ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    edited = s.model_copy(update={"steps": 12})  # the grid changed since: its probes must run again
    with pytest.raises(ceiling.ProbeMismatch, match="steps, preset, card, allocator"):
        ceiling.search_state(edited, tmp_path)
    (stopped,) = ceiling.run_searches([edited], tmp_path, tmp_path / "cells", echo=lambda line: None)
    assert stopped.stopped.startswith("ProbeMismatch")  # reported, and the other searches go on
    assert ceiling.main([str(ROOT / "grids" / "ceilings.yaml"), "--match", "no-such-search*"]) == 2


def test_a_crashed_probe_runs_again_once_with_rerun_crashed(tmp_path, monkeypatch):
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700, crash_at=512))
    s = search(limit=1024)
    assert ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None).stopped
    calls: list = []
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700, calls=calls))  # the crash was transient
    result = ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None, rerun_crashed=True)
    assert calls[0] == (512, 42) and (result.fits, result.fails) == (672, 704)


def test_the_reading_compares_the_fused_ceiling_with_vanillas(tmp_path, monkeypatch):
    vanilla, fused = search(limit=2048), search(variant="lik", limit=2048)
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700))
    ceiling.run_search(vanilla, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    monkeypatch.setattr(ceiling, "run_one", fake_probe(1400))
    ceiling.run_search(fused, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "ceilings", "searches": [s.model_dump(exclude={"grid"}) for s in (vanilla, fused)]}))
    (line,) = report.binding_reading(report.ceilings(tmp_path, grid))
    assert line.startswith("pylate · grad-checkpoint on 80 GB (78.43 GiB): vanilla 672 (the next batch fails in the MaxSim op); lik 1376")
    assert line.endswith("the fused kernels train 2.05× vanilla's batch.")


def test_the_allocator_reading_sets_each_ceiling_beside_its_fragmentation(tmp_path, monkeypatch):
    default, expandable, alone = search(limit=2048), search(allocator="expandable", limit=2048), search(variant="lik", limit=2048)
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700, reserved=110.0))  # 10 MiB a sample reserved, unused
    ceiling.run_search(default, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    monkeypatch.setattr(ceiling, "run_one", fake_probe(760, reserved=101.0))
    ceiling.run_search(expandable, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "ceilings", "searches": [s.model_dump(exclude={"grid"}) for s in (default, expandable, alone)]}))
    searches = report.ceilings(tmp_path, grid)
    (line,) = report.allocator_reading(searches)  # lik ran under one allocator only: no line
    assert line == (
        "pylate · grad-checkpoint, vanilla on 80 GB (78.43 GiB): 672 with the default allocator, 736 with expandable "
        f"segments (reserved − allocated at the ceiling: {672 * 10 / 1024:.2f} → {736 * 1 / 1024:.2f} GiB).")
    assert report.ceiling_of(searches, "pylate", "grad-checkpoint", "vanilla", "h100-80gb", "expandable") == "736"
    assert report.ceiling_of(searches, "pylate", "grad-checkpoint", "lik", "h100-80gb") == "not run"
    assert report.ceiling_of(searches, "pylate", "plain", "vanilla", "h100-80gb") == "not searched"
    assert report.settled_ceiling(report.ceiling_row(searches, "pylate", "grad-checkpoint", "vanilla", "h100-80gb")) == 672
    assert report.settled_ceiling(report.ceiling_row(searches, "pylate", "grad-checkpoint", "lik", "h100-80gb")) is None
    assert report.settled_ceiling(None) is None
    assert report.probe_seeds(tmp_path, "pylate", "grad-checkpoint", 672, "vanilla", "h100-80gb") == [
        "seed 42 trains all 8 steps (peak 65.62 GiB allocated, 72.19 GiB reserved)",
        "seed 43 trains all 8 steps (peak 65.62 GiB allocated, 72.19 GiB reserved)"]
    assert report.probe_seeds(tmp_path, "pylate", "grad-checkpoint", 704, "vanilla", "h100-80gb") == [
        "seed 42 runs out of memory in the MaxSim op after 1 of 8 steps (Tried to allocate 2.00 GiB; 68.75 GiB allocated, 75.62 GiB reserved)"]


def test_the_gains_over_vanilla_are_stated_only_for_finished_searches(tmp_path, monkeypatch):
    vanilla, fused, expandable = search(limit=2048), search(variant="lik", limit=2048), search(allocator="expandable", limit=2048)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "ceilings", "searches": [s.model_dump(exclude={"grid"}) for s in (vanilla, fused, expandable)]}))
    for s, true_ceiling in ((vanilla, 700), (fused, 1400)):
        monkeypatch.setattr(ceiling, "run_one", fake_probe(true_ceiling))
        ceiling.run_search(s, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    waiting = report.ceiling_gains(report.ceilings(tmp_path, grid), "pylate", "grad-checkpoint", "h100-80gb")
    assert waiting == "How far each choice moves the ceiling is stated once those searches have finished."
    monkeypatch.setattr(ceiling, "run_one", fake_probe(600))
    ceiling.run_search(expandable, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    assert report.ceiling_gains(report.ceilings(tmp_path, grid), "pylate", "grad-checkpoint", "h100-80gb") == (
        "Against vanilla scoring under the default allocator, the fused kernel trains 704 more (1376 against 672); "
        "expandable segments, with vanilla scoring kept, 96 fewer (576 against 672).")
    capped = search(variant="lik", limit=1024)  # a fused search that stops at its limit: a lower bound
    elsewhere = tmp_path / "capped"
    for s, true_ceiling in ((vanilla, 700), (capped, 1400), (expandable, 600)):
        monkeypatch.setattr(ceiling, "run_one", fake_probe(true_ceiling))
        ceiling.run_search(s, elsewhere, tmp_path / "cells", None, None, echo=lambda line: None)
    grid.write_text(yaml.safe_dump({"name": "ceilings", "searches": [s.model_dump(exclude={"grid"}) for s in (vanilla, capped, expandable)]}))
    rows = report.ceilings(elsewhere, grid)
    assert report.settled_ceiling(report.ceiling_row(rows, "pylate", "grad-checkpoint", "lik", "h100-80gb")) == 1024
    assert "the fused kernel trains at least 352 more (≥ 1024 against 672)" in report.ceiling_gains(rows, "pylate", "grad-checkpoint", "h100-80gb")
    with pytest.raises(ceiling.ProbeMismatch):  # the limit edited under the first folder's probes
        report.ceilings(tmp_path, grid)
    stopped = report.ceiling_row(rows, "pylate", "grad-checkpoint", "vanilla", "h100-80gb").copy()
    stopped["stopped"] = "probe x crashed"
    assert report.settled_ceiling(stopped) is None


def test_each_seed_of_a_probed_batch_is_read_out(tmp_path, monkeypatch):
    monkeypatch.setattr(ceiling, "run_one", fake_probe({42: 700, 43: 650}))
    ceiling.run_search(search(limit=1024), tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    assert report.seed_reading(tmp_path, "pylate", "grad-checkpoint", 672, "vanilla", "h100-80gb") == (
        "The ceiling search ran B=672 for 8 steps, with 2 seeds (each seed draws other data and lengths): "
        "seed 42 trains all 8 steps (peak 65.62 GiB allocated, 72.19 GiB reserved); seed 43 runs out of memory in the "
        "MaxSim op after 1 of 8 steps (Tried to allocate 2.00 GiB; 65.62 GiB allocated, 72.19 GiB reserved). "
        "Same batch, card and backend: whether it trains is decided by the draw.")
    assert report.seed_reading(tmp_path, "pylate", "grad-checkpoint", 640, "vanilla", "h100-80gb").endswith("reserved).")
    assert report.seed_reading(tmp_path, "pylate", "grad-checkpoint", 999, "vanilla", "h100-80gb") == ""


def test_every_probe_is_plotted_at_its_peaks_one_panel_per_allocator(tmp_path, monkeypatch):
    default, expandable = search(limit=2048), search(allocator="expandable", limit=2048)
    monkeypatch.setattr(ceiling, "run_one", fake_probe(700, reserved=110.0))
    ceiling.run_search(default, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    monkeypatch.setattr(ceiling, "run_one", fake_probe(760, reserved=101.0))
    ceiling.run_search(expandable, tmp_path, tmp_path / "cells", None, None, echo=lambda line: None)
    probes = report.ceiling_probes(tmp_path)
    figure = report.plot_probe_peaks(probes, "pylate · grad-checkpoint on 80 GB")
    left, right = figure.axes
    assert (left.get_title(), right.get_title()) == ("default allocator", "expandable allocator")
    allocated, reserved, failed = left.collections  # one backend: its three kinds of marker
    fits = probes[(probes["allocator"] == "default") & (probes["outcome"] == "ok")]
    assert sorted(allocated.get_offsets()[:, 1]) == pytest.approx(sorted(fits["batch_size"] * 100 / 1024))
    assert sorted(reserved.get_offsets()[:, 1]) == pytest.approx(sorted(fits["batch_size"] * 110 / 1024))
    assert sorted(failed.get_offsets()[:, 0]) == sorted(probes[(probes["allocator"] == "default") & (probes["outcome"] == "oom")]["batch_size"])
    assert report.ceiling_probes(tmp_path / "nothing").empty
