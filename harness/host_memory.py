"""Host memory of collating a ColQwen2 batch: what each of the recipe's dataloader workers holds.

colpali-engine's recipe runs its dataloader with ``DATALOADER_WORKERS`` workers
(:mod:`harness.stacks.colpali`), each turning a whole batch of pages into ``pixel_values`` on the
CPU. At large batches that, not the GPU, can end a cell: the host's out-of-memory killer stops it
(its crash marker says so, :func:`harness.host.oom_kill_words`). :func:`measure` collates B
synthetic pages of a seed's stream (the pages a cell trains on) with the offline processor in this
process and reads the process's peak resident memory before and after; ``tools/collate_host_memory.py``
runs it in a fresh process per batch size and writes the rows with :func:`write`
(``results/host-memory/``), which the ceilings page reads (:func:`read`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
from pathlib import Path
from typing import Any

import pandas as pd

from harness.results import Skipped, default_results_dir

KIND = "collate-host-memory"
FOLDER = "host-memory"  # results/host-memory/: one file per stack and device
MIB = 2**20


def measure(batch_size: int, seed: int) -> dict[str, Any]:
    """Draw and collate ``batch_size`` pages of seed ``seed``'s synthetic stream in this process (run
    it in a fresh one: the peak resident memory is the process's): the batch's tensors, the peak
    resident memory before and after (MiB), and the shape of ``pixel_values``."""
    from harness.stacks import colpali_data, colqwen2_model

    processor = colqwen2_model.load_processor(colqwen2_model.materialize_processor(seed))
    stream = colpali_data.SyntheticTrainSet(seed)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    # as a worker does: draw the batch's pages, then collate them (both held at the peak)
    out = processor.process_images([stream[index]["image"] for index in range(batch_size)])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tensors = sum(value.numel() * value.element_size() for value in out.values() if hasattr(value, "numel"))
    return {"batch_size": batch_size, "seed": seed, "batch_tensors_mib": tensors / MIB,
            "rss_before_mib": before / 1024, "peak_rss_mib": peak / 1024,
            "pixel_values_shape": list(out["pixel_values"].shape)}  # fmt: skip


def write(rows: list[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """The measured rows as one result file, with the environment and the code that measured them."""
    from harness import provenance
    from harness.backends import installed_version
    from harness.results import write_text_atomic
    from harness.stacks.colpali import DATALOADER_WORKERS

    document = {
        "kind": KIND, "stack": "colpali",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env": {"platform": platform.platform(), "python": platform.python_version(),
                "packages": {name: installed_version(name) for name in ("torch", "transformers", "colpali-engine",
                                                                         "pillow")}},
        "provenance": provenance.collect().model_dump(mode="json"),
        "dataloader_workers": DATALOADER_WORKERS, "rows": rows,
    }  # fmt: skip
    return write_text_atomic(path, json.dumps(document, indent=2) + "\n")


def read_all(results_dir: Path | None = None) -> tuple[list[dict[str, Any]], list[Skipped]]:
    """Every host-memory document under ``results_dir/host-memory``, and every file there that is not
    one, with its one-line reason (the results page lists them)."""
    root = (Path(results_dir) if results_dir is not None else default_results_dir()) / FOLDER
    documents, skipped = [], []
    for path in sorted(root.glob("*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            skipped.append(Skipped(path, f"unreadable: {error}"))
            continue
        if not isinstance(document, dict) or document.get("kind") != KIND or not document.get("rows"):
            skipped.append(Skipped(path, f"not a host-memory record (kind {KIND!r} with rows)"))
            continue
        documents.append(document)
    return documents, skipped


def read(results_dir: Path | None = None) -> list[dict[str, Any]]:
    """Every host-memory document under ``results_dir/host-memory`` (:func:`read_all`)."""
    return read_all(results_dir)[0]


def per_page(documents: list[dict[str, Any]], stack: str = "colpali") -> pd.DataFrame:
    """One row per measured batch of ``stack``: how much collating it raised the peak resident memory,
    in all and a page (MiB), the batch's tensors a page, and the recipe's dataloader workers."""
    rows = [{**row, "workers": document["dataloader_workers"],
             "collate_mib": row["peak_rss_mib"] - row["rss_before_mib"]}
            for document in documents if document.get("stack") == stack for row in document["rows"]]  # fmt: skip
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["collate_mib_per_page"] = frame["collate_mib"] / frame["batch_size"]
    frame["tensors_mib_per_page"] = frame["batch_tensors_mib"] / frame["batch_size"]
    return frame.sort_values("batch_size").reset_index(drop=True)
