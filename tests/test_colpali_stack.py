"""The colpali stack on CPU: the tiny preset through colpali-engine's real trainer (colpali environment)."""

import numpy as np
import pytest
import torch

from harness import trace
from harness.cell import CellError, run_cell
from harness.memory import MIB
from harness.report.tables import PUBLISHED_QUERY_RANGE, QUERY_CALIBRATION
from harness.spec import SpecError, TrainSpec
from harness.stacks import colpali_data, colqwen2_model

pytestmark = pytest.mark.colpali
BATCH, STEPS = 4, 2
PROMPT_TOKENS = 11


def cell(tmp_path, **overrides):
    fields = dict(stack="colpali", regime="plain", batch_size=BATCH, steps=STEPS, preset="tiny", device="cpu")
    return run_cell(TrainSpec(**(fields | overrides)), tmp_path / "cell.json")


@pytest.fixture(scope="module")
def processor():
    return colqwen2_model.load_processor(colqwen2_model.materialize_processor())


def test_a_tiny_cell_trains_through_colpali_engines_trainer(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXSIM_PARITY_DIR", str(tmp_path / "store"))
    result = cell(tmp_path, trace=True)  # traced as a parity cell is (harness.trace): the same cell, more recorded
    assert result.outcome == "ok" and len(result.step_times_sec) == STEPS
    assert result.cell_id == f"colpali-plain-b{BATCH}-vanilla-native" and result.preset == "tiny" and result.grid is None
    assert len(result.maxsim_calls_in_train) == STEPS  # one loss call per step
    for call in result.maxsim_calls_in_train:
        queries, docs = call.query_shape, call.doc_shape
        assert queries[0] == docs[0] == BATCH and queries[2] == docs[2] == 128
        # documents: the widest page of the batch (capped at 768 visual tokens) + the prompt
        assert 700 + PROMPT_TOKENS <= docs[1] <= 768 + PROMPT_TOKENS
        assert queries[1] > 10  # text + the collator's 10 augmentation tokens
        # bf16 training, fp32 embeddings: the L2 normalisation promotes (as in the published run)
        assert call.dtype == "float32" and call.step in range(STEPS)
        # the loss forward holds the vanilla grid + amax + scores, and the pairwise head's few [B]-sized tensors
        grid = BATCH * BATCH * queries[1] * docs[1] * 4
        assert call.predicted_grid_mib * MIB == grid
        extra = call.saved_for_backward_mib * MIB - call.predicted_saved_for_backward_mib * MIB
        assert 0 <= extra <= 64 * BATCH * BATCH
    for replay in result.maxsim_calls_isolated:  # the op alone: exactly the prediction, to the byte
        assert round(replay.saved_for_backward_mib * MIB) == round(replay.predicted_saved_for_backward_mib * MIB)
        assert round(replay.forward_transient_peak_mib * MIB) == round(replay.predicted_forward_transient_mib * MIB)
        # backward: grad of the grid (scatter from amax) + grads of both inputs, on top of what is held
        assert replay.backward_transient_peak_mib * MIB >= replay.predicted_grid_mib * MIB
    assert result.env.packages["colpali-engine"] and result.env.packages["peft"]
    assert result.env.model_source == "offline:colqwen2-base-tiny-random-seed42"
    assert result.env.data_source == f"synthetic:colpali_train_set:seed=42:stream={colpali_data.STREAM_ROWS}"
    # the trace: a loss and a gradient norm per step, and vanilla's reference for the other backends
    assert len(result.loss_per_step) == len(result.grad_norm_per_step) == STEPS
    saved = torch.load(trace.reference_path(result.spec), weights_only=True)
    # only the LoRA adapters train: the kept vectors are theirs, and the first is the unclipped gradient
    assert float(saved["first_grad"].norm()) == pytest.approx(result.grad_norm_per_step[0], rel=1e-4)
    assert 0 < saved["final"].numel() < 10_000_000


def test_the_fused_variant_is_refused_on_cpu_and_flash_is_not_a_colpali_variant(tmp_path):
    from harness.backends import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="runs only on CUDA devices"):
        cell(tmp_path, variant="lik")
    with pytest.raises(SpecError, match="variant 'flash' is not available for colpali; choose one of vanilla, lik"):
        cell(tmp_path, variant="flash")
    with pytest.raises(SpecError, match="score_mini_batch_size is PyLate's chunking"):
        cell(tmp_path, score_mini_batch_size=2)
    assert not (tmp_path / "cell.json").exists()


def test_the_full_architecture_and_its_lora_match_colqwen2_base():
    import torch
    from colpali_engine.models import ColQwen2
    from peft import get_peft_model

    from harness.stacks.colpali import lora_config

    config = colqwen2_model.model_config("full")
    assert config.text_config.vocab_size == 151936 and config.image_token_id == 151655
    with torch.device("meta"):
        model = ColQwen2(config)
    assert sum(p.numel() for p in model.parameters()) == 2_209_182_336
    lora = get_peft_model(model, lora_config())
    assert sum(p.numel() for p in lora.parameters() if p.requires_grad) == 36_982_784


