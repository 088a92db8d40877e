"""Isolated replay: each recorded MaxSim shape re-run on fresh leaf tensors in a graph holding only the op.

In a training step the op's backward runs interleaved with the encoder's, so its own spike cannot
be separated there. On fresh leaves nothing else is live, so three brackets are exact:
forward transient, what the forward holds for backward (plus output), and the backward spike on
top of what is held. An OOM in replay is a recorded marker (``oom_in_replay``), never a crash: a
cell that died in train still gets its replays, and a shape too big to replay says so.

``harness-replay`` runs this engine on shapes given on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
from collections.abc import Iterable, Sequence

import torch

from harness import backends
from harness.bracket import PeakLedger, bracket
from harness.memory import MemoryProbe, probe_for, to_mib
from harness.ops import DTYPES, MaxSimOp, OpShape, op_for
from harness.recorder import first_line, op_call
from harness.results import OpCall


def replay_call(op: MaxSimOp, shape: OpShape, variant: str, probe: MemoryProbe, call_index: int = 0, seed: int = 0) -> OpCall:
    """Bracket forward, held and backward of one call of ``shape`` with ``variant``.

    A backend that cannot run here raises :class:`harness.backends.BackendUnavailable` before any
    tensor is made; an OOM returns an ``oom_in_replay`` record with what was measured before it.
    """
    op.check_variant(variant)
    if variant != "vanilla":
        backends.require(variant, op.stack, probe.device)
    ledger = PeakLedger(probe)
    counter = backends.EntryPointCounter(variant)
    measured: dict[str, object] = {}
    inputs: dict[str, torch.Tensor] = {}
    scores = grad_scores = None
    try:
        with counter.active():
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
    return op_call(op, shape, variant, call_index=call_index, **measured)


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
    in a fresh replay it would land inside the first bracket and be counted as the op's.
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


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(n) for n in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not a comma-separated list of integers") from None
    if not dims or any(n <= 0 for n in dims):
        raise argparse.ArgumentTypeError(f"shape {text!r} must have positive dimensions")
    return dims


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="harness-replay",
        description="Replay one MaxSim shape in isolation and print forward / held / backward MiB per variant.",
    )
    parser.add_argument("--stack", required=True, choices=["colpali", "pylate"])
    parser.add_argument("--variant", nargs="+", default=["vanilla"])
    parser.add_argument("--query-shape", type=_shape, required=True, help="e.g. 128,51,128")
    parser.add_argument("--doc-shape", type=_shape, required=True, help="e.g. 128,771,128 (colpali) or 512,2,300,128 (pylate)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--no-doc-mask", action="store_true", help="pylate: call without documents_mask")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", help="write the records as JSON here")
    args = parser.parse_args(argv)

    op = op_for(args.stack)
    for variant in args.variant:
        op.check_variant(variant)
        if variant != "vanilla":
            backends.require(variant, op.stack, args.device)
    expected_rank = 3 if args.stack == "colpali" else 4
    if len(args.query_shape) != 3 or len(args.doc_shape) != expected_rank:
        parser.error(f"{args.stack} takes a 3-D query shape and a {expected_rank}-D doc shape")
    doc_mask = None if args.stack == "colpali" or args.no_doc_mask else args.doc_shape[:-1]
    shape = OpShape(args.query_shape, args.doc_shape, args.dtype, doc_mask_shape=doc_mask)
    probe = probe_for(args.device)
    records = [replay_shapes(op, [shape], variant, probe)[0] for variant in args.variant]

    print(f"{args.stack} MaxSim replay on {args.device}: Q{list(shape.query_shape)} D{list(shape.doc_shape)} {shape.dtype}")
    print(f"{'variant':<8} {'fwd MiB':>11} {'held MiB':>11} {'bwd MiB':>11} {'pred fwd':>11} {'pred held':>11} {'calls':>6}  outcome")
    for record in records:
        outcome = record.oom_message if record.oom_in_replay else "ok"
        cells = [record.forward_transient_peak_mib, record.saved_for_backward_mib, record.backward_transient_peak_mib]
        text = " ".join(f"{v:>11.2f}" if v is not None else f"{'-':>11}" for v in cells)
        calls = "-" if record.entry_point_calls is None else str(record.entry_point_calls)
        predicted = f"{record.predicted_forward_transient_mib:>11.2f} {record.predicted_saved_for_backward_mib:>11.2f}"
        print(f"{record.variant:<8} {text} {predicted} {calls:>6}  {outcome}")
    if args.output:
        payload = {"device": str(args.device), "records": [r.model_dump() for r in records]}
        if torch.cuda.is_available() and torch.device(args.device).type == "cuda":
            payload["device_name"] = torch.cuda.get_device_name(torch.device(args.device))
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
