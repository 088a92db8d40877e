"""Data-parallel cells: one cell of world size W that owns W GPUs, launched with torchrun.

Practitioners train data-parallel by starting the same script once per GPU with ``torchrun``:
transformers' Trainer then wraps the model in DistributedDataParallel, each rank draws its own
``batch_size`` samples per step, and a loss built with ``gather_across_devices`` scores each rank's
queries against every rank's documents (PyLate's ``gather_across_devices``; colpali-engine's
ContrastiveTrainer always gathers). A cell of ``spec.world_size`` W is launched the same way:
:func:`launch` runs ``torchrun --standalone --nproc-per-node W -m harness.ranks``, every rank runs
:func:`harness.cell.run_cell` on its own device (``cuda:LOCAL_RANK``; gloo on the CPU) and writes
its own result, and :func:`merge` folds the ranks' results into the cell's: every rank's record in
``ranks``, the worst outcome, the largest peaks, the slowest rank's step times.

A rank that runs out of memory writes its result and exits with :data:`RANK_FAILED`, so torchrun
stops the others, which would otherwise wait in the next all-reduce until the collective's timeout;
they are recorded as ``stopped``. The ranks' files live in a scratch folder beside the output
(:func:`rank_folder`), removed once the cell's result is written.

Where a host lends fewer GPUs than ranks, a cell may put every rank on one GPU
(``spec.ranks_share_gpu``): NCCL refuses two ranks on one device, so the trainer's process group runs
on gloo (``ddp_backend``), which gathers CUDA tensors through host memory. Each rank's peaks are
still its own process's allocator's, so its bytes are measured as on its own GPU, but for the
collectives' buffers (NCCL's live outside PyTorch's allocator; gloo's backward of the gather
stacks the ranks' gradients where NCCL reduce-scatters them); its times are never published.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import gpu_gate
from harness.results import CellResult, RankResult, ResultError, load_result, write_result
from harness.spec import TrainSpec

RANKS_VARIABLE = "MAXSIM_RANKS"  # set in every rank: the scratch folder its result goes to
RANK_FAILED = 3  # a rank's exit status when it did not train every step: torchrun then stops the rest


class RanksError(RuntimeError):
    """No rank of a data-parallel cell wrote a result, or one crashed: the cell has no measurement."""


def in_rank() -> bool:
    """Whether this process is one rank of a data-parallel cell launched by :func:`launch`."""
    return bool(os.environ.get(RANKS_VARIABLE))


def rank_folder(output: Path) -> Path:
    return output.parent / f".{output.stem}.ranks"


def command(spec: TrainSpec, folder: Path, grid: str | None, notebook: Path | None) -> list[str]:
    """The torchrun command line of a cell: W processes on this host, rendezvous on a free port."""
    line = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.world_size}",
            "-m", "harness.ranks", str(folder / "spec.json"), str(folder)]  # fmt: skip
    if grid is not None:
        line += ["--grid", grid]
    if notebook is not None:
        line += ["--notebook", str(notebook)]
    return line


def check_devices(spec: TrainSpec) -> None:
    """Refuse, before any rank starts, a cell needing more GPUs than this process sees."""
    if spec.device != "cuda":
        return
    import torch

    if (count := torch.cuda.device_count()) < spec.gpus:
        per = "GPUs, one per rank" if spec.gpus > 1 else "GPU, its ranks share it"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise ValueError(f"world_size {spec.world_size} needs {spec.gpus} {per}; this process sees {count} "
                         f"(CUDA_VISIBLE_DEVICES={visible}).")  # fmt: skip


def rank_device(spec: TrainSpec, local_rank: int) -> int:
    """The CUDA device index of a rank: its own GPU, or the one its ranks share (``ranks_share_gpu``)."""
    return 0 if spec.ranks_share_gpu else local_rank


def launch(spec: TrainSpec, output: Path, grid: str | None = None, notebook: Path | None = None) -> CellResult:
    """Run ``spec`` as ``spec.world_size`` ranks under torchrun, write the merged result to ``output``
    and return it. ``spec`` is resolved (its device and preset are no longer ``auto``)."""
    check_devices(spec)
    folder = rank_folder(output)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps(dataclasses.asdict(spec)))
    env = dict(os.environ, **{RANKS_VARIABLE: str(folder)})
    # the launching process holds the cell's GPU gate; a rank entering it again would wait on itself
    env.pop(gpu_gate.LOCK_VARIABLE, None)
    finished = subprocess.run(command(spec, folder, grid, notebook), env=env, check=False)
    records: list[CellResult | None] = []
    for rank in range(spec.world_size):
        try:
            records.append(load_result(folder / f"rank{rank}.json"))
        except ResultError:
            records.append(None)
    result = merge(spec, records, finished.returncode)
    write_result(result, output)
    shutil.rmtree(folder, ignore_errors=True)
    return result


def rank_record(rank: int, result: CellResult | None) -> RankResult:
    """A rank's own result as the cell keeps it: the fields of :class:`RankResult` it shares with a
    cell's result, and its device; ``stopped`` for a rank that wrote nothing."""
    if result is None:
        return RankResult(rank=rank, outcome="stopped")
    shared = result.model_dump(mode="python", include=set(RankResult.model_fields) & set(CellResult.model_fields))
    return RankResult(rank=rank, device=result.env.device if result.env else None, **shared)


