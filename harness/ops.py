"""The two MaxSim call sites this report measures, as replayable ops.

Each op knows four things and nothing about training:

* how to read the shapes of one real call (``describe_call``) — what the in-train recorder stores;
* how to build fresh inputs of a recorded shape (``make_inputs``) — leaf tensors for the replay;
* how each backend computes it (``forward``) — vanilla is the library's exact math, written out
  here so it runs anywhere and is checked against the library in the stack tests; fused variants
  call the kernel libraries' own entry points with the same argument adaptation the stack's
  dispatcher applies (colpali-engine 0.3.18 ``utils/_lik_backend``; PyLate 1.6.0
  ``scores/_lik_backend`` and ``scores/_flash_backend``);
* what the vanilla path must cost (``predict``) — the analytic grid bytes stored beside every
  measurement, so a disagreement shows up as a number in the result, not as a hunch.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from harness import backends, op_bytes

DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"unsupported MaxSim dtype {dtype}; expected one of {sorted(DTYPES)}.")


@dataclasses.dataclass(frozen=True)
class OpShape:
    """The shapes and dtype of one MaxSim call: everything its memory depends on."""

    query_shape: tuple[int, ...]
    doc_shape: tuple[int, ...]
    dtype: str
    query_mask_shape: tuple[int, ...] | None = None
    doc_mask_shape: tuple[int, ...] | None = None

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize


@dataclasses.dataclass(frozen=True)
class VanillaPrediction:
    """Bytes the vanilla path must allocate for one call, from shapes alone.

    ``grid_bytes`` is one full similarity grid (all its slots for PyLate); the other two are the
    replay brackets' expected values: ``forward_transient_bytes`` the peak above the inputs,
    ``saved_for_backward_bytes`` what stays alive for backward (including the output).
    """

    grid_bytes: int
    forward_transient_bytes: int | None  # None where only the grids are modelled
    saved_for_backward_bytes: int | None


class MaxSimOp(abc.ABC):
    """One stack's MaxSim call site, replayable in isolation."""

    stack: str
    call_site: str
    variants: tuple[str, ...]

    @abc.abstractmethod
    def describe_call(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> OpShape:
        """Shapes of a real call at the wrapped call site."""

    @abc.abstractmethod
    def make_inputs(self, shape: OpShape, device: torch.device, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Fresh inputs of ``shape``: embeddings are leaves that require grad; masks are bool."""

    @abc.abstractmethod
    def forward(self, variant: str, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Scores of ``variant`` on ``inputs`` (differentiable)."""

    @abc.abstractmethod
    def predict(self, shape: OpShape) -> VanillaPrediction:
        """Analytic vanilla bytes for ``shape``."""

    def check_variant(self, variant: str) -> None:
        if variant not in self.variants:
            raise ValueError(
                f"unknown variant {variant!r} for the {self.stack} MaxSim op; choose one of {list(self.variants)}."
            )


def _shape_of(tensor: Any, what: str) -> tuple[int, ...]:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} at the MaxSim call site is {type(tensor).__name__}, expected a tensor.")
    return tuple(int(n) for n in tensor.shape)


def _embeddings(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Unit-norm random embeddings as a leaf (the losses L2-normalise before scoring)."""
    values = torch.randn(shape, generator=generator, dtype=torch.float32, device="cpu")
    values = torch.nn.functional.normalize(values, dim=-1).to(device=device, dtype=dtype)
    return values.requires_grad_(True)


class ColpaliInBatchMaxSim(MaxSimOp):
    """colpali-engine's in-batch MaxSim: ``einsum("bnd,csd->bcns") → amax(3) → sum(2)``.

    Wrapped in train at the loss module's ``forward(query_embeddings, doc_embeddings)``.
    Vanilla keeps the whole ``[Bq, Bd, Lq, Ld]`` grid alive for ``amax``'s backward, so the
    bytes held between forward and backward grow with B².
    """

    stack = "colpali"
    call_site = "loss.forward(query_embeddings, doc_embeddings)"
    variants = ("vanilla", "lik")

    def describe_call(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> OpShape:
        query = kwargs["query_embeddings"] if "query_embeddings" in kwargs else args[0]
        doc = kwargs["doc_embeddings"] if "doc_embeddings" in kwargs else args[1]
        return OpShape(_shape_of(query, "query_embeddings"), _shape_of(doc, "doc_embeddings"), dtype_name(query.dtype))

    def make_inputs(self, shape: OpShape, device: torch.device, generator: torch.Generator) -> dict[str, torch.Tensor]:
        dtype = DTYPES[shape.dtype]
        return {
            "query": _embeddings(shape.query_shape, dtype, device, generator),
            "doc": _embeddings(shape.doc_shape, dtype, device, generator),
        }

    def forward(self, variant: str, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.check_variant(variant)
        query, doc = inputs["query"], inputs["doc"]
        if variant == "vanilla":
            return torch.einsum("bnd,csd->bcns", query, doc).amax(dim=3).sum(dim=2)
        backends.require(variant, self.stack, query.device)
        import late_interaction_kernels.autograd as lik_autograd

        return lik_autograd.maxsim(query, doc)

    def predict(self, shape: OpShape) -> VanillaPrediction:
        bytes_ = op_bytes.colpali_inbatch(shape.query_shape, shape.doc_shape, shape.itemsize)
        return VanillaPrediction(grid_bytes=bytes_.grid, forward_transient_bytes=bytes_.forward_transient,
                                 saved_for_backward_bytes=bytes_.held)  # fmt: skip


class PylateColbertScores(MaxSimOp):
    """PyLate's ``ColBERTScores``: per document slot, ``colbert_scores`` on ``[Bq, Bd, Lq, Ld]``.

    Wrapped in train at the Contrastive loss's ``score_metric(queries, docs_stacked,
    queries_mask=..., documents_mask=...)`` with docs ``[Bd, N, Ld, d]`` and bool skiplist masks.
    Vanilla per slot: einsum grid, mask multiply (a second grid while the first is still alive),
    ``max(-1)`` (keeps int64 indices for backward), ``sum(-1)``; slots stacked query-major. So the
    forward transient is ~2 grids of one slot while little is held for backward.
    """

    stack = "pylate"
    call_site = "loss.score_metric(queries, documents, queries_mask=, documents_mask=)"
    variants = ("vanilla", "lik", "flash")

    def describe_call(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> OpShape:
        names = ("queries_embeddings", "documents_embeddings", "queries_mask", "documents_mask")
        values = dict(zip(names, args, strict=False))  # positional arguments: a prefix of the names
        values.update({k: v for k, v in kwargs.items() if k in names})
        query, doc = values["queries_embeddings"], values["documents_embeddings"]
        q_mask, d_mask = values.get("queries_mask"), values.get("documents_mask")
        return OpShape(
            query_shape=_shape_of(query, "queries_embeddings"),
            doc_shape=_shape_of(doc, "documents_embeddings"),
            dtype=dtype_name(query.dtype),
            query_mask_shape=None if q_mask is None else _shape_of(q_mask, "queries_mask"),
            doc_mask_shape=None if d_mask is None else _shape_of(d_mask, "documents_mask"),
        )

    def make_inputs(self, shape: OpShape, device: torch.device, generator: torch.Generator) -> dict[str, torch.Tensor]:
        dtype = DTYPES[shape.dtype]
        inputs = {
            "query": _embeddings(shape.query_shape, dtype, device, generator),
            "doc": _embeddings(shape.doc_shape, dtype, device, generator),
        }
        # All-True bool masks: the same dtype and bytes as the real skiplist/attention masks; the
        # vanilla path multiplies by the whole mask regardless of its values.
        if shape.query_mask_shape is not None:
            inputs["query_mask"] = torch.ones(shape.query_mask_shape, dtype=torch.bool, device=device)
        if shape.doc_mask_shape is not None:
            inputs["doc_mask"] = torch.ones(shape.doc_mask_shape, dtype=torch.bool, device=device)
        return inputs

    def forward(self, variant: str, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.check_variant(variant)
        query, doc = inputs["query"], inputs["doc"]
        q_mask, d_mask = inputs.get("query_mask"), inputs.get("doc_mask")
        if variant != "vanilla":
            backends.require(variant, self.stack, query.device)
        score_slot = {"vanilla": _pylate_slot_vanilla, "lik": _pylate_slot_lik, "flash": _pylate_slot_flash}[variant]
        n_docs, n_slots = doc.shape[0], doc.shape[1]
        per_slot = [
            score_slot(query, doc[:, slot], q_mask, None if d_mask is None else d_mask[:, slot])
            for slot in range(n_slots)
        ]
        return torch.stack(per_slot, dim=2).reshape(-1, n_docs * n_slots)

    def predict(self, shape: OpShape) -> VanillaPrediction:
        bytes_ = op_bytes.pylate_scores(shape.query_shape, shape.doc_shape, shape.itemsize)
        return VanillaPrediction(grid_bytes=bytes_.grid, forward_transient_bytes=bytes_.forward_transient,
                                 saved_for_backward_bytes=bytes_.held)  # fmt: skip


def _pylate_slot_vanilla(query, doc, q_mask, d_mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """PyLate 1.6.0 ``colbert_scores`` with backend ``torch``, operation for operation."""
    scores = torch.einsum("ash,bth->abst", query, doc)
    if q_mask is not None:
        scores = scores * q_mask.unsqueeze(1).unsqueeze(3)
    if d_mask is not None:
        scores = scores * d_mask.unsqueeze(0).unsqueeze(2)
    return scores.max(axis=-1).values.sum(axis=-1)  # type: ignore[call-overload]  # PyLate's own spelling (axis=)


def _pylate_slot_lik(query, doc, q_mask, d_mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """PyLate's lik backend: bool masks pass straight to ``late_interaction_kernels.autograd.maxsim``."""
    import late_interaction_kernels.autograd as lik_autograd

    return lik_autograd.maxsim(query, doc, q_mask=_as_bool(q_mask), d_mask=_as_bool(d_mask))


def _pylate_slot_flash(query, doc, q_mask, d_mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """PyLate's flash training path: masks become int32 lengths, Lq is zero-padded to a power of
    two (one autotune bucket per size), then ``flash_maxsim.flash_maxsim_batched_train``."""
    import flash_maxsim

    q_lengths = None if q_mask is None else q_mask.sum(dim=-1, dtype=torch.int64).to(torch.int32).contiguous()
    d_lengths = None if d_mask is None else d_mask.sum(dim=-1, dtype=torch.int64).to(torch.int32).contiguous()
    lq = query.shape[-2]
    padded_lq = 1 << max(lq - 1, 0).bit_length()
    if padded_lq != lq:
        query = torch.nn.functional.pad(query, (0, 0, 0, padded_lq - lq))
    return flash_maxsim.flash_maxsim_batched_train(
        query, doc, shared_docs=True, doc_lengths=d_lengths, query_lengths=q_lengths
    )


def _as_bool(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask != 0


OPS: Mapping[str, MaxSimOp] = {"colpali": ColpaliInBatchMaxSim(), "pylate": PylateColbertScores()}


def op_for(stack: str) -> MaxSimOp:
    try:
        return OPS[stack]
    except KeyError:
        raise ValueError(f"unknown stack {stack!r}; choose one of {sorted(OPS)}.") from None

