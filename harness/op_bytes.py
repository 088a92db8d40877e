"""The analytic bytes of the vanilla MaxSim ops, from shapes alone (no torch): the one place these
formulas live. :mod:`harness.ops` predicts every replay with them (a replay matches them to the
byte); :mod:`harness.memmodel` adds them to its step peaks.

ColQwen2 in-batch (``[Bq, Lq, d]`` × ``[Bd, Ld, d]``): ``einsum → amax(3) → sum(2)`` keeps the whole
``[Bq, Bd, Lq, Ld]`` grid, amax's result and the scores alive for backward, so the forward transient
and what is held are the same bytes.

PyLate ``ColBERTScores`` (docs ``[Bd, N, Ld, d]``): per slot, the einsum grid and the masked grid live
at once. A slot ``docs[:, j]`` of the stacked tensor is not contiguous when N > 1, so einsum copies it
to a ``[Bd*Ld, d]`` matrix for its matmul and keeps that copy for backward. Kept per slot: that copy,
max's int64 indices ``[Bq, Bd, Lq]`` and, until the stack, the slot's scores ``[Bq, Bd]``; the peak is
the last slot's mask multiply on top of what earlier slots keep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
INDEX_BYTES = 8  # max's int64 indices


@dataclasses.dataclass(frozen=True)
class OpBytes:
    grid: int  # one full similarity grid (every slot's, for PyLate)
    forward_transient: int  # peak above the inputs during the forward
    held: int  # what stays alive for backward, the output included


def colpali_inbatch(query_shape: Sequence[int], doc_shape: Sequence[int], itemsize: int) -> OpBytes:
    (bq, lq, _), (bd, ld, _) = query_shape, doc_shape
    grid = bq * bd * lq * ld * itemsize
    held = grid + bq * bd * lq * itemsize + bq * bd * itemsize  # grid + amax result + scores
    return OpBytes(grid, held, held)


def pylate_scores(query_shape: Sequence[int], doc_shape: Sequence[int], itemsize: int) -> OpBytes:
    (bq, lq, _), (bd, slots, ld, dim) = query_shape, doc_shape
    slot_grid = bq * bd * lq * ld * itemsize
    doc_copy = bd * ld * dim * itemsize if slots > 1 else 0
    kept_per_slot = doc_copy + bq * bd * lq * INDEX_BYTES + bq * bd * itemsize
    transient = 2 * slot_grid + doc_copy + (slots - 1) * kept_per_slot
    held = slots * (doc_copy + bq * bd * lq * INDEX_BYTES) + bq * bd * slots * itemsize  # + stacked scores
    return OpBytes(slots * slot_grid, transient, held)


def formula(stack: str) -> Callable[[Sequence[int], Sequence[int], int], OpBytes]:
    """The vanilla op's formula of a stack: ColQwen2's in-batch MaxSim or PyLate's ColBERT scores."""
    return colpali_inbatch if stack == "colpali" else pylate_scores


def gathered(stack: str, query_shape: Sequence[int], doc_shape: Sequence[int], itemsize: int, world: int) -> OpBytes:
    """One rank's vanilla op when documents are gathered across ``world`` ranks (PyLate's
    ``Contrastive(gather_across_devices=True)``, colpali-engine's ContrastiveTrainer under
    torch.distributed): its ``B`` local queries score every rank's documents, ``[B·world, …]``, so
    the grid grows with the world size while the queries (and the encoder) stay per rank."""
    if world < 1:
        raise ValueError(f"world size {world}: must be at least 1")
    docs = [doc_shape[0] * world, *doc_shape[1:]]
    return formula(stack)(query_shape, docs, itemsize)

