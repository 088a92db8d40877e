"""The environment block every result carries: versions, device, card, allocator, sources, seed."""

from __future__ import annotations

import os
import platform
import sys

import torch

from harness.backends import installed_version
from harness.memory import MIB
from harness.results import Environment

PACKAGES = (
    "torch", "triton", "torchvision", "transformers", "peft", "accelerate", "sentence-transformers",
    "colpali-engine", "pylate", "late-interaction-kernels", "flash-maxsim", "datasets", "numpy",
    "maxsim-vram-report",
)  # fmt: skip


def collect(
    device: torch.device,
    card: str,
    card_cap_bytes: int | None,
    seed: int,
    model_source: str | None = None,
    data_source: str | None = None,
) -> Environment:
    name = capacity = None
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        name, capacity = properties.name, properties.total_memory / MIB
    else:
        name = platform.processor() or platform.machine()
    return Environment(
        packages={package: installed_version(package) for package in PACKAGES},
        python=sys.version.split()[0],
        platform=platform.platform(),
        device=str(device),
        device_name=name,
        device_capacity_mib=capacity,
        card=card,
        card_cap_mib=None if card_cap_bytes is None else card_cap_bytes / MIB,
        pytorch_cuda_alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        model_source=model_source,
        data_source=data_source,
        seed=seed,
    )
