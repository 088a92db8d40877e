"""What a cell is, in one place: the frozen cell specification and the registries it is checked against.

Every layer passes a :class:`TrainSpec` or :class:`OpSpec` along — a grid entry expands into specs,
the sweep and the ceiling search launch them, a notebook's papermill parameters map onto one, the
cell runners take one, and every result embeds the one it ran — so nothing copies a cell field by
field and no identity is read back from a file path.

The registries say what the project knows about its stacks, MaxSim backends, emulated cards,
allocators and environments (with their Jupyter kernels). This module imports the standard
library only: the report, the results and ``tools/envs.py`` (which runs before anything is
installed) read it without torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

# --- registries ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Environment:
    """A pinned environment (``envs/<name>/``) and the Jupyter kernel its notebooks run in."""

    name: str
    kernel: str | None  # None: no notebooks run there (the replay environment)
    libraries: tuple[str, ...]  # the MaxSim libraries it carries: "colpali", "pylate"
    backends: tuple[str, ...]  # the fused backends installed there, besides vanilla


ENVIRONMENTS: dict[str, Environment] = {
    env.name: env
    for env in (
        Environment("colpali", "maxsim-colpali", ("colpali",), ("lik",)),
        Environment("colpali-0.3.16", "maxsim-colpali-0.3.16", ("colpali",), ("lik",)),
        Environment("pylate", "maxsim-pylate", ("pylate",), ("lik", "flash")),
        Environment("pylate-1.5", "maxsim-pylate-1.5", ("pylate",), ("lik",)),
        Environment("replay", None, ("colpali", "pylate"), ("lik", "flash")),
    )
}


@dataclasses.dataclass(frozen=True)
class Stack:
    """A stack as the orchestration knows it, without importing it (its libraries live in its own
    environment): training cells of a library's recipe, or one of its loss heads alone (op cells)."""

    name: str
    kind: Literal["train", "op"]
    library: str  # whose MaxSim it is: "colpali" (colpali-engine) or "pylate"
    regimes: tuple[str, ...]  # training regimes; for op stacks, the loss heads
    environment: str
    notebook: str
    module: str | None = None  # train stacks: the module that builds a cell
    presets: tuple[str, ...] = ()  # train stacks: model presets besides "auto"
    lengths: tuple[int, int] | None = None  # op stacks: (query, document) tokens of the published shapes
    chunking: bool = False  # PyLate's score_mini_batch_size
    negative_heads: tuple[str, ...] = ()  # op stacks: heads that take explicit negatives
    # train stacks: whether a batch's tensor shapes follow the drawn data (ColQwen2's image and query token
    # counts do; PyLate pads every query and document to fixed lengths), so a probe of another draw of the
    # data ran other shapes, not only other values
    shapes_follow_data: bool = False

    @property
    def kernel(self) -> str:
        kernel = ENVIRONMENTS[self.environment].kernel
        assert kernel is not None, f"environment {self.environment} has no kernel"
        return kernel


STACKS: dict[str, Stack] = {
    stack.name: stack
    for stack in (
        Stack("colpali", "train", "colpali", ("plain",), "colpali", "notebooks/colpali.ipynb",
              module="harness.stacks.colpali", presets=("tiny", "full"), shapes_follow_data=True),
        Stack("pylate", "train", "pylate", ("plain", "grad-checkpoint", "gradcache"), "pylate", "notebooks/pylate.ipynb",
              module="harness.stacks.pylate", presets=("tiny", "full"), chunking=True),
        Stack("op-colpali", "op", "colpali", ("inbatch", "negative-ce", "pairwise-negative-ce"), "colpali",
              "notebooks/op.ipynb", lengths=(32, 1030), negative_heads=("negative-ce", "pairwise-negative-ce")),
        Stack("op-pylate", "op", "pylate", ("inbatch",), "pylate", "notebooks/op.ipynb", lengths=(48, 300)),
    )
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Backend:
    """A MaxSim backend (a cell's ``variant``): which libraries dispatch to it and how its use is proven."""

    name: str
    description: str
    libraries: tuple[str, ...]
    package: str | None = None  # distribution name, for errors and the environment block
    module: str | None = None
    entry_points: tuple[str, ...] = ()  # "module:attribute" the libraries' dispatchers call
    needs_cuda: bool = False


BACKENDS: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("vanilla", "the library's own PyTorch math", ("colpali", "pylate")),
        Backend("lik", "late-interaction-kernels fused Triton kernels", ("colpali", "pylate"),
                package="late-interaction-kernels", module="late_interaction_kernels",
                entry_points=("late_interaction_kernels.autograd:maxsim",), needs_cuda=True),
        Backend("flash", "flash-maxsim fused Triton kernels", ("pylate",), package="flash-maxsim",
                module="flash_maxsim", entry_points=("flash_maxsim:flash_maxsim_batched_train",), needs_cuda=True),
    )
}  # fmt: skip