def test_the_processor_has_qwen2_vls_specials_prompt_layout_and_the_768_token_cap(processor):
    from PIL import Image

    tokenizer = processor.tokenizer
    assert len(tokenizer) == 151657 and tokenizer.padding_side == "left"
    assert tokenizer.convert_tokens_to_ids(list(colqwen2_model.SPECIAL_TOKENS)) == list(range(151643, 151657))
    assert processor.image_processor.max_pixels == 768 * 28 * 28
    pages = processor.process_images([Image.new("RGB", (1700, 2200)), Image.new("RGB", (500, 400))])
    # 1700x2200 is above the cap: scaled to 48x62 patches of 14 px, merged 2x2 -> 24*31 = 744 tokens
    assert pages["image_grid_thw"].tolist() == [[1, 62, 48], [1, 28, 36]]
    assert (pages["input_ids"] == 151655).sum(dim=1).tolist() == [744, 252]
    assert pages["input_ids"].shape == (2, 744 + PROMPT_TOKENS)
    prompt = [t for t in pages["input_ids"][0].tolist() if t != 151655]
    assert tokenizer.convert_ids_to_tokens(prompt) == [
        "<|im_start|>", "user", "Ċ", "<|vision_start|>", "<|vision_end|>",
        "Describe", "Ġthe", "Ġimage", ".", "<|im_end|>", "<|endoftext|>",
    ]  # fmt: skip
    assert pages["input_ids"][1, 0].item() == 151643  # left-padded with <|endoftext|>
    queries = processor.process_texts(["What is the total?" + "<|endoftext|>" * 10])
    assert queries["input_ids"][0, -10:].tolist() == [151643] * 10


def test_synthetic_queries_follow_the_real_length_statistics(processor):
    lengths = [len(q) for q in colpali_data.queries(5000, 0)]
    assert 64 <= np.mean(lengths) <= 70 and max(lengths) > 2 * np.mean(lengths)  # mean ~67 with a tail
    # independent batches per seed of the grids, padded as colpali-engine's collator pads them (its
    # augmentation tokens added): the ranges the methodology states (prose.query_calibration)
    calibration, (low, high) = QUERY_CALIBRATION, PUBLISHED_QUERY_RANGE
    for seed in calibration.seeds:
        queries = [colpali_data.query(seed, index) for index in range(calibration.batches * calibration.batch)]
        tokens = np.array([len(ids) for ids in processor.tokenizer(queries)["input_ids"]]) + calibration.augmentation
        padded = tokens.reshape(calibration.batches, calibration.batch).max(axis=1)
        median, inside, above = np.median(padded), np.mean((padded >= low) & (padded <= high)), np.mean(padded > high)
        assert calibration.median[0] <= median <= calibration.median[1], (seed, median)
        assert calibration.inside[0] <= inside <= calibration.inside[1], (seed, inside)
        assert calibration.above[0] <= above <= calibration.above[1], (seed, above)


def test_one_seed_names_one_stream_of_batches():
    """The first batches of a 2-step run are those of a 4-step run; another seed draws others."""
    from toy_stack import first_batches

    def batches(steps, seed=42):
        return first_batches("colpali", 3, steps, seed, keys=lambda key: key in ("query_input_ids", "doc_image_grid_thw"))

    first = batches(2)
    assert first == batches(4)
    assert first != batches(2, seed=7)
    assert colpali_data.SyntheticTrainSet(42)[5] | {"image": None} == colpali_data.SyntheticTrainSet(42)[5] | {"image": None}
    assert len(colpali_data.SyntheticTrainSet(42)) == colpali_data.STREAM_ROWS


