"""Op-level cells: one MaxSim loss head alone, no encoder, timed and bracketed per backend.

The end-to-end cells say what a backend changes in a real step; these say what it changes in the
head itself, at shapes a step never isolates — notably colpali-engine's explicit-negative losses,
where the fused kernels' speedups are largest. Two op "stacks" run through the same sweep:

* ``op-colpali`` (colpali environment): colpali-engine's own loss modules, called as the trainer
  calls them — ``inbatch`` (``ColbertPairwiseCELoss``, the recipe's loss), ``negative-ce``
  (``ColbertNegativeCELoss``) and ``pairwise-negative-ce`` (``ColbertPairwiseNegativeCELoss``) —
  on bf16 queries [B, 32, 128], documents [B, 1030, 128] and negatives [B, N, 1030, 128], with
  colpali-engine's strict ``COLPALI_SCORES_BACKEND`` switch;
* ``op-pylate`` (pylate environment): PyLate's in-batch ``ColBERTScores`` on the training shapes
  (queries [B, 48, 128], documents [B, 2, 300, 128], bool masks, fp32), through the same math and
  kernel entry points as the replays (``harness.ops.PylateColbertScores``).

Timing: forward + backward of the head, each repetition between two CUDA events (a synchronized
wall clock on the CPU); warm-up repetitions first, continued while a Triton kernel is still
autotuning; then ``reps`` timed repetitions over ``rotate`` distinct input sets in turn, so a small
shape cannot run from a warm L2 cache. Memory: the head's forward transient, held and backward
spike, bracketed once in isolation by the shared replay (``harness.replay``).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from harness import backends, environment, gpu_gate, host, provenance
from harness.bracket import PeakLedger
from harness.cell import (
    CellError,
    check_backend_ran,
    check_device,
    check_writable,
    countable_backends,
    resolve_auto,
    timing_context,
)
from harness.memory import probe_for, to_mib
from harness.ops import DTYPES, ColpaliInBatchMaxSim, MaxSimOp, OpShape, PylateColbertScores, VanillaPrediction, _embeddings
from harness.recorder import first_line
from harness.replay import replay_shapes
from harness.results import CellResult, Outcome, write_result
from harness.spec import OpSpec
from harness.timing import AutotuneWatch

COLPALI_LOSSES = {
    "inbatch": "ColbertPairwiseCELoss",
    "negative-ce": "ColbertNegativeCELoss",
    "pairwise-negative-ce": "ColbertPairwiseNegativeCELoss",
}
MAX_EXTRA_WARMUP = 20  # repetitions allowed for autotuning to settle after the warm-up


class ColpaliLossHead(MaxSimOp):
    """One of colpali-engine's late-interaction losses, called with (query, doc[, negatives])."""

    stack = "colpali"
    variants = ("vanilla", "lik")

    def __init__(self, head: str) -> None:
        self.head = head
        self.call_site = f"{COLPALI_LOSSES[head]}.forward"
        self._module: torch.nn.Module | None = None

    @property
    def negatives(self) -> bool:
        return self.head != "inbatch"

    def shape(self, batch: int, negatives: int | None, lq: int, ld: int, dim: int = 128, dtype: str = "bfloat16") -> OpShape:
        """Documents are described as [B, 1 + N, Ld, d]: the positive, then the N negatives."""
        docs = (batch, 1 + negatives, ld, dim) if self.negatives and negatives else (batch, ld, dim)
        return OpShape((batch, lq, dim), docs, dtype)

    def describe_call(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> OpShape:
        raise NotImplementedError("op-level heads are replayed from their parameters, not recorded in train")

    def make_inputs(self, shape: OpShape, device: torch.device, generator: torch.Generator) -> dict[str, torch.Tensor]:
        dtype = DTYPES[shape.dtype]
        batch, *rest = shape.doc_shape
        inputs = {"query": _embeddings(shape.query_shape, dtype, device, generator)}
        if len(rest) == 3:  # [1 + N, Ld, d]: separate leaves, as a trainer passes them
            inputs["doc"] = _embeddings((batch, *rest[1:]), dtype, device, generator)
            inputs["neg"] = _embeddings((batch, rest[0] - 1, *rest[1:]), dtype, device, generator)
        else:
            inputs["doc"] = _embeddings(shape.doc_shape, dtype, device, generator)
        return inputs

    def forward(self, variant: str, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.check_variant(variant)
        from harness.stacks.colpali import select_backend

        select_backend(variant)
        if self._module is None:
            from colpali_engine.loss import late_interaction_losses

            self._module = getattr(late_interaction_losses, COLPALI_LOSSES[self.head])()
        if "neg" in inputs:
            return self._module(inputs["query"], inputs["doc"], inputs["neg"])
        return self._module(inputs["query"], inputs["doc"])

    def predict(self, shape: OpShape) -> VanillaPrediction:
        """In-batch: colpali-engine's grid, exactly (the loss head adds a few [B]-sized tensors).
        With negatives only the grids are modelled: the per-query negatives' [B, N, Lq, Ld], the
        positives' [B, Lq, Ld] and the in-batch term's [B, B, Lq, Ld]."""
        (batch, lq, dim) = shape.query_shape
        if len(shape.doc_shape) == 3:
            return ColpaliInBatchMaxSim().predict(shape)
        _, slots, ld, _ = shape.doc_shape
        size = shape.itemsize
        grids = (batch * (slots - 1) + batch + batch * batch) * lq * ld * size
        return VanillaPrediction(grid_bytes=grids, forward_transient_bytes=None, saved_for_backward_bytes=None)


class PylateScoresHead(PylateColbertScores):
    """PyLate's in-batch ColBERTScores on its training shapes."""

    def shape(self, batch: int, negatives: int | None, lq: int, ld: int, dim: int = 128, dtype: str = "float32") -> OpShape:
        return OpShape((batch, lq, dim), (batch, 2, ld, dim), dtype, doc_mask_shape=(batch, 2, ld))


def head_op(spec: OpSpec) -> ColpaliLossHead | PylateScoresHead:
    """The loss head an op spec names (the spec checked its stack and head when it was made)."""
    return ColpaliLossHead(spec.head) if spec.stack == "op-colpali" else PylateScoresHead()


def validate(spec: OpSpec, output: Path) -> MaxSimOp:
    """Everything checkable without touching the device; returns the head to run. ``spec`` must be resolved."""
    if spec.device == "auto":
        raise CellError("resolve the spec first (harness.cell.resolve_auto): device must not be 'auto'.")
    op = head_op(spec)
    check_device(spec.device)
    try:
        backends.require(spec.variant, op.stack, spec.device)
    except ValueError as error:
        raise CellError(str(error)) from None
    check_writable(output)
    return op


def time_head(op: MaxSimOp, shape: OpShape, variant: str, device: torch.device, reps: int, warmup: int, rotate: int,
              seed: int, counters: Mapping[str, backends.EntryPointCounter]) -> list[float]:  # fmt: skip
    """Seconds per forward + backward for ``reps`` repetitions; ``counters`` count the kernel calls they make."""
    generator = torch.Generator().manual_seed(seed)
    sets = [op.make_inputs(shape, device, generator) for _ in range(rotate)]
    cuda = device.type == "cuda"

    def once(inputs: dict[str, torch.Tensor]) -> float:
        for tensor in inputs.values():
            tensor.grad = None
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = op.forward(variant, inputs)
            out.backward(torch.ones_like(out))
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        began = time.perf_counter()
        out = op.forward(variant, inputs)
        out.backward(torch.ones_like(out))
        return time.perf_counter() - began

    watch = AutotuneWatch()
    with watch.active():
        for index in range(warmup):
            once(sets[index % rotate])
        for index in range(MAX_EXTRA_WARMUP):  # a kernel that just tuned may tune again on the next set
            before = watch.events
            once(sets[index % rotate])
            if watch.events == before:
                break
        with contextlib.ExitStack() as counting:
            for counter in counters.values():
                counting.enter_context(counter.active())
            times = [once(sets[index % rotate]) for index in range(reps)]
    del sets
    return times


def run_op_cell(spec: OpSpec, output: Path, grid: str | None = None, notebook: Path | None = None) -> CellResult:
    """Time and bracket one head; write and return the result (outcome ``oom`` when it does not fit)."""
    resolved = resolve_auto(spec)
    assert isinstance(resolved, OpSpec)
    spec = resolved
    host.enter(spec.cell_id)
    op = validate(spec, output)
    gpu_wait = gpu_gate.hold()
    started = time.perf_counter()
    probe = probe_for(spec.device)
    device = probe.device
    shape = op.shape(spec.batch_size, spec.negatives, *spec.lengths)  # type: ignore[attr-defined]
    ledger = PeakLedger(probe)
    times: list[float] = []
    counters = {name: backends.EntryPointCounter(name) for name in countable_backends(op.stack)}
    outcome: Outcome = "ok"
    oom_message: str | None = None
    neighbours = host.HostWatch()
    with probe:
        isolated = replay_shapes(op, [shape], spec.variant, probe, seed=spec.seed)
        if isolated[0].oom_in_replay:
            outcome, oom_message = "oom", isolated[0].oom_message
        else:
            neighbours.mark(device.type)
            try:
                ledger.reset_window()
                times = time_head(op, shape, spec.variant, device, spec.reps, spec.warmup, spec.rotate, spec.seed, counters)
            except torch.OutOfMemoryError as error:
                outcome, oom_message = "oom", first_line(error)
                error.__traceback__ = None
                del error
            neighbours.mark(device.type)
            ledger.fold()
        gc.collect()
        probe.empty_cache()
    check_backend_ran(spec.variant, counters, len(times))  # every repetition reached the kernel, or none did
    kernel_calls = counters[spec.variant].calls if spec.variant in counters else None
    median = statistics.median(times) if times else None
    result = CellResult(
        grid=grid, cell_id=spec.cell_id, spec=spec, provenance=provenance.collect(notebook),
        outcome=outcome, oom_message=oom_message, oom_where="maxsim" if outcome == "oom" else None,
        step_peak_alloc_mib=to_mib(ledger.peak_allocated_bytes), step_peak_reserved_mib=to_mib(ledger.peak_reserved_bytes),
        step_times_sec=times, steady_steps=list(range(len(times))), steady_step_time_sec=median,
        samples_per_sec=None if not median else spec.batch_size / median,
        backend_entry_point_calls=kernel_calls, maxsim_calls_isolated=isolated,
        env=environment.collect(device, "native", None, spec.seed, "none (loss head only)", "random unit-norm embeddings"),
        wall_sec=time.perf_counter() - started, gpu_wait_sec=gpu_wait,
        timing=timing_context(device, neighbours),
    )  # fmt: skip
    write_result(result, output)
    return result
