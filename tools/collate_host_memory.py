"""Host memory of collating one ColQwen2 batch: what each dataloader worker of the recipe holds.

colpali-engine's recipe runs its dataloader with workers (``harness.stacks.colpali.DATALOADER_WORKERS``),
each turning a batch of pages into ``pixel_values`` on the CPU. This measures, in a fresh process per
batch size, the batch's tensors and the process's peak resident memory while the offline processor
collates B synthetic pages of the seed's stream (the pages a cell trains on), so the host memory a
batch needs can be set beside the host's:

    .venvs/colpali/bin/python tools/collate_host_memory.py 32 64 128
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MEASURE = """
import json, resource, sys
from harness.stacks import colpali_data, colqwen2_model
batch, seed = int(sys.argv[1]), int(sys.argv[2])
processor = colqwen2_model.load_processor(colqwen2_model.materialize_processor(seed))
stream = colpali_data.SyntheticTrainSet(seed)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = processor.process_images([stream[index]["image"] for index in range(batch)])
tensors = sum(value.numel() * value.element_size() for value in out.values() if hasattr(value, "numel"))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
print(json.dumps({"batch_size": batch, "seed": seed, "batch_tensors_mib": tensors / 2**20,
                  "peak_rss_mib": peak / 1024, "rss_before_mib": before / 1024,
                  "pixel_values_shape": list(out["pixel_values"].shape)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("batch_sizes", type=int, nargs="+")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
