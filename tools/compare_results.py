#!/usr/bin/env python3
"""Compare the memory two result folders measured for the same cells (same grid, same cell id).

Memory is exact and repeatable on one device, so a re-run of a committed cell must give the same
step peaks and op records: this is how a change to the harness is checked against the committed
results. Times are not compared (they depend on the host's load).

    python tools/compare_results.py results/ /tmp/rerun/results --tolerance-mib 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.results import CellResult, largest_isolated_call, read_results  # noqa: E402


def peaks(result: CellResult) -> dict[str, float | None]:
    """The memory a cell measured: step peaks and the largest isolated op record's brackets."""
    largest = largest_isolated_call(result)
    return {
        "step_peak_alloc_mib": result.step_peak_alloc_mib,
        "step_peak_reserved_mib": result.step_peak_reserved_mib,
        "op_saved_for_backward_mib": None if largest is None else largest.saved_for_backward_mib,
        "op_backward_transient_peak_mib": None if largest is None else largest.backward_transient_peak_mib,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", type=Path, help="the committed results folder")
    parser.add_argument("rerun", type=Path, help="a folder of re-run cells")
    parser.add_argument("--tolerance-mib", type=float, default=1.0, help="largest difference that counts as equal")
    args = parser.parse_args(argv)
    reference = {(r.grid, r.cell_id): r for _, r in read_results(args.reference)[0]}
    rerun, skipped = read_results(args.rerun)
    for item in skipped:
        print(f"skipped {item.path}: {item.reason}")
    differing = 0
    for _, result in rerun:
        old = reference.get((result.grid, result.cell_id))
        if old is None:
            print(f"{result.grid}/{result.cell_id}: no committed cell to compare")
            continue
        line, same = [], old.outcome == result.outcome
        for name, value in peaks(result).items():
            before = peaks(old)[name]
            if value is None or before is None:
                same &= value is None and before is None
                continue
            same &= abs(value - before) <= args.tolerance_mib
            line.append(f"{name} {before:.1f} → {value:.1f}")
        differing += not same
        verdict = "same " if same else "DIFF "
        print(f"{verdict} {result.grid}/{result.cell_id}: {old.outcome} → {result.outcome}; " + "; ".join(line))
    print(f"{len(rerun)} re-run cells, {differing} differ by more than {args.tolerance_mib} MiB or in outcome")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
