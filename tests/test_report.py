"""The stack pages render measured tables and plots: built from fixture results, shot in headless Chromium."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness import report
from harness.results import OpCall, write_result
from test_book import build
from test_results import make_result

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def replay(batch, variant, held_mib, oom=False):
    return OpCall(
        call_index=0, variant=variant, query_shape=[batch, 48, 128], doc_shape=[batch, 2, 300, 128], dtype="float32",
        forward_transient_peak_mib=None if oom else 2 * held_mib, saved_for_backward_mib=None if oom else held_mib,
        backward_transient_peak_mib=None if oom else held_mib, predicted_grid_mib=held_mib,
        predicted_forward_transient_mib=held_mib, predicted_saved_for_backward_mib=held_mib, oom_in_replay=oom,
        oom_message="CUDA out of memory. Tried to allocate 56.25 GiB." if oom else None,
    )  # fmt: skip


def fixture_results(root: Path) -> Path:
    """A small PyLate grad-checkpoint sweep: vanilla ×4 per doubling and OOM at 1024, lik ×2."""
    for batch, held in ((256, 100.0), (512, 400.0), (1024, 1600.0)):
        oom = batch == 1024
        cell = make_result(
            stack="pylate", regime="grad-checkpoint", batch_size=batch, variant="vanilla", card="h100-80gb",
            outcome="oom" if oom else "ok", oom_where="maxsim" if oom else None,
            oom_message="CUDA out of memory. Tried to allocate 56.25 GiB. GPU 0 has ..." if oom else None,
            step_peak_alloc_mib=batch * 100.0, step_peak_reserved_mib=batch * 110.0, step_times_sec=[3.0, 1.0, 1.0],
            steady_step_time_sec=None if oom else batch / 400, samples_per_sec=None if oom else 400.0,
            maxsim_calls_isolated=[replay(batch, "vanilla", held, oom=oom)],
        )  # fmt: skip
        write_result(cell, root / f"vanilla-{batch}.json")
        lik = make_result(
            stack="pylate", regime="grad-checkpoint", batch_size=batch, variant="lik", card="h100-80gb",
            step_peak_alloc_mib=batch * 55.0, step_peak_reserved_mib=batch * 58.0, step_times_sec=[9.0, 1.0, 1.0],
            steady_step_time_sec=batch / 450, samples_per_sec=450.0,
            maxsim_calls_isolated=[replay(batch, "lik", held / 25 * batch / 256)],
        )  # fmt: skip
        write_result(lik, root / f"lik-{batch}.json")
    return root


def test_doubling_factors_are_measured_from_the_points():
    assert report.doubling_factors(np.array([256, 512, 1024]), np.array([100.0, 400.0, 1600.0])) == pytest.approx(4.0)
    assert report.doubling_factors(np.array([256, 512]), np.array([4.0, 8.0])) == pytest.approx(2.0)


def test_tables_read_the_results(tmp_path):
    cells, calls = report.load(fixture_results(tmp_path / "results"))
    ceiling = report.ceiling_table(report.select(cells, "pylate", "grad-checkpoint"))
    assert ceiling.loc[512, "vanilla"] == "50.00 / 55.00"
    assert ceiling.loc[1024, "vanilla"].startswith("OOM in the MaxSim op (Tried to allocate 56.25 GiB; pre-OOM 100.00")
    times = report.step_time_table(cells)
    assert list(times[times["backend"] == "lik"]["speed vs vanilla"]) == ["1.12×", "1.12×", ""]  # no vanilla at 1024
    ops = report.op_vram_table(calls)
    assert ops[(ops["batch"] == 1024) & (ops["backend"] == "vanilla")]["held MiB"].item() == "OOM in replay"
    comparison = report.published_comparison(cells, "pylate", "grad-checkpoint")
    row = comparison[(comparison["batch"] == 1024) & (comparison["backend"] == "vanilla")].iloc[0]
    assert row["published"] == "OOM (asked 56.25 GiB)" and row["ours"] == "OOM (Tried to allocate 56.25 GiB)"


def test_a_stack_page_screenshot_shows_its_table_and_plot(tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian's chromium (see .ci/run)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    html = build(tmp_path, fixture_results(tmp_path / "results"))
    page = html / "book" / "pylate-grad-checkpoint.html"
    text = page.read_text()
    assert "×4.0 per doubling" not in text  # legends live in the PNG, not the HTML
    assert text.count("<img") >= 2 and "Tried to allocate 56.25 GiB" in text
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
    colourful = (np.ptp(pixels, axis=2) > 60).mean()  # saturated pixels: plot lines and bars, not text
    assert ink > 0.03, "the page looks blank"
    assert colourful > 0.005, "no plot colours on the page"


@pytest.mark.pylate
def test_op_level_cells_give_a_speed_table_and_a_speedup_plot(tmp_path):
    from harness.opbench import OpCellParams, run_op_cell
    from harness.results import write_result

    folder = tmp_path / "op" / "op-pylate" / "inbatch"
    for batch in (2, 4):
        vanilla = run_op_cell(OpCellParams(stack="op-pylate", head="inbatch", batch_size=batch, reps=4, warmup=1, rotate=2,
                                           query_length=6, doc_length=10, device="cpu", output=folder / f"b{batch}-vanilla.json"))  # fmt: skip
        # a fused cell cannot run on the CPU: the same record relabelled, twice as fast, stands in for it
        fused = vanilla.model_copy(update={
            "variant": "lik", "steady_step_time_sec": vanilla.steady_step_time_sec / 2,
            "maxsim_calls_isolated": [c.model_copy(update={"variant": "lik"}) for c in vanilla.maxsim_calls_isolated],
        })  # fmt: skip
        write_result(fused, folder / f"b{batch}-lik.json")
    cells, calls = report.load(tmp_path)
    table = report.op_speed_table(report.op_level(cells, calls))
    assert len(table) == 4 and set(table["speedup vs vanilla"]) == {"", "2.00×"}
    assert all(table["held + bwd spike MiB"] != "")
    figure = report.plot_op_speedup(report.op_level(cells, calls), "op")
    assert len(figure.axes[0].lines) == 2  # the lik speedup line and the 1× reference


def test_the_shared_gpu_check_sets_each_probe_beside_its_run_alone(tmp_path):
    per_step = dict(step_peak_alloc_per_step_mib=[90.0, 100.0], step_peak_reserved_per_step_mib=[120.0, 130.0])
    folder = Path("ceilings") / "colpali" / "plain"
    for name, shared_reserved in (("same.json", 130.0), ("moved.json", 132.0)):
        write_result(make_result(**per_step, steady_step_time_sec=0.25), tmp_path / folder / name)
        shared = make_result(**{**per_step, "step_peak_reserved_per_step_mib": [120.0, shared_reserved]},
                             step_peak_reserved_mib=shared_reserved, steady_step_time_sec=0.75 if name == "same.json" else 0.5,
                             gpu_share_gib=24.96)  # fmt: skip
        write_result(shared, tmp_path / report.SHARED_CHECK / folder / name)
    write_result(make_result(), tmp_path / report.SHARED_CHECK / folder / "no-twin.json")  # nothing to compare: left out
    check = report.sharing_check(tmp_path).set_index("probe")
    assert list(check.index) == ["moved", "same"]
    assert check.loc["same", "identical"] == "yes" and check.loc["moved", "identical"] == "no"
    assert check.loc["moved", "peak reserved MiB alone · shared"] == "130 · 132"
    assert check.loc["same", "GiB given on the shared GPU"] == "24.96"
    assert check.loc["same", "steps compared"] == 2
    assert report.sharing_reading(check.reset_index()) == (
        "2 probes run again on a shared GPU, beside other probes, gave the same outcome and peaks for only 1 of them, "
        "as on a GPU they had alone. Their steady step times were 2.0× to 3.0× those they had alone, depending on "
        "what ran beside them.")  # fmt: skip
    assert report.sharing_reading(report.sharing_check(tmp_path / "nothing")) == "No shared-GPU check has been committed yet."
    cells, _ = report.load(tmp_path)  # the check's results are not cells of any stack page
    assert cells.empty


def test_seeds_of_a_batch_run_beside_others_are_compared_per_backend():
    import pandas as pd

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
    assert report.shared_seed_agreement(probes) == (
        "PyLate batches whose seeds all trained on a shared GPU (same shapes, run at different moments beside "
        "different neighbours) with identical allocated and reserved peaks for every seed: flash 0 of 1, lik 1 of 1.")
    assert report.shared_seed_agreement(probes.iloc[5:7]) == ""
    assert report.shared_probe_count(probes).startswith("7 of the 9 committed probes were run under `--share-gpu`")
