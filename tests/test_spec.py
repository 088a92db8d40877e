"""The cell spec: one frozen, validated description of a cell, its id, and the grids that expand into it."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import spec as registry
from harness.grid import EXPANDABLE, grid_names, load_grid
from harness.results import load_result, result_paths
from harness.search import MIN_STEPS, MIN_STEPS_OF, load_searches
from harness.spec import (
    DEFAULT_SEED,
    OpSpec,
    SpecError,
    TrainSpec,
    admits,
    from_notebook,
    make_spec,
    notebook_parameters,
    spec_dict,
    with_fields,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


# --- grids expand into specs -------------------------------------------------------------------------


def cell_grids():
    return {name: path for name, path in grid_names().items() if "cells" in (yaml.safe_load(path.read_text()) or {})}


def test_the_committed_grids_are_the_report_s():
    assert set(grid_names()) == {"published", "ours", "op", "ceilings", "shared-gpu-check", "repeat", "gradcache", "parity",
                                 "long-run", "pinned-check", "multi-gpu", "multi-gpu-ceilings", "cross-card-check"}  # fmt: skip
    assert set(cell_grids()) == {"published", "ours", "op", "repeat", "gradcache", "parity", "long-run", "pinned-check",
                                 "multi-gpu"}  # fmt: skip
    # the multi-GPU grid: every world size of each setting, gathering on
    multi = load_grid(grid_names()["multi-gpu"])
    assert {cell.spec.world_size for cell in multi} == {1, 2, 4, 8} and all(cell.spec.gather for cell in multi)
    # the repeat grid runs cells of the published grid again, with the same specs
    published = {cell.cell_id: cell.spec for cell in load_grid(grid_names()["published"])}
    assert all(published[cell.cell_id] == cell.spec for cell in load_grid(grid_names()["repeat"]))
    # the shared-GPU check is one search of the ceilings grid, run again under a grid name of its own
    (check,) = load_searches(grid_names()["shared-gpu-check"])
    twin = next(search for search in load_searches(grid_names()["ceilings"]) if search.search_id == check.search_id)
    assert check.model_dump(exclude={"grid"}) == twin.model_dump(exclude={"grid"})
    # so is each search of the cross-card check: the same probes, run on another GPU
    ceilings = {search.search_id: search for search in load_searches(grid_names()["ceilings"])}
    again = load_searches(grid_names()["cross-card-check"])
    assert len(again) == 6 and {search.stack for search in again} == {"colpali", "pylate"}
    # one of each stack, each kind of backend and each allocator; each of ColQwen2's backends, and PyLate's with both
    assert {search.variant for search in again} == {"vanilla", "lik", "flash"}
    assert {search.variant for search in again if search.stack == "colpali"} == {"vanilla", "lik"}
    assert {search.allocator for search in again if search.stack == "pylate"} == {"default", "expandable"}
    # the same search but for where its walk starts and how it strides (one may start near its twin's ceiling, so
    # fewer probes reach the same deciding ones), and, once finished, the same ceiling as its twin on the H200
    walk = {"grid", "start", "step"}
    assert all(search.model_dump(exclude=walk) == ceilings[search.search_id].model_dump(exclude=walk) for search in again)
    from harness.search import search_state

    results, compared = ROOT / "results", 0
    for search in again:
        mine, twin = search_state(search, results)[0], search_state(ceilings[search.search_id], results)[0]
        if mine.done and twin.done:
            assert (mine.fits, mine.fails) == (twin.fits, twin.fails), search.search_id
            compared += 1
    assert compared >= 1


@pytest.mark.parametrize("name", ["published", "ours", "op"])
def test_every_grid_entry_expands_into_specs(name):
    path = grid_names()[name]
    document = yaml.safe_load(path.read_text())
    cells = load_grid(path)
    # every entry becomes the product of its listed fields, one spec each, none repeated
    expected = sum(math.prod(len(value) for key, value in ({**document.get("defaults", {}), **entry}).items()
                             if key in EXPANDABLE and isinstance(value, list)) for entry in document["cells"])  # fmt: skip
    assert len(cells) == expected == len({cell.cell_id for cell in cells})
    assert {cell.grid for cell in cells} == {name}
    kind = OpSpec if name == "op" else TrainSpec
    assert all(isinstance(cell.spec, kind) for cell in cells)
    for cell in cells:  # each spec is the entry's fields over the defaults, nothing else
        assert cell.spec.device == "cuda" and cell.spec.seed == DEFAULT_SEED
        assert make_spec({k: v for k, v in spec_dict(cell.spec).items()}) == cell.spec
    if name == "published":  # the published harness's grid: 8 ColQwen2, 6 PyLate plain, 10 PyLate grad-checkpoint cells
        assert len(cells) == 24 and all(cell.spec.card == "h100-80gb" and cell.spec.preset == "full" for cell in cells)
        assert "pylate-grad-checkpoint-b1024-vanilla-chunk64-h100-80gb" in {cell.cell_id for cell in cells}


def test_every_ceiling_search_makes_its_probes_specs():
    searches = load_searches(grid_names()["ceilings"])
    document = yaml.safe_load(grid_names()["ceilings"].read_text())
    expected = sum(math.prod(len(v) for k, v in entry.items() if isinstance(v, list)) for entry in document["searches"])
    assert len(searches) == expected
    for search in searches:
        probe = search.probe(search.start, search.seeds[0])
        assert isinstance(probe, TrainSpec) and search.owns(probe)
        assert probe.steps >= MIN_STEPS_OF.get(search.regime, MIN_STEPS) and probe.steps == search.steps
        assert probe.cell_id.startswith(f"{search.stack}-{search.regime}-b{search.start}-")


# --- committed results: their ids are their file names ----------------------------------------------------


def committed_results():
    return [(path, load_result(path)) for path in result_paths(RESULTS)]


def test_the_cell_ids_of_the_committed_results_are_their_file_names():
    results = committed_results()
    assert len(results) > 200
    for path, result in results:
        assert result.cell_id == result.spec.cell_id == path.stem, path
        # results/<grid>/.../<stack>/<regime>/<cell id>.json
        assert result.grid == path.relative_to(RESULTS).parts[0], path
        assert path.parent.parts[-2:] == result.spec.folder, path


def test_the_committed_results_are_cells_of_their_grids():
    grids = {name: {cell.cell_id for cell in load_grid(path)} for name, path in cell_grids().items()}
    searches = load_searches(grid_names()["ceilings"])
    for path, result in committed_results():
        if result.grid in grids:
            assert result.cell_id in grids[result.grid], path
        elif result.grid == "ceilings":
            assert any(search.owns(result.spec) for search in searches), path


# --- ids are stable --------------------------------------------------------------------------------------


def test_cell_ids_are_stable():
    gc = TrainSpec(stack="pylate", regime="grad-checkpoint", batch_size=512, variant="vanilla", score_mini_batch_size=64,
                   card="h100-80gb")  # fmt: skip
    assert gc.cell_id == "pylate-grad-checkpoint-b512-vanilla-chunk64-h100-80gb"
    assert gc.setting_id == "vanilla-chunk64-h100-80gb"
    # seed and allocator name a cell only where they differ from the defaults (ids of older cells stay)
    assert with_fields(gc, seed=43).cell_id == "pylate-grad-checkpoint-b512-vanilla-chunk64-h100-80gb-s43"
    assert with_fields(gc, allocator="expandable").cell_id == "pylate-grad-checkpoint-b512-vanilla-chunk64-h100-80gb-expandable"
    assert with_fields(gc, allocator="expandable", seed=44).cell_id.endswith("-h100-80gb-expandable-s44")
    assert TrainSpec().cell_id == "colpali-plain-b4-vanilla-native"
    # dataloader workers other than the recipe's name a ColQwen2 cell (0 is a setting, not the default)
    loader = TrainSpec(stack="colpali", batch_size=320, variant="lik", dataloader_workers=1)
    assert loader.cell_id == "colpali-plain-b320-lik-native-dw1" and loader.setting_id == "lik-native-dw1"
    assert with_fields(loader, dataloader_workers=0, seed=43).cell_id == "colpali-plain-b320-lik-native-dw0-s43"
    assert loader.title == "colpali · plain · B=320 · lik · native · 1 dataloader worker"
    # what does not change what was measured is not in the id: steps, warm-up, preset, device, sources
    same = with_fields(gc, steps=8, warmup_steps=2, preset="full", device="cuda", model_source="hub", data_source="hub")
    assert same.cell_id == gc.cell_id
    assert OpSpec(stack="op-colpali", head="negative-ce", negatives=8, batch_size=128, variant="lik").cell_id == (
        "op-colpali-negative-ce-b128-n8-lik-native")  # fmt: skip
    assert OpSpec(stack="op-pylate", batch_size=64, seed=7).cell_id == "op-pylate-inbatch-b64-vanilla-native-s7"
    assert gc.title == "pylate · grad-checkpoint · B=512 · vanilla + chunk 64 · h100-80gb"
    assert with_fields(gc, seed=43, allocator="expandable").title.endswith("h100-80gb · expandable allocator · seed 43")


def test_a_spec_is_frozen_and_changed_only_through_its_checks():
    spec = TrainSpec(stack="pylate")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batch_size = 8  # type: ignore[misc]
    assert with_fields(spec, batch_size=8).batch_size == 8 and spec.batch_size == 4
    with pytest.raises(SpecError, match="batch_size must be an integer of at least 1"):
        with_fields(spec, batch_size=0)
    assert hash(spec) == hash(TrainSpec(stack="pylate"))  # a spec can key a dict


# --- validation: one line, with a suggestion -------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, reason",
    [
        (
            dict(stack="pylat"),
            "unknown stack 'pylat' (did you mean 'pylate'?); choose one of colpali, pylate, op-colpali, op-pylate.",
        ),
        (
            dict(stack="pylate", variant="flsh"),
            "unknown variant 'flsh' (did you mean 'flash'?); choose one of vanilla, lik, flash.",
        ),
        (
            dict(card="h100"),
            "unknown card 'h100' (did you mean 'h100-80gb'?); "
            "choose one of rtx4090-24gb, a100-40gb, l40s-48gb, h100-80gb, native.",
        ),
        (
            dict(allocator="expandible"),
            "unknown allocator 'expandible' (did you mean 'expandable'?); choose one of default, expandable.",
        ),
        (
            dict(stack="pylate", regime="gradcheckpoint"),
            "unknown regime for pylate 'gradcheckpoint' (did you mean 'grad-checkpoint'?); "
            "choose one of plain, grad-checkpoint, gradcache.",
        ),
        (dict(stack="colpali", variant="flash"), "variant 'flash' is not available for colpali; choose one of vanilla, lik."),
        (
            dict(stack="colpali", score_mini_batch_size=64),
            "score_mini_batch_size is PyLate's chunking; the colpali stack has no such option.",
        ),
        (
            dict(stack="pylate", variant="lik", score_mini_batch_size=64),
            "score_mini_batch_size chunks PyLate's vanilla scores; the fused backends never build the grid (under "
            "gradcache, the cached loss scores in chunks for every backend).",
        ),
        (
            dict(stack="pylate", regime="grad-checkpoint", mini_batch_size=32),
            "mini_batch_size is the gradcache regime's (PyLate's CachedContrastive); regime 'grad-checkpoint' embeds "
            "the whole batch at once.",
        ),
        (dict(stack="pylate", regime="gradcache", mini_batch_size=0), "mini_batch_size must be an integer of at least 1, got 0."),
        (
            dict(stack="pylate", dataloader_workers=1),
            "dataloader_workers is colpali-engine's recipe's (4 workers); the pylate stack collates in the trainer's process.",
        ),
        (dict(stack="colpali", dataloader_workers=-1), "dataloader_workers must be an integer of at least 0, got -1."),
        (dict(steps=4, warmup_steps=4), "warmup_steps (4) must be below steps (4): the cell would have no steady step to time."),
        (dict(card="h100-80gb", device="cpu"), "card 'h100-80gb' emulation caps a CUDA device; on the CPU use card 'native'."),
        (dict(batch_size=True), "batch_size must be an integer of at least 1, got True."),
        (dict(seed="42"), "seed must be an integer, got '42'."),
        (dict(stack="op-colpali"), "'op-colpali' is an op-level stack; describe its cells with OpSpec (kind 'op')."),
    ],
)
def test_a_train_spec_that_cannot_be_is_refused_in_one_line(fields, reason):
    with pytest.raises(SpecError) as refused:
        TrainSpec(**fields)
    assert str(refused.value) == reason and "\n" not in reason


@pytest.mark.parametrize(
    "fields, reason",
    [
        (
            dict(stack="pylate", batch=4),
            "train cells have no field 'batch' (did you mean 'batch_size'?); they take allocator, batch_size, "
            "card, data_source, dataloader_workers, device, gather, min_steady_steps, mini_batch_size, model_source, "
            "preset, ranks_share_gpu, regime, score_mini_batch_size, seed, stack, steps, trace, variant, warmup_steps, "
            "world_size.",
        ),
        (
            dict(stack="op-colpali", head="negative", negatives=4),
            "unknown head for op-colpali 'negative' (did you mean 'negative-ce'?); "
            "choose one of inbatch, negative-ce, pairwise-negative-ce.",
        ),
        (
            dict(stack="op-colpali", head="negative-ce"),
            "the negative-ce head needs negatives (explicit negative documents per query, >= 1).",
        ),
        (dict(stack="op-pylate", variant="lik", reps=0), "reps must be an integer of at least 1, got 0."),
        (dict(kind="train", stack="op-pylate"), "'op-pylate' is an op-level stack; describe its cells with OpSpec (kind 'op')."),
        (dict(kind="sweep"), "unknown cell kind 'sweep'; choose one of train, op."),
    ],
)
def test_make_spec_refuses_in_one_line(fields, reason):
    with pytest.raises(SpecError) as refused:
        make_spec(fields)
    assert str(refused.value) == reason


def test_make_spec_takes_the_kind_from_the_stack():
    assert make_spec({"stack": "op-pylate", "batch_size": 64}) == OpSpec(stack="op-pylate", batch_size=64)
    assert make_spec({"stack": "pylate", "batch_size": 64}) == TrainSpec(stack="pylate", batch_size=64)
    assert make_spec({}) == TrainSpec()


def test_a_planned_cell_admits_what_ran_with_auto_resolved():
    planned = TrainSpec(stack="pylate", batch_size=64)  # preset and device "auto"
    assert admits(planned, with_fields(planned, device="cuda", preset="full"))
    assert admits(planned, with_fields(planned, device="cpu", preset="tiny"))
    assert not admits(planned, with_fields(planned, batch_size=128))
    assert not admits(with_fields(planned, device="cuda"), with_fields(planned, device="cpu", preset="tiny"))
    assert not admits(planned, OpSpec(stack="op-pylate", batch_size=64))


def test_notebook_parameters_round_trip_through_from_notebook():
    spec = TrainSpec(stack="pylate", regime="grad-checkpoint", batch_size=512, variant="lik", card="h100-80gb", seed=43)
    parameters = notebook_parameters(spec)
    assert parameters["batch"] == 512 and "batch_size" not in parameters and parameters["stack"] == "pylate"
    assert from_notebook("pylate", parameters) == spec
    op = OpSpec(stack="op-colpali", head="pairwise-negative-ce", negatives=4, batch_size=128)
    assert from_notebook("op-pylate", notebook_parameters(op)) == op  # the op notebook's `stack` parameter wins
    # a notebook's globals hold more than its parameters; only the fields are read
    assert from_notebook("colpali", {"batch": 8, "output": "x.json", "grid": None, "In": []}) == TrainSpec(batch_size=8)


def test_the_registries_agree_with_each_other():
    for stack in registry.STACKS.values():
        environment = registry.ENVIRONMENTS[stack.environment]
        assert stack.library in environment.libraries and (ROOT / stack.notebook).exists()
        assert stack.kernel == environment.kernel
    for backend in registry.BACKENDS.values():
        assert backend.name == "vanilla" or (backend.entry_points and backend.needs_cuda and backend.package)
    assert registry.CARDS["h100-80gb"].usable_bytes == int(78.43 * 2**30) and registry.CARDS["native"].usable_bytes is None
    assert registry.CARDS["rtx4090-24gb"].usable_gib == round(23.64 - registry.CONTEXT_GIB, 2)


# --- the spec module is torch-free ------------------------------------------------------------------------


def test_the_spec_module_imports_the_standard_library_only():
    script = (
        "import json, sys\nbefore = set(sys.modules)\nimport harness.spec\nprint(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    loaded = json.loads(completed.stdout)
    assert "harness.spec" in loaded
    outside = sorted({name.split(".")[0] for name in loaded} - set(sys.stdlib_module_names) - {"harness"})
    assert outside == [], f"harness.spec imported {outside}"
    assert not {"torch", "pydantic", "pandas", "yaml", "numpy"} & {name.split(".")[0] for name in loaded}
    assert {name for name in loaded if name.startswith("harness")} == {"harness", "harness.spec"}


def test_a_gradcache_cell_names_its_mini_batch_and_score_chunk_for_every_backend():
    spec = TrainSpec(stack="pylate", regime="gradcache", variant="lik", batch_size=4096, mini_batch_size=64,
                     score_mini_batch_size=128)  # fmt: skip
    assert spec.cell_id == "pylate-gradcache-b4096-lik-mb64-chunk128-native"
    assert spec.title == "pylate · gradcache · B=4096 · lik · mini-batch 64 + chunk 128 · native"
    assert TrainSpec(stack="pylate", regime="gradcache", batch_size=8).cell_id == "pylate-gradcache-b8-vanilla-native"
