"""Emulated cards: cap the CUDA caching allocator so a large GPU behaves like a smaller one.

``torch.cuda.set_per_process_memory_fraction`` makes the allocator refuse any allocation that
would take *reserved* memory past ``fraction × total``, raising the same ``OutOfMemoryError`` a
smaller card would. The cap is what PyTorch can use on that card (the driver and CUDA context
take the rest), so an "80 GB H100" is 78.43 GiB usable, as measured on one.

For the other cards the cap is derived, not measured: the capacity PyTorch reports for that card
(``total_memory``, the "GPU 0 has a total capacity of X GiB" of its out-of-memory message, quoted
from public reports) less the same 0.68 GiB the H100 loses to its CUDA context (79.11 GiB reported,
78.43 usable). A card whose context is larger or smaller than the H100's shifts its ceiling by that
difference; the report states the cap each ceiling was found under.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from harness.memory import GIB


CONTEXT_GIB = 0.68  # the H100 80 GB's reported capacity (79.11 GiB) less what PyTorch could use there (78.43)


@dataclasses.dataclass(frozen=True)
class CardProfile:
    name: str
    usable_gib: float | None  # None: the device as it is
    description: str
    nominal_gb: int | None = None  # the card's marketed size, for ordering and labels

    @property
    def usable_bytes(self) -> int | None:
        return None if self.usable_gib is None else int(self.usable_gib * GIB)


CARDS: dict[str, CardProfile] = {
    profile.name: profile
    for profile in (
        CardProfile("rtx4090-24gb", round(23.64 - CONTEXT_GIB, 2), "24 GB, e.g. RTX 4090 (23.64 GiB reported)", 24),
        CardProfile("a100-40gb", round(39.50 - CONTEXT_GIB, 2), "40 GB, e.g. A100 40 GB (39.50 GiB reported)", 40),
        CardProfile("l40s-48gb", round(44.43 - CONTEXT_GIB, 2), "48 GB with ECC, e.g. L40S, RTX 6000 Ada (44.43 GiB reported)", 48),
        CardProfile("h100-80gb", 78.43, "NVIDIA H100 80 GB: 78.43 GiB usable to PyTorch", 80),
        CardProfile("native", None, "the whole device, uncapped (H200: 141 GB)", 141),
    )
}


def card(name: str) -> CardProfile:
    try:
        return CARDS[name]
    except KeyError:
        raise ValueError(f"unknown card {name!r}; choose one of {sorted(CARDS)}.") from None


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
