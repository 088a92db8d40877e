"""The in-train op recorder: wraps the MaxSim call site and brackets every real call.

Why in train *and* in replay: in train the op's inputs carry the encoder's graph, so the bracket
shows what the op adds to a real step (its forward transient and the bytes it holds until
backward) but cannot separate its backward from the encoder's. Replay (``harness.replay``)
brackets the backward, on the shapes recorded here.

An OOM inside the op is recorded on the call (``oom_in_forward``) and re-raised: the trainer must
still die the way it would for a user; the cell runner turns that into an ``oom`` outcome.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.bracket import PeakLedger, bracket
from harness.memory import to_mib
from harness.ops import MaxSimOp, OpShape
from harness.results import OpCall


def first_line(error: BaseException) -> str:
    """First non-empty line of an error message ("CUDA out of memory. Tried to allocate ...")."""
    for line in str(error).splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__


def op_call(
    op: MaxSimOp, shape: OpShape, variant: str, call_index: int, **measured: Any
) -> OpCall:
    """An :class:`OpCall` for ``shape`` with the analytic prediction filled in."""
    prediction = op.predict(shape)
    return OpCall(
        call_index=call_index,
        variant=variant,
        query_shape=list(shape.query_shape),
        doc_shape=list(shape.doc_shape),
        query_mask_shape=None if shape.query_mask_shape is None else list(shape.query_mask_shape),
        doc_mask_shape=None if shape.doc_mask_shape is None else list(shape.doc_mask_shape),
        dtype=shape.dtype,
        predicted_grid_mib=to_mib(prediction.grid_bytes),
        predicted_forward_transient_mib=_mib_or_none(prediction.forward_transient_bytes),
        predicted_saved_for_backward_mib=_mib_or_none(prediction.saved_for_backward_bytes),
        **measured,
    )


def _mib_or_none(value: int | None) -> float | None:
    return None if value is None else to_mib(value)


class OpRecorder:
    """Records every call of one MaxSim call site during training."""

    def __init__(self, op: MaxSimOp, variant: str, ledger: PeakLedger) -> None:
        self.op = op
        self.variant = variant
        self.ledger = ledger
        self.calls: list[OpCall] = []
        self.shapes: list[OpShape] = []
        self.step: int | None = None  # set by the step timer, so calls carry their step

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` with every call bracketed and recorded (an OOM too, then re-raised)."""

        @functools.wraps(function)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            shape = self.op.describe_call(args, kwargs)
            oom: torch.OutOfMemoryError | None = None
            try:
                with bracket(self.ledger) as reading:
                    return function(*args, **kwargs)
            except torch.OutOfMemoryError as error:
                oom = error
                raise
            finally:
                self.shapes.append(shape)
                self.calls.append(
                    op_call(
                        self.op,
                        shape,
                        self.variant,
                        call_index=len(self.calls),
                        step=self.step,
                        forward_transient_peak_mib=to_mib(reading.transient_peak_bytes),
                        saved_for_backward_mib=None if oom else to_mib(reading.retained_bytes),
                        oom_in_forward=oom is not None,
                        oom_message=None if oom is None else first_line(oom),
                    )
                )

        return recorded

    @contextlib.contextmanager
    def installed(self, owner: object, attribute: str) -> Iterator[OpRecorder]:
        """Replace ``owner.attribute`` (the call site) by its recorded version, restoring it after."""
        original = getattr(owner, attribute)
        setattr(owner, attribute, self.wrap(original))
        try:
            yield self
        finally:
            setattr(owner, attribute, original)
