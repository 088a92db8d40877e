"""MaxSim backends (variants): what each needs, a strict refusal when it cannot run, and proof it ran.

A cell whose backend silently fell back to another path is a wrong result, so there is no
fallback anywhere in this package: :func:`require` raises :class:`BackendUnavailable` with what to
do, and :class:`EntryPointCounter` counts calls into the fused entry points so a cell can prove the
intended path ran (a ``lik`` cell with zero kernel calls is a failed cell, not a measurement).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
from collections.abc import Iterator

import torch

from harness import spec

Backend = spec.Backend
BACKENDS = spec.BACKENDS


class BackendUnavailable(RuntimeError):
    """A requested backend cannot run here. Never caught to fall back."""


def backend(name: str) -> Backend:
    return spec.backend(name)


def check_supported(variant: str, library: str) -> Backend:
    """The backend for ``variant`` if ``library`` dispatches to it; a clear ValueError otherwise."""
    return spec.check_variant(variant, library)


def require(variant: str, library: str, device: torch.device | str) -> Backend:
    """Raise :class:`BackendUnavailable` unless ``variant`` can run for ``library`` on ``device``."""
    chosen = check_supported(variant, library)
    device = torch.device(device)
    if chosen.needs_cuda and device.type != "cuda":
        raise BackendUnavailable(
            f"variant {variant!r} ({chosen.description}) runs only on CUDA devices, not {device.type}; "
            "it is never replaced by a fallback. Run it on a GPU host or choose variant 'vanilla'."
        )
    if chosen.module is not None and not _importable(chosen.module):
        environment = next(env.name for env in spec.ENVIRONMENTS.values() if library in env.libraries and variant in env.backends)
        raise BackendUnavailable(
            f"variant {variant!r} needs {chosen.package}, which is not installed here: "
            f"run it in the {environment} environment (python tools/envs.py create {environment})."
        )
    return chosen


@functools.cache
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
    def active(self) -> Iterator[EntryPointCounter]:
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
            for owner, name, function in reversed(patches):
                setattr(owner, name, function)

    def _counting(self, function):  # type: ignore[no-untyped-def]
        @functools.wraps(function)
        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            return function(*args, **kwargs)

        return counted