# An H100 80 GB's reported capacity as 79.11 GiB less the 78.43 GiB cap of the 80 GB profile: the CUDA
# context. The other caps are the capacity PyTorch reports for that card less the same amount. Public
# H100 messages also print 79.18 GiB (driver and board); from 79.18 the context would be
# 0.75 GiB and each derived cap 0.07 GiB smaller. Kept: committed results were measured under these caps.
CONTEXT_GIB = 0.68


@dataclasses.dataclass(frozen=True)
class Card:
    """An emulated card: the allocator is capped at ``usable_gib`` (None: the device as it is)."""

    name: str
    usable_gib: float | None
    description: str
    nominal_gb: int | None = None  # the card's marketed size, for ordering and labels

    @property
    def usable_bytes(self) -> int | None:
        return None if self.usable_gib is None else int(self.usable_gib * (1 << 30))


CARDS: dict[str, Card] = {
    card.name: card
    for card in (
        Card("rtx4090-24gb", round(23.64 - CONTEXT_GIB, 2), "24 GB, e.g. RTX 4090 (23.64 GiB reported)", 24),
        Card("a100-40gb", round(39.50 - CONTEXT_GIB, 2), "40 GB, e.g. A100 40 GB (39.50 GiB reported)", 40),
        Card("l40s-48gb", round(44.43 - CONTEXT_GIB, 2), "48 GB with ECC, e.g. L40S, RTX 6000 Ada (44.43 GiB reported)", 48),
        Card("h100-80gb", 78.43, "NVIDIA H100 80 GB: 78.43 GiB usable to PyTorch", 80),
        Card("native", None, "the whole device, uncapped (H200: 141 GB)", 141),
    )
}

# The CUDA caching allocator's regime: PYTORCH_CUDA_ALLOC_CONF for each (None: unset, the default).
ALLOCATORS: dict[str, str | None] = {"default": None, "expandable": "expandable_segments:True"}
DEVICES = ("auto", "cuda", "cpu")
PRESET_AUTO = "auto"
DEFAULT_SEED = 42
MAX_STEADY_STEPS = 64  # a timed cell's steady steps: enough for percentiles, bounded so a cell ends
MAX_WORLD_SIZE = 8  # the most GPUs one host lends; a cell of world size W owns W of them
AUTOTUNE_ALLOWANCE = 8  # steps beyond warm-up + steady ones a timed cell may spend autotuning (new shape buckets)


class SpecError(ValueError):
    """A cell that cannot be described as asked: raised before anything runs, in one line."""


SYNONYMS = {"gpu": "cuda", "colbert": "pylate"}  # what a user may type for a choice: PyLate trains ColBERT models


