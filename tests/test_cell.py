"""The cell runner on CPU through a real transformers.Trainer (the toy stack in toy_stack.py)."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from harness import backends, provenance
from harness.cell import BackendPathError, CellError, check_backend_ran, resolve_auto, run_cell, validate
from harness.memory import MIB
from harness.results import load_result
from harness.spec import OpSpec, SpecError, TrainSpec, with_fields
from toy_stack import DIM, DOC_LENGTH, OOM_MESSAGE, QUERY_LENGTH, ToyStack, run_in_a_fresh_process

ROOT = Path(__file__).resolve().parent.parent


def spec(**overrides):
    """A resolved toy cell: the toy stack stands in for colpali's (see toy_stack.py)."""
    fields = dict(stack="colpali", regime="plain", batch_size=4, steps=3, preset="tiny", device="cpu")
    return TrainSpec(**(fields | overrides))


def test_a_cell_trains_records_every_call_and_replays_its_shape(tmp_path):
    stack = ToyStack()
    result = run_cell(spec(), tmp_path / "cell.json", stack=stack)
    assert result.outcome == "ok" and stack.specs == [spec()]  # the stack is built from the spec it was given
    assert result.spec == spec() and result.cell_id == "colpali-plain-b4-vanilla-native"
    assert len(result.step_times_sec) == 3 and result.steady_steps == [1, 2]
    assert result.samples_per_sec == pytest.approx(4 / result.steady_step_time_sec)
    # one MaxSim call per step, each with the real shapes, tagged with its step
    assert [c.step for c in result.maxsim_calls_in_train] == [0, 1, 2]
    for call in result.maxsim_calls_in_train:
        assert (call.query_shape, call.doc_shape, call.dtype) == ([4, QUERY_LENGTH, DIM], [4, DOC_LENGTH, DIM], "float32")
        # in train the head holds the grid, amax and scores plus the small loss tensors ([B, B] and scalars)
        extra = round((call.saved_for_backward_mib - call.predicted_saved_for_backward_mib) * MIB)
        assert 0 <= extra <= 4 * 4 * 4 * 4
    # the one distinct shape is replayed in isolation, exactly as predicted
    (isolated,) = result.maxsim_calls_isolated
    grid = 4 * 4 * QUERY_LENGTH * DOC_LENGTH * 4
    assert round(isolated.saved_for_backward_mib * MIB) == grid + 4 * 4 * QUERY_LENGTH * 4 + 4 * 4 * 4
    assert result.step_peak_alloc_mib >= isolated.saved_for_backward_mib
    assert result.step_peak_reserved_mib == result.step_peak_alloc_mib  # no caching allocator on CPU
    # each step's own peak: it holds the step's grid (B x B x Lq x Ld fp32) on top of the model, and
    # the run peak is the largest of them or was reached outside the steps
    per_step = result.step_peak_alloc_per_step_mib
    assert len(per_step) == len(result.step_peak_reserved_per_step_mib) == 3
    assert all(peak * MIB >= grid for peak in per_step) and max(per_step) <= result.step_peak_alloc_mib
    assert result.step_peak_reserved_per_step_mib == per_step  # CPU: reserved is allocated
    assert result.env.seed == 42 and result.env.packages["torch"] and result.env.model_source == "toy:random"
    # where the wall time went, phase by phase, within it
    assert set(result.phase_sec) == {"device", "build", "train", "replay"}
    assert all(seconds > 0 for seconds in result.phase_sec.values())
    assert sum(result.phase_sec.values()) <= result.wall_sec
    assert result.phase_sec["train"] >= sum(result.step_times_sec)
    assert load_result(tmp_path / "cell.json") == result


