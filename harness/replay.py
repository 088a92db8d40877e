"""Isolated replay: each recorded MaxSim shape re-run on fresh leaf tensors in a graph holding only the op.

In a training step the op's backward runs interleaved with the encoder's, so its own spike cannot
be separated there. On fresh leaves nothing else is live, so three brackets are exact:
forward transient, what the forward holds for backward (plus output), and the backward spike on
top of what is held. An OOM in replay is a recorded marker (``oom_in_replay``), never a crash: a
cell that died in train still gets its replays, and a shape too big to replay says so.

``harness replay`` runs this engine on shapes given on the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from harness import backends, spec
from harness.bracket import PeakLedger, bracket
from harness.memory import MemoryProbe, probe_for, to_mib
from harness.ops import MaxSimOp, OpShape, op_for
from harness.recorder import first_line, op_call
from harness.results import OpCall, write_text_atomic

# A Triton kernel that autotunes inside a bracket benchmarks each of its configs there, and every
# benchmark allocates Triton's 256 MiB L2-flush buffer (``triton.testing.do_bench``) on top of what
# is live: the bracket then reports the tuner, not the op. A training step tuned its kernels long
# before its replay, but the two-row warm-up below can miss a kernel the measured shape uses:
# late-interaction-kernels routes Nq >= 256, Nd >= 256, Lq <= 64 to its ``lowmem`` backward and
# smaller batches to ``unified``, so an op cell's first B=256 backward tuned two kernels inside the
# bracket (301.75 MiB instead of 71.8). A call during which an autotuner ran is measured again, now
# tuned, at most this many times in all.
MAX_REPLAY_ATTEMPTS = 3


def replay_call(op: MaxSimOp, shape: OpShape, variant: str, probe: MemoryProbe, call_index: int = 0, seed: int = 0) -> OpCall:
    """Bracket forward, held and backward of one call of ``shape`` with ``variant``.

    A backend that cannot run here raises :class:`harness.backends.BackendUnavailable` before any
    tensor is made; an OOM returns an ``oom_in_replay`` record with what was measured before it.
    A measurement during which a Triton autotuner ran is discarded and taken again (see
    :data:`MAX_REPLAY_ATTEMPTS`).
    """
    op.check_variant(variant)
    if variant != "vanilla":
        backends.require(variant, op.stack, probe.device)
    for _ in range(MAX_REPLAY_ATTEMPTS):
        measured, autotuned = _measure_call(op, shape, variant, probe, seed)
        if not autotuned or measured.get("oom_in_replay"):
            break
    return op_call(op, shape, variant, call_index=call_index, **measured)


def _measure_call(op: MaxSimOp, shape: OpShape, variant: str, probe: MemoryProbe, seed: int) -> tuple[dict[str, object], bool]:
    """One bracketed forward and backward on fresh inputs: the readings, and whether a Triton
    autotuner ran during them (so they include its benchmarks)."""
    ledger = PeakLedger(probe)
    counter = backends.EntryPointCounter(variant)
    watch = _autotune_watch(variant)
    measured: dict[str, object] = {}
    inputs: dict[str, torch.Tensor] = {}
    scores = grad_scores = None
    try:
        with counter.active(), watch.active():
            inputs = op.make_inputs(shape, probe.device, torch.Generator().manual_seed(seed))
            with bracket(ledger) as forward:
                scores = op.forward(variant, inputs)
            measured["forward_transient_peak_mib"] = to_mib(forward.transient_peak_bytes)
            measured["saved_for_backward_mib"] = to_mib(forward.retained_bytes)
            grad_scores = torch.ones_like(scores)
            with bracket(ledger) as backward:
                scores.backward(grad_scores)
            measured["backward_transient_peak_mib"] = to_mib(backward.transient_peak_bytes)
    except torch.OutOfMemoryError as error:
        measured["oom_in_replay"] = True
        measured["oom_message"] = first_line(error)
    finally:
        del inputs, scores, grad_scores
        gc.collect()
        probe.empty_cache()
    if variant != "vanilla":
        measured["entry_point_calls"] = counter.calls
    return measured, watch.events > 0


class _NoAutotune:
    """The vanilla path runs no Triton kernel: nothing to watch."""

    events = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[_NoAutotune]:
        yield self


def _autotune_watch(variant: str) -> Any:
    """An :class:`harness.timing.AutotuneWatch` for the fused variants (imported here: that module
    pulls in transformers, which the vanilla replay does not need)."""
    if variant == "vanilla":
        return _NoAutotune()
    from harness.timing import AutotuneWatch

    return AutotuneWatch()


def replay_shapes(op: MaxSimOp, shapes: Iterable[OpShape], variant: str, probe: MemoryProbe, seed: int = 0) -> list[OpCall]:
    """Replay each distinct recorded ``(shape, dtype)`` once, in order of first appearance."""
    distinct = list(dict.fromkeys(shapes))
    probe.empty_cache()
    with probe:
        first_of_each_dtype = {shape.dtype: shape for shape in reversed(distinct)}
        for shape in first_of_each_dtype.values():
            warm_up(op, shape, variant, probe)
        return [replay_call(op, shape, variant, probe, call_index=i, seed=seed) for i, shape in enumerate(distinct)]


def warm_up(op: MaxSimOp, shape: OpShape, variant: str, probe: MemoryProbe) -> None:
    """Run the op once, forward and backward, on a two-row version of ``shape``, unmeasured.

    The first matmul of a process makes cuBLAS allocate its workspace (32 MiB on Hopper) through
    the caching allocator, where it stays. In a training step it already exists when the op runs;
    in a fresh replay it would land inside the first bracket and be counted as the op's. Two rows
    also tune the fused kernels they reach, but not a kernel path only a larger batch takes: that
    tuning is caught and measured away by :func:`replay_call`.
    """
    if variant != "vanilla":
        backends.require(variant, op.stack, probe.device)
    tiny = dataclasses.replace(
        shape,
        query_shape=(2, *shape.query_shape[1:]),
        doc_shape=(2, *shape.doc_shape[1:]),
        query_mask_shape=None if shape.query_mask_shape is None else (2, *shape.query_mask_shape[1:]),
        doc_mask_shape=None if shape.doc_mask_shape is None else (2, *shape.doc_mask_shape[1:]),
    )
    try:
        inputs = op.make_inputs(tiny, probe.device, torch.Generator().manual_seed(0))
        op.forward(variant, inputs).sum().backward()
    except torch.OutOfMemoryError:
        pass  # the measured replay will record it
    finally:
        inputs = {}
        gc.collect()
        probe.empty_cache()


def shape_argument(text: str) -> tuple[int, ...]:
    """A shape on the command line: ``128,51,128`` (or ``128x51x128``)."""
    try:
        dims = tuple(int(n) for n in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not a comma-separated list of integers") from None
    if not dims or any(n <= 0 for n in dims):
        raise argparse.ArgumentTypeError(f"shape {text!r} must have positive dimensions")
    return dims


class ReplayError(ValueError):
    """A replay that cannot run as asked; raised before anything is allocated."""


def replay_command(library: str, variants: Sequence[str], query_shape: tuple[int, ...], doc_shape: tuple[int, ...],
                   dtype: str = "float32", doc_mask: bool = True, device: str = "auto",
                   output: Path | None = None) -> list[OpCall]:  # fmt: skip
    """``harness replay``: check everything first (variants, ranks, device, the output's folder), then
    replay one shape per variant, print a table and write the records atomically to ``output``."""
    op = op_for(library)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    expected_rank = 3 if library == "colpali" else 4
    if len(query_shape) != 3 or len(doc_shape) != expected_rank:
        raise ReplayError(f"{library} takes a 3-D query shape and a {expected_rank}-D doc shape, "
                          f"got {len(query_shape)}-D and {len(doc_shape)}-D")  # fmt: skip
    if query_shape[-1] != doc_shape[-1]:
        raise ReplayError(f"query and document embeddings differ in dimension ({query_shape[-1]} vs {doc_shape[-1]})")
    if library == "pylate" and query_shape[0] != doc_shape[0]:
        raise ReplayError(f"pylate scores each query against its own documents: batch {query_shape[0]} vs {doc_shape[0]}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ReplayError("device 'cuda' requested but no CUDA device is visible; use --device cpu")
    for variant in variants:
        try:
            spec.check_variant(variant, library)
            if variant != "vanilla":
                backends.require(variant, op.stack, device)
        except (ValueError, backends.BackendUnavailable) as error:
            raise ReplayError(str(error)) from None
    if output is not None and not output.parent.is_dir():
        raise ReplayError(f"the output's folder {output.parent} does not exist")
    mask = None if library == "colpali" or not doc_mask else doc_shape[:-1]
    shape = OpShape(query_shape, doc_shape, dtype, doc_mask_shape=mask)
    probe = probe_for(device)
    records = [replay_shapes(op, [shape], variant, probe)[0] for variant in variants]

    print(f"{library} MaxSim replay on {device}: Q{list(shape.query_shape)} D{list(shape.doc_shape)} {shape.dtype}")
    headers = ("fwd MiB", "held MiB", "bwd MiB", "pred fwd", "pred held")
    print(f"{'variant':<8} " + " ".join(f"{header:>11}" for header in headers) + f" {'calls':>6}  outcome")
    for record in records:
        outcome = record.oom_message if record.oom_in_replay else "ok"
        cells = [record.forward_transient_peak_mib, record.saved_for_backward_mib, record.backward_transient_peak_mib]
        text = " ".join(f"{v:>11.2f}" if v is not None else f"{'-':>11}" for v in cells)
        calls = "-" if record.entry_point_calls is None else str(record.entry_point_calls)
        predictions = (record.predicted_forward_transient_mib, record.predicted_saved_for_backward_mib)
        predicted = " ".join(f"{v:>11.2f}" if v is not None else f"{'-':>11}" for v in predictions)
        print(f"{record.variant:<8} {text} {predicted} {calls:>6}  {outcome}")
    if output is not None:
        payload: dict[str, object] = {"device": device, "records": [r.model_dump() for r in records]}
        if device == "cuda":
            payload["device_name"] = torch.cuda.get_device_name(torch.device(device))
        write_text_atomic(output, json.dumps(payload, indent=2) + "\n")
    return records
