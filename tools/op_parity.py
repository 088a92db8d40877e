"""Op parity on this device: every head × backend × dtype × case of one library against the fp64
reference (harness.parity), written to results/op-parity/<library>-op-parity-<device>.json.

    .venvs/pylate/bin/python tools/op_parity.py pylate --device cuda
    .venvs/colpali/bin/python tools/op_parity.py colpali --device cuda --cases published

A fused backend (lik, flash) runs only on CUDA: on the CPU it is refused in one line, never replaced.

    .venvs/pylate/bin/python tools/op_parity.py pylate --mask-readings

writes results/op-parity/pylate-mask-readings-cpu.json instead: for every padded PyLate case, the
differences each fused backend's reading of the document masks makes against the vanilla math
(harness.parity.masks_read_as), computed on the CPU, to set beside that backend's errors on the GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from harness import parity
from harness.backends import BackendUnavailable

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", choices=sorted(parity.HEADS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    parser.add_argument("--variants", nargs="+", help="default: every backend of the library")
    parser.add_argument("--cases", choices=("cpu", "published", "all"), default="all")
    parser.add_argument("--chunk", type=int, default=16, help="PyLate's score_mini_batch_size for the chunked loss")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--mask-readings", action="store_true",
                        help="PyLate: the fused backends' readings of the masks, on the CPU (see the module docstring)")
    args = parser.parse_args(argv)
    if args.mask_readings:
        if args.library != "pylate":
            print("refused: --mask-readings is about PyLate's bool masks", file=sys.stderr)
            return 2
        output = args.output or ROOT / "results" / "op-parity" / "pylate-mask-readings-cpu.json"
        parity.write_mask_readings(output, args.seed)
        print(f"wrote {output}")
        return 0

    variants = args.variants or list(parity.VARIANTS[args.library])
    device = torch.device(args.device)
    for variant in variants:
        if variant != "vanilla":
            try:
                parity.check_runnable(args.library, parity.HEADS[args.library][0], variant, device)
            except (BackendUnavailable, ValueError) as error:
                print(f"refused: {error}", file=sys.stderr)
                return 2
    cases = {"cpu": parity.CPU_CASES, "published": parity.PUBLISHED_CASES[args.library],
             "all": parity.CPU_CASES + parity.PUBLISHED_CASES[args.library]}[args.cases]  # fmt: skip
    records = []
    for case in cases:
        for head in parity.HEADS[args.library]:
            for variant in variants:
                chunks: list[int | None] = [None]
                if args.library == "pylate" and head == "contrastive" and variant == "vanilla":
                    chunks.append(min(args.chunk, case.batch))
                for dtype in parity.DEFAULT_DTYPES[args.library]:
                    for chunk in chunks:
                        record = parity.check_parity(args.library, head, variant, dtype, case, device, chunk, args.seed)
                        records.append(record)
                        worst = max(record.errors, key=lambda e: e.error_to_bound)
                        print(f"{'ok  ' if record.passed else 'FAIL'} {case.name:<20} {head:<21} {variant:<7} {dtype:<8} "
                              f"chunk={chunk} worst {worst.quantity} abs {worst.max_abs_error:.2e} rel "
                              f"{worst.max_rel_error:.2e} ({worst.error_to_bound:.3f} of bound)")  # fmt: skip
    output = args.output or ROOT / "results" / "op-parity" / f"{args.library}-op-parity-{device.type}.json"
    parity.write_parity(records, output, device, args.seed)
    print(f"wrote {output}: {sum(r.passed for r in records)}/{len(records)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
