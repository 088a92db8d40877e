#!/usr/bin/env python3
"""Why does late-interaction-kernels' (lik) backward spike depend on context? (issue 17, item 5)

PyLate's in-batch scores, Q [B, 48, 128] x D [B, 2, 300, 128] fp32 with a bool doc mask, give a lik
backward spike of 71.8 MiB at B=256 in a training cell's replay but 301.75 MiB (once 264.2) in the
op cell, through the same replay code. The hypothesis this script tests:

* ``maxsim(backward=None)`` routes Nq >= 256, Nd >= 256, Lq <= 64 to the ``lowmem`` backward and
  smaller batches to ``unified`` (late_interaction_kernels/autograd.py, ``_MaxSimFn.backward``).
  The replay's warm-up runs two rows, so it tunes ``unified`` only; in a fresh op-cell process the
  first B >= 256 backward autotunes ``_bwd_dQ_kernel`` and ``_bwd_dD_owned_kernel`` inside the
  bracket. A training cell ran the shape for many steps before its replay: tuned, no sweep.
* Each config's benchmark (``triton.testing.do_bench``) allocates Triton's 256 MiB L2-flush buffer
  through the caching allocator, on top of what is live: grad_scores (B*B*4) and grad_Q
  (B*64*128*4) for the dQ sweep, plus grad_D (B*300*128*4) for the dD sweep. So the spike is
  256 MiB + live, whatever config wins: 301.75 at B=256, 348 at B=512, 442 at B=1024.
* ``_bwd_dD_owned_kernel`` has ``cache_results=True`` (Triton's on-disk autotune cache), the dQ
  kernel does not: a process that finds dD's winner on disk sweeps dQ only, 256 + B*B*4 + B*32 KiB
  = 264.25 MiB at B=256 (the "second run"), 292 at B=1024 (the committed op cell).

Each experiment that needs a fresh autotuner runs in a child process of this script, all sharing a
private ``TRITON_CACHE_DIR`` (so compiled kernels are reused and the on-disk autotune state is
known). Every sub-measurement is guarded: an error is recorded, never fatal.

    .venvs/pylate/bin/python tools/investigate_lik_spike.py --out DIR          # on a CUDA host, < 3 min
    .venvs/pylate/bin/python tools/investigate_lik_spike.py --dry-run          # anywhere: imports, shapes

Writes ``DIR/lik_spike_investigation.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

MIB = 2**20
LQ, LD, DIM, SLOTS = 48, 300, 128, 2  # PyLate's training shapes (queries 48 tokens, docs 300)
LQ_BUCKET = 64  # lik pads Lq to the next power of two (autograd._bucket_lq)
FLUSH_BYTES = 256 * MIB  # triton.testing.do_bench's L2-flush buffer (backends/nvidia/driver.py)
OP_CELL_SEED = 42  # grids/op.yaml defaults
RESULT_NAME = "lik_spike_investigation.json"
REPO = Path(__file__).resolve().parent.parent

# What the committed results say (backward_transient_peak_mib of the isolated call).
COMMITTED = {
    "training_replay": {64: 23.580078125, 128: 44.1611328125, 256: 71.822265625, 512: 98.822265625, 1024: 186.0},
    "op_cell": {64: 24.080078125, 128: 43.1611328125, 256: 301.75, 512: 348.0, 1024: 292.0},
    "op_cell_flash": {64: 24.125, 128: 43.25, 256: 72.0, 512: 99.0, 1024: 186.0},
    "op_cell_second_run_b256": 264.2,
    "published_seed_pr": {128: 62, 256: 110, 512: 157, 1024: 186},
}

LIK_AUTOTUNERS = {  # module: attribute of every autotuned lik kernel the in-batch path can reach
    "late_interaction_kernels.forward": ["_maxsim_fwd_kernel"],
    "late_interaction_kernels.backward.unified": ["_bwd_unified_kernel"],
    "late_interaction_kernels.backward.lowmem": ["_bwd_dQ_kernel", "_bwd_dD_owned_kernel"],
}


# --------------------------------------------------------------------------------------------------
# analytic predictions


def lik_path(batch: int, lq: int = LQ_BUCKET) -> str:
    """``_MaxSimFn.backward`` with backward="auto", cross layout: Nq = Nd = batch per slot."""
    return "lowmem" if batch >= 256 and batch >= 256 and lq <= 64 else "unified"


def predictions(batch: int) -> dict[str, Any]:
    """Bytes live when each lowmem kernel would autotune in the first slot's backward, and the peak
    that sweep would give (live + the 256 MiB flush buffer). fp32 everywhere (lowmem writes grads
    in the input dtype)."""
    grad_scores = batch * batch * 4  # grad_scores.contiguous(): the slot's [B, B] view is strided
    grad_q = batch * LQ_BUCKET * DIM * 4  # [Nq, 64, 128] on the padded query
    grad_d = batch * LD * DIM * 4  # [Nd, 300, 128]
    path = lik_path(batch)
    dq_live, dd_live = grad_scores + grad_q, grad_scores + grad_q + grad_d
    row: dict[str, Any] = {
        "batch": batch,
        "backward_path_auto": path,
        "grad_scores_mib": grad_scores / MIB,
        "grad_q_mib": grad_q / MIB,
        "grad_d_mib": grad_d / MIB,
        "flush_buffer_mib": FLUSH_BYTES / MIB,
        "config_dependent_workspace_mib": 0.0,  # no split/partial buffers in lik 0.4.5's backward
    }
    if path == "lowmem":
        row["peak_if_dq_sweeps_mib"] = (FLUSH_BYTES + dq_live) / MIB
        row["peak_if_dq_and_dd_sweep_mib"] = (FLUSH_BYTES + dd_live) / MIB
        row["two_row_warmup_tunes_this_path"] = False
    else:
        row["two_row_warmup_tunes_this_path"] = True  # same autotune keys: Lq, d_pad, layout, dtypes
    return row


# --------------------------------------------------------------------------------------------------
# small helpers


def guarded(record: dict[str, Any], name: str, function, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Run one sub-measurement; store its value or its error under ``record[name]``."""
    try:
        value = function(*args, **kwargs)
        record[name] = value
        return value
    except BaseException as error:  # noqa: BLE001 — a sub-measurement never ends the run
        if isinstance(error, KeyboardInterrupt):
            raise
        record[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(limit=6)}
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                gc.collect()
                torch.cuda.empty_cache()
        return None