def choose(kind: str, name: object, known: Iterable[str]) -> str:
    """``name`` if it is one of ``known``; else a :class:`SpecError` naming the choices and the closest one."""
    known = list(known)
    if name in known:
        return str(name)
    synonym = SYNONYMS.get(str(name))
    close = [synonym] if synonym in known else difflib.get_close_matches(str(name), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise SpecError(f"unknown {kind} {name!r}{hint}; choose one of {', '.join(known)}.")


def stack(name: str) -> Stack:
    return STACKS[choose("stack", name, STACKS)]


def backend(name: str) -> Backend:
    return BACKENDS[choose("variant", name, BACKENDS)]


def card(name: str) -> Card:
    return CARDS[choose("card", name, CARDS)]


def check_variant(variant: str, library: str) -> Backend:
    """The backend for ``variant`` if ``library`` dispatches to it; a :class:`SpecError` otherwise."""
    spec = backend(variant)
    if library not in spec.libraries:
        offered = ", ".join(name for name, other in BACKENDS.items() if library in other.libraries)
        raise SpecError(f"variant {variant!r} is not available for {library}; choose one of {offered}.")
    return spec


# --- the cell specification -------------------------------------------------------------------------


def _positive(name: str, value: object, allow_none: bool = False, minimum: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{name} must be an integer of at least {minimum}, got {value!r}.")


GRADCACHE = "gradcache"  # PyLate's CachedContrastive: GradCache, the encoder in mini-batches, scores per query chunk
GRADCACHE_MINI_BATCH = 32  # CachedContrastive's own default mini_batch_size


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """One training cell: a few real optimizer steps of a stack's own trainer, measured end to end.

    ``preset`` and ``device`` may be ``auto`` (the published model on CUDA when a GPU is visible,
    else the tiny one on the CPU); a result embeds the spec with both resolved.
    """

    kind: Literal["train"] = dataclasses.field(default="train", metadata={"help": "a training cell"})
    stack: str = dataclasses.field(default="colpali", metadata={"help": "which library's recipe trains"})
    regime: str = dataclasses.field(default="plain", metadata={"help": "the recipe's regime"})
    batch_size: int = dataclasses.field(default=4, metadata={"help": "per-device batch size (queries per step)"})
    variant: str = dataclasses.field(default="vanilla", metadata={"help": "the MaxSim backend"})
    score_mini_batch_size: int | None = dataclasses.field(
        default=None, metadata={"help": "PyLate's chunking: queries scored per chunk (vanilla only; any backend under "
                                        "gradcache, where it defaults to mini_batch_size)"})
    mini_batch_size: int | None = dataclasses.field(
        default=None, metadata={"help": "gradcache only: samples PyLate's CachedContrastive embeds per mini-batch "
                                        f"(default {GRADCACHE_MINI_BATCH})"})
    card: str = dataclasses.field(default="native", metadata={"help": "emulated card: the allocator is capped to it"})
    allocator: str = dataclasses.field(default="default", metadata={"help": "the CUDA caching allocator regime"})
    steps: int = dataclasses.field(default=4, metadata={"help": "optimizer steps (the least a cell trains)"})
    warmup_steps: int = dataclasses.field(default=1, metadata={"help": "first steps left out of the steady time"})
    min_steady_steps: int = dataclasses.field(
        default=0, metadata={"help": "timed cells: train past `steps` until this many steady steps (after warm-up, "
                                     "no autotune) were timed, at most `max_steps`"})
    seed: int = dataclasses.field(default=DEFAULT_SEED, metadata={"help": "seed and data seed"})
    preset: str = dataclasses.field(
        default=PRESET_AUTO, metadata={"help": "model preset: auto (full on CUDA, tiny on CPU), tiny, full"})
    device: str = dataclasses.field(default="auto", metadata={"help": "auto (CUDA when visible), cuda or cpu"})
    model_source: str | None = dataclasses.field(
        default=None, metadata={"help": "None: offline random weights; 'hub', a hub id or a checkpoint directory"})
    data_source: str | None = dataclasses.field(
        default=None, metadata={"help": "None: synthetic data; 'hub' or a local dataset directory"})
    trace: bool = dataclasses.field(
        default=False, metadata={"help": "parity: record each step's loss and gradient norm, and compare the first "
                                         "gradient and final weights with the vanilla cell's (harness.trace)"})
    world_size: int = dataclasses.field(
        default=1, metadata={"help": "data-parallel ranks, one GPU each, launched with torchrun as one cell: "
                                     "batch_size stays per rank (harness.ranks)"})
    gather: bool = dataclasses.field(
        default=False, metadata={"help": "negatives gathered across ranks: each rank scores its queries against every "
                                         "rank's documents (PyLate's gather_across_devices; colpali-engine's "
                                         "ContrastiveTrainer always gathers under torch.distributed)"})
    ranks_share_gpu: bool = dataclasses.field(
        default=False, metadata={"help": "every rank of a data-parallel cell on one GPU, its process group on gloo "
                                         "(NCCL refuses two ranks on one GPU): each rank's bytes are still its own "
                                         "process's, its times are never published (harness.ranks)"})
    dataloader_workers: int | None = dataclasses.field(
        default=None, metadata={"help": "colpali only: the trainer's dataloader workers (None: the recipe's 4 on CUDA, "
                                        "none on the CPU); they collate on the host, so they set the host's memory, "
                                        "not the GPU's"})

    # papermill parameter names of the stack notebooks that differ from the field names
    NOTEBOOK_NAMES: ClassVar[dict[str, str]] = {"batch_size": "batch"}

    def __post_init__(self) -> None:
        info = stack(self.stack)
        if info.kind != "train":
            raise SpecError(f"{self.stack!r} is an op-level stack; describe its cells with OpSpec (kind 'op').")
        choose(f"regime for {self.stack}", self.regime, info.regimes)
        check_variant(self.variant, info.library)
        card(self.card)
        choose("allocator", self.allocator, ALLOCATORS)
        choose("device", self.device, DEVICES)
        choose(f"preset for {self.stack}", self.preset, (PRESET_AUTO, *info.presets))
        _positive("batch_size", self.batch_size)
        _positive("steps", self.steps)
        _positive("warmup_steps", self.warmup_steps, minimum=0)
        _positive("min_steady_steps", self.min_steady_steps, minimum=0)
        if self.min_steady_steps > MAX_STEADY_STEPS:
            raise SpecError(f"min_steady_steps must be at most {MAX_STEADY_STEPS}, got {self.min_steady_steps}.")
        _positive("score_mini_batch_size", self.score_mini_batch_size, allow_none=True)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise SpecError(f"seed must be an integer, got {self.seed!r}.")
        if self.warmup_steps >= self.steps:
            raise SpecError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps}): the cell would "
                            "have no steady step to time.")
        if self.score_mini_batch_size is not None and not info.chunking:
            raise SpecError(f"score_mini_batch_size is PyLate's chunking; the {self.stack} stack has no such option.")
        _positive("mini_batch_size", self.mini_batch_size, allow_none=True)
        if self.mini_batch_size is not None and self.regime != GRADCACHE:
            raise SpecError(f"mini_batch_size is the {GRADCACHE} regime's (PyLate's CachedContrastive); "
                            f"regime {self.regime!r} embeds the whole batch at once.")
        if self.score_mini_batch_size is not None and self.variant != "vanilla" and self.regime != GRADCACHE:
            raise SpecError("score_mini_batch_size chunks PyLate's vanilla scores; the fused backends never build the grid "
                            f"(under {GRADCACHE}, the cached loss scores in chunks for every backend).")
        if not isinstance(self.trace, bool):
            raise SpecError(f"trace must be true or false, got {self.trace!r}.")
        if self.card != "native" and self.device == "cpu":
            raise SpecError(f"card {self.card!r} emulation caps a CUDA device; on the CPU use card 'native'.")
        _positive("world_size", self.world_size)
        if self.world_size > MAX_WORLD_SIZE:
            raise SpecError(f"world_size must be at most {MAX_WORLD_SIZE} (one host's GPUs), got {self.world_size}.")
        if not isinstance(self.gather, bool):
            raise SpecError(f"gather must be true or false, got {self.gather!r}.")
        if self.stack == "colpali" and self.world_size > 1 and not self.gather:
            raise SpecError("colpali-engine's ContrastiveTrainer always gathers the documents across processes: a "
                            "colpali cell of world_size above 1 needs gather: true.")  # fmt: skip
        if not isinstance(self.ranks_share_gpu, bool):
            raise SpecError(f"ranks_share_gpu must be true or false, got {self.ranks_share_gpu!r}.")
        if self.ranks_share_gpu and (self.world_size < 2 or self.device == "cpu"):
            raise SpecError("ranks_share_gpu puts the ranks of a data-parallel cell on one GPU: it needs world_size of "
                            f"2 or more and device cuda, got world_size {self.world_size} on {self.device}.")  # fmt: skip
        _positive("dataloader_workers", self.dataloader_workers, allow_none=True, minimum=0)
        if self.dataloader_workers is not None and self.stack != "colpali":
            raise SpecError(f"dataloader_workers is colpali-engine's recipe's (4 workers); the {self.stack} stack collates "
                            "in the trainer's process.")  # fmt: skip
        if self.world_size > 1 and self.trace:
            raise SpecError("trace (parity) compares one process's gradients; run it with world_size 1.")

    @property
    def max_steps(self) -> int:
        """The most steps the cell may train: ``steps``, or with ``min_steady_steps`` room for the
        warm-up, the steady steps and up to :data:`AUTOTUNE_ALLOWANCE` steps that autotune."""
        if not self.min_steady_steps:
            return self.steps
        return max(self.steps, self.warmup_steps + self.min_steady_steps + AUTOTUNE_ALLOWANCE)

    @property
    def setting_id(self) -> str:
        """Backend, card, allocator and dataloader workers: ``vanilla-chunk64-h100-80gb``,
        ``lik-native-expandable``, ``lik-native-dw1`` (workers other than the recipe's)."""
        chunk = f"-chunk{self.score_mini_batch_size}" if self.score_mini_batch_size else ""
        if self.mini_batch_size:
            chunk = f"-mb{self.mini_batch_size}{chunk}"
        # the allocator and seed name a cell only where they differ from the defaults, so the ids
        # of cells run before those dimensions existed stay what they were
        allocator = f"-{self.allocator}" if self.allocator != "default" else ""
        workers = f"-dw{self.dataloader_workers}" if self.dataloader_workers is not None else ""
        return f"{self.variant}{chunk}-{self.card}{allocator}{workers}"

    @property
    def cell_id(self) -> str:
        seed = f"-s{self.seed}" if self.seed != DEFAULT_SEED else ""
        return f"{self.stack}-{self.regime}-b{self.batch_size}-{self.setting_id}{self.ranks_id}{seed}"

    @property
    def ranks_id(self) -> str:
        """``-w2-gather``: the world size (above 1), gathered negatives and ranks sharing one GPU
        (``-onegpu``) name a cell only when set."""
        return ((f"-w{self.world_size}" if self.world_size > 1 else "") + ("-gather" if self.gather else "")
                + ("-onegpu" if self.ranks_share_gpu else ""))  # fmt: skip

    @property
    def gpus(self) -> int:
        """The GPUs the cell owns: one per rank, or one for all its ranks (``ranks_share_gpu``)."""
        return 1 if self.ranks_share_gpu else self.world_size

    @property
    def title(self) -> str:
        chunk = f" + chunk {self.score_mini_batch_size}" if self.score_mini_batch_size else ""
        if self.mini_batch_size:
            chunk = f" · mini-batch {self.mini_batch_size}{chunk}"
        allocator = f" · {self.allocator} allocator" if self.allocator != "default" else ""
        seed = f" · seed {self.seed}" if self.seed != DEFAULT_SEED else ""
        ranks = (f" · {self.world_size} GPUs" if self.world_size > 1 and not self.ranks_share_gpu else "") \
            + (f" · {self.world_size} ranks on one GPU" if self.ranks_share_gpu else "") + (" · gathered" if self.gather else "")
        workers = "" if self.dataloader_workers is None else \
            f" · {self.dataloader_workers} dataloader worker{'' if self.dataloader_workers == 1 else 's'}"
        return (f"{self.stack} · {self.regime} · B={self.batch_size} · {self.variant}{chunk} · {self.card}{allocator}"
                f"{workers}{ranks}{seed}")  # fmt: skip

    @property
    def folder(self) -> tuple[str, str]:
        """Where its files go under a grid's folder: ``(stack, regime)``."""
        return self.stack, self.regime

    @property
    def head(self) -> None:
        return None

    @property
    def negatives(self) -> None:
        return None

    @property
    def reps(self) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op-level cell: a loss head alone on fresh leaf tensors, timed over ``reps`` repetitions
    and bracketed once in isolation. It runs on the whole device with the default allocator."""

    kind: Literal["op"] = dataclasses.field(default="op", metadata={"help": "an op-level cell"})
    stack: str = dataclasses.field(default="op-colpali", metadata={"help": "whose loss head"})
    head: str = dataclasses.field(default="inbatch", metadata={"help": "the loss head"})
    batch_size: int = dataclasses.field(default=4, metadata={"help": "queries per batch"})
    variant: str = dataclasses.field(default="vanilla", metadata={"help": "the MaxSim backend"})
    negatives: int | None = dataclasses.field(default=None, metadata={"help": "explicit negatives per query (negative heads)"})
    reps: int = dataclasses.field(default=50, metadata={"help": "timed forward + backward repetitions"})
    warmup: int = dataclasses.field(default=5, metadata={"help": "untimed repetitions first (more while a kernel autotunes)"})
    rotate: int = dataclasses.field(default=4, metadata={"help": "distinct input sets taken in turn"})
    query_length: int | None = dataclasses.field(default=None, metadata={"help": "query tokens (default: the published shape)"})
    doc_length: int | None = dataclasses.field(default=None, metadata={"help": "document tokens (default: the published shape)"})
    seed: int = dataclasses.field(default=DEFAULT_SEED, metadata={"help": "seed of the random embeddings"})
    device: str = dataclasses.field(default="auto", metadata={"help": "auto (CUDA when visible), cuda or cpu"})

    NOTEBOOK_NAMES: ClassVar[dict[str, str]] = {"batch_size": "batch"}
    card: ClassVar[str] = "native"
    allocator: ClassVar[str] = "default"

    def __post_init__(self) -> None:
        info = stack(self.stack)
        if info.kind != "op":
            raise SpecError(f"{self.stack!r} trains; describe its cells with TrainSpec (kind 'train').")
        choose(f"head for {self.stack}", self.head, info.regimes)
        check_variant(self.variant, info.library)
        choose("device", self.device, DEVICES)
        for name in ("batch_size", "reps", "warmup", "rotate"):
            _positive(name, getattr(self, name))
        for name in ("negatives", "query_length", "doc_length"):
            _positive(name, getattr(self, name), allow_none=True)
        if self.head in info.negative_heads and not self.negatives:
            raise SpecError(f"the {self.head} head needs negatives (explicit negative documents per query, >= 1).")
        if self.head not in info.negative_heads and self.negatives is not None:
            raise SpecError(f"the {self.head} head has no explicit negatives; leave negatives unset.")

    @property
    def lengths(self) -> tuple[int, int]:
        default = stack(self.stack).lengths
        assert default is not None
        return self.query_length or default[0], self.doc_length or default[1]

    @property
    def cell_id(self) -> str:
        negatives = f"-n{self.negatives}" if self.negatives else ""
        seed = f"-s{self.seed}" if self.seed != DEFAULT_SEED else ""
        # "-native": op cells always run on the whole device; the id says so as a training cell's does
        return f"{self.stack}-{self.head}-b{self.batch_size}{negatives}-{self.variant}-native{seed}"

    @property
    def title(self) -> str:
        negatives = f" · {self.negatives} negatives" if self.negatives else ""
        seed = f" · seed {self.seed}" if self.seed != DEFAULT_SEED else ""
        return f"{self.stack} · {self.head} · B={self.batch_size}{negatives} · {self.variant} · native{seed}"

    @property
    def folder(self) -> tuple[str, str]:
        return self.stack, self.head

    @property
    def regime(self) -> str:
        """The part of the stack measured, as tables name it for both kinds: here the loss head."""
        return self.head

    @property
    def score_mini_batch_size(self) -> None:
        return None

    @property
    def mini_batch_size(self) -> None:
        return None

    @property
    def steps(self) -> int:
        return self.reps

    @property
    def preset(self) -> str:
        return "op"


CellSpec = TrainSpec | OpSpec
SPEC_TYPES: dict[str, type[TrainSpec] | type[OpSpec]] = {"train": TrainSpec, "op": OpSpec}


def trace_reference_key(spec: TrainSpec) -> str:
    """What a traced cell (``trace: true``, :mod:`harness.trace`) is compared by: everything but the
    backend (and PyLate's score chunk)."""
    mini = f"-mb{spec.mini_batch_size}" if spec.mini_batch_size else ""
    return (f"{spec.stack}-{spec.regime}-b{spec.batch_size}{mini}-{spec.card}-{spec.allocator}-s{spec.seed}"
            f"-{spec.preset}-{spec.device}-steps{spec.max_steps}")  # fmt: skip


def trace_reference_path(spec: TrainSpec) -> Path:
    """Where a traced cell's reference is kept: ``$MAXSIM_PARITY_DIR`` (default
    ``runs/parity-reference/``, never committed), one file per :func:`trace_reference_key`."""
    store = os.environ.get("MAXSIM_PARITY_DIR") or Path(__file__).resolve().parent.parent / "runs" / "parity-reference"
    return Path(store) / f"{trace_reference_key(spec)}.pt"


def is_trace_reference(spec: TrainSpec) -> bool:
    """The vanilla cell without chunking is every traced cell's reference."""
    return spec.variant == "vanilla" and spec.score_mini_batch_size is None


def spec_fields(kind: str) -> list[dataclasses.Field[Any]]:
    """The settable fields of a spec kind (``kind`` itself excluded), in declaration order."""
    return [field for field in dataclasses.fields(SPEC_TYPES[kind]) if field.name != "kind"]


def make_spec(fields: Mapping[str, Any]) -> CellSpec:
    """A spec from a mapping of field names (its kind from ``kind``, else from the stack); unknown
    fields and bad values raise :class:`SpecError` in one line."""
    fields = dict(fields)
    kind = fields.pop("kind", None) or stack(fields.get("stack", "colpali")).kind
    cls = SPEC_TYPES[choose("cell kind", kind, SPEC_TYPES)]
    names = {field.name for field in spec_fields(kind)}
    for name in fields:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SpecError(f"{kind} cells have no field {name!r}{hint}; they take {', '.join(sorted(names))}.")
    return cls(**fields)


def with_fields(spec: CellSpec, **changes: Any) -> CellSpec:
    """``spec`` with some fields changed (and checked again)."""
    return dataclasses.replace(spec, **changes)


def spec_dict(spec: CellSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def notebook_parameters(spec: CellSpec) -> dict[str, Any]:
    """The papermill parameters of ``spec``'s notebook: every field under its notebook name."""
    names = type(spec).NOTEBOOK_NAMES
    return {names.get(field.name, field.name): getattr(spec, field.name) for field in spec_fields(spec.kind)}


def from_notebook(stack_name: str, namespace: Mapping[str, Any]) -> CellSpec:
    """The spec a notebook's parameters describe: each field read from ``namespace`` (the notebook's
    globals) under its notebook name; ``stack_name`` is the notebook's stack (a ``stack`` parameter
    there wins, as the op notebook has one)."""
    kind = stack(namespace.get("stack", stack_name)).kind
    cls = SPEC_TYPES[kind]
    fields: dict[str, Any] = {"stack": namespace.get("stack", stack_name)}
    for field in spec_fields(kind):
        name = cls.NOTEBOOK_NAMES.get(field.name, field.name)
        if field.name != "stack" and name in namespace:
            fields[field.name] = namespace[name]
    return make_spec(fields)


def differences(planned: CellSpec, ran: CellSpec) -> list[str]:
    """The fields in which a cell that ran as ``ran`` is not the cell ``planned`` asked for (``kind``
    alone for specs of different kinds); where ``planned`` left ``preset`` or ``device`` to ``auto``,
    any resolution of it counts."""
    if type(planned) is not type(ran):
        return ["kind"]
    return [field.name for field in spec_fields(planned.kind)
            if getattr(planned, field.name) != getattr(ran, field.name)
            and not (field.name in ("preset", "device") and getattr(planned, field.name) == "auto")]  # fmt: skip


def admits(planned: CellSpec, ran: CellSpec) -> bool:
    """Whether a cell that ran as ``ran`` is the cell ``planned`` asked for (:func:`differences`)."""
    return not differences(planned, ran)