def test_synthetic_pages_land_in_the_capped_visual_token_range(processor):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    size = processor.image_processor.size
    tokens = []
    for _, width, height in colpali_data.page_sizes(3000, 42):
        h, w = smart_resize(height, width, 28, size["shortest_edge"], size["longest_edge"])
        tokens.append((h // 28) * (w // 28))
    tokens = np.array(tokens)
    assert tokens.max() <= 768
    assert np.mean((tokens >= 700) & (tokens <= 768)) >= 0.95
    row = colpali_data.SyntheticTrainSet(42)[3]
    assert set(row) >= {"query", "image", "image_filename", "options", "answer", "page", "model", "prompt", "source"}
    assert row["image"].size == colpali_data.page_sizes(4, 42)[3][1:] and row["query"] == colpali_data.queries(4, 42)[3]


def test_a_local_checkpoint_and_local_shards_load_like_the_hub(tmp_path):
    import shutil

    import datasets
    from PIL import Image

    checkpoint = tmp_path / "colqwen2-checkpoint"  # laid out like vidore/colqwen2-base
    model, _, _ = colqwen2_model.load(None, "tiny", 42, "cpu")
    model.save_pretrained(checkpoint)
    # the processor files as the hub has them: Qwen2-VL's pixel range, *without* colpali-engine's cap
    shutil.copytree(colqwen2_model.materialize_processor(), checkpoint, dirs_exist_ok=True)
    assert '"longest_edge": 12845056' in (checkpoint / "processor_config.json").read_text()
    shards = tmp_path / "colpali_train_set" / "data"  # laid out like the dataset repository
    shards.mkdir(parents=True)
    features = datasets.Features({"query": datasets.Value("string"), "image": datasets.Image(),
                                  "source": datasets.Value("string")})  # fmt: skip
    rows = {"query": [f"What is shown in figure {i}?" for i in range(6)],
            "image": [Image.new("RGB", (560, 700)) for i in range(5)] + [Image.new("RGB", (1700, 2200))],
            "source": ["docvqa"] * 6}  # fmt: skip
    datasets.Dataset.from_dict(rows, features=features).to_parquet(shards / "train-00000-of-00002.parquet")
    large = dict(rows, image=[Image.new("RGB", (1700, 2200)) for _ in range(6)])  # any batch of 6 of the 12 holds one
    datasets.Dataset.from_dict(large, features=features).to_parquet(shards / "train-00001-of-00002.parquet")

    loaded, source = colpali_data.load_train_set(str(shards.parent), 4, 42)  # every shard: one fixed set
    assert len(loaded) == 12 and source.endswith("train-00000-of-00002.parquet,train-00001-of-00002.parquet:rows=12")
    assert isinstance(loaded[0]["image"], Image.Image)
    again, _ = colpali_data.load_train_set(str(shards.parent), 8, 42)
    assert again["query"] == loaded["query"]
    with pytest.raises(ValueError, match="fewer than the 13"):
        colpali_data.load_train_set(str(shards.parent), 13, 42)
    result = cell(tmp_path, model_source=str(checkpoint), data_source=str(shards.parent), batch_size=6, steps=1, warmup_steps=0)
    assert result.outcome == "ok"
    assert result.env.model_source == f"local:{checkpoint}" and result.env.data_source.startswith("local:")
    (call,) = result.maxsim_calls_in_train
    # the 1700x2200 page is capped by from_pretrained(max_num_visual_tokens=768): 24*31 = 744 tokens (uncapped:
    # 79*61 = 4819 tokens); the 560x700 pages stay under the cap (20*25 = 500)
    assert call.doc_shape[1] == 744 + PROMPT_TOKENS


def test_real_data_with_the_offline_processor_is_refused_before_anything_is_built(tmp_path):
    with pytest.raises(CellError, match="real data"):
        cell(tmp_path, data_source="hub")


def test_the_notebook_runs_with_only_batch_and_variant_given(tmp_path):
    """`papermill notebooks/colpali.ipynb out.ipynb -p batch 128 -p variant lik` is the documented call: device
    and preset default to "auto" (here, without a GPU: the CPU and the tiny preset)."""
    from pathlib import Path

    import papermill

    from harness.results import load_result

    root = Path(__file__).resolve().parent.parent
    output = tmp_path / "cell.json"
    papermill.execute_notebook(str(root / "notebooks" / "colpali.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                               parameters={"batch": 2, "variant": "vanilla", "steps": 1, "warmup_steps": 0,
                                           "output": str(output)},
                               cwd=str(root), progress_bar=False)  # fmt: skip
    result = load_result(output)
    assert (result.outcome, result.preset, result.env.device, result.batch_size) == ("ok", "tiny", "cpu", 2)
    assert result.spec == TrainSpec(batch_size=2, steps=1, warmup_steps=0, device="cpu", preset="tiny")
    assert result.grid is None and result.provenance.notebook_sha256


def test_dataloader_workers_collate_in_another_process_and_train_the_same_batches(tmp_path, monkeypatch):
    """Fewer workers than the recipe's (a ceiling probe whose host cannot hold four workers' batches)
    move the collation, not the training: the same shapes reach the loss, with the same losses."""
    monkeypatch.setenv("MAXSIM_PARITY_DIR", str(tmp_path / "store"))
    (tmp_path / "recipe").mkdir()
    (tmp_path / "worker").mkdir()
    recipe = cell(tmp_path / "recipe", trace=True)  # no worker on the CPU
    worker = cell(tmp_path / "worker", trace=True, dataloader_workers=1)
    assert worker.outcome == recipe.outcome == "ok"
    assert worker.cell_id == f"colpali-plain-b{BATCH}-vanilla-native-dw1" and worker.spec.dataloader_workers == 1
    shapes = [[(call.query_shape, call.doc_shape) for call in result.maxsim_calls_in_train] for result in (recipe, worker)]
    assert shapes[0] == shapes[1] and len(shapes[0]) == STEPS
    assert worker.loss_per_step == pytest.approx(recipe.loss_per_step, rel=1e-6)
    # and the trainer's dataloader is the one the cell names (the recipe's 4 where it names none, on CUDA)
    from harness.stacks.colpali import STACK, dataloader_workers

    spec = TrainSpec(stack="colpali", batch_size=BATCH, steps=STEPS, preset="tiny", device="cpu", dataloader_workers=2)
    assert STACK.build(spec, torch.device("cpu")).trainer.args.dataloader_num_workers == 2
    assert dataloader_workers(None, torch.device("cuda")) == 4 and dataloader_workers(None, torch.device("cpu")) == 0
