"""The cell runner: one (stack, regime, batch, variant, card) cell, measured end to end.

Order matters and is the contract of this module:

1. validate every parameter and the backend *before* any GPU work (a bad cell costs nothing);
2. cap the device to the emulated card, then build the stack's trainer;
3. train with the call site wrapped by the recorder, the step timer and the backend's entry-point
   counter; a ``torch.OutOfMemoryError`` anywhere becomes the ``oom`` outcome (first line of the
   message, whether it struck inside the MaxSim op, the pre-OOM peaks);
4. free the trainer, replay every recorded shape in isolation (OOM there is a marker);
5. check the intended backend really ran, then write the result atomically.

An OOM cell still ends with a result and exit status 0; only a kernel death (handled by the
sweep driver, which writes a crash marker) leaves a cell without one.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness import allocator, backends, cards, environment, gpu_gate
from harness.bracket import PeakLedger
from harness.memory import probe_for, to_mib
from harness.recorder import OpRecorder, first_line
from harness.replay import replay_shapes
from harness.results import CellResult, write_result
from harness.stacks import Stack, check_cell, load_stack
from harness.timing import AutotuneWatch, StepTimer, steady_state, timed


class CellParams(BaseModel):
    """Parameters of one cell, validated before anything is built."""

    model_config = ConfigDict(extra="forbid")

    stack: str
    regime: str
    batch_size: int = Field(gt=0)
    variant: str = "vanilla"
    score_mini_batch_size: int | None = Field(default=None, gt=0)
    steps: int = Field(default=4, gt=0)
    warmup_steps: int = Field(default=1, ge=0)
    card: str = "native"
    seed: int = 42
    preset: str = "full"
    model_source: str | None = None
    data_source: str | None = None
    device: str = "cuda"
    output: Path

    @field_validator("variant")
    @classmethod
    def _known_variant(cls, variant: str) -> str:
        backends.backend(variant)
        return variant

    @field_validator("card")
    @classmethod
    def _known_card(cls, name: str) -> str:
        cards.card(name)
        return name


def resolve_auto(device: str, preset: str) -> tuple[str, str]:
    """The notebooks' defaults: ``device="auto"`` is CUDA when a GPU is visible, else the CPU;
    ``preset="auto"`` is the published model on CUDA and the tiny one on the CPU. So
    ``papermill notebooks/colpali.ipynb out.ipynb -p batch 128 -p variant lik`` runs the real cell
    on a GPU host and a quick one on a laptop."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if preset == "auto":
        preset = "full" if torch.device(device).type == "cuda" else "tiny"
    return device, preset


class CellError(ValueError):
    """A cell that cannot run as asked; raised before any GPU work."""