def safe(function, *args, **kwargs):  # type: ignore[no-untyped-def]
    """``function(*args, **kwargs)``, or ``{"error": ...}`` if it raised."""
    holder: dict[str, Any] = {}
    value = guarded(holder, "value", function, *args, **kwargs)
    return holder["value"] if value is None else value


def versions() -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    from importlib import metadata

    for name in ("torch", "triton", "late-interaction-kernels", "flash-maxsim", "pylate"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    for module in ("late_interaction_kernels", "flash_maxsim"):
        with contextlib.suppress(Exception):
            info[f"{module}_file"] = __import__(module).__file__
    names = ("TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "TRITON_PRINT_AUTOTUNING", "PYTORCH_CUDA_ALLOC_CONF",
             "CUDA_VISIBLE_DEVICES", "LIK_SUPPRESS_NORM_WARN")  # fmt: skip
    info["env"] = {name: os.environ.get(name) for name in names}
    return info


# --------------------------------------------------------------------------------------------------
# child side: the op as the harness calls it (harness/ops.py PylateColbertScores, _pylate_slot_*)


def make_inputs(batch: int, dtype_name: str = "float32", seed: int = OP_CELL_SEED, query_mask: bool = False,
                doc_mask: bool = True) -> dict[str, Any]:  # fmt: skip
    """harness.ops._embeddings and PylateColbertScores.make_inputs, on CUDA."""
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    generator = torch.Generator().manual_seed(seed)

    def embeddings(shape: tuple[int, ...]) -> torch.Tensor:
        values = torch.randn(shape, generator=generator, dtype=torch.float32, device="cpu")
        values = torch.nn.functional.normalize(values, dim=-1).to(device="cuda", dtype=dtype)
        return values.requires_grad_(True)

    inputs = {"query": embeddings((batch, LQ, DIM)), "doc": embeddings((batch, SLOTS, LD, DIM))}
    if query_mask:
        inputs["query_mask"] = torch.ones((batch, LQ), dtype=torch.bool, device="cuda")
    if doc_mask:
        inputs["doc_mask"] = torch.ones((batch, SLOTS, LD), dtype=torch.bool, device="cuda")
    return inputs


def forward(variant: str, inputs: dict[str, Any], backward: str | None = None):  # type: ignore[no-untyped-def]
    """PylateColbertScores.forward: per slot, lik ``maxsim`` (bool masks) or flash's train path."""
    import torch

    query, doc = inputs["query"], inputs["doc"]
    q_mask, d_mask = inputs.get("query_mask"), inputs.get("doc_mask")
    per_slot = []
    for slot in range(doc.shape[1]):
        slot_mask = None if d_mask is None else d_mask[:, slot]
        if variant == "lik":
            import late_interaction_kernels.autograd as lik_autograd

            per_slot.append(lik_autograd.maxsim(query, doc[:, slot], q_mask=q_mask, d_mask=slot_mask, backward=backward))
        elif variant == "flash":
            import flash_maxsim

            q_lengths = None if q_mask is None else q_mask.sum(dim=-1, dtype=torch.int64).to(torch.int32).contiguous()
            d_lengths = None if slot_mask is None else slot_mask.sum(dim=-1, dtype=torch.int64).to(torch.int32).contiguous()
            padded_lq = 1 << max(query.shape[-2] - 1, 0).bit_length()
            q = query if padded_lq == query.shape[-2] else torch.nn.functional.pad(query, (0, 0, 0, padded_lq - query.shape[-2]))
            per_slot.append(flash_maxsim.flash_maxsim_batched_train(
                q, doc[:, slot], shared_docs=True, doc_lengths=d_lengths, query_lengths=q_lengths))  # fmt: skip
        else:
            raise ValueError(f"unknown variant {variant!r}")
    return torch.stack(per_slot, dim=2).reshape(-1, doc.shape[0] * doc.shape[1])


class TuneLog:
    """Every Triton autotuner run that filled its cache: which kernel, benchmarked or read from
    disk, how many configs, the winner, and the bytes live (above the open bracket) when it ran."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.bench_calls = 0
        self.phase = "setup"
        self.phase_base = 0
        self.installed = False

    def install(self) -> None:
        import torch
        from triton.runtime.autotuner import Autotuner

        log = self
        original_run, original_bench = Autotuner.run, Autotuner._bench

        def run(tuner, *args, **kwargs):  # type: ignore[no-untyped-def]
            cache = getattr(tuner, "cache", None)
            before = set(cache) if cache is not None else set()
            benches = log.bench_calls
            live = torch.cuda.memory_allocated()
            try:
                return original_run(tuner, *args, **kwargs)
            finally:
                if cache is not None and len(cache) > len(before):
                    new = [key for key in cache if key not in before]
                    count = log.bench_calls - benches
                    log.events.append({
                        "phase": log.phase,
                        "kernel": kernel_name(tuner),
                        "key": [str(k) for k in new[-1]] if new and isinstance(new[-1], tuple) else str(new),
                        "benchmarked_configs": count,
                        "source": "benchmark" if count else "disk cache (or a single config)",
                        "chosen": str(cache[new[-1]]) if new else None,
                        "cache_results": getattr(tuner, "cache_results", None),
                        "bench_time_s": getattr(tuner, "bench_time", None) if count else None,
                        "live_mib_above_bracket": (live - log.phase_base) / MIB,
                        "predicted_peak_mib_above_bracket": (live - log.phase_base + FLUSH_BYTES) / MIB if count else None,
                    })  # fmt: skip

        def bench(tuner, *args, **kwargs):  # type: ignore[no-untyped-def]
            log.bench_calls += 1
            return original_bench(tuner, *args, **kwargs)

        Autotuner.run, Autotuner._bench = run, bench
        self.installed = True

    def since(self, start: int) -> list[dict[str, Any]]:
        return self.events[start:]


def kernel_name(tuner: Any) -> str:
    for attribute in ("base_fn", "fn"):
        fn = getattr(tuner, attribute, None)
        while fn is not None and not hasattr(fn, "__name__") and hasattr(fn, "fn"):
            fn = fn.fn
        if fn is not None and hasattr(fn, "__name__"):
            return fn.__name__
    return type(tuner).__name__


def lik_autotuners() -> dict[str, Any]:
    import importlib

    found = {}
    for module_name, names in LIK_AUTOTUNERS.items():
        module = importlib.import_module(module_name)
        for name in names:
            found[name] = getattr(module, name)
    return found


def autotuner_state() -> dict[str, Any]:
    """Per lik kernel: how many configs, its key, disk caching, and what its in-memory cache holds."""
    state = {}
    for name, tuner in lik_autotuners().items():
        state[name] = {
            "type": type(tuner).__name__,
            "n_configs": len(getattr(tuner, "configs", []) or []),
            "key": list(getattr(tuner, "keys", []) or []),
            "cache_results": getattr(tuner, "cache_results", None),
            "reset_to_zero": list(getattr(tuner, "reset_to_zero", []) or []),
            "cache": {str(k): str(v) for k, v in (getattr(tuner, "cache", {}) or {}).items()},
            "best_config": str(getattr(tuner, "best_config", None)),
        }
    return state


def set_disk_autotune(enabled: bool) -> dict[str, Any]:
    """Turn Triton's on-disk autotune cache on or off for every lik kernel (in this process)."""
    changed = {}
    for name, tuner in lik_autotuners().items():
        if hasattr(tuner, "cache_results"):
            changed[name] = {"was": tuner.cache_results, "now": bool(enabled) and tuner.cache_results}
            if not enabled:
                tuner.cache_results = False
    return changed


def sync() -> None:
    import torch

    torch.cuda.synchronize()


def warm_up_tiny(variant: str) -> None:
    """harness.replay.warm_up: the op once, forward and backward, on a two-row shape, unmeasured."""
    import torch

    inputs = make_inputs(2, seed=0)
    try:
        forward(variant, inputs).sum().backward()
    finally:
        del inputs
        gc.collect()
        torch.cuda.empty_cache()


def warm_up_full(variant: str, batch: int, backward: str | None = None, dtype: str = "float32", **masks: bool) -> None:
    """What a training cell has done before its replay: the measured shape itself, unmeasured."""
    import torch

    inputs = make_inputs(batch, dtype, seed=1, **masks)
    try:
        forward(variant, inputs, backward).sum().backward()
    finally:
        del inputs
        gc.collect()
        torch.cuda.empty_cache()


def measure(variant: str, batch: int, log: TuneLog, backward: str | None = None, dtype: str = "float32",
            empty_cache_after: bool = True, seed: int = OP_CELL_SEED, **masks: bool) -> dict[str, Any]:  # fmt: skip
    """harness.replay.replay_call's brackets, one attempt: forward transient, held, backward spike
    (max_memory_allocated above the level before backward, after reset_peak_memory_stats)."""
    import torch

    first_event = len(log.events)
    inputs: dict[str, Any] = {}
    scores = grad = None
    result: dict[str, Any] = {"batch": batch, "variant": variant, "backward_method": backward or "auto", "dtype": dtype, **masks}
    try:
        inputs = make_inputs(batch, dtype, seed, **masks)
        sync()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        log.phase, log.phase_base = "forward", before
        scores = forward(variant, inputs, backward)
        sync()
        result["forward_transient_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / MIB
        result["saved_for_backward_mib"] = (torch.cuda.memory_allocated() - before) / MIB
        grad = torch.ones_like(scores)
        sync()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        log.phase, log.phase_base = "backward", before
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.perf_counter()
        start.record()
        scores.backward(grad)
        end.record()
        sync()
        result["backward_transient_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / MIB
        result["backward_peak_reserved_mib"] = torch.cuda.max_memory_reserved() / MIB
        result["backward_ms"] = start.elapsed_time(end)
        result["backward_wall_s"] = time.perf_counter() - began
    except torch.OutOfMemoryError as error:
        result["oom"] = str(error).splitlines()[0]
    finally:
        log.phase = "after"
        del inputs, scores, grad
        gc.collect()
        if empty_cache_after:
            torch.cuda.empty_cache()
    events = log.since(first_event)
    result["autotune_events"] = events
    result["autotuned_in_backward"] = [e["kernel"] for e in events if e["phase"] == "backward" and e["benchmarked_configs"]]
    result["disk_hits_in_backward"] = [e["kernel"] for e in events if e["phase"] == "backward" and not e["benchmarked_configs"]]
    return result


def child_setup(args: dict[str, Any]) -> tuple[dict[str, Any], TuneLog]:
    import torch

    record: dict[str, Any] = {"versions": versions()}
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible")
    record["device"] = torch.cuda.get_device_name(0)
    import late_interaction_kernels.autograd  # noqa: F401 — imported before the log patches Triton

    log = TuneLog()

    def install() -> bool:
        log.install()
        return True

    guarded(record, "tune_log_installed", install)
    if args.get("disk_autotune") == "off":
        guarded(record, "disk_autotune_off", set_disk_autotune, False)
    return record, log


def child_opcell(args: dict[str, Any]) -> dict[str, Any]:
    """The op cell's sequence in a fresh process: empty_cache, two-row warm-up, one measured call
    (the recorded one), then ``repeats`` more calls (what a tuned process, like a training cell's
    replay, measures)."""
    import torch

    record, log = child_setup(args)
    variant, batch = args.get("variant", "lik"), int(args["batch"])
    record["prediction"] = predictions(batch)
    torch.cuda.empty_cache()

    def warm() -> list[dict[str, Any]]:
        warm_up_tiny(variant)
        return log.since(0)  # what the two rows tuned

    guarded(record, "warm_up_two_rows", warm)
    record["first_call"] = guarded(record, "first_call", measure, variant, batch, log)
    repeats = []
    for index in range(int(args.get("repeats", 2))):
        repeats.append(safe(measure, variant, batch, log, seed=OP_CELL_SEED + 1 + index))
    record["repeat_calls"] = repeats
    guarded(record, "autotuners_after", autotuner_state)
    return record


def child_harness(args: dict[str, Any]) -> dict[str, Any]:
    """The harness's own path: harness.replay.replay_shapes with the op cell's op and shape."""
    import torch

    record, log = child_setup(args)
    sys.path.insert(0, str(REPO))

    def run(batch: int) -> dict[str, Any]:
        from harness.memory import probe_for
        from harness.ops import OpShape, PylateColbertScores

        shape = OpShape((batch, LQ, DIM), (batch, SLOTS, LD, DIM), "float32", doc_mask_shape=(batch, SLOTS, LD))
        start = len(log.events)
        probe = probe_for("cuda")
        (call,) = __import__("harness.replay", fromlist=["replay_shapes"]).replay_shapes(
            PylateColbertScores(), [shape], args.get("variant", "lik"), probe, seed=OP_CELL_SEED
        )
        return {"op_call": call.model_dump(), "autotune_events": log.since(start)}

    import harness.replay as replay

    record["harness_retries_on_autotune"] = hasattr(replay, "MAX_REPLAY_ATTEMPTS")
    for index, batch in enumerate(args.get("batches", [256, 256, 512])):
        guarded(record, f"replay_{index}_b{batch}", run, int(batch))
    torch.cuda.synchronize()
    guarded(record, "autotuners_after", autotuner_state)
    return record


@contextlib.contextmanager
def pinned(tuner: Any, config: Any):  # type: ignore[no-untyped-def]
    """One config only: Triton's Autotuner.run then launches configs[0] without benchmarking."""
    saved = tuner.configs
    tuner.configs = [config]
    try:
        yield
    finally:
        tuner.configs = saved


def child_explore(args: dict[str, Any]) -> dict[str, Any]:
    """In one process, tuned first: the flush buffer's size; the backward spike per forced config,
    per backward path, per allocator state, per dtype / mask."""
    import torch

    record, log = child_setup(args)

    def flush_buffer() -> dict[str, Any]:
        import triton

        before = torch.cuda.memory_allocated()
        buffer = triton.runtime.driver.active.get_empty_cache_for_benchmark()
        size = torch.cuda.memory_allocated() - before
        out = {"allocated_mib": size / MIB, "numel_x_itemsize_mib": buffer.numel() * buffer.element_size() / MIB}
        del buffer
        torch.cuda.empty_cache()
        return out

    guarded(record, "flush_buffer", flush_buffer)
    guarded(record, "warm_up_two_rows", warm_up_tiny, "lik")
    for batch in args.get("batches", [128, 256, 512]):
        guarded(record, f"warm_full_b{batch}", warm_up_full, "lik", int(batch))
    guarded(record, "autotuners_tuned", autotuner_state)

    # (1) the backward path: auto vs forced unified / lowmem, each tuned first, measured twice
    paths = []
    for batch in args.get("batches", [128, 256, 512]):
        for method in ("auto", "unified", "lowmem"):
            entry: dict[str, Any] = {"batch": batch, "method": method}
            backward = None if method == "auto" else method
            guarded(entry, "warm", warm_up_full, "lik", int(batch), backward)
            entry["calls"] = [safe(measure, "lik", int(batch), log, backward) for _ in range(2)]
            paths.append(entry)
    record["paths"] = paths

    # (2) every config of each backward kernel, forced one at a time (B=256 lowmem, B=128 unified)
    tuners = lik_autotuners()
    configs = []
    for kernel, batch in (("_bwd_dQ_kernel", 256), ("_bwd_dD_owned_kernel", 256), ("_bwd_unified_kernel", 128)):
        tuner = tuners.get(kernel)
        for config in list(getattr(tuner, "configs", []) or []):
            entry = {"kernel": kernel, "batch": batch, "config": str(config)}
            try:
                with pinned(tuner, config):
                    guarded(entry, "warm", warm_up_full, "lik", batch)
                    entry["call"] = safe(measure, "lik", batch, log)
            except Exception as error:  # noqa: BLE001
                entry["error"] = f"{type(error).__name__}: {error}"
            configs.append(entry)
    record["configs"] = configs

    # (3) allocator state before the call: emptied cache (the harness), a warm cache, a fragmented one
    allocator: dict[str, Any] = {}
    guarded(allocator, "after_empty_cache", measure, "lik", 256, log)
    guarded(allocator, "cache_kept_1", measure, "lik", 256, log, empty_cache_after=False)
    guarded(allocator, "cache_kept_2", measure, "lik", 256, log, empty_cache_after=False)

    def fragmented() -> dict[str, Any]:
        generator = torch.Generator().manual_seed(7)
        sizes = (torch.randint(1, 40, (240,), generator=generator) * 131_072 + 4096).tolist()  # ~0.13-5 MiB
        blocks = [torch.empty(int(size), dtype=torch.uint8, device="cuda") for size in sizes]
        del blocks[::2]  # free every other block: holes of odd sizes in the cache
        try:
            return measure("lik", 256, log, empty_cache_after=False)
        finally:
            del blocks
            torch.cuda.empty_cache()

    guarded(allocator, "fragmented_cache", fragmented)
    record["allocator"] = allocator

    # (4) dtype and masks (a new dtype is a new autotune key: first call vs tuned calls)
    variants = []
    for label, dtype, masks in (
        ("fp32 doc mask (harness)", "float32", {"query_mask": False, "doc_mask": True}),
        ("fp32 no masks", "float32", {"query_mask": False, "doc_mask": False}),
        ("fp32 query + doc masks", "float32", {"query_mask": True, "doc_mask": True}),
        ("bf16 doc mask", "bfloat16", {"query_mask": False, "doc_mask": True}),
    ):
        entry = {"label": label, "calls": [safe(measure, "lik", 256, log, None, dtype, **masks) for _ in range(2)]}
        variants.append(entry)
    record["dtype_masks"] = variants
    guarded(record, "autotuners_after", autotuner_state)
    return record


CHILDREN = {"opcell": child_opcell, "harness": child_harness, "explore": child_explore}


def child_main(name: str, args: dict[str, Any]) -> int:
    result_path = Path(args["result_path"])
    record: dict[str, Any] = {"child": name, "args": args}
    started = time.perf_counter()
    try:
        record.update(CHILDREN[name](args))
    except BaseException as error:  # noqa: BLE001
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc()
    record["wall_s"] = time.perf_counter() - started
    result_path.write_text(json.dumps(record, indent=1, default=str))
    return 0


# --------------------------------------------------------------------------------------------------
# parent side


def plan(quick: bool) -> list[tuple[str, str, dict[str, Any], int]]:
    """(label, child, args, timeout_s) in order of how much each tells. The first child finds an
    empty private Triton cache: it compiles everything and writes the disk-cached autotune winners
    (forward and dD kernels), which the "disk-warm" child then reads."""
    steps: list[tuple[str, str, dict[str, Any], int]] = [
        ("op-cell b256, empty triton cache", "opcell", {"batch": 256, "disk_autotune": "on", "repeats": 2}, 150),
        ("op-cell b256, disk-cached dD winner", "opcell", {"batch": 256, "disk_autotune": "on", "repeats": 1}, 60),
        ("op-cell b512, no disk autotune", "opcell", {"batch": 512, "disk_autotune": "off", "repeats": 1}, 60),
        ("op-cell b128, no disk autotune", "opcell", {"batch": 128, "disk_autotune": "off", "repeats": 1}, 60),
        ("harness replay_shapes b256,b256,b512", "harness", {"batches": [256, 256, 512], "disk_autotune": "off"}, 60),
        (
            "explore (tuned): configs, paths, allocator, dtype",
            "explore",
            {"batches": [128, 256, 512], "disk_autotune": "on"},
            100,
        ),
        ("op-cell b256 flash", "opcell", {"batch": 256, "variant": "flash", "repeats": 1}, 60),
        ("op-cell b256 again (cold autotune) #2", "opcell", {"batch": 256, "disk_autotune": "off", "repeats": 0}, 45),
        ("op-cell b256 again (cold autotune) #3", "opcell", {"batch": 256, "disk_autotune": "off", "repeats": 0}, 45),
    ]
    if quick:
        steps = steps[:3]
    return steps


def run_child(label: str, name: str, args: dict[str, Any], timeout: float, work: Path, env: dict[str, str],
              dry_run: bool = False) -> dict[str, Any]:  # fmt: skip
    index = len(list(work.glob("child-*.json")))
    result_path = work / f"child-{index:02d}-{name}.json"
    args = {**args, "result_path": str(result_path)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--child-args", json.dumps(args)]
    entry: dict[str, Any] = {"label": label, "child": name, "command": command, "timeout_s": timeout}
    if dry_run:
        return entry
    began = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        entry["returncode"] = done.returncode
        entry["stderr_tail"] = done.stderr[-3000:]
    except subprocess.TimeoutExpired as error:
        entry["error"] = f"timed out after {timeout:.0f} s"
        entry["stderr_tail"] = (
            (error.stderr or b"")[-3000:].decode(errors="replace")
            if isinstance(error.stderr, bytes)
            else str(error.stderr)[-3000:]
        )
    entry["wall_s"] = time.perf_counter() - began
    if result_path.exists():
        try:
            entry["result"] = json.loads(result_path.read_text())
        except ValueError as error:
            entry["error"] = f"unreadable child result: {error}"
    elif "error" not in entry:
        entry["error"] = "the child wrote no result"
    return entry


def fmt(value: Any) -> str:
    return f"{value:8.2f}" if isinstance(value, (int, float)) else f"{'-':>8}"


def summary(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured call worth a line, and the checks that discriminate the causes."""
    rows = []
    for child in children:
        result = child.get("result") or {}
        if child["child"] == "opcell":
            batch = result.get("args", {}).get("batch")
            first = result.get("first_call") or {}
            repeats = [r for r in result.get("repeat_calls") or [] if isinstance(r, dict)]
            prediction = predictions(batch) if batch else {}
            expected = None
            tuned = first.get("autotuned_in_backward") or []
            if "_bwd_dD_owned_kernel" in tuned:
                expected = prediction.get("peak_if_dq_and_dd_sweep_mib")
            elif "_bwd_dQ_kernel" in tuned:
                expected = prediction.get("peak_if_dq_sweeps_mib")
            rows.append({
                "experiment": child["label"], "batch": batch,
                "first_bwd_mib": first.get("backward_transient_peak_mib"),
                "repeat_bwd_mib": [r.get("backward_transient_peak_mib") for r in repeats],
                "swept_in_bwd": tuned, "disk_hits_in_bwd": first.get("disk_hits_in_backward"),
                "predicted_first_mib": expected,
                "chosen": {e["kernel"]: e["chosen"] for e in first.get("autotune_events", []) if e.get("phase") == "backward"},
                "error": child.get("error") or result.get("error") or child.get("skipped"),
            })  # fmt: skip
        elif child["child"] == "harness":
            for key, value in result.items():
                if key.startswith("replay_") and isinstance(value, dict):
                    call = value.get("op_call") or {}
                    rows.append({
                        "experiment": f"harness {key}", "batch": (call.get("query_shape") or [None])[0],
                        "first_bwd_mib": call.get("backward_transient_peak_mib"), "repeat_bwd_mib": [],
                        "swept_in_bwd": [e["kernel"] for e in value.get("autotune_events", []) if e["benchmarked_configs"]],
                        "predicted_first_mib": None, "error": value.get("error"),
                    })  # fmt: skip
        elif child["child"] == "explore":
            for entry in result.get("paths") or []:
                calls = [c for c in entry.get("calls") or [] if isinstance(c, dict)]
                rows.append({
                    "experiment": f"tuned, backward={entry['method']}", "batch": entry["batch"],
                    "first_bwd_mib": calls[0].get("backward_transient_peak_mib") if calls else None,
                    "repeat_bwd_mib": [c.get("backward_transient_peak_mib") for c in calls[1:]],
                    "swept_in_bwd": sum((c.get("autotuned_in_backward") or [] for c in calls), []),
                    "predicted_first_mib": None, "error": None,
                })  # fmt: skip
    return rows


def checks(children: list[dict[str, Any]]) -> dict[str, Any]:
    """Verdicts on each candidate cause, computed from the measurements (None where not measured)."""
    out: dict[str, Any] = {}
    by_label = {c["label"]: c.get("result") or {} for c in children}
    explore = next((c.get("result") or {} for c in children if c["child"] == "explore"), {})
    flush = explore.get("flush_buffer")
    if isinstance(flush, dict) and "allocated_mib" in flush:
        out["flush_buffer_mib"] = flush["allocated_mib"]
    # autotune in the bracket: the first call's spike minus a tuned call's, vs the flush buffer + live
    deltas = {}
    for label, result in by_label.items():
        first = result.get("first_call") or {}
        tuned = [r.get("backward_transient_peak_mib") for r in result.get("repeat_calls") or [] if isinstance(r, dict)]
        tuned = [t for t in tuned if t is not None]
        if first.get("backward_transient_peak_mib") is None:
            continue
        sweeps = [e for e in first.get("autotune_events", []) if e["phase"] == "backward" and e["benchmarked_configs"]]
        predicted = max((e["predicted_peak_mib_above_bracket"] for e in sweeps), default=None)
        matches = None if predicted is None else abs(predicted - first["backward_transient_peak_mib"]) <= 1.0
        deltas[label] = {
            "first_mib": first["backward_transient_peak_mib"],
            "tuned_mib": tuned[-1] if tuned else None,
            "first_minus_tuned_mib": first["backward_transient_peak_mib"] - tuned[-1] if tuned else None,
            "kernels_swept_in_bracket": [e["kernel"] for e in sweeps],
            "first_predicted_from_live_plus_flush_mib": predicted,
            "matches_prediction_within_1mib": matches,
        }  # fmt: skip
    out["autotune_in_bracket"] = deltas
    configs = [
        c for c in explore.get("configs") or [] if isinstance(c.get("call"), dict) and "backward_transient_peak_mib" in c["call"]
    ]
    per_kernel: dict[str, list[float]] = {}
    for entry in configs:
        per_kernel.setdefault(entry["kernel"], []).append(entry["call"]["backward_transient_peak_mib"])
    out["config_spread_mib"] = {k: {"min": min(v), "max": max(v), "n": len(v)} for k, v in per_kernel.items()}
    allocator = explore.get("allocator") or {}
    readings = [v.get("backward_transient_peak_mib") for v in allocator.values() if isinstance(v, dict)]
    values = [float(v) for v in readings if v is not None]
    if values:
        out["allocator_state_spread_mib"] = {"min": min(values), "max": max(values)}
    chosen: dict[str, set[str]] = {}
    for result in by_label.values():
        for event in (result.get("first_call") or {}).get("autotune_events", []):
            if event.get("benchmarked_configs"):
                chosen.setdefault(event["kernel"], set()).add(event["chosen"])
    out["winners_across_fresh_processes"] = {k: sorted(v) for k, v in chosen.items()}
    return out


def print_table(rows: list[dict[str, Any]], verdicts: dict[str, Any]) -> None:
    print(f"\n{'experiment':<46} {'B':>5} {'bwd 1st':>8} {'bwd rep':>8} {'pred':>8}  swept in bwd bracket")
    for row in rows:
        repeats = [r for r in row.get("repeat_bwd_mib") or [] if r is not None]
        swept = ",".join(k.replace("_bwd_", "").replace("_kernel", "") for k in row.get("swept_in_bwd") or []) or "-"
        error = f"  ERROR {row['error'][:60]}" if row.get("error") else ""
        print(f"{row['experiment'][:46]:<46} {row['batch'] or '-':>5} {fmt(row['first_bwd_mib'])} "
              f"{fmt(repeats[-1] if repeats else None)} {fmt(row.get('predicted_first_mib'))}  {swept}{error}")  # fmt: skip
    print("\nchecks:")
    for key, value in verdicts.items():
        print(f"  {key}: {json.dumps(value, default=str)[:400]}")


def dry_run(record: dict[str, Any]) -> None:
    """No GPU needed: the imports, the objects the children patch, the shapes and the plan."""
    import torch

    checks_: dict[str, Any] = {}
    guarded(checks_, "torch_cuda_available", torch.cuda.is_available)
    guarded(
        checks_,
        "lik_autograd_maxsim",
        lambda: __import__("late_interaction_kernels.autograd", fromlist=["maxsim"]).maxsim.__name__,
    )
    guarded(checks_, "lik_autotuners", autotuner_state)

    def autotuner_hooks() -> bool:
        from triton.runtime.autotuner import Autotuner

        return all(hasattr(Autotuner, name) for name in ("run", "_bench"))

    guarded(checks_, "triton_autotuner_has_run_and_bench", autotuner_hooks)
    guarded(checks_, "triton_do_bench", lambda: __import__("triton.testing", fromlist=["do_bench"]).do_bench.__name__)

    def flush_source() -> str:
        import inspect

        from triton.backends.nvidia.driver import CudaDriver

        return inspect.getsource(CudaDriver.get_empty_cache_for_benchmark).strip().splitlines()[-2:]  # type: ignore[return-value]

    guarded(checks_, "triton_flush_buffer_source", flush_source)
    guarded(checks_, "flash_batched_train", lambda: __import__("flash_maxsim").flash_maxsim_batched_train.__name__)

    def harness_imports() -> dict[str, Any]:
        sys.path.insert(0, str(REPO))
        import harness.replay as replay
        from harness.ops import OpShape, PylateColbertScores

        shape = OpShape((256, LQ, DIM), (256, SLOTS, LD, DIM), "float32", doc_mask_shape=(256, SLOTS, LD))
        return {"replay_shapes": replay.replay_shapes.__name__, "retries_on_autotune": hasattr(replay, "MAX_REPLAY_ATTEMPTS"),
                "op": PylateColbertScores().call_site, "shape": str(shape)}  # fmt: skip

    guarded(checks_, "harness", harness_imports)

    def shapes() -> dict[str, Any]:
        out = {}
        for batch in (128, 256, 512):
            inputs = {
                "query": torch.empty((batch, LQ, DIM), device="meta"),
                "doc": torch.empty((batch, SLOTS, LD, DIM), device="meta"),
                "doc_mask": torch.empty((batch, SLOTS, LD), dtype=torch.bool, device="meta"),
            }
            slot = inputs["doc"][:, 0]
            out[str(batch)] = {
                "query": list(inputs["query"].shape), "doc_slot": list(slot.shape), "doc_slot_contiguous": slot.is_contiguous(),
                "doc_mask_slot": list(inputs["doc_mask"][:, 0].shape), "lik_backward_path": lik_path(batch),
            }  # fmt: skip
        return out

    guarded(checks_, "shapes", shapes)

    def tiny_cpu_inputs() -> dict[str, Any]:  # the input builder, on the CPU, at a small size
        generator = torch.Generator().manual_seed(0)
        values = torch.nn.functional.normalize(torch.randn((2, LQ, DIM), generator=generator), dim=-1)
        return {"shape": list(values.shape), "norm_mean": float(values.norm(dim=-1).mean())}

    guarded(checks_, "input_builder", tiny_cpu_inputs)
    record["dry_run_checks"] = checks_
    work = Path(tempfile.mkdtemp(prefix="lik-spike-dry-"))
    record["plan"] = [run_child(label, name, args, timeout, work, {}, dry_run=True) for label, name, args, timeout in plan(False)]
    shutil.rmtree(work, ignore_errors=True)
    errors = {k: v["error"] for k, v in checks_.items() if isinstance(v, dict) and "error" in v}
    record["dry_run_ok"] = not errors
    print("dry run:", "ok" if not errors else f"errors in {sorted(errors)}")
    for key, value in checks_.items():
        print(f"  {key}: {json.dumps(value, default=str)[:300]}")
    print("\npredictions (MiB):")
    for batch in (128, 256, 512, 1024):
        p = predictions(batch)
        print(f"  B={batch:<5} path={p['backward_path_auto']:<8} dQ sweep -> {fmt(p.get('peak_if_dq_sweeps_mib'))}"
              f"  dQ+dD sweep -> {fmt(p.get('peak_if_dq_and_dd_sweep_mib'))}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for lik_spike_investigation.json (made if missing)")
    parser.add_argument("--dry-run", action="store_true", help="check imports, shapes and the plan only (no GPU)")
    parser.add_argument("--quick", action="store_true", help="only the first three experiments")
    parser.add_argument("--budget-s", type=float, default=170.0, help="stop starting experiments after this (default 170)")
    parser.add_argument("--keep-triton-cache", action="store_true", help="keep the private Triton cache folder")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--child-args", default="{}", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        return child_main(options.child, json.loads(options.child_args))

    started = time.perf_counter()
    record: dict[str, Any] = {
        "what": "lik backward spike: op cell vs training replay (issue 17 item 5)",
        "argv": sys.argv, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": safe(versions), "committed_results": COMMITTED,
        "predictions": {str(b): predictions(b) for b in (64, 128, 256, 512, 1024, 2048)},
    }  # fmt: skip
    out = options.out
    if options.dry_run:
        dry_run(record)
    else:
        if out is None:
            parser.error("--out is required (or use --dry-run)")
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device visible: run with --dry-run on a CPU host", file=sys.stderr)
            return 2
        cache = Path(tempfile.mkdtemp(prefix="lik-spike-triton-"))
        work = Path(tempfile.mkdtemp(prefix="lik-spike-children-"))
        env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1", "LIK_SUPPRESS_NORM_WARN": "1"}
        env.pop("TRITON_CACHE_AUTOTUNING", None)
        record["triton_cache_dir"] = str(cache)
        children = []
        for label, name, args, timeout in plan(options.quick):
            left = options.budget_s - (time.perf_counter() - started)
            if left < 20:
                children.append({"label": label, "child": name, "skipped": f"time budget ({options.budget_s:.0f} s) spent"})
                continue
            print(f"[{time.perf_counter() - started:6.1f} s] {label} ...", flush=True)
            children.append(run_child(label, name, args, min(timeout, left), work, env))
            last = children[-1]
            if last.get("error"):
                print(f"    error: {last['error']}", flush=True)
        record["children"] = children
        record["summary"] = safe(summary, children)
        record["checks"] = safe(checks, children)
        shutil.rmtree(work, ignore_errors=True)
        if not options.keep_triton_cache:
            shutil.rmtree(cache, ignore_errors=True)
        if isinstance(record["summary"], list):
            print_table(record["summary"], record["checks"] if isinstance(record["checks"], dict) else {})
    record["wall_s"] = time.perf_counter() - started
    if out is not None or not options.dry_run:
        target_dir = out if out is not None else Path(tempfile.mkdtemp(prefix="lik-spike-"))
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / RESULT_NAME
        target.write_text(json.dumps(record, indent=1, default=str) + "\n")
        print(f"\nwrote {target} ({record['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
