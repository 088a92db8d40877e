import argparse
import contextlib
import json

import pytest
import torch

from harness import backends
from harness import replay as replay_module
from harness.cli import main
from harness.memory import MIB, CpuMemoryProbe
from harness.ops import ColpaliInBatchMaxSim, OpShape, PylateColbertScores, op_for
from harness.replay import ReplayError, replay_call, replay_command, replay_shapes, shape_argument

COLPALI = ColpaliInBatchMaxSim()
PYLATE = PylateColbertScores()


def replay(op, shape, variant="vanilla"):
    probe = CpuMemoryProbe()
    with probe:
        return replay_call(op, shape, variant, probe)


def as_bytes(mib):
    return round(mib * MIB)


def test_colpali_vanilla_holds_grid_plus_amax_plus_scores_to_the_byte():
    bq, lq, bd, ld, dim = 8, 13, 6, 40, 32
    record = replay(COLPALI, OpShape((bq, lq, dim), (bd, ld, dim), "float32"))
    grid, amax, scores = bq * bd * lq * ld * 4, bq * bd * lq * 4, bq * bd * 4
    assert as_bytes(record.saved_for_backward_mib) == grid + amax + scores == 102_528
    assert as_bytes(record.forward_transient_peak_mib) == grid + amax + scores
    assert record.predicted_saved_for_backward_mib == record.saved_for_backward_mib
    assert record.predicted_grid_mib * MIB == grid
    # backward materialises at least one grid-sized gradient on top of what is held
    assert as_bytes(record.backward_transient_peak_mib) >= grid
    assert record.oom_in_replay is False and record.entry_point_calls is None


def test_colpali_vanilla_held_scales_with_the_square_of_the_batch():
    small = replay(COLPALI, OpShape((4, 8, 16), (4, 30, 16), "float32"))
    large = replay(COLPALI, OpShape((8, 8, 16), (8, 30, 16), "float32"))
    assert large.saved_for_backward_mib == pytest.approx(4 * small.saved_for_backward_mib)


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("query_mask", [False, True])
def test_pylate_per_slot_forward_transient_matches_its_formula(slots, query_mask):
    bq, lq, bd, ld, dim = 5, 7, 4, 24, 16
    shape = OpShape(
        (bq, lq, dim), (bd, slots, ld, dim), "float32",
        query_mask_shape=(bq, lq) if query_mask else None, doc_mask_shape=(bd, slots, ld),
    )  # fmt: skip
    record = replay(PYLATE, shape)
    slot_grid = bq * bd * lq * ld * 4
    doc_copy = bd * ld * dim * 4 if slots > 1 else 0  # a non-contiguous slot is copied for the matmul
    kept = doc_copy + bq * bd * lq * 8 + bq * bd * 4  # + int64 max indices + slot scores
    assert as_bytes(record.forward_transient_peak_mib) == 2 * slot_grid + doc_copy + (slots - 1) * kept
    assert as_bytes(record.saved_for_backward_mib) == slots * (doc_copy + bq * bd * lq * 8) + bq * bd * slots * 4
    assert record.predicted_forward_transient_mib == record.forward_transient_peak_mib
    assert record.predicted_saved_for_backward_mib == record.saved_for_backward_mib


def test_pylate_scores_are_query_major_and_respect_the_doc_mask():
    generator = torch.Generator().manual_seed(0)
    shape = OpShape((3, 4, 8), (2, 2, 5, 8), "float32", doc_mask_shape=(2, 2, 5))
    inputs = PYLATE.make_inputs(shape, torch.device("cpu"), generator)
    inputs["doc_mask"][1, 0, 3:] = False
    scores = PYLATE.forward("vanilla", inputs)
    assert scores.shape == (3, 4)
    q, d, m = inputs["query"], inputs["doc"], inputs["doc_mask"]
    expected = (torch.einsum("sh,th->st", q[2], d[1, 0]) * m[1, 0]).max(-1).values.sum()
    assert torch.allclose(scores[2, 1 * 2 + 0], expected)


@pytest.mark.parametrize("op,variant", [(COLPALI, "lik"), (PYLATE, "lik"), (PYLATE, "flash")])
def test_fused_variants_are_refused_on_cpu_never_replaced(op, variant):
    shape = OpShape((2, 4, 16), (2, 8, 16) if op is COLPALI else (2, 2, 8, 16), "float32")
    installed = backends.installed_version(backends.BACKENDS[variant].package) is not None
    expected = "never replaced by a fallback" if installed else "is not installed"
    with pytest.raises(backends.BackendUnavailable, match=expected):
        replay(op, shape, variant)


