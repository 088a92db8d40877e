"""The cell runner: one (stack, regime, batch, variant, card) cell, measured end to end.

Order matters and is the contract of this module:

1. validate every parameter and the backend *before* any GPU work (a bad cell costs nothing);
2. cap the device to the emulated card, then build the stack's trainer;
3. train with the call site wrapped by the recorder, the step timer and the backend's entry-point
   counter; a ``torch.OutOfMemoryError`` anywhere becomes the ``oom`` outcome (first line of the
   message, whether it struck inside the MaxSim op, the pre-OOM peaks);
4. free the trainer, replay every recorded shape in isolation (OOM there is a marker);
5. check the intended backend really ran, then write the result atomically.

A cell of many steps (:data:`PROGRESS_MIN_STEPS`, the long runs) also writes what it has measured
every :data:`PROGRESS_EVERY` steps (:class:`harness.results.Progress`), so a host taken back mid-run
(a lease that ended) leaves its steps measured; the result removes that record once written.

An OOM cell still ends with a result and exit status 0; only a kernel death (handled by the
sweep driver, which writes a crash marker) leaves a cell without one.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import torch

from harness import allocator, backends, cards, environment, gpu_gate, host, provenance, ranks
from harness.bracket import PeakLedger
from harness.memory import probe_for, to_mib
from harness.recorder import OpRecorder, first_line
from harness.replay import replay_shapes
from harness.results import CellResult, Outcome, Parity, Progress, Timing, progress_path, write_progress, write_result
from harness.spec import CellSpec, TrainSpec, with_fields
from harness.stacks import BuiltCell, Stack, load_stack
from harness.timing import AutotuneWatch, StepTimer, steady_state, timed
from harness.trace import TrainingTrace, trainable

PROGRESS_MIN_STEPS = 50  # a cell planned for this many steps or more writes its progress …
PROGRESS_EVERY = 10  # … every this many steps


def resolve_auto(spec: CellSpec) -> CellSpec:
    """``device="auto"`` is CUDA when a GPU is visible, else the CPU; ``preset="auto"`` is the
    published model on CUDA and the tiny one on the CPU. So ``papermill notebooks/colpali.ipynb
    out.ipynb -p batch 128 -p variant lik`` runs the real cell on a GPU host and a quick one on a
    laptop. A result embeds the resolved spec."""
    device = spec.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    changes: dict[str, str] = {"device": device}
    if isinstance(spec, TrainSpec) and spec.preset == "auto":
        changes["preset"] = "full" if device == "cuda" else "tiny"
    return with_fields(spec, **changes)


class CellError(ValueError):
    """A cell that cannot run as asked; raised before any GPU work."""


def check_device(device_type: str) -> None:
    """A CUDA cell needs exactly one visible CUDA device."""
    if device_type != "cuda":
        return
    if not torch.cuda.is_available():
        raise CellError("device 'cuda' requested but no CUDA device is visible; use device 'cpu' (or 'auto').")
    if torch.cuda.device_count() > 1:
        # Seen on a two-GPU host: transformers' Trainer then wraps the model in DataParallel and
        # trains per_device_batch × n_gpu samples a step — another cell than the one asked for.
        raise CellError(
            f"this process sees {torch.cuda.device_count()} CUDA devices; a cell trains on one. Pin it with "
            "CUDA_VISIBLE_DEVICES=<index> (the sweep does so for every cell)."
        )


def validate(spec: TrainSpec, output: Path, stack: Stack | None = None) -> Stack:
    """Check everything that can be checked without a GPU (the spec checked itself when it was
    made); return the stack to build. ``spec`` must be resolved (no ``auto``)."""
    if spec.device == "auto" or spec.preset == "auto":
        raise CellError("resolve the spec first (harness.cell.resolve_auto): device and preset must not be 'auto'.")
    stack = stack or load_stack(spec.stack)
    if spec.stack != stack.name:
        raise CellError(f"the spec is for stack {spec.stack!r} but the stack given is {stack.name!r}.")
    check_device(spec.device)
    try:
        stack.check(spec)
        allocator.apply(spec.allocator, torch.cuda.is_initialized())
        backends.require(spec.variant, stack.op.stack, spec.device)
    except ValueError as error:
        raise CellError(str(error)) from None
    check_writable(output)
    return stack


def check_writable(path: Path) -> None:
    """Fail now, not after an hour of training, if the result cannot be written at ``path``."""
    if path.exists() and path.is_dir():
        raise CellError(f"output {path} is a directory; give the result file's path.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".write-check-", delete=True):
            pass
    except OSError as error:
        raise CellError(f"cannot write the result to {path}: {error}") from None


def run_cell(spec: TrainSpec, output: Path, grid: str | None = None, notebook: Path | None = None,
             stack: Stack | None = None) -> CellResult:  # fmt: skip
    """Run one training cell and write its result to ``output``; returns the result. ``grid``: the
    grid it belongs to (None: a cell run by hand); ``notebook``: the notebook running it (hashed
    into the provenance)."""
    resolved = resolve_auto(spec)
    assert isinstance(resolved, TrainSpec)
    spec = resolved
    host.enter(spec.cell_id)  # neighbours starting up now see this cell, and it sees them
    stack = validate(spec, output, stack)
    # under harness sweep / harness ceiling: wait for this GPU (or room on it) before creating a CUDA context
    gpu_wait = gpu_gate.hold(cards.card(spec.card).usable_gib)
    if spec.world_size > 1 and not ranks.in_rank():  # the cell is its ranks, which torchrun starts
        return ranks.launch(spec, output, grid, notebook)
    started = time.perf_counter()
    phases: dict[str, float] = {}
    with timed(phases, "device"):
        probe = probe_for(spec.device)
        device = probe.device  # with its index resolved (cuda -> cuda:0)
        card_cap = cards.apply_card(cards.card(spec.card), device)

    ledger = PeakLedger(probe)
    recorder = OpRecorder(stack.op, spec.variant, ledger)
    watch = AutotuneWatch()
    neighbours = host.HostWatch()

    def on_step(step: int) -> None:  # before the step's clock starts
        recorder.step = step
        neighbours.look()
        if step and step % PROGRESS_EVERY == 0 and spec.steps >= PROGRESS_MIN_STEPS and spec.world_size == 1:
            write_progress(progress_of(spec, timer, device), output)

    timer = StepTimer(device, watch, on_step=on_step, ledger=ledger,
                      min_steps=spec.steps, min_steady=spec.min_steady_steps, warmup_steps=spec.warmup_steps)  # fmt: skip
    counters = {name: backends.EntryPointCounter(name) for name in countable_backends(stack.op.stack)}
    outcome: Outcome = "ok"
    oom_message: str | None = None
    oom_where: Literal["maxsim", "elsewhere"] | None = None
    device_oom = False
    built: BuiltCell | None = None
    trace = TrainingTrace() if spec.trace else None
    parity: Parity | None = None
    samples_per_step = spec.batch_size
    trainable_mib: float | None = None
    model_source, data_source = spec.model_source, spec.data_source

    with probe:
        try:
            with contextlib.ExitStack() as active:
                for counter in counters.values():
                    active.enter_context(counter.active())
                active.enter_context(watch.active())
                with timed(phases, "build"):
                    built = stack.build(spec, device)
                samples_per_step = built.samples_per_step
                trainable_mib = to_mib(sum(p.numel() * p.element_size() for p in trainable(built.trainer.model)))
                model_source, data_source = built.model_source, built.data_source
                built.trainer.add_callback(timer)
                quiet_printer(built.trainer)
                neighbours.mark(device.type)
                if trace is not None:
                    active.enter_context(trace.installed(built.trainer))
                with recorder.installed(built.call_site_owner, built.call_site_attribute), timed(phases, "train"):
                    built.trainer.train()
                if trace is not None:
                    parity = trace.finish(spec, built.trainer.model)
        except torch.OutOfMemoryError as error:
            outcome, oom_message = "oom", first_line(error)
            # on a shared GPU an OOM the message cannot attribute is not taken for the card's
            cause = cards.oom_cause(str(error), card_cap)
            device_oom = cause == "device" or (cause is None and gpu_gate.share_gib() is not None)
            oom_where = "maxsim" if recorder.calls and recorder.calls[-1].oom_in_forward else "elsewhere"
            error.__traceback__ = None  # frames of the failed step pin its tensors
            del error
        if device_oom:  # raised before the replays: nothing of this run is kept
            raise DeviceOutOfMemory(
                f"the device, not the {spec.card} cap, refused memory (or the message does not say which, on a "
                f"shared GPU), so this run says nothing about that card: another process was using the GPU. Run it "
                f"again with the GPU to itself. ({oom_message})"
            )
        neighbours.mark(device.type)
        ledger.fold()
        ddp_buckets = None if built is None else ranks.ddp_bucket_bytes(getattr(built.trainer, "model_wrapped", None))
        built = None
        gc.collect()
        with timed(phases, "replay"):
            isolated = replay_shapes(stack.op, recorder.shapes, spec.variant, probe, seed=spec.seed)

    entry_point_calls = counters[spec.variant].calls if spec.variant in counters else None
    check_backend_ran(spec.variant, counters, sum(not call.oom_in_forward for call in recorder.calls))
    steady, steady_time = steady_state(timer.step_times_sec, timer.autotune_steps, spec.warmup_steps)
    peak_alloc, peak_reserved = to_mib(ledger.peak_allocated_bytes), to_mib(ledger.peak_reserved_bytes)
    result = CellResult(
        grid=grid,
        cell_id=spec.cell_id,
        spec=spec,
        provenance=provenance.collect(notebook),
        gpu_wait_sec=gpu_wait,
        gpu_share_gib=gpu_gate.share_gib(),
        outcome=outcome,
        oom_message=oom_message,
        oom_where=oom_where,
        pre_oom_alloc_mib=peak_alloc if outcome == "oom" else None,
        pre_oom_reserved_mib=peak_reserved if outcome == "oom" else None,
        step_peak_alloc_mib=peak_alloc,
        step_peak_reserved_mib=peak_reserved,
        step_times_sec=timer.step_times_sec,
        step_peak_alloc_per_step_mib=[to_mib(n) for n in timer.step_peak_allocated_bytes],
        step_peak_reserved_per_step_mib=[to_mib(n) for n in timer.step_peak_reserved_bytes],
        autotune_steps=timer.autotune_steps,
        steady_steps=steady,
        steady_step_time_sec=steady_time,
        samples_per_sec=None if steady_time is None else samples_per_step / steady_time,
        backend_entry_point_calls=entry_point_calls,
        trainable_parameter_mib=trainable_mib,
        ddp_bucket_mib=None if ddp_buckets is None else to_mib(ddp_buckets),
        maxsim_calls_in_train=recorder.calls,
        maxsim_calls_isolated=isolated,
        env=environment.collect(device, spec.card, card_cap, spec.seed, model_source, data_source),
        wall_sec=time.perf_counter() - started,
        phase_sec=phases,
        timing=timing_context(device, neighbours, spec.world_size if spec.ranks_share_gpu else 1),
        loss_per_step=[] if trace is None else trace.loss_per_step,
        grad_norm_per_step=[] if trace is None else trace.grad_norm_per_step,
        parity=parity,
    )
    write_result(result, output)
    progress_path(output).unlink(missing_ok=True)  # the result supersedes it
    return result


def progress_of(spec: TrainSpec, timer: StepTimer, device: torch.device) -> Progress:
    """What the cell has measured so far on ``device``: its completed steps' peaks and times."""
    return Progress(
        cell_id=spec.cell_id,
        spec=spec,
        steps_done=len(timer.step_times_sec),
        step_peak_alloc_per_step_mib=[to_mib(n) for n in timer.step_peak_allocated_bytes],
        step_peak_reserved_per_step_mib=[to_mib(n) for n in timer.step_peak_reserved_bytes],
        step_times_sec=list(timer.step_times_sec),
        gpu_share_gib=gpu_gate.share_gib(),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        written_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def timing_context(device: torch.device, neighbours: host.HostWatch, ranks_on_gpu: int = 1) -> Timing:
    """The timing rule (:mod:`harness.host`) as this cell met it; ``ranks_on_gpu``: the ranks of a
    data-parallel cell that share its one GPU (``ranks_share_gpu``), whose times are never the card's."""
    shared = gpu_gate.share_gib() is not None
    if device.type != "cuda":
        reason: str | None = "timed on the CPU"
    elif ranks_on_gpu > 1:
        reason = f"its {ranks_on_gpu} ranks shared one GPU (ranks_share_gpu)"
    elif shared:
        reason = "measured beside other cells on its GPU (--share-gpu)"
    elif neighbours.most_sharing_cpus:
        reason = f"{neighbours.most_sharing_cpus} other cell process(es) could run on its CPU cores while it trained"
    else:
        reason = None
    return Timing(
        gpu=host.visible_gpu(),
        cpus=host.cpu_ranges(neighbours.cpus),
        pinned=bool(os.environ.get(host.PINNED_VARIABLE)),
        neighbours=neighbours.most_neighbours,
        neighbours_on_own_cpus=neighbours.most_sharing_cpus,
        gpu_shared=shared,
        sm_clock_mhz=[state["sm_clock_mhz"] for state in neighbours.gpu_states],
        temperature_c=[state["temperature_c"] for state in neighbours.gpu_states],
        comparable=reason is None,
        reason=reason,
    )


def quiet_printer(trainer: object) -> None:
    """transformers' Trainer prints its metrics dict (``{'train_runtime': …}``) when training ends,
    through PrinterCallback; a cell reports what it measured itself, so that line only adds noise."""
    remove = getattr(trainer, "remove_callback", None)
    if remove is not None:
        from transformers.trainer_callback import PrinterCallback

        remove(PrinterCallback)


def countable_backends(library: str) -> list[str]:
    """Fused backends of the op's ``library`` that are installed: their entry points can be counted."""
    return [
        name
        for name, backend in backends.BACKENDS.items()
        if backend.module is not None and library in backend.libraries and backends.installed_version(backend.package or "")
    ]


class DeviceOutOfMemory(RuntimeError):
    """A capped cell ran out of device memory the cap still allowed: not an outcome of its card."""


class BackendPathError(RuntimeError):
    """The trainer did not run the backend the cell asked for."""


def check_backend_ran(variant: str, counters: dict[str, backends.EntryPointCounter], n_calls: int) -> None:
    """A fused cell must have called its kernel; a vanilla cell must have called none."""
    for name, counter in counters.items():
        if name == variant and counter.calls < n_calls:
            # Every recorded call must reach the kernel at least once (PyLate: once per document slot);
            # fewer means some calls fell back to another path.
            raise BackendPathError(
                f"variant {variant!r}: {n_calls} MaxSim calls were recorded but only {counter.calls} reached "
                f"{', '.join(counter.spec.entry_points)}; the backend did not run on every call, so this cell "
                "measured something else."
            )
        if name != variant and counter.calls:
            raise BackendPathError(
                f"variant {variant!r}: {counter.calls} calls reached the {name!r} kernels; "
                f"the cell did not run {variant!r} alone."
            )


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["cell", *sys.argv[1:]]))
