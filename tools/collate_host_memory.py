"""Host memory of collating one ColQwen2 batch: what each dataloader worker of the recipe holds.

Runs :func:`harness.host_memory.measure` in a fresh process per batch size (the peak resident
memory is a process's) and writes the rows to one result file, which the ceilings page reads:

    .venvs/colpali/bin/python tools/collate_host_memory.py 32 64 128 \
        --output results/host-memory/colpali-collate-cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from harness import host_memory

MEASURE = "import json, sys; from harness import host_memory; " \
          "print(json.dumps(host_memory.measure(int(sys.argv[1]), int(sys.argv[2]))))"  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("batch_sizes", type=int, nargs="+")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", help="write the rows here (JSON, atomically)")
    args = parser.parse_args()
    if any(batch < 1 for batch in args.batch_sizes):
        parser.error("batch sizes must be positive")
    rows = []
    for batch in args.batch_sizes:
        done = subprocess.run([sys.executable, "-c", MEASURE, str(batch), str(args.seed)], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        row = rows[-1]
        grew = row["peak_rss_mib"] - row["rss_before_mib"]
        print(f"B={batch}: batch tensors {row['batch_tensors_mib'] / 1024:.2f} GiB, collating raised peak RSS by "
              f"{grew / 1024:.2f} GiB ({grew / batch:.1f} MiB a page)", flush=True)  # fmt: skip
    if args.output:
        print(f"wrote {host_memory.write(rows, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
