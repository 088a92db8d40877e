"""Data-parallel cells (harness.ranks): the spec's world size and gathered negatives, the merge of
the ranks' results, and one real torchrun launch of PyLate's recipe on the CPU (gloo)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest

from harness import display, op_bytes, ranks
from harness.cell import run_cell
from harness.results import OpCall, load_result
from harness.spec import MAX_WORLD_SIZE, SpecError, TrainSpec
from test_results import make_call, make_result

PYLATE = dict(stack="pylate", regime="grad-checkpoint", batch_size=8, variant="vanilla", steps=2, device="cpu",
              preset="tiny")  # fmt: skip


def test_a_data_parallel_cell_is_named_and_refused_in_one_line():
    assert TrainSpec(**PYLATE).cell_id == "pylate-grad-checkpoint-b8-vanilla-native"
    assert TrainSpec(**PYLATE, world_size=2).cell_id == "pylate-grad-checkpoint-b8-vanilla-native-w2"
    assert TrainSpec(**PYLATE, world_size=2, gather=True).cell_id == "pylate-grad-checkpoint-b8-vanilla-native-w2-gather"
    assert TrainSpec(**PYLATE, gather=True).cell_id.endswith("-native-gather")  # W = 1: the baseline, gathering alone
    assert TrainSpec(**PYLATE, world_size=2, gather=True).title.endswith("· 2 GPUs · gathered")
    refusals = {
        "world_size must be at most 8 (one host's GPUs), got 9.": dict(PYLATE, world_size=MAX_WORLD_SIZE + 1),
        "world_size must be an integer of at least 1, got 0.": dict(PYLATE, world_size=0),
        "trace (parity) compares one process's gradients; run it with world_size 1.": dict(PYLATE, world_size=2, trace=True),
        "gather must be true or false, got 'yes'.": dict(PYLATE, gather="yes"),
    }  # fmt: skip
    for reason, fields in refusals.items():
        with pytest.raises(SpecError) as refused:
            TrainSpec(**fields)
        assert str(refused.value) == reason


def _rank(rank, outcome="ok", alloc=100.0, times=(0.5, 0.25, 0.25), calls=1):
    spec = dict(PYLATE, world_size=2, gather=True)
    return make_result(**spec, outcome=outcome, step_peak_alloc_mib=alloc, step_peak_reserved_mib=alloc + 30,
                       step_times_sec=list(times), step_peak_alloc_per_step_mib=[alloc - 1, alloc],
                       step_peak_reserved_per_step_mib=[alloc + 29, alloc + 30],
                       oom_message="CUDA out of memory." if outcome == "oom" else None,
                       maxsim_calls_in_train=[make_call()] * calls)  # fmt: skip


def test_the_cells_result_is_its_ranks_worst_and_largest():
    spec = TrainSpec(**PYLATE, world_size=2, gather=True)
    merged = ranks.merge(spec, [_rank(0, alloc=100.0, times=(0.5, 0.2, 0.3)), _rank(1, alloc=120.0, times=(0.4, 0.3, 0.2))])
    assert merged.outcome == "ok" and [r.rank for r in merged.ranks] == [0, 1]
    assert (merged.step_peak_alloc_mib, merged.step_peak_reserved_mib) == (120.0, 150.0)
    assert merged.step_peak_alloc_per_step_mib == [119.0, 120.0] and merged.fragmentation_per_step_mib == [30.0, 30.0]
    assert merged.step_times_sec == [0.5, 0.3, 0.3]  # a data-parallel step lasts as long as its slowest rank
    assert merged.steady_step_time_sec == 0.3 and math.isclose(merged.samples_per_sec or 0, 8 * 2 / 0.3)
    assert [r.step_peak_alloc_mib for r in merged.ranks] == [100.0, 120.0]
    shown = display.summary(merged)["value"]
    assert (shown["data-parallel ranks"], shown["negatives gathered across ranks"]) == ("2 (torchrun)", "yes")
    assert shown["per rank: outcome, step peak allocated"] == (f"rank 0 ok, {display.mib_gib(100.0)}; "
                                                                f"rank 1 ok, {display.mib_gib(120.0)}")
    assert "data-parallel ranks" not in display.summary(make_result())["value"]
    # one rank out of memory, the other stopped by torchrun: the cell ran out of memory
    stopped = ranks.merge(spec, [None, _rank(1, outcome="oom", alloc=140.0)], returncode=1)
    assert stopped.outcome == "oom" and stopped.oom_message == "CUDA out of memory."
    assert [(r.rank, r.outcome) for r in stopped.ranks] == [(0, "stopped"), (1, "oom")]
    # no rank out of memory, yet one wrote nothing: the cell crashed, and says which rank
    with pytest.raises(ranks.RanksError, match=r"rank 1 stopped \(torchrun exit status 1\)"):
        ranks.merge(spec, [_rank(0), None], returncode=1)


def test_a_data_parallel_cell_needs_a_gpu_per_rank_before_it_starts(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    spec = dataclasses.replace(TrainSpec(**PYLATE, world_size=2), device="cuda")
    with pytest.raises(ValueError, match=r"^world_size 2 needs 2 GPUs, one per rank; this process sees 1"):
        ranks.check_devices(spec)


def test_ranks_sharing_one_gpu_are_named_placed_on_it_and_never_timed(monkeypatch, tmp_path: Path):
    """ranks_share_gpu: a W-rank cell on the one GPU a host lends, its process group on gloo."""
    import torch

    from harness.cell import timing_context
    from harness.grid import GridCell
    from harness.host import HostWatch
    from harness.orchestrate import sweep
    from harness.stacks import measurement_arguments

    cuda = dict(PYLATE, device="cuda", world_size=2, gather=True)
    shared = TrainSpec(**cuda, ranks_share_gpu=True)
    assert shared.cell_id == "pylate-grad-checkpoint-b8-vanilla-native-w2-gather-onegpu" and shared.gpus == 1
    assert shared.title.endswith("· 2 ranks on one GPU · gathered") and TrainSpec(**cuda).gpus == 2
    reason = ("ranks_share_gpu puts the ranks of a data-parallel cell on one GPU: it needs world_size of 2 or more and "
              "device cuda, got world_size {} on {}.")  # fmt: skip
    for fields, world, device in ((dict(cuda, world_size=1), 1, "cuda"), (dict(cuda, device="cpu"), 2, "cpu")):
        with pytest.raises(SpecError) as refused:
            TrainSpec(**fields, ranks_share_gpu=True)
        assert str(refused.value) == reason.format(world, device)
    # one GPU is enough, every rank is placed on it, and the trainer's process group is gloo
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ranks.check_devices(shared)
    assert (ranks.rank_device(shared, 1), ranks.rank_device(TrainSpec(**cuda), 1)) == (0, 1)
    assert measurement_arguments(shared, torch.device("cpu"))["ddp_backend"] == "gloo"
    assert "ddp_backend" not in measurement_arguments(TrainSpec(**cuda), torch.device("cpu"))
    assert sweep._gpus(GridCell("multi-gpu", shared)) == 1 and sweep._gpus(GridCell("multi-gpu", TrainSpec(**cuda))) == 2
    # its times are never the card's
    timing = timing_context(torch.device("cuda"), HostWatch(), ranks_on_gpu=2)
    assert (timing.comparable, timing.reason) == (False, "its 2 ranks shared one GPU (ranks_share_gpu)")
    merged = ranks.merge(shared, [_rank(0).model_copy(update={"spec": shared, "cell_id": shared.cell_id}),
                                  _rank(1).model_copy(update={"spec": shared, "cell_id": shared.cell_id})])  # fmt: skip
    assert display.summary(merged)["value"]["data-parallel ranks"] == "2 (torchrun, all on one GPU, gloo)"
    # under torchrun, rank 1 runs as local rank 0 on cuda:0 (accelerate and transformers read LOCAL_RANK)
    placed: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", placed.append)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    seen: list[str] = []

    def run_cell(spec, output, grid=None, notebook=None):
        seen.append(os.environ["LOCAL_RANK"])
        return merged

    monkeypatch.setattr("harness.cell.run_cell", run_cell)
    (tmp_path / "spec.json").write_text(json.dumps(dataclasses.asdict(shared)))
    assert ranks.main([str(tmp_path / "spec.json"), str(tmp_path)]) == 0
    assert (placed, seen) == ([0], ["0"])


def _doc_rows(calls: list[OpCall]) -> set[int]:
    return {call.doc_shape[0] for call in calls}


def test_torchrun_trains_pylates_recipe_on_two_ranks_with_documents_gathered(tmp_path: Path):
    """Two ranks under torchrun (gloo, CPU), PyLate's Contrastive with gather_across_devices: every
    rank trains every step and scores its 8 queries against both ranks' documents (16 rows), where
    the same cell on one process scores against its own 8; the merged result holds both ranks."""
    spec = TrainSpec(**PYLATE, world_size=2, gather=True)
    result = run_cell(spec, tmp_path / "cell.json", grid="multi-gpu")
    assert load_result(tmp_path / "cell.json") == result
    assert result.outcome == "ok" and result.cell_id.endswith("-w2-gather")
    assert [(r.rank, r.outcome, len(r.step_times_sec)) for r in result.ranks] == [(0, "ok", 2), (1, "ok", 2)]
    assert all(_doc_rows(r.maxsim_calls_in_train) == {16} for r in result.ranks)
    assert result.step_peak_alloc_mib == max(r.step_peak_alloc_mib or 0 for r in result.ranks)
    assert not ranks.rank_folder(tmp_path / "cell.json").exists()  # the ranks' scratch files are gone
    alone = run_cell(TrainSpec(**PYLATE, gather=True), tmp_path / "alone.json")
    assert _doc_rows(alone.maxsim_calls_in_train) == {8} and alone.ranks == []
    # what a rank holds that one process does not: DDP's allreduce buckets, a second copy of the trainable
    # parameters' fp32 gradients (the trainer keeps them apart from the gradients); one process has no DDP
    assert result.trainable_parameter_mib == alone.trainable_parameter_mib > 0
    assert result.ddp_bucket_mib == result.trainable_parameter_mib and alone.ddp_bucket_mib is None
    buckets = "DDP's allreduce buckets (per rank)"  # the cell's page names them; a one-process cell's does not
    assert display.summary(result)["value"][buckets] == display.mib_gib(result.ddp_bucket_mib)
    assert buckets not in display.summary(alone).index
    # the analytic per-rank grid with W (op_bytes.gathered), from the one-process shapes: the replays of
    # the gathered shapes match it to the byte (the CPU's MemTracker counts exact bytes). A rank's CPU
    # brackets in training were seen to miss the op beside gloo's threads (one read 0 MiB), so only the
    # shapes are asserted there; on the GPUs the in-training records are the measurement.
    mib = 2**20
    for world, replays in ((1, alone.maxsim_calls_isolated), (2, result.maxsim_calls_isolated)):
        for call, base in zip(replays, alone.maxsim_calls_isolated, strict=True):
            predicted = op_bytes.gathered("pylate", base.query_shape, base.doc_shape, 4, world)
            assert (call.forward_transient_peak_mib, call.saved_for_backward_mib) == (predicted.forward_transient / mib,
                                                                                      predicted.held / mib)


@pytest.mark.colpali
def test_torchrun_trains_colqwen2s_recipe_on_two_ranks_gathering_documents(tmp_path: Path):
    """colpali-engine's ContrastiveTrainer gathers the documents under torch.distributed by itself:
    on two CPU ranks each rank's loss scores its 4 queries against both ranks' 8 documents, and the
    replays match the gathered in-batch grid's formula to the byte."""
    spec = TrainSpec(stack="colpali", batch_size=4, variant="vanilla", steps=2, device="cpu", preset="tiny", world_size=2,
                     gather=True)  # fmt: skip
    result = run_cell(spec, tmp_path / "cell.json")
    assert result.outcome == "ok" and [(r.rank, r.outcome) for r in result.ranks] == [(0, "ok"), (1, "ok")]
    for rank in result.ranks:
        assert [(call.query_shape[0], call.doc_shape[0]) for call in rank.maxsim_calls_in_train] == [(4, 8), (4, 8)]
    assert result.ddp_bucket_mib == result.trainable_parameter_mib > 0  # DDP's buckets: the LoRA gradients again
    for call in result.maxsim_calls_isolated:  # rank 0's replays, against the formula from one rank's 4 documents
        predicted = op_bytes.gathered("colpali", call.query_shape, [4, *call.doc_shape[1:]], 4, 2)
        assert (call.forward_transient_peak_mib, call.saved_for_backward_mib) == (predicted.forward_transient / 2**20,
                                                                                  predicted.held / 2**20)
    with pytest.raises(SpecError, match="always gathers the documents across processes"):
        TrainSpec(stack="colpali", world_size=2)