def test_unknown_and_unsupported_variants_are_clear_errors():
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        backends.check_supported("fast", "colpali")
    with pytest.raises(ValueError, match="variant 'flash' is not available for colpali; choose one of vanilla, lik"):
        backends.check_supported("flash", "colpali")
    with pytest.raises(ValueError, match="unknown variant 'flash' for the colpali MaxSim op"):
        replay(COLPALI, OpShape((2, 4, 16), (2, 8, 16), "float32"), "flash")
    with pytest.raises(ValueError, match="unknown stack"):
        op_for("colbert")


def test_an_oom_in_replay_is_a_recorded_marker(monkeypatch):
    def explode(variant, inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.81 GiB.\nmore detail")

    monkeypatch.setattr(COLPALI, "forward", explode)
    record = replay(COLPALI, OpShape((2, 4, 16), (2, 8, 16), "float32"))
    assert record.oom_in_replay and record.oom_message == "CUDA out of memory. Tried to allocate 7.81 GiB."
    assert record.saved_for_backward_mib is None and record.predicted_grid_mib > 0


class ScriptedWatch:
    """Stands in for harness.timing.AutotuneWatch: reports the autotuner runs it is told to."""

    def __init__(self, events):
        self.events = events

    @contextlib.contextmanager
    def active(self):
        yield self


def tuning_forward(monkeypatch, op, tuned_attempts):
    """Make ``op``'s forward allocate a 1 MiB scratch buffer (as an autotuner's benchmarks would)
    and the watch report an autotune run, on the first ``tuned_attempts`` attempts."""
    attempts = []
    original = op.forward

    def forward(variant, inputs):
        attempts.append(variant)
        scratch = torch.empty(MIB, dtype=torch.uint8) if len(attempts) <= tuned_attempts else None
        scores = original(variant, inputs)
        del scratch  # live through the op's own peak, then gone: a pure transient
        return scores

    watches = iter([ScriptedWatch(1 if i < tuned_attempts else 0) for i in range(replay_module.MAX_REPLAY_ATTEMPTS)])
    monkeypatch.setattr(op, "forward", forward)
    monkeypatch.setattr(replay_module, "_autotune_watch", lambda variant: next(watches))
    return attempts


def test_a_call_during_which_a_kernel_autotuned_is_measured_again(monkeypatch):
    shape = OpShape((4, 8, 16), (4, 30, 16), "float32")
    clean = replay(COLPALI, shape)
    attempts = tuning_forward(monkeypatch, COLPALI, tuned_attempts=1)
    record = replay(COLPALI, shape)
    assert len(attempts) == 2  # the tuned attempt, then the one kept
    assert record.forward_transient_peak_mib == clean.forward_transient_peak_mib
    assert record.backward_transient_peak_mib == clean.backward_transient_peak_mib


def test_the_retries_are_bounded_and_keep_the_last_measurement(monkeypatch):
    shape = OpShape((4, 8, 16), (4, 30, 16), "float32")
    clean = replay(COLPALI, shape)
    attempts = tuning_forward(monkeypatch, COLPALI, tuned_attempts=replay_module.MAX_REPLAY_ATTEMPTS)
    record = replay(COLPALI, shape)
    assert len(attempts) == replay_module.MAX_REPLAY_ATTEMPTS
    assert record.forward_transient_peak_mib == pytest.approx(clean.forward_transient_peak_mib + 1)


def test_an_oom_is_not_measured_again(monkeypatch):
    calls = []

    def explode(variant, inputs):
        calls.append(variant)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB.")

    monkeypatch.setattr(COLPALI, "forward", explode)
    monkeypatch.setattr(replay_module, "_autotune_watch", lambda variant: ScriptedWatch(1))
    record = replay(COLPALI, OpShape((2, 4, 16), (2, 8, 16), "float32"))
    assert record.oom_in_replay and len(calls) == 1


def test_the_vanilla_path_watches_no_autotuner():
    watch = replay_module._autotune_watch("vanilla")
    with watch.active():
        pass
    assert watch.events == 0


def test_replay_shapes_replays_each_distinct_shape_once():
    a = OpShape((2, 4, 16), (2, 8, 16), "float32")
    b = OpShape((2, 5, 16), (2, 8, 16), "float32")
    probe = CpuMemoryProbe()
    records = replay_shapes(COLPALI, [a, b, a, a], "vanilla", probe)
    assert [r.query_shape for r in records] == [[2, 4, 16], [2, 5, 16]]
    assert [r.call_index for r in records] == [0, 1]


def test_replay_command_line(tmp_path, capsys):
    output = tmp_path / "replay.json"
    code = main(["replay", "--library", "pylate", "--query-shape", "4,8,16", "--doc-shape", "4x2x30x16", "--device", "cpu",
                 "--output", str(output)])  # fmt: skip
    assert code == 0
    assert "pylate MaxSim replay on cpu: Q[4, 8, 16] D[4, 2, 30, 16] float32" in capsys.readouterr().out
    assert '"doc_mask_shape": [\n        4,\n        2,\n        30\n      ]' in output.read_text()
    (record,) = json.loads(output.read_text())["records"]
    # PyLate's in-batch scores on [4, 2, 30] documents: per slot, the int64 max indices, plus the scores
    assert round(record["saved_for_backward_mib"] * MIB) == 2 * (4 * 4 * 8 * 8 + 4 * 30 * 16 * 4) + 4 * 4 * 2 * 4
    assert record["saved_for_backward_mib"] == record["predicted_saved_for_backward_mib"]


def test_replay_command_returns_one_record_per_variant_without_a_mask(tmp_path):
    records = replay_command("pylate", ["vanilla", "vanilla"], (2, 4, 16), (2, 2, 8, 16), doc_mask=False, device="cpu")
    assert [r.variant for r in records] == ["vanilla", "vanilla"] and records[0].doc_mask_shape is None
    assert records[0].saved_for_backward_mib == records[1].saved_for_backward_mib  # the same bytes each time


@pytest.mark.parametrize(
    "library, variants, query, doc, device, output, message",
    [
        (
            "colpali",
            ["vanilla"],
            (2, 4, 16),
            (2, 2, 8, 16),
            "cpu",
            None,
            "colpali takes a 3-D query shape and a 3-D doc shape, got 3-D and 4-D",
        ),
        ("pylate", ["vanilla"], (2, 4, 16), (2, 8, 16), "cpu", None, "pylate takes a 3-D query shape and a 4-D doc shape"),
        ("colpali", ["vanilla"], (2, 4, 16), (2, 8, 32), "cpu", None, r"differ in dimension \(16 vs 32\)"),
        ("pylate", ["vanilla"], (3, 4, 16), (2, 2, 8, 16), "cpu", None, "batch 3 vs 2"),
        ("colpali", ["vanilla", "flash"], (2, 4, 16), (2, 8, 16), "cpu", None, "variant 'flash' is not available for colpali"),
        ("colpali", ["fast"], (2, 4, 16), (2, 8, 16), "cpu", None, "unknown variant 'fast'"),
        ("pylate", ["vanilla", "lik"], (2, 4, 16), (2, 2, 8, 16), "cpu", None, "variant 'lik'"),
        (
            "colpali",
            ["vanilla"],
            (2, 4, 16),
            (2, 8, 16),
            "cpu",
            "missing/replay.json",
            "the output's folder .*missing does not exist",
        ),
    ],
)
def test_replay_command_refuses_before_any_work(tmp_path, monkeypatch, library, variants, query, doc, device, output, message):
    monkeypatch.setattr(replay_module, "replay_shapes", lambda *args, **kwargs: pytest.fail("replayed before refusing"))
    monkeypatch.setattr(replay_module, "probe_for", lambda *args, **kwargs: pytest.fail("probed before refusing"))
    with pytest.raises(ReplayError, match=message):
        replay_command(library, variants, query, doc, device=device, output=None if output is None else tmp_path / output)


def test_replay_command_refuses_cuda_on_a_cpu_host():
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    with pytest.raises(ReplayError, match="no CUDA device is visible"):
        replay_command("colpali", ["vanilla"], (2, 4, 16), (2, 8, 16), device="cuda")


def test_shapes_on_the_command_line():
    assert shape_argument("128,51,128") == shape_argument("128x51x128") == (128, 51, 128)
    for text, message in (("4,a", "not a comma-separated list of integers"), ("4,0,2", "must have positive dimensions")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            shape_argument(text)


def test_the_replay_command_line_refuses_in_one_line_and_exits_2(capsys):
    for argv, message in (
        (["--query-shape", "4,8", "--doc-shape", "4,30,16"], "colpali takes a 3-D query shape"),
        (["--query-shape", "4,x,16", "--doc-shape", "4,30,16"], "is not a comma-separated list of integers"),
        (["--variant", "lik", "--query-shape", "4,8,16", "--doc-shape", "4,30,16"], "variant 'lik'"),
    ):
        assert main(["replay", "--library", "colpali", "--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("harness replay: ") and message in err and err.count("\n") == 1