def test_a_cell_records_its_provenance_and_no_grid_when_run_by_hand(tmp_path):
    result = run_cell(spec(steps=2), tmp_path / "cell.json", stack=ToyStack())
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert result.grid is None  # a cell run by hand is never part of the report
    recorded = result.provenance
    assert (recorded.commit, recorded.dirty) == (head, bool(status.strip()))
    assert recorded.harness_sha256 == provenance.tree_sha256(ROOT / "harness") and len(recorded.harness_sha256) == 64
    assert recorded.notebook_sha256 is None and recorded.migrated_from_schema is None
    assert load_result(tmp_path / "cell.json").provenance == recorded
    # under a grid and from a notebook: both recorded, the notebook by its content
    notebook = Path("notebooks/colpali.ipynb")
    result = run_cell(spec(steps=2), tmp_path / "grid.json", grid="published", notebook=notebook, stack=ToyStack())
    assert result.grid == "published"
    assert result.provenance.notebook_sha256 == provenance.file_sha256(ROOT / notebook)


def test_an_oom_inside_the_op_is_an_outcome_with_its_message_and_replays_still_run(tmp_path):
    result = run_cell(spec(), tmp_path / "cell.json", stack=ToyStack(oom_in_head_at_step=1))
    assert result.outcome == "oom" and result.oom_where == "maxsim"
    assert result.oom_message == OOM_MESSAGE.splitlines()[0]
    first, failed = result.maxsim_calls_in_train
    assert not first.oom_in_forward and failed.oom_in_forward and failed.oom_message == result.oom_message
    assert failed.saved_for_backward_mib is None
    assert len(result.step_times_sec) == 1  # the step that died has no time
    assert result.phase_sec["train"] >= result.step_times_sec[0]  # timed up to the OOM
    assert result.pre_oom_alloc_mib == result.step_peak_alloc_mib > 0
    assert len(result.maxsim_calls_isolated) == 1 and not result.maxsim_calls_isolated[0].oom_in_replay
    assert load_result(tmp_path / "cell.json").outcome == "oom"


def test_an_oom_outside_the_op_is_recorded_as_elsewhere(tmp_path):
    result = run_cell(spec(), tmp_path / "cell.json", stack=ToyStack(oom_in_encoder_at_step=2))
    assert result.outcome == "oom" and result.oom_where == "elsewhere"
    assert [c.oom_in_forward for c in result.maxsim_calls_in_train] == [False, False]
    assert len(result.step_times_sec) == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(batch_size=0), "batch_size must be an integer of at least 1, got 0"),
        (dict(steps=0), "steps must be an integer of at least 1, got 0"),
        (dict(variant="fast"), "unknown variant 'fast'"),
        (dict(card="h300"), "unknown card 'h300'"),
        (dict(score_mini_batch_size=0), "score_mini_batch_size must be an integer of at least 1"),
        (dict(regime="ckpt"), "unknown regime for colpali 'ckpt'"),
        (dict(card="h100-80gb"), "emulation caps a CUDA device"),
        (dict(score_mini_batch_size=64), "PyLate's chunking"),
        (dict(variant="flash"), "variant 'flash' is not available for colpali"),
    ],
)
def test_bad_cells_fail_when_their_spec_is_made(overrides, message):
    with pytest.raises(SpecError, match=message):
        spec(**overrides)


@pytest.mark.parametrize(
    "cell, error, message",
    [
        (spec(variant="lik"), backends.BackendUnavailable, "lik"),
        (spec(stack="pylate"), CellError, "the spec is for stack 'pylate' but the stack given is 'colpali'"),
        # on a CPU host "auto" resolves to the CPU, where a card cannot be emulated: refused at resolution
        (TrainSpec(batch_size=4, steps=3, card="h100-80gb"), SpecError if not torch.cuda.is_available() else CellError, "CUDA"),
    ],
)
def test_cells_that_cannot_run_are_refused_before_anything_is_built(tmp_path, cell, error, message):
    stack = ToyStack()
    with pytest.raises(error, match=message):
        run_cell(cell, tmp_path / "cell.json", stack=stack)
    assert stack.builds == 0 and not (tmp_path / "cell.json").exists()


def test_an_unwritable_output_or_an_unresolved_spec_is_refused_before_training(tmp_path):
    stack = ToyStack()
    (tmp_path / "taken").mkdir()
    with pytest.raises(CellError, match="is a directory"):
        validate(spec(), tmp_path / "taken", stack)
    (tmp_path / "file").write_text("")
    with pytest.raises(CellError, match="cannot write the result"):
        validate(spec(), tmp_path / "file" / "cell.json", stack)
    with pytest.raises(CellError, match="resolve the spec first"):
        validate(spec(device="auto"), tmp_path / "cell.json", stack)
    assert stack.builds == 0