def validate(params: CellParams, stack: Stack | None = None) -> Stack:
    """Check everything that can be checked without a GPU; return the stack to build."""
    stack = stack or load_stack(params.stack)
    if params.stack != stack.name:
        raise CellError(f"parameters are for stack {params.stack!r} but the stack given is {stack.name!r}.")
    try:
        check_cell(stack.name, stack.regimes, params.regime, params.score_mini_batch_size)
    except ValueError as error:
        raise CellError(str(error)) from None
    if params.preset not in stack.presets:
        raise CellError(f"unknown preset {params.preset!r} for the {stack.name} stack; choose one of {list(stack.presets)}.")
    device = torch.device(params.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CellError("device 'cuda' requested but no CUDA device is visible; pass device='cpu' for the tiny preset.")
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        # Seen on a two-GPU host: transformers' Trainer then wraps the model in DataParallel and
        # trains per_device_batch × n_gpu samples a step — another cell than the one asked for.
        raise CellError(
            f"this process sees {torch.cuda.device_count()} CUDA devices; a cell trains on one. Pin it with "
            "CUDA_VISIBLE_DEVICES=<index> (harness-sweep does so for every cell)."
        )
    try:
        stack.op.check_variant(params.variant)
        stack.check(params)
    except ValueError as error:
        raise CellError(str(error)) from None
    backends.require(params.variant, stack.op.stack, device)
    if cards.card(params.card).usable_bytes is not None and device.type != "cuda":
        raise CellError(f"card {params.card!r} emulation needs a CUDA device; on {device.type} use card 'native'.")
    check_writable(params.output)
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


def run_cell(params: CellParams, stack: Stack | None = None) -> CellResult:
    """Run one cell and write its result to ``params.output``; returns the result."""
    stack = validate(params, stack)
    # under harness-sweep / harness-ceiling: wait for this GPU (or room on it) before creating a CUDA context
    gpu_wait = gpu_gate.hold(cards.card(params.card).usable_gib)
    started = time.perf_counter()
    phases: dict[str, float] = {}
    with timed(phases, "device"):
        probe = probe_for(params.device)
        device = probe.device  # with its index resolved (cuda -> cuda:0)
        card_cap = cards.apply_card(cards.card(params.card), device)

    ledger = PeakLedger(probe)
    recorder = OpRecorder(stack.op, params.variant, ledger)
    watch = AutotuneWatch()
    timer = StepTimer(device, watch, on_step=lambda step: setattr(recorder, "step", step), ledger=ledger)
    counters = {name: backends.EntryPointCounter(name) for name in countable_backends(stack.op.stack)}
    outcome, oom_message, oom_where, device_oom = "ok", None, None, False
    samples_per_step = params.batch_size
    model_source, data_source = params.model_source, params.data_source

    with probe:
        try:
            with contextlib.ExitStack() as active:
                for counter in counters.values():
                    active.enter_context(counter.active())
                active.enter_context(watch.active())
                with timed(phases, "build"):
                    built = stack.build(params, device)
                samples_per_step = built.samples_per_step
                model_source, data_source = built.model_source, built.data_source
                built.trainer.add_callback(timer)
                with recorder.installed(built.call_site_owner, built.call_site_attribute), timed(phases, "train"):
                    built.trainer.train()
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
                f"the device, not the {params.card} cap, refused memory (or the message does not say which, on a "
                f"shared GPU), so this run says nothing about that card: another process was using the GPU. Run it "
                f"again with the GPU to itself. ({oom_message})"
            )
        ledger.fold()
        built = None
        gc.collect()
        with timed(phases, "replay"):
            isolated = replay_shapes(stack.op, recorder.shapes, params.variant, probe, seed=params.seed)

    entry_point_calls = counters[params.variant].calls if params.variant in counters else None
    check_backend_ran(params.variant, counters, sum(not call.oom_in_forward for call in recorder.calls))
    steady, steady_time = steady_state(timer.step_times_sec, timer.autotune_steps, params.warmup_steps)
    peak_alloc, peak_reserved = to_mib(ledger.peak_allocated_bytes), to_mib(ledger.peak_reserved_bytes)
    result = CellResult(
        stack=stack.name,
        gpu_wait_sec=gpu_wait,
        gpu_share_gib=gpu_gate.share_gib(),
        regime=params.regime,
        batch_size=params.batch_size,
        variant=params.variant,
        score_mini_batch_size=params.score_mini_batch_size,
        card=params.card,
        allocator=allocator.current(),
        steps=params.steps,
        seed=params.seed,
        preset=params.preset,
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
        maxsim_calls_in_train=recorder.calls,
        maxsim_calls_isolated=isolated,
        env=environment.collect(device, params.card, card_cap, params.seed, model_source, data_source),
        wall_sec=time.perf_counter() - started,
        phase_sec=phases,
    )
    write_result(result, params.output)
    return result


def countable_backends(library: str) -> list[str]:
    """Fused backends of the op's ``library`` that are installed: their entry points can be counted."""
    return [
        name
        for name, spec in backends.BACKENDS.items()
        if spec.module is not None and library in spec.stacks and backends.installed_version(spec.package or "")
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
                f"variant {variant!r}: {counter.calls} calls reached the {name!r} kernels; the cell did not run {variant!r} alone."
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness-cell", description="Run one measured training cell.")
    for name, field in CellParams.model_fields.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, required=field.is_required(), default=None)
    args = {key: value for key, value in vars(parser.parse_args(argv)).items() if value is not None}
    try:
        params = CellParams(**args)
        result = run_cell(params)
    except (ValueError, backends.BackendUnavailable) as error:
        print(f"harness-cell: {error}", file=sys.stderr)
        return 2
    detail = f" ({result.oom_message})" if result.oom_message else ""
    print(
        f"{result.stack}/{result.regime} B={result.batch_size} {result.variant}: {result.outcome}{detail}; "
        f"step peak {result.step_peak_alloc_mib:.0f} MiB allocated / {result.step_peak_reserved_mib:.0f} MiB reserved"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
