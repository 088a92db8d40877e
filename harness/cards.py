"""Emulated cards: cap the CUDA caching allocator so a large GPU behaves like a smaller one.

``torch.cuda.set_per_process_memory_fraction`` makes the allocator refuse any allocation that
would take *reserved* memory past ``fraction × total``, raising the same ``OutOfMemoryError`` a
smaller card would. The cap is what PyTorch can use on that card (the driver and CUDA context
take the rest), so an "80 GB H100" is 78.43 GiB usable, as measured on one.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.memory import GIB


@dataclasses.dataclass(frozen=True)
class CardProfile:
    name: str
    usable_gib: float | None  # None: the device as it is
    description: str

    @property
    def usable_bytes(self) -> int | None:
        return None if self.usable_gib is None else int(self.usable_gib * GIB)


CARDS: dict[str, CardProfile] = {
    profile.name: profile
    for profile in (
        CardProfile("native", None, "the whole device, uncapped"),
        CardProfile("h100-80gb", 78.43, "NVIDIA H100 80 GB: 78.43 GiB usable to PyTorch"),
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