def test_the_specs_allocator_is_applied_before_cuda_starts_and_refused_after(tmp_path, monkeypatch):
    from harness import allocator

    monkeypatch.delenv(allocator.VARIABLE, raising=False)
    stack = ToyStack()
    validate(spec(allocator="expandable"), tmp_path / "cell.json", stack)
    assert allocator.current() == "expandable"
    validate(spec(), tmp_path / "cell.json", stack)
    assert allocator.VARIABLE not in os.environ  # back to the default
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # CUDA started under the default allocator:
    with pytest.raises(CellError, match="allocator 'expandable' must be set before CUDA starts"):
        run_cell(spec(allocator="expandable"), tmp_path / "cell.json", stack=stack)
    assert stack.builds == 0


def test_cuda_is_refused_clearly_on_a_cpu_host(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    with pytest.raises(CellError, match="no CUDA device is visible"):
        validate(spec(device="cuda"), tmp_path / "cell.json", ToyStack())


def test_the_command_line_refuses_a_bad_cell_in_one_line_and_exits_2(tmp_path, capsys):
    from harness.cli import main

    with pytest.raises(SystemExit) as exited:  # argparse: the flag's own type refuses it
        main(["cell", "--stack", "pylate", "--batch-size", "-1", "--output", str(tmp_path / "x.json")])
    assert exited.value.code == 2 and "argument --batch-size: must be at least 1, got -1" in capsys.readouterr().err
    code = main(["cell", "--stack", "colpali", "--score-mini-batch-size", "64", "--output", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("harness cell: score_mini_batch_size is PyLate's chunking") and err.count("\n") == 1
    code = main(["cell", "--stack", "pylate", "--warmup-steps", "4", "--steps", "4", "--output", str(tmp_path / "x.json")])
    assert code == 2 and "warmup_steps (4) must be below steps (4)" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_python_m_harness_cell_is_harness_cell():
    import sys

    completed = subprocess.run([sys.executable, "-m", "harness.cell", "--stack", "colpali", "--score-mini-batch-size", "64"],
                               capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert completed.returncode == 2
    assert completed.stderr == "harness cell: score_mini_batch_size is PyLate's chunking; the colpali stack has no such option.\n"


def test_a_cell_that_sees_two_gpus_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(CellError, match="sees 2 CUDA devices"):
        validate(spec(device="cuda"), tmp_path / "cell.json", ToyStack())


def test_auto_picks_the_device_and_preset_the_machine_can_run(monkeypatch):
    for cuda, expected in ((False, ("cpu", "tiny")), (True, ("cuda", "full"))):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        resolved = resolve_auto(TrainSpec())
        assert (resolved.device, resolved.preset) == expected
        assert resolved == with_fields(TrainSpec(), device=expected[0], preset=expected[1])  # nothing else changes
    resolved = resolve_auto(TrainSpec(device="cpu"))
    assert (resolved.device, resolved.preset) == ("cpu", "tiny")
    resolved = resolve_auto(TrainSpec(device="cpu", preset="full"))  # explicit choices are kept
    assert (resolved.device, resolved.preset) == ("cpu", "full")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    op = resolve_auto(OpSpec(device="auto"))
    assert op == OpSpec(device="cpu")  # an op cell has no preset to resolve


# --- check_backend_ran: the intended kernel ran on every call, and no other ----------------------------


def counters(**calls):
    """EntryPointCounters with fake counts (nothing patched: they are never activated)."""
    made = {name: backends.EntryPointCounter(name) for name in ("lik", "flash")}
    for name, count in calls.items():
        made[name].calls = count
    return made


@pytest.mark.parametrize(
    "variant, calls, n_calls, message",
    [
        (
            "lik",
            dict(),
            4,
            "variant 'lik': 4 MaxSim calls were recorded but only 0 reached late_interaction_kernels.autograd:maxsim",
        ),
        ("flash", dict(), 2, "only 0 reached flash_maxsim:flash_maxsim_batched_train"),
        ("lik", dict(lik=3), 4, "4 MaxSim calls were recorded but only 3 reached"),  # one call fell back
        ("vanilla", dict(lik=2), 4, "variant 'vanilla': 2 calls reached the 'lik' kernels"),
        ("vanilla", dict(flash=1), 4, "1 calls reached the 'flash' kernels"),
        ("flash", dict(flash=8, lik=1), 4, "variant 'flash': 1 calls reached the 'lik' kernels"),
    ],
)
def test_a_cell_whose_backend_did_not_run_alone_on_every_call_fails(variant, calls, n_calls, message):
    with pytest.raises(BackendPathError, match=message):
        check_backend_ran(variant, counters(**calls), n_calls)


@pytest.mark.parametrize(
    "variant, calls, n_calls",
    [("vanilla", dict(), 4), ("lik", dict(lik=4), 4), ("flash", dict(flash=8), 4), ("lik", dict(lik=0), 0)],
)
def test_a_cell_whose_backend_ran_on_every_call_passes(variant, calls, n_calls):
    check_backend_ran(variant, counters(**calls), n_calls)  # PyLate: once per document slot, so more is fine


def test_a_vanilla_cell_that_reached_a_fused_kernel_writes_no_result(tmp_path, monkeypatch):
    from harness import cell

    class ReachedKernel(backends.EntryPointCounter):
        """A counter that saw two kernel calls (as if a dispatcher ignored the vanilla switch)."""

        def active(self):
            import contextlib

            self.calls = 2
            return contextlib.nullcontext(self)

    monkeypatch.setattr(cell, "countable_backends", lambda library: ["lik"])
    monkeypatch.setattr(cell.backends, "EntryPointCounter", ReachedKernel)
    with pytest.raises(BackendPathError, match="variant 'vanilla': 2 calls reached the 'lik' kernels"):
        run_cell(spec(steps=2), tmp_path / "cell.json", stack=ToyStack())
    assert not (tmp_path / "cell.json").exists()


# --- out of memory on a shared or capped GPU -------------------------------------------------------------

# PyTorch's message for an OOM under a 43.75 GiB cap on a shared H200, as a committed probe recorded it
CAP_OOM = (
    "CUDA out of memory. Tried to allocate 486.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which 15.17 GiB "
    "is free. Including non-PyTorch memory, this process has 44.47 GiB memory in use. 43.75 GiB allowed; Of the "
    "allocated memory 41.17 GiB is allocated by PyTorch, and 2.56 GiB is reserved by PyTorch but unallocated."
)
# the same request refused by the device while the process was far below its cap
DEVICE_OOM = CAP_OOM.replace("15.17 GiB is free", "100.00 MiB is free").replace(
    "41.17 GiB is allocated", "20.00 GiB is allocated"
)


def test_an_oom_is_the_cards_only_when_the_cap_refused_it():
    from harness.cards import oom_cause

    cap = int(43.75 * 1024**3)
    assert oom_cause(CAP_OOM, cap) == "cap"  # 41.17 + 2.56 + 0.47 GiB passes the cap: the card's OOM
    assert oom_cause(DEVICE_OOM, cap) == "device"  # 20 + 2.56 + 0.47 GiB is within it, but the device had 100 MiB
    assert oom_cause(DEVICE_OOM, None) == "cap"  # uncapped: the device is the card
    # PyTorch prints small sizes in bytes, and CUDA-graph pools when there are any
    starved = DEVICE_OOM.replace("100.00 MiB is free", "0 bytes is free").replace("2.56 GiB is reserved", "512 bytes is reserved")
    assert oom_cause(starved, cap) == "device"
    pooled = CAP_OOM.replace("by PyTorch, and", "by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and")
    assert oom_cause(pooled, cap) == "cap"
    assert oom_cause(OOM_MESSAGE, cap) is None  # without the allocator's accounting it cannot say


def test_a_capped_cell_that_the_device_starved_measures_nothing(tmp_path, monkeypatch):
    import toy_stack
    from harness import cell

    output = tmp_path / "cell.json"
    monkeypatch.setattr(cell.cards, "apply_card", lambda profile, device: int(43.75 * 1024**3))
    monkeypatch.setattr(toy_stack, "OOM_MESSAGE", DEVICE_OOM)
    with pytest.raises(cell.DeviceOutOfMemory, match="another process was using the GPU"):
        run_cell(spec(steps=2), output, stack=ToyStack(oom_in_head_at_step=1))
    assert not output.exists()
    monkeypatch.setattr(toy_stack, "OOM_MESSAGE", CAP_OOM)
    assert run_cell(spec(steps=2), output, stack=ToyStack(oom_in_head_at_step=1)).outcome == "oom"
    monkeypatch.setattr(toy_stack, "OOM_MESSAGE", OOM_MESSAGE)  # a message that cannot be attributed:
    assert run_cell(spec(steps=2), output, stack=ToyStack(oom_in_head_at_step=1)).outcome == "oom"  # the card's when alone,
    monkeypatch.setattr(cell.gpu_gate, "share_gib", lambda: 24.96)
    with pytest.raises(cell.DeviceOutOfMemory):  # but not on a shared GPU
        run_cell(spec(steps=2), output, stack=ToyStack(oom_in_head_at_step=1))


def test_a_cell_leaves_nothing_in_the_temporary_directory(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    completed = run_in_a_fresh_process(tmp_path / "cell.json", dict(os.environ) | {"TMPDIR": str(scratch)},
                                       stack="colpali", batch_size=4, steps=2, preset="tiny", device="cpu")  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert load_result(tmp_path / "cell.json").outcome == "ok"
    assert sorted(os.listdir(scratch)) == []  # the trainer's output_dir went with the process


def test_a_long_cell_keeps_its_measured_steps_when_its_host_is_taken_back(tmp_path, monkeypatch):
    import harness.cell as runner
    from harness.results import load_progress, progress_path, write_progress

    monkeypatch.setattr(runner, "PROGRESS_MIN_STEPS", 5)  # a "long" cell of 5 steps, checkpointed every 2
    monkeypatch.setattr(runner, "PROGRESS_EVERY", 2)
    output = tmp_path / "long.json"
    write = runner.write_result

    def taken_back(*args, **kwargs):  # the host goes before the result is written
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "write_result", taken_back)
    with pytest.raises(KeyboardInterrupt):
        run_cell(spec(steps=5), output, stack=ToyStack())
    assert not output.exists()
    kept = load_progress(output)
    # written before steps 3 and 5 began: 4 steps measured, each holding its grid (CPU: reserved is allocated)
    assert kept.cell_id == "colpali-plain-b4-vanilla-native" and kept.spec == spec(steps=5) and kept.steps_done == 4
    grid = 4 * 4 * QUERY_LENGTH * DOC_LENGTH * 4
    assert len(kept.step_times_sec) == len(kept.step_peak_alloc_per_step_mib) == 4
    assert kept.step_peak_reserved_per_step_mib == kept.step_peak_alloc_per_step_mib
    assert all(peak * MIB >= grid for peak in kept.step_peak_alloc_per_step_mib)
    # a re-run keeps the longer record until it passes it
    assert not write_progress(kept.model_copy(update={"steps_done": 2}), output)
    assert load_progress(output).steps_done == 4
    # a run that ends writes its result, which supersedes the record
    monkeypatch.setattr(runner, "write_result", write)
    assert run_cell(spec(steps=5), output, stack=ToyStack()).outcome == "ok"
    assert load_result(output).steps == 5 and not progress_path(output).exists()
    # a short cell (a ceiling probe's 8 steps stand below the threshold) writes none
    monkeypatch.setattr(runner, "PROGRESS_MIN_STEPS", 50)
    monkeypatch.setattr(runner, "write_result", taken_back)
    with pytest.raises(KeyboardInterrupt):
        run_cell(spec(steps=5), tmp_path / "short.json", stack=ToyStack())
    assert load_progress(tmp_path / "short.json") is None
