"""Emulated cards: cap the CUDA caching allocator so a large GPU behaves like a smaller one.

``torch.cuda.set_per_process_memory_fraction`` makes the allocator refuse any allocation that
would take *reserved* memory past ``fraction × total``, raising the same ``OutOfMemoryError`` a
smaller card would. The cap is what PyTorch can use on that card (the driver and CUDA context
take the rest), so an "80 GB H100" is 78.43 GiB usable (the published run's lik B=128 cell reserved
78.37 GiB on one and trained).

For the other cards the cap is derived, not measured: the capacity PyTorch reports for that card
(``total_memory``, the "GPU 0 has a total capacity of X GiB" of its out-of-memory message, quoted
from public reports) less ``CONTEXT_GIB`` = 0.68 GiB, an H100 80 GB's reported 79.11 GiB less the
78.43 GiB cap. The H100's reported capacity varies with driver and board (public messages print
79.11 or 79.18 GiB; the seed PR quotes none): from 79.18 the context would be 0.75 GiB and
each derived cap 0.07 GiB smaller. The caps are kept as they are, since committed results were
measured under them. A card whose context is larger or smaller shifts its ceiling by that
difference; the report states the cap each ceiling was found under.
"""

from __future__ import annotations

import re

import torch

from harness import spec
from harness.memory import GIB

CONTEXT_GIB = spec.CONTEXT_GIB
CardProfile = spec.Card
CARDS = spec.CARDS
card = spec.card


def apply_card(profile: CardProfile, device: torch.device) -> int | None:
    """Cap ``device`` to ``profile``; return the cap in bytes (None for the native card)."""
    if profile.usable_bytes is None:
        return None
    if device.type != "cuda":
        raise ValueError(f"card {profile.name!r} emulation needs a CUDA device; on {device.type} use card 'native'.")
    total = torch.cuda.get_device_properties(device).total_memory
    if profile.usable_bytes > total:
        raise ValueError(
            f"card {profile.name!r} ({profile.usable_gib} GiB) is larger than this device ({total / GIB:.2f} GiB)."
        )
    torch.cuda.set_per_process_memory_fraction(profile.usable_bytes / total, device)
    return profile.usable_bytes


# PyTorch's format_size: "512 bytes", "1.41 MiB", "2.00 GiB" (never "B" or "TiB")
_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB)"
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_REQUEST = re.compile(rf"Tried to allocate {_SIZE}")
_FREE = re.compile(rf"has a total capacity of {_SIZE} of which {_SIZE} is free")
_HELD = re.compile(
    rf"Of the allocated memory {_SIZE} is allocated by PyTorch, "
    rf"(?:with {_SIZE} allocated in private pools \(e\.g\., CUDA Graphs\), )?"
    rf"and {_SIZE} is reserved by PyTorch but unallocated"
)
# the cap check and the request compare rounded block sizes; leave room for rounding either way
ROUNDING_SLACK_BYTES = 64 << 20


def oom_cause(message: str, cap_bytes: int | None) -> str | None:
    """What refused an out-of-memory request under a card cap: "cap", "device", or None when the
    message does not say (no cap: always "cap", the device being the card).

    Read from PyTorch's message: "Tried to allocate R. GPU 0 has a total capacity of T of which F is
    free. … Of the allocated memory A is allocated by PyTorch, and U is reserved by PyTorch but
    unallocated." The cap refused it when A + U + R passes the cap. The device refused it when it
    had less than R free while the cap still allowed it; that can only happen when another process
    used the GPU, and such an OOM says nothing about the card.
    """
    if cap_bytes is None:
        return "cap"
    request, free, held = _REQUEST.search(message), _FREE.search(message), _HELD.search(message)
    if not (request and free and held):
        return None

    def size(number: str, unit: str) -> float:
        return float(number) * _UNITS[unit]

    requested = size(*request.groups())
    reserved = size(*held.groups()[:2]) + size(*held.groups()[-2:])
    if size(*free.groups()[2:]) < requested and reserved + requested + ROUNDING_SLACK_BYTES < cap_bytes:
        return "device"
    return "cap"
