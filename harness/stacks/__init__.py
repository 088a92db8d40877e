"""Stacks: how to build one training cell of a library, and where its MaxSim call site is.

A stack module knows its model, data, trainer and call site, and nothing about measuring: the
cell runner (``harness.cell``) does the measuring for every stack alike. Each stack module
exposes ``STACK``, an object with the :class:`Stack` interface.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import tempfile
from typing import Any, Protocol

import torch

from harness.ops import MaxSimOp
from harness.spec import TrainSpec
from harness.spec import stack as stack_info


@dataclasses.dataclass
class BuiltCell:
    """A ready-to-train cell: the library's trainer and the call site to wrap."""

    trainer: Any  # a transformers.Trainer (or subclass): has add_callback() and train()
    call_site_owner: object
    call_site_attribute: str
    samples_per_step: int
    model_source: str
    data_source: str


class Stack(Protocol):
    name: str
    regimes: tuple[str, ...]
    presets: tuple[str, ...]
    op: MaxSimOp

    def check(self, params: TrainSpec) -> None:
        """Raise ValueError for parameters this stack cannot run (called before any GPU work)."""

    def build(self, params: TrainSpec, device: torch.device) -> BuiltCell:
        """Model, data and trainer for ``params``, with the variant's backend switched on strictly."""


@functools.cache
def _scratch() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="maxsim-trainers-")


def scratch_output_dir(prefix: str) -> str:
    """A fresh folder for a trainer's ``output_dir``, which the trainer creates though a measured
    cell saves nothing there. All of a process's such folders live in one temporary folder that is
    removed when the process exits, so cells leave nothing behind in the temporary directory."""
    return tempfile.mkdtemp(prefix=prefix, dir=_scratch().name)


def measurement_arguments(params: TrainSpec, device: torch.device) -> dict[str, Any]:
    """TrainingArguments every measured cell shares, whatever its recipe: the cell's batch and steps,
    no warm-up, seed = data_seed, and nothing saved, evaluated, logged or reported."""
    return dict(
        output_dir=scratch_output_dir(f"{params.stack}-cell-"),
        per_device_train_batch_size=params.batch_size,
        max_steps=params.max_steps,  # a timed cell stops earlier, once it has its steady steps
        warmup_steps=0,
        use_cpu=device.type == "cpu",
        seed=params.seed,
        data_seed=params.seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        # ranks on one GPU cannot use NCCL (harness.ranks): gloo, the one backend that lets them share it
        **({"ddp_backend": "gloo"} if params.ranks_share_gpu else {}),
    )


def release(package: str) -> tuple[int, ...]:
    """The installed release of ``package`` as comparable numbers, e.g. ``(0, 3, 18)``."""
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version(package)).release  # "0.3.18rc1" -> (0, 3, 18), as pip orders releases


def switch_backend(variant: str, *, native: bool, variable: str, values: dict[str, str], library: str) -> str:
    """Switch a library's MaxSim to ``variant`` strictly and return how.

    Releases with a native switch get ``variable`` set to the strict value (never "auto": a backend
    that cannot run raises instead of falling back). Older releases are left untouched for vanilla
    and patched by late-interaction-kernels (``patch_<library>()``) for lik.
    """
    if native:
        os.environ[variable] = values[variant]
        return f"{variable}={values[variant]}"
    import late_interaction_kernels

    os.environ.pop(variable, None)
    if variant == "lik":
        getattr(late_interaction_kernels, f"patch_{library}")()
        return f"late_interaction_kernels.patch_{library}()"
    getattr(late_interaction_kernels, f"unpatch_{library}")()
    return "untouched library"


class StackUnavailable(RuntimeError):
    pass


def load_stack(name: str) -> Stack:
    """The training stack ``name``, imported from its module (its libraries must be installed here)."""
    info = stack_info(name)
    if info.module is None:
        raise ValueError(f"{name!r} is an op-level stack: its cells run through harness.opbench, not a trainer.")
    try:
        module = importlib.import_module(info.module)
    except ImportError as error:
        raise StackUnavailable(
            f"the {name} stack cannot be loaded ({error}); run it in the {info.environment} environment "
            f"(python tools/envs.py create {info.environment})."
        ) from error
    return module.STACK
