"""Op parity: does a backend compute the same scores, loss and input gradients as the exact math?

Each loss head the report measures — colpali-engine's ``ColbertPairwiseCELoss`` (``inbatch``),
``ColbertNegativeCELoss`` (``negative-ce``), ``ColbertPairwiseNegativeCELoss``
(``pairwise-negative-ce``), PyLate's ``ColBERTScores`` with masks (``scores``) and PyLate's
``Contrastive`` loss on them, whole or query-chunked (``contrastive``, ``score_mini_batch_size``) —
runs through the code path the harness measures (:mod:`harness.opbench`'s heads, PyLate's own loss)
on seeded inputs of one :class:`Case`, and is compared with an fp64 reference of the library's
vanilla math on the same inputs (cast exactly to float64, on the CPU). A :class:`ParityRecord`
holds, per quantity, the max absolute error, the max relative error and the worst error as a
fraction of its bound; it passes when no element exceeds the bound argued below.

Relative error is ``max|x − ref| / max|ref|`` over the whole tensor (normwise), never elementwise:
a score or a gradient near zero would make an elementwise ratio meaningless.

**The bound, from the dtype** (``u`` = unit roundoff: 2^-24 fp32, 2^-8 bf16, 2^-11 fp16 and for
the operands of a TF32 or fp16 tensor-core product, 2^-53 fp64). Every path computes a grid element
``g = q·e`` (``d`` = 128 products of unit-norm vectors) with operands rounded to ``u_op`` (0 when
the kernel uses the inputs' own dtype), an fp32 accumulator ``u_acc`` and a result rounded to
``u_out``; by the standard dot-product bound and Cauchy–Schwarz (``Σ|q_k e_k| ≤ ‖q‖‖e‖``)::

    |ĝ − g| ≤ δ = (2·u_op + d·u_acc + u_out) · ‖q‖·‖e‖

``max`` is exact on its inputs, so each token maximum is off by at most max δ over its row, and the
score ``S = Σ_n max_s g`` (an ``Lq``-term sum) by::

    tol_S = Σ_n max_s δ + (u_out + Lq·u_acc) · Σ_n |max_s g|

(masked tokens enter as exact zeros: PyLate multiplies by its bool masks, colpali zero-pads). The
loss ``L(S)`` is smooth in the scores (softplus, cross-entropy) except where a hardest negative is
chosen; to first order ``|ΔL| ≤ Σ|∂L/∂S|·tol_S``, plus the loss's own roundings
``4·u_out·(|L| + Σ|∂L/∂S|·|S|)`` (division by lengths and temperature, difference, softplus/log-sum-exp,
mean). Gradients ``∂L/∂q = Σ_c G_c·e_{c,s*}`` (``G = ∂L/∂S``, ``s*`` the argmax token) carry three
errors: ``ΔG`` from the score errors, bounded by ``2·|∇²L|·tol_S`` (the Hessian of the loss in the
scores, from the fp64 reference; the 2 covers second-order terms) plus ``4·u_out·|G|``; the
rounding of the backward's own sums, ``(2·u_out + 2·u_op + u_grad + n·u_acc)·|G|·|e|``; and **ties**:
where another token's exact value lies within ``2δ`` of the maximum, a backend in that arithmetic may
legitimately pick it, moving ``|G|·|e_s − e_s'|``; the bound adds ``|G|·Σ_{s in the tie set} |e_s|``
there, and likewise for a hardest negative within ``tol_S`` of another (pairwise losses). The
per-element bound is the sum of these, mapped back to the input tensors. It is a worst-case bound
(no cancellation assumed), so a correct backend sits well below it (see the numbers each record
stores) while a wrong operation — a mean for a max, a wrong mask, a perturbed gradient — exceeds it
by orders of magnitude.

**The arithmetic of a backend** is part of the argument (:func:`arithmetic`): vanilla computes in
the inputs' dtype with fp32 accumulation; late-interaction-kernels multiplies fp32 operands as TF32
(Triton's default ``tl.dot`` precision) and its ``lowmem`` backward writes fp32 ``grad_D`` through
fp16 matmuls; flash-maxsim converts every operand to fp16 when it loads it. The fp32 bound of a
fused backend is therefore the TF32/fp16 one, recorded beside the errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from harness import backends

SCHEMA_VERSION = 1
KIND = "op-parity"
Library = Literal["colpali", "pylate"]

# --- the heads, their cases and the arithmetic of each backend -------------------------------------

HEADS: Mapping[str, tuple[str, ...]] = {
    "colpali": ("inbatch", "negative-ce", "pairwise-negative-ce"),
    "pylate": ("scores", "contrastive"),
}
VARIANTS: Mapping[str, tuple[str, ...]] = {"colpali": ("vanilla", "lik"), "pylate": ("vanilla", "lik", "flash")}
PARITY_DTYPES: Mapping[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
UNIT_ROUNDOFF: Mapping[str, float] = {"float64": 2.0**-53, "float32": 2.0**-24, "tf32": 2.0**-11,
                                      "float16": 2.0**-11, "bfloat16": 2.0**-8}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Arithmetic:
    """How a backend rounds: operands (0: used as given), accumulator, results, gradients."""

    name: str
    operand_unit: float
    accumulate_unit: float
    output_unit: float
    grad_unit: float


def arithmetic(variant: str, dtype: str, normalises: bool = False) -> Arithmetic:
    """The arithmetic ``variant`` uses on ``dtype`` inputs (``normalises``: the head L2-normalises its
    inputs in that dtype first, which rounds every operand once more)."""
    u = UNIT_ROUNDOFF[dtype]
    fp32 = UNIT_ROUNDOFF["float32"]
    operand, grad, name = 0.0, u, dtype
    if variant == "lik" and dtype == "float32":
        operand, grad, name = UNIT_ROUNDOFF["tf32"], UNIT_ROUNDOFF["float16"], "tf32 products, fp16 lowmem grad_D"
    elif variant == "flash" and dtype == "float32":
        operand, grad, name = UNIT_ROUNDOFF["float16"], UNIT_ROUNDOFF["float16"], "fp16 operands"
    elif variant == "flash":
        name = f"{dtype} as fp16 operands"  # bf16 → fp16 is exact for unit-norm components in fp16's normal range
    if normalises:
        operand = max(operand, u)
    return Arithmetic(name, operand, fp32 if dtype != "float64" else u, u, max(grad, u))


@dataclasses.dataclass(frozen=True)
class Case:
    """One input shape, seeded. ``padding``: the awkward padded layout — colpali's zero-padded
    tokens (queries left-padded, documents right-padded, one document entirely padding) or PyLate's
    bool masks (varying lengths, skiplist holes, one document slot fully masked)."""

    name: str
    batch: int
    query_tokens: int
    doc_tokens: int
    negatives: int = 2  # colpali explicit negatives per query; PyLate always scores 2 slots (positive, negative)
    dim: int = 128
    padding: bool = False
    published: bool = False  # a shape the report publishes (run on the GPU); the others are CPU-sized


CPU_CASES: tuple[Case, ...] = (
    Case("aligned", batch=4, query_tokens=32, doc_tokens=64),
    Case("odd-lengths", batch=5, query_tokens=13, doc_tokens=77, negatives=3),
    Case("single-query-token", batch=4, query_tokens=1, doc_tokens=45),
    Case("padded", batch=4, query_tokens=20, doc_tokens=50, padding=True),
)
PUBLISHED_CASES: Mapping[str, tuple[Case, ...]] = {
    # grids/op.yaml: bf16 queries [B, 32, 128], documents [B, 1030, 128], 4 negatives each; the
    # e2e ColQwen2 calls: queries [B, 33-57], documents [B, 755-779] (zero-padded)
    "colpali": (
        Case("op-grid", batch=64, query_tokens=32, doc_tokens=1030, negatives=4, published=True),
        Case("colqwen2-train", batch=16, query_tokens=57, doc_tokens=779, negatives=2, padding=True, published=True),
    ),
    # the PyLate recipe: queries [B, 48, 128], documents [B, 2, 300, 128] with skiplist masks
    "pylate": (Case("pylate-train", batch=64, query_tokens=48, doc_tokens=300, padding=True, published=True),),
}
DEFAULT_DTYPES: Mapping[str, tuple[str, ...]] = {"colpali": ("bfloat16", "float32"), "pylate": ("float32", "bfloat16")}


def head_normalises(library: str, head: str) -> bool:
    return library == "pylate" and head == "contrastive"  # PyLate's Contrastive L2-normalises what the model gives


# --- inputs ---------------------------------------------------------------------------------------


def make_inputs(library: str, head: str, case: Case, dtype: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded CPU inputs in ``dtype``: unit-norm embeddings (zero where colpali pads), bool masks (PyLate).

    colpali: ``query [B, Lq, d]``, ``doc [B, Ld, d]``, with negatives ``neg [B, N, Ld, d]``.
    PyLate: ``query [B, Lq, d]``, ``doc [B, 2, Ld, d]`` (positive, negative), ``doc_mask [B, 2, Ld]``.
    """
    generator = torch.Generator().manual_seed(seed)
    b, lq, ld, d = case.batch, case.query_tokens, case.doc_tokens, case.dim

    def unit(*shape: int) -> torch.Tensor:
        values = torch.randn(shape, generator=generator, dtype=torch.float64)
        return torch.nn.functional.normalize(values, dim=-1).to(PARITY_DTYPES[dtype])

    if library == "colpali":
        inputs = {"query": unit(b, lq, d), "doc": unit(b, ld, d)}
        if head != "inbatch":
            inputs["neg"] = unit(b, case.negatives, ld, d)
        if case.padding:
            query_pad = torch.randint(0, max(lq // 4, 1), (b,), generator=generator)
            query_pad[0] = 0  # every query keeps at least its last 3/4 of tokens
            for row, pad in enumerate(query_pad.tolist()):
                inputs["query"][row, :pad] = 0  # left padding, as the processor pads queries
            lengths = torch.randint(ld // 3, ld + 1, (b,), generator=generator)
            for row, length in enumerate(lengths.tolist()):
                inputs["doc"][row, length:] = 0
            inputs["doc"][1 % b] = 0  # a document that is all padding
            if "neg" in inputs:
                inputs["neg"][0, -1, ld // 2 :] = 0
                inputs["neg"][b - 1, 0] = 0
        return inputs
    inputs = {"query": unit(b, lq, d), "doc": unit(b, 2, ld, d), "doc_mask": torch.ones(b, 2, ld, dtype=torch.bool)}
    if case.padding:
        mask = inputs["doc_mask"]
        lengths = torch.randint(max(ld // 10, 1), ld + 1, (b, 2), generator=generator)
        mask &= torch.arange(ld) < lengths.unsqueeze(-1)  # padding after each passage
        mask &= torch.rand(b, 2, ld, generator=generator) > 0.1  # skiplist holes (punctuation) inside it
        mask[1 % b, 1] = False  # a document slot that is all padding
    return inputs


# --- the fp64 reference ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Grid:
    """One MaxSim grid of the reference: queries against shared ``[C, Ld, d]`` or per-query ``[B, C, Ld, d]``
    documents, with what the bound needs (scores' bound, tie sets, effective embeddings)."""

    query: str
    doc: str
    doc_view: Callable[[torch.Tensor], torch.Tensor]  # the documents this grid scores, as a view of the input
    doc_mask: str | None = None  # the input holding their bool mask (viewed the same way)


def _grid_scores(q: torch.Tensor, docs: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The vanilla math in fp64: grid, bool-mask multiply (PyLate), max over doc tokens, sum over query tokens."""
    shared = docs.dim() == 3
    grid = torch.einsum("bnk,csk->bcns" if shared else "bnk,bcsk->bcns", q, docs)
    if mask is not None:
        grid = grid * (mask.unsqueeze(1) if shared else mask.unsqueeze(2)).to(grid.dtype)
    return grid.amax(dim=3).sum(dim=2)


def _grid_bounds(q: torch.Tensor, docs: torch.Tensor, mask: torch.Tensor | None, arith: Arithmetic,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(tol_S [B, C], near [B, C, Lq, Ld] tie sets, multi [B, C, Lq] rows with a tie, |q|, |e_eff|)."""
    shared = docs.dim() == 3
    effective = docs if mask is None else docs * mask.unsqueeze(-1).to(docs.dtype)
    grid = torch.einsum("bnk,csk->bcns" if shared else "bnk,bcsk->bcns", q, effective)
    q_norm, e_norm = q.norm(dim=-1), effective.norm(dim=-1)
    gamma = 2 * arith.operand_unit + q.shape[-1] * arith.accumulate_unit + arith.output_unit
    delta = gamma * q_norm[:, None, :, None] * (e_norm[None, :, None, :] if shared else e_norm[:, :, None, :])
    maxima = grid.amax(dim=3)
    delta_max = delta.amax(dim=3)
    lq = q.shape[1]
    tol = delta_max.sum(dim=2) + (arith.output_unit + lq * arith.accumulate_unit) * maxima.abs().sum(dim=2)
    near = grid >= (maxima - 2 * delta_max).unsqueeze(-1)
    multi = near.sum(dim=3) > 1
    return tol, near, multi, q.abs(), effective.abs()


@dataclasses.dataclass
class Reference:
    """The fp64 reference of one head on one input set, with the elementwise bound of every quantity."""

    scores: dict[str, torch.Tensor]
    loss: torch.Tensor | None
    grads: dict[str, torch.Tensor]
    bounds: dict[str, torch.Tensor]  # "scores:<name>", "loss", "grad:<input>"


LossOfScores = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]
TieBound = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]


def _reference(inputs: Mapping[str, torch.Tensor], grids: Mapping[str, _Grid], loss_of_scores: LossOfScores,
               arith: Arithmetic, compared: Sequence[str], loss_is_compared: bool = True,
               ties: TieBound | None = None) -> Reference:  # fmt: skip
    """Run the vanilla math in fp64 and bound each quantity for ``arith`` (see the module docstring)."""
    leaves = {k: v.detach().to("cpu", torch.float64).requires_grad_() for k, v in inputs.items() if v.is_floating_point()}
    masks = {name: None if g.doc_mask is None else g.doc_view(inputs[g.doc_mask].detach().cpu()) for name, g in grids.items()}
    scores = {name: _grid_scores(leaves[g.query], g.doc_view(leaves[g.doc]), masks[name]) for name, g in grids.items()}
    loss = loss_of_scores(scores)
    embedded = [k for k in leaves if leaves[k].requires_grad]
    score_grads = torch.autograd.grad(loss, list(scores.values()), retain_graph=True)
    grads = dict(zip(embedded, torch.autograd.grad(loss, [leaves[k] for k in embedded]), strict=True))
    g_of = {name: grad.detach() for name, grad in zip(scores, score_grads, strict=True)}
    s_of = {name: s.detach() for name, s in scores.items()}

    bounds_of = {name: _grid_bounds(leaves[g.query].detach(), g.doc_view(leaves[g.doc].detach()), masks[name], arith)
                 for name, g in grids.items()}  # fmt: skip
    tol_s = {name: bound[0] for name, bound in bounds_of.items()}
    u_out = arith.output_unit
    bounds: dict[str, torch.Tensor] = {f"scores:{name}": tol_s[name] for name in compared}
    loss_value = loss.detach()
    first_order = sum(((g_of[n].abs() * tol_s[n]).sum() for n in scores), torch.zeros((), dtype=torch.float64))
    rounding = 4 * u_out * (loss_value.abs() + sum(((g_of[n].abs() * s_of[n].abs()).sum() for n in scores),
                                                    torch.zeros((), dtype=torch.float64)))  # fmt: skip
    if loss_is_compared:
        bounds["loss"] = first_order + rounding

    # ΔG: 2·|∇²L|·tol_S (+ the loss's roundings, + hardest-negative ties)
    names = list(scores)
    sizes = [s_of[n].numel() for n in names]
    flat = torch.cat([s_of[n].reshape(-1) for n in names])

    def flat_loss(vector: torch.Tensor) -> torch.Tensor:
        parts = torch.split(vector, sizes)
        return loss_of_scores({n: p.reshape(s_of[n].shape) for n, p in zip(names, parts, strict=True)})

    hessian = torch.autograd.functional.hessian(flat_loss, flat, vectorize=True)
    tol_flat = torch.cat([tol_s[n].reshape(-1) for n in names])
    delta_g_flat = 2 * hessian.abs() @ tol_flat
    delta_g = {n: p.reshape(s_of[n].shape) + 4 * u_out * g_of[n].abs()
               for n, p in zip(names, torch.split(delta_g_flat, sizes), strict=True)}  # fmt: skip
    if ties is not None:
        for n, extra in ties(s_of, g_of, tol_s).items():
            delta_g[n] = delta_g[n] + extra

    grad_bounds = {k: torch.zeros_like(leaves[k], dtype=torch.float64) for k in embedded}
    for name, grid in grids.items():
        _, near, multi, q_abs, e_abs = bounds_of[name]
        b, lq = q_abs.shape[:2]
        c = s_of[name].shape[1]
        eps = 2 * u_out + 2 * arith.operand_unit + arith.grad_unit + (b * lq + c) * arith.accumulate_unit
        weight = (delta_g[name] + eps * g_of[name].abs()).unsqueeze(-1) + g_of[name].abs().unsqueeze(-1) * multi
        near_w = near.to(torch.float64)
        shared = e_abs.dim() == 3
        grad_bounds[grid.query] += torch.einsum("bcn,bcns,csk->bnk" if shared else "bcn,bcns,bcsk->bnk", weight, near_w, e_abs)
        doc_bound = torch.einsum("bcn,bcns,bnk->csk" if shared else "bcn,bcns,bnk->bcsk", weight, near_w, q_abs)
        dummy = torch.zeros_like(leaves[grid.doc], dtype=torch.float64, requires_grad=True)
        (mapped,) = torch.autograd.grad(grid.doc_view(dummy), dummy, grad_outputs=doc_bound)  # a view's sum: |.| adds up
        grad_bounds[grid.doc] += mapped
    bounds |= {f"grad:{k}": v for k, v in grad_bounds.items()}
    return Reference(
        scores={n: s_of[n] for n in compared},
        loss=loss_value if loss_is_compared else None,
        grads={k: v.detach() for k, v in grads.items()},
        bounds=bounds,
    )


def _hardest_negative_ties(name: str, weight: float) -> TieBound:
    """Pairwise losses pick ``max_{c≠b} S_bc``: where another negative is within the score bound of it,
    the gradient of that row may move to it (|G| of the chosen one, on every member of the tie set)."""

    def ties(s_of: Mapping[str, torch.Tensor], g_of: Mapping[str, torch.Tensor], tol_s: Mapping[str, torch.Tensor]
             ) -> dict[str, torch.Tensor]:  # fmt: skip
        scores, grads, tol = s_of[name], g_of[name], tol_s[name]
        eye = torch.eye(scores.shape[0], dtype=torch.bool)
        negatives = scores.masked_fill(eye, float("-inf"))
        chosen = negatives.argmax(dim=1, keepdim=True)
        top, top_tol = negatives.gather(1, chosen), tol.gather(1, chosen)
        tie_set = (negatives >= top - (tol + top_tol)) & ~eye
        moved = grads.abs().gather(1, chosen)
        return {name: tie_set.to(torch.float64) * moved * (tie_set.sum(dim=1, keepdim=True) > 1) * max(weight, 1.0)}

    return ties


def _query_lengths(query: torch.Tensor) -> torch.Tensor:
    return (query[:, :, 0] != 0).sum(dim=1).to(torch.float64)  # colpali-engine: non-zero query tokens


def _softplus_pairwise(scores: torch.Tensor, lengths: torch.Tensor, temperature: float) -> torch.Tensor:
    """ColbertPairwiseCELoss: softplus((hardest in-batch negative − positive) / T), lengths-normalised."""
    normalised = scores / lengths.unsqueeze(1)
    positives = normalised.diagonal()
    eye = torch.eye(scores.shape[0], dtype=torch.bool)
    hardest = normalised.masked_fill(eye, float("-inf")).amax(dim=1)
    return torch.nn.functional.softplus((hardest - positives) / temperature).mean()


def _info_nce(scores: torch.Tensor, lengths: torch.Tensor, temperature: float) -> torch.Tensor:
    """ColbertLoss: cross-entropy of the lengths-normalised in-batch scores / T, positives on the diagonal."""
    normalised = scores / lengths.unsqueeze(1)
    return torch.nn.functional.cross_entropy(normalised / temperature, torch.arange(scores.shape[0]))


def reference(library: str, head: str, inputs: Mapping[str, torch.Tensor], variant: str = "vanilla",
              hyper: Mapping[str, float] | None = None, weights: torch.Tensor | None = None,
              dtype: str | None = None) -> Reference:  # fmt: skip
    """The fp64 reference of ``head`` on ``inputs`` with the bound of ``variant``'s arithmetic on ``dtype``
    (default: the inputs' dtype).

    ``hyper``: the loss's hyperparameters (read from the library's module when the backend runs;
    the libraries' defaults otherwise). ``weights``: the upstream gradient of the ``scores`` head.
    """
    dtype = dtype or ops_dtype_name(inputs["query"].dtype)
    arith = arithmetic(variant, dtype, head_normalises(library, head))
    hyper = dict(DEFAULT_HYPER[(library, head)]) | dict(hyper or {})
    if library == "colpali":
        lengths = _query_lengths(inputs["query"].detach())
        temperature, ib_weight = hyper["temperature"], hyper.get("in_batch_term_weight", 0.0)
        inbatch = _Grid("query", "doc", lambda doc: doc)
        if head == "inbatch":
            return _reference(inputs, {"inbatch": inbatch},
                              lambda s: _softplus_pairwise(s["inbatch"], lengths, temperature), arith, ["inbatch"],
                              ties=_hardest_negative_ties("inbatch", 1.0))  # fmt: skip
        grids = {"inbatch": inbatch, "pos": _Grid("query", "doc", lambda doc: doc.unsqueeze(1)),
                 "kd": _Grid("query", "neg", lambda neg: neg)}  # fmt: skip

        def negative_loss(s: Mapping[str, torch.Tensor]) -> torch.Tensor:
            pos, neg = s["pos"][:, 0] / lengths, s["kd"] / lengths.unsqueeze(1)
            loss = torch.nn.functional.softplus((neg - pos.unsqueeze(1)) / temperature).mean()
            in_batch = (_info_nce if head == "negative-ce" else _softplus_pairwise)(s["inbatch"], lengths, temperature)
            return loss * (1 - ib_weight) + in_batch * ib_weight

        ties = _hardest_negative_ties("inbatch", 1.0) if head == "pairwise-negative-ce" else None
        return _reference(inputs, grids, negative_loss, arith, ["inbatch", "kd"], ties=ties)
    slots = inputs["doc"].shape[1]
    mask = "doc_mask" if "doc_mask" in inputs else None
    grids = {f"slot{j}": _Grid("query", "doc", _slot(j), mask) for j in range(slots)}

    def stacked(s: Mapping[str, torch.Tensor]) -> torch.Tensor:  # ColBERTScores: query-major [B, B*N]
        return torch.stack([s[f"slot{j}"] for j in range(slots)], dim=2).reshape(s["slot0"].shape[0], -1)

    if head == "scores":
        assert weights is not None, "the scores head needs its upstream gradient (weights)"
        upstream = weights.to(torch.float64)
        ref = _reference(inputs, grids, lambda s: (stacked(s) * upstream).sum(), arith, list(grids), loss_is_compared=False)
    else:
        temperature = hyper["temperature"]

        def contrastive(s: Mapping[str, torch.Tensor]) -> torch.Tensor:
            scores = stacked(s)
            return torch.nn.functional.cross_entropy(scores / temperature, torch.arange(scores.shape[0]) * slots)

        ref = _reference(inputs, grids, contrastive, arith, list(grids))
    merged = stacked({n: ref.scores[n] for n in grids})
    bound = stacked({n: ref.bounds.pop(f"scores:{n}") for n in grids})
    ref.scores, ref.bounds["scores:scores"] = {"scores": merged}, bound
    return ref


def _slot(j: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Slot ``j`` of PyLate's stacked documents ``[B, N, Ld, d]`` (or of their masks ``[B, N, Ld]``)."""
    return lambda stacked: stacked[:, j]


DEFAULT_HYPER: Mapping[tuple[str, str], Mapping[str, float]] = {
    ("colpali", "inbatch"): {"temperature": 1.0},  # ColbertPairwiseCELoss() defaults, colpali-engine 0.3.18
    ("colpali", "negative-ce"): {"temperature": 0.02, "in_batch_term_weight": 0.5},
    ("colpali", "pairwise-negative-ce"): {"temperature": 0.02, "in_batch_term_weight": 0.5},
    ("pylate", "scores"): {},
    ("pylate", "contrastive"): {"temperature": 1.0},  # Contrastive() default, PyLate 1.6.0
}


def ops_dtype_name(dtype: torch.dtype) -> str:
    for name, value in PARITY_DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"parity covers {sorted(PARITY_DTYPES)}, not {dtype}.")


# --- the backend under test, through the harness's own paths ----------------------------------------


@dataclasses.dataclass
class Observed:
    """What a backend computed: scores by name, the loss (None for the scores head) and input gradients."""

    scores: dict[str, torch.Tensor]
    loss: torch.Tensor | None
    grads: dict[str, torch.Tensor]
    hyper: dict[str, float] = dataclasses.field(default_factory=dict)


def upstream_weights(case: Case, seed: int = 0) -> torch.Tensor:
    """The scores head's fixed upstream gradient ``[B, 2B]``: every score's gradient is exercised."""
    return torch.randn(case.batch, 2 * case.batch, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)


@contextlib.contextmanager
def _capturing(owner: Any, attribute: str, into: dict[str, list[torch.Tensor]], key: str) -> Iterator[None]:
    """Record every output of ``owner.attribute`` (the dispatch a loss calls) while active."""
    original = getattr(owner, attribute)

    def captured(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = original(*args, **kwargs)
        into.setdefault(key, []).append(out.detach())
        return out

    setattr(owner, attribute, captured)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


def run_colpali(head: str, variant: str, inputs: Mapping[str, torch.Tensor]) -> Observed:
    """colpali-engine's loss module through :class:`harness.opbench.ColpaliLossHead` (its strict backend
    switch); the scores are the ones its MaxSim dispatch (``maxsim_inbatch``, ``maxsim_kd``) returned."""
    from colpali_engine.loss import late_interaction_losses as losses

    from harness.opbench import ColpaliLossHead

    op = ColpaliLossHead(head)
    captured: dict[str, list[torch.Tensor]] = {}
    with _capturing(losses, "maxsim_inbatch", captured, "inbatch"), _capturing(losses, "maxsim_kd", captured, "kd"):
        loss = op.forward(variant, inputs)
    loss.backward()
    module = op._module
    hyper = {name: float(getattr(module, name)) for name in ("temperature", "in_batch_term_weight") if hasattr(module, name)}
    if getattr(module, "normalize_scores", True) is not True or getattr(module, "pos_aware_negative_filtering", False):
        raise RuntimeError(f"{COLPALI_NAME[head]} no longer has the defaults this reference encodes; update harness.parity.")
    scores = {name: outs[0] for name, outs in captured.items()}
    return Observed(scores, loss.detach(), _grads(inputs), hyper)


COLPALI_NAME = {"inbatch": "ColbertPairwiseCELoss", "negative-ce": "ColbertNegativeCELoss",
                "pairwise-negative-ce": "ColbertPairwiseNegativeCELoss"}  # fmt: skip


def run_pylate_scores(variant: str, inputs: Mapping[str, torch.Tensor], weights: torch.Tensor) -> Observed:
    """PyLate's in-batch ``ColBERTScores`` through :class:`harness.opbench.PylateScoresHead` (the replayed op),
    backpropagated from the fixed upstream ``weights``."""
    from harness.opbench import PylateScoresHead

    scores = PylateScoresHead().forward(variant, inputs)
    scores.backward(weights.to(scores.device, scores.dtype))
    return Observed({"scores": scores.detach()}, None, _grads(inputs))


class _Encoder(torch.nn.Module):
    """Stands in for the ColBERT model inside PyLate's Contrastive: each feature carries its embeddings."""

    SKIP_TOKEN = 7  # documents' skiplist holes carry this token id, as punctuation does in training
    skiplist = [SKIP_TOKEN]
    do_query_expansion = True  # GTE-ModernColBERT's training: the query mask is not used in scoring

    def forward(self, features: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"token_embeddings": features["embeddings"]}


def run_pylate_contrastive(variant: str, inputs: Mapping[str, torch.Tensor], score_mini_batch_size: int | None) -> Observed:
    """PyLate's own ``losses.Contrastive`` (its normalisation, skiplist masks, query chunks and
    cross-entropy) on the inputs, with the backend set by ``PYLATE_SCORES_BACKEND``. The compared
    gradients are those of the normalised embeddings its score metric receives."""
    from pylate import losses, scores

    from harness.stacks.pylate import select_backend

    select_backend(variant)
    metric = scores.ColBERTScores()
    seen: dict[str, Any] = {"queries": [], "scores": []}

    def score_metric(queries: torch.Tensor, docs: torch.Tensor, **masks: Any) -> torch.Tensor:
        queries.retain_grad()
        docs.retain_grad()
        seen["queries"].append(queries)
        seen["docs"] = docs
        out = metric(queries, docs, **masks)
        seen["scores"].append(out.detach())
        return out

    encoder: Any = _Encoder()  # duck-typed: Contrastive reads only its forward, skiplist and do_query_expansion
    loss_module = losses.Contrastive(encoder, score_metric=score_metric, score_mini_batch_size=score_mini_batch_size)
    query, docs, mask = inputs["query"], inputs["doc"], inputs["doc_mask"]
    ones = torch.ones(query.shape[:2], dtype=torch.long, device=query.device)
    features = [{"input_ids": ones, "attention_mask": ones, "embeddings": query}]
    for slot in range(docs.shape[1]):
        slot_mask = mask[:, slot].to(query.device)
        ids = torch.where(slot_mask, 1, _Encoder.SKIP_TOKEN)  # masked tokens: half skiplist, half padding
        attention = torch.where(~slot_mask & (torch.arange(slot_mask.shape[-1], device=query.device) % 2 == 0), 0, 1)
        features.append({"input_ids": ids, "attention_mask": attention, "embeddings": docs[:, slot]})
    loss = loss_module(features)
    loss.backward()
    grads = {"query": torch.cat([q.grad for q in seen["queries"]]), "doc": seen["docs"].grad}
    return Observed({"scores": torch.cat(seen["scores"])}, loss.detach(), grads, {"temperature": float(loss_module.temperature)})


def _grads(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.grad.detach() for name, tensor in inputs.items() if tensor.grad is not None}


# --- comparison and records ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QuantityError:
    """One compared quantity: errors against the fp64 reference and against the bound.

    ``max_rel_error`` = ``max_abs_error / reference_max_abs`` (normwise); ``error_to_bound`` =
    max over elements of ``|x − ref| / bound`` (≤ 1 passes); ``bound_max`` the largest element bound.
    """

    quantity: str
    shape: list[int]
    max_abs_error: float
    max_rel_error: float
    reference_max_abs: float
    bound_max: float
    error_to_bound: float
    passed: bool


@dataclasses.dataclass(frozen=True)
class ParityRecord:
    """One head × backend × dtype × case on one device, against the fp64 reference."""

    library: str
    head: str
    variant: str
    dtype: str
    case: str
    device: str
    arithmetic: str
    query_shape: list[int]
    doc_shape: list[int]
    negatives_shape: list[int] | None
    score_mini_batch_size: int | None
    seed: int
    errors: list[QuantityError]
    passed: bool
    hyper: dict[str, float]

    def error(self, quantity: str) -> QuantityError:
        return next(e for e in self.errors if e.quantity == quantity)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare(quantity: str, observed: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> QuantityError:
    """Errors of ``observed`` against ``expected`` (fp64), elementwise against ``bound``."""
    got = observed.detach().to("cpu", torch.float64)
    if got.shape != expected.shape:
        raise ValueError(f"{quantity}: backend shape {list(got.shape)} is not the reference's {list(expected.shape)}")
    error = (got - expected).abs()
    error = torch.where(torch.isfinite(got), error, torch.full_like(error, float("inf")))
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    max_abs = float(error.max()) if error.numel() else 0.0
    ratio = torch.where(error == 0, torch.zeros_like(error), error / bound)  # 0/0 passes, x/0 does not
    worst = float(ratio.max()) if ratio.numel() else 0.0
    return QuantityError(
        quantity=quantity, shape=list(got.shape), max_abs_error=max_abs,
        max_rel_error=max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf")),
        reference_max_abs=scale, bound_max=float(bound.max()) if bound.numel() else 0.0,
        error_to_bound=worst, passed=worst <= 1.0,
    )  # fmt: skip


def check_runnable(library: str, head: str, variant: str, device: torch.device | str,
                   score_mini_batch_size: int | None = None) -> None:  # fmt: skip
    """Refuse, before anything runs, a combination that cannot run here (never a fallback)."""
    if head not in HEADS.get(library, ()):
        raise ValueError(f"unknown head {head!r} for {library}; choose one of {list(HEADS.get(library, ()))}.")
    if variant not in VARIANTS[library]:
        raise ValueError(f"variant {variant!r} is not available for {library}; choose one of {list(VARIANTS[library])}.")
    if score_mini_batch_size is not None and not (library == "pylate" and head == "contrastive" and variant == "vanilla"):
        raise ValueError("score_mini_batch_size is PyLate's chunking of its Contrastive loss: vanilla 'contrastive' only.")
    if variant != "vanilla":
        backends.require(variant, library, device)


def check_parity(library: str, head: str, variant: str, dtype: str, case: Case, device: torch.device | str = "cpu",
                 score_mini_batch_size: int | None = None, seed: int = 0,
                 tamper: Callable[[Observed], Observed] | None = None) -> ParityRecord:  # fmt: skip
    """Run ``head`` with ``variant`` on ``case`` in ``dtype`` and compare it with the fp64 reference.

    ``tamper`` (tests only) alters what the backend returned before the comparison, to show a wrong
    backend fails.
    """
    device = torch.device(device)
    check_runnable(library, head, variant, device, score_mini_batch_size)
    cpu_inputs = make_inputs(library, head, case, dtype, seed)
    inputs = {k: v.to(device).requires_grad_(v.is_floating_point()) for k, v in cpu_inputs.items()}
    weights = upstream_weights(case, seed) if head == "scores" else None
    if library == "colpali":
        observed = run_colpali(head, variant, inputs)
    elif head == "scores":
        assert weights is not None
        observed = run_pylate_scores(variant, inputs, weights)
    else:
        observed = run_pylate_contrastive(variant, inputs, score_mini_batch_size)
    if tamper is not None:
        observed = tamper(observed)
    ref_inputs = dict(cpu_inputs)
    if head_normalises(library, head):  # compared where the score metric receives them: after PyLate's normalisation
        ref_inputs["query"] = torch.nn.functional.normalize(cpu_inputs["query"].double(), dim=-1)
        ref_inputs["doc"] = torch.nn.functional.normalize(cpu_inputs["doc"].double(), dim=-1)
    ref = reference(library, head, ref_inputs, variant, observed.hyper, weights, dtype=dtype)
    errors = [compare(f"scores:{name}", observed.scores[name], ref.scores[name], ref.bounds[f"scores:{name}"])
              for name in ref.scores]  # fmt: skip
    if ref.loss is not None and observed.loss is not None:
        errors.append(compare("loss", observed.loss, ref.loss, ref.bounds["loss"]))
    errors += [compare(f"grad:{name}", observed.grads[name], ref.grads[name], ref.bounds[f"grad:{name}"]) for name in ref.grads]
    return ParityRecord(
        library=library, head=head, variant=variant, dtype=dtype, case=case.name, device=str(device),
        arithmetic=arithmetic(variant, dtype, head_normalises(library, head)).name,
        query_shape=list(cpu_inputs["query"].shape), doc_shape=list(cpu_inputs["doc"].shape),
        negatives_shape=list(cpu_inputs["neg"].shape) if "neg" in cpu_inputs else None,
        score_mini_batch_size=score_mini_batch_size, seed=seed, errors=errors,
        passed=all(e.passed for e in errors), hyper=observed.hyper,
    )  # fmt: skip


# --- the result file --------------------------------------------------------------------------------


def parity_document(records: Sequence[ParityRecord], device: torch.device | str, seed: int = 0) -> dict[str, Any]:
    """The op-parity result: schema version, kind, environment and provenance blocks as every result has, records."""
    from harness import environment, provenance

    device = torch.device(device)
    env = environment.collect(device, "native", None, seed, "none (loss head only)", "seeded unit-norm embeddings")
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env": env.model_dump(mode="json"),
        "provenance": provenance.collect().model_dump(mode="json"),
        "passed": all(r.passed for r in records),
        "records": [r.to_dict() for r in records],
    }


# --- why a fused backend differs on PyLate's masks: what it reads them as -----------------------------


def _inbatch_scores(query: torch.Tensor, doc: torch.Tensor, valid: torch.Tensor, masked_as: str) -> torch.Tensor:
    """PyLate's in-batch scores ``[B, 2B]`` in fp64 over ``valid`` document tokens: ``masked_as='zero'`` is
    the vanilla math (masked tokens enter the maximum as zeros), ``'excluded'`` leaves them out of it."""
    b, slots, ld, dim = doc.shape
    docs, valid = doc.reshape(b * slots, ld, dim), valid.reshape(b * slots, ld)
    grid = torch.einsum("qnh,csh->qcns", query, docs)
    if masked_as == "zero":
        grid = grid * valid[None, :, None, :].to(grid.dtype)
    else:
        grid = grid.masked_fill(~valid[None, :, None, :], float("-inf"))
    return grid.amax(dim=-1).sum(dim=-1)


# What each fused backend is found to read PyLate's bool document masks as (harness.report.agreement
# sets each reading's differences beside the backend's recorded errors):
# - "lengths": PyLate's flash path (pylate/scores/_flash_backend.py) hands flash-maxsim each mask as a
#   length (mask.sum(-1)): the first `length` tokens count, whatever the mask said of them, so a skiplist
#   hole inside a passage moves the counted tokens; a document of length 0 gets a score that is not
#   finite, and the backward goes through its token 0.
# - "excluded": masked tokens are left out of the maximum instead of entering it as zeros, which
#   differs where every real token of a document scores below 0 for some query token (short documents).
MASK_READINGS: Mapping[str, str] = {"flash": "lengths", "lik": "excluded"}


def masks_read_as(case: Case, reading: str, dtype: str = "float32", seed: int = 0) -> dict[str, float]:
    """The vanilla math with PyLate's document masks read as ``reading`` (:data:`MASK_READINGS`),
    against the vanilla math itself, on the scores head's inputs of ``dtype`` (cast exactly to fp64)
    and upstream gradient: the largest absolute difference of the finite scores, of ``grad:query``
    and of ``grad:doc`` (the quantities :func:`check_parity` records), how many scores are not
    finite, and how many document slots are fully masked. If these equal a backend's recorded errors,
    that reading is the whole difference."""
    made = make_inputs("pylate", "scores", case, dtype, seed)
    inputs = {k: v.double() if v.is_floating_point() else v for k, v in made.items()}
    weights = upstream_weights(case, seed)
    mask = inputs["doc_mask"]
    lengths = mask.sum(dim=-1, keepdim=True)
    if reading == "lengths":
        valid = torch.arange(mask.shape[-1]) < lengths
        valid[..., 0] |= lengths[..., 0] == 0  # an empty document: its token 0 carries the backward
    elif reading == "excluded":
        valid = mask
    else:
        raise ValueError(f"unknown mask reading {reading!r}; choose one of {sorted(set(MASK_READINGS.values()))}")
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, chosen, masked_as in (("vanilla", mask, "zero"), ("read", valid, "excluded")):
        query = inputs["query"].clone().requires_grad_()
        doc = inputs["doc"].clone().requires_grad_()
        scores = _inbatch_scores(query, doc, chosen, masked_as)
        if reading == "excluded":
            scores = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))  # an empty document scores 0
        scores.backward(weights)
        assert query.grad is not None and doc.grad is not None
        out[name] = {"scores": scores.detach(), "grad:query": query.grad, "grad:doc": doc.grad}
    finite = torch.isfinite(out["read"]["scores"])
    if reading == "lengths":  # flash scores an empty document with a value that is not finite
        finite &= (lengths.reshape(1, -1) > 0)
    result = {quantity: float((out["read"][quantity] - out["vanilla"][quantity]).abs().max())
              for quantity in ("grad:query", "grad:doc")}  # fmt: skip
    result["scores"] = float((out["read"]["scores"] - out["vanilla"]["scores"])[finite].abs().max())
    result["scores_not_finite"] = float((~finite).sum())
    result["empty_documents"] = float((lengths == 0).sum())
    return result


MASK_READINGS_KIND = "mask-readings"


def write_mask_readings(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """:func:`masks_read_as` for every backend's reading, padded PyLate case and dtype, as one result file."""
    from harness import provenance
    from harness.results import write_text_atomic

    cases = [case for case in CPU_CASES + PUBLISHED_CASES["pylate"] if case.padding]
    rows = [{"variant": variant, "reading": reading, "case": case.name, "dtype": dtype, "seed": seed,
             **masks_read_as(case, reading, dtype, seed)}
            for variant, reading in MASK_READINGS.items() for case in cases for dtype in DEFAULT_DTYPES["pylate"]]  # fmt: skip
    document = {"schema_version": SCHEMA_VERSION, "kind": MASK_READINGS_KIND, "head": "scores",
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "provenance": provenance.collect().model_dump(mode="json"), "rows": rows}  # fmt: skip
    return write_text_atomic(path, json.dumps(document, indent=2) + "\n")


def write_parity(records: Sequence[ParityRecord], path: str | os.PathLike[str], device: torch.device | str,
                 seed: int = 0) -> Path:  # fmt: skip
    """Write one op-parity result file atomically (:func:`harness.results.write_text_atomic`)."""
    from harness.results import write_text_atomic

    document = parity_document(records, device, seed)
    return write_text_atomic(path, json.dumps(document, indent=2, allow_nan=True) + "\n")
