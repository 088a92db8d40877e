"""MaxSim backends (variants): what each needs, a strict refusal when it cannot run, and proof it ran.

A cell whose backend silently fell back to another path is a wrong result, so there is no
fallback anywhere in this package: :func:`require` raises :class:`BackendUnavailable` with what to
do, and :class:`EntryPointCounter` counts calls into the fused entry points so a cell can prove the
intended path ran (a ``lik`` cell with zero kernel calls is a failed cell, not a measurement).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
from collections.abc import Iterator

import torch


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    description: str
    stacks: tuple[str, ...]
    package: str | None = None  # distribution name, for errors and the environment block
    module: str | None = None
    entry_points: tuple[str, ...] = ()  # "module:attribute" the stacks' dispatchers call
    needs_cuda: bool = False


BACKENDS: dict[str, Backend] = {
    "vanilla": Backend("vanilla", "the library's own PyTorch math", stacks=("colpali", "pylate")),
    "lik": Backend(
        "lik",
        "late-interaction-kernels fused Triton kernels",
        stacks=("colpali", "pylate"),
        package="late-interaction-kernels",
        module="late_interaction_kernels",
        entry_points=("late_interaction_kernels.autograd:maxsim",),
        needs_cuda=True,
    ),
    "flash": Backend(
        "flash",
        "flash-maxsim fused Triton kernels",
        stacks=("pylate",),
        package="flash-maxsim",
        module="flash_maxsim",
        entry_points=("flash_maxsim:flash_maxsim_batched_train",),
        needs_cuda=True,
    ),
}

class BackendUnavailable(RuntimeError):
    """A requested backend cannot run here. Never caught to fall back."""


def backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; choose one of {sorted(BACKENDS)}.") from None


def check_supported(variant: str, stack: str) -> Backend:
    """The backend for ``variant`` if ``stack`` supports it; a clear ValueError otherwise."""
    spec = backend(variant)
    if stack not in spec.stacks:
        raise ValueError(f"variant {variant!r} is not available for the {stack} stack; it supports {list(spec.stacks)}.")
    return spec


def require(variant: str, stack: str, device: torch.device | str) -> Backend:
    """Raise :class:`BackendUnavailable` unless ``variant`` can run for ``stack`` on ``device``."""
    spec = check_supported(variant, stack)
    device = torch.device(device)
    if spec.module is not None and not _importable(spec.module):
        from harness.stacks import STACK_INFO  # the stack's own environment carries its backends

        environment = STACK_INFO[stack].environment
        raise BackendUnavailable(
            f"variant {variant!r} needs {spec.package}, which is not installed: "
            f"install the {environment} environment (python tools/envs.py create {environment})."
        )
    if spec.needs_cuda and device.type != "cuda":
        raise BackendUnavailable(
            f"variant {variant!r} ({spec.description}) runs only on CUDA devices, not {device.type}; "
            "it is never replaced by a fallback. Run it on a GPU host or choose variant 'vanilla'."
        )
    return spec


@functools.lru_cache(maxsize=None)
def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class EntryPointCounter:
    """Counts calls into a backend's fused entry points while active.

    The stacks' dispatchers import the entry point at call time (``from late_interaction_kernels
    .autograd import maxsim`` inside the function), so replacing the module attribute is seen by
    every call made while the counter is active, in training and in replay alike.
    """

    def __init__(self, variant: str) -> None:
        self.spec = backend(variant)
        self.calls = 0

    @contextlib.contextmanager
    def active(self) -> Iterator["EntryPointCounter"]:
        patches: list[tuple[object, str, object]] = []
        try:
            for target in self.spec.entry_points:
                module_name, attribute = target.split(":")
                module = importlib.import_module(module_name)
                original = getattr(module, attribute)
                patches.append((module, attribute, original))
                setattr(module, attribute, self._counting(original))
            yield self
        finally:
            for module, attribute, original in reversed(patches):
                setattr(module, attribute, original)

    def _counting(self, function):  # type: ignore[no-untyped-def]
        @functools.wraps(function)
        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            return function(*args, **kwargs)

        return counted