def ddp_bucket_bytes(model: object) -> int | None:
    """What a data-parallel rank holds that one process does not: the bytes DistributedDataParallel's
    reducer keeps in its allreduce buckets beside the gradients (by default a second copy of them;
    0 with ``gradient_as_bucket_view``, where the gradients are views into the buckets). None when
    ``model`` is not wrapped in DDP (a one-process cell, or a trainer that never wrapped it)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    logged = model._get_ddp_logging_data()  # the reducer's own record of its buckets, in bytes
    if logged.get("gradient_as_bucket_view"):
        return 0
    return sum(int(size) for size in str(logged.get("bucket_sizes", "")).split(",") if size)


def _largest(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def _per_step_max(series: list[list[float]]) -> list[float]:
    """Step by step, the largest value over the ranks, for the steps every rank completed."""
    return [max(values) for values in zip(*series, strict=False)] if series else []


def merge(spec: TrainSpec, records: list[CellResult | None], returncode: int = 0) -> CellResult:
    """The cell's result from its ranks' (None: a rank that wrote nothing). It out of memory when any
    rank ran out of memory (the first such rank's message); :class:`RanksError` when no rank ran out
    of memory yet some rank has no result or crashed (the cell crashed)."""
    from harness.timing import steady_state

    ranks = [rank_record(rank, record) for rank, record in enumerate(records)]
    present = [record for record in records if record is not None]
    failed = next((record for record in present if record.outcome == "oom"), None)
    if failed is None and (len(present) < len(records) or any(r.outcome != "ok" for r in present)):
        how = ", ".join(f"rank {r.rank} {r.outcome}" for r in ranks if r.outcome != "ok")
        raise RanksError(f"{spec.cell_id}: {how} (torchrun exit status {returncode})")
    first = present[0]
    times = _per_step_max([record.step_times_sec for record in present])
    autotune = sorted({step for record in present for step in record.autotune_steps})
    steady, steady_time = steady_state(times, autotune, spec.warmup_steps)
    merged = first.model_dump(mode="python") | {
        "ranks": [rank.model_dump(mode="python") for rank in ranks],
        "outcome": failed.outcome if failed else "ok",
        "oom_message": failed.oom_message if failed else None,
        "oom_where": failed.oom_where if failed else None,
        "pre_oom_alloc_mib": failed.pre_oom_alloc_mib if failed else None,
        "pre_oom_reserved_mib": failed.pre_oom_reserved_mib if failed else None,
        "step_peak_alloc_mib": _largest([record.step_peak_alloc_mib for record in present]),
        "step_peak_reserved_mib": _largest([record.step_peak_reserved_mib for record in present]),
        "step_peak_alloc_per_step_mib": _per_step_max([record.step_peak_alloc_per_step_mib for record in present]),
        "step_peak_reserved_per_step_mib": _per_step_max([r.step_peak_reserved_per_step_mib for r in present]),
        "step_times_sec": times,
        "autotune_steps": autotune,
        "steady_steps": steady,
        "steady_step_time_sec": steady_time,
        "samples_per_sec": None if steady_time is None else spec.batch_size * spec.world_size / steady_time,
    }
    return CellResult.model_validate(merged)


def main(argv: list[str] | None = None) -> int:
    """One rank (under torchrun): run the cell on this rank's device and write ``rank{RANK}.json``."""
    parser = argparse.ArgumentParser(prog="python -m harness.ranks", description=main.__doc__)
    parser.add_argument("spec", type=Path)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--grid")
    parser.add_argument("--notebook", type=Path)
    args = parser.parse_args(argv)
    spec = TrainSpec(**json.loads(args.spec.read_text()))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if spec.ranks_share_gpu:
        # every rank is local rank 0 of its GPU: accelerate and transformers then place it on cuda:0 (and name that
        # device in the barrier), where LOCAL_RANK 1 would ask for a second GPU this process cannot see
        os.environ["LOCAL_RANK"] = "0"
    if spec.device == "cuda":
        import torch

        torch.cuda.set_device(rank_device(spec, local_rank))  # before the cell's probe resolves "cuda" to it
    from harness.cell import run_cell

    result = run_cell(spec, args.folder / f"rank{rank}.json", grid=args.grid, notebook=args.notebook)
    return 0 if result.outcome == "ok" else RANK_FAILED


if __name__ == "__main__":
    sys.exit(main())
