"""The PyLate stack on CPU: the tiny preset through PyLate's real trainer (pylate environment)."""

import math
import string

import numpy as np
import pytest

from harness import provenance
from harness.cell import run_cell
from harness.memory import MIB
from harness.spec import TrainSpec
from harness.stacks import lexicon, msmarco

pytestmark = pytest.mark.pylate
BATCH, STEPS = 6, 2


def cell(tmp_path, **overrides):
    fields = dict(stack="pylate", regime="plain", batch_size=BATCH, steps=STEPS, preset="tiny", device="cpu")
    return run_cell(TrainSpec(**(fields | overrides)), tmp_path / "cell.json")


@pytest.mark.parametrize("regime", ["plain", "grad-checkpoint"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_a_tiny_cell_trains_through_pylates_trainer(tmp_path, regime, chunk):
    result = cell(tmp_path, regime=regime, score_mini_batch_size=chunk)
    assert result.outcome == "ok" and len(result.step_times_sec) == STEPS
    assert result.cell_id == f"pylate-{regime}-b{BATCH}-vanilla{'' if chunk is None else f'-chunk{chunk}'}-native"
    calls_per_step = 1 if chunk is None else math.ceil(BATCH / chunk)
    assert len(result.maxsim_calls_in_train) == STEPS * calls_per_step
    query_rows = [c.query_shape[0] for c in result.maxsim_calls_in_train[:calls_per_step]]
    assert query_rows == ([BATCH] if chunk is None else [4, 2])
    for call in result.maxsim_calls_in_train:
        # queries padded (expanded) to query_length, documents padded to document_length
        assert call.query_shape[1:] == [48, 128] and call.doc_shape == [BATCH, 2, 300, 128]
        assert call.doc_mask_shape == [BATCH, 2, 300] and call.query_mask_shape is None  # query expansion on
        assert call.dtype == "float32" and call.step in range(STEPS)
    for replay in result.maxsim_calls_isolated:
        assert round(replay.saved_for_backward_mib * MIB) == round(replay.predicted_saved_for_backward_mib * MIB)
        assert round(replay.forward_transient_peak_mib * MIB) == round(replay.predicted_forward_transient_mib * MIB)
    assert result.env.packages["pylate"] in ("1.6.0", "1.5.0") and result.env.model_source.startswith("offline:")
    assert result.env.data_source.startswith("synthetic:msmarco-triplet")


@pytest.mark.parametrize("mini_batch, score_chunk, rows", [(2, 5, [5, 1])])
def test_a_gradcache_cell_scores_each_query_chunk_against_every_document(tmp_path, mini_batch, score_chunk, rows):
    """CachedContrastive: one score call per query chunk of score_mini_batch_size (not of the
    mini-batch the encoder runs in), each against all B documents; the encoder's passes never reach
    the call site."""
    result = cell(tmp_path, regime="gradcache", mini_batch_size=mini_batch, score_mini_batch_size=score_chunk)
    assert result.outcome == "ok" and len(result.step_times_sec) == STEPS
    chunk = "" if score_chunk is None else f"-chunk{score_chunk}"
    assert result.cell_id == f"pylate-gradcache-b{BATCH}-vanilla-mb{mini_batch}{chunk}-native"
    assert len(result.maxsim_calls_in_train) == STEPS * len(rows)
    assert [c.query_shape[0] for c in result.maxsim_calls_in_train[: len(rows)]] == rows
    assert all(c.doc_shape == [BATCH, 2, 300, 128] and c.doc_mask_shape == [BATCH, 2, 300]
               for c in result.maxsim_calls_in_train)  # fmt: skip
    for replay in result.maxsim_calls_isolated:  # the analytic prediction holds for a chunk against every document
        assert round(replay.forward_transient_peak_mib * MIB) == round(replay.predicted_forward_transient_mib * MIB)
        assert round(replay.saved_for_backward_mib * MIB) == round(replay.predicted_saved_for_backward_mib * MIB)


def test_in_train_score_calls_hold_what_the_replay_holds(tmp_path, capsys):
    """Through `harness cell --device cpu` without --preset: "auto" is the tiny model on a CPU."""
    from harness.cli import main
    from harness.results import load_result

    output = tmp_path / "cell.json"
    assert main(["cell", "--stack", "pylate", "--device", "cpu", "--batch-size", str(BATCH), "--steps", str(STEPS),
                 "--output", str(output)]) == 0  # fmt: skip
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith(f"pylate-plain-b{BATCH}-vanilla-native: ok; peak ") and printed.endswith(f"; result in {output}")
    result = load_result(output)
    assert result.spec == TrainSpec(stack="pylate", batch_size=BATCH, steps=STEPS, device="cpu", preset="tiny")
    assert result.grid is None and result.env.model_source == "offline:gte-moderncolbert-v1-tiny-random-seed42"
    (replay,) = result.maxsim_calls_isolated
    for call in result.maxsim_calls_in_train:
        # in train the doc slots are views of the stacked tensor exactly as in replay
        assert round(call.saved_for_backward_mib * MIB) == round(replay.saved_for_backward_mib * MIB)


def test_the_tokenizer_has_modernberts_id_layout_and_pylate_adds_the_prefixes():
    from harness.stacks import pylate_model

    tokenizer = pylate_model.build_tokenizer()
    assert len(tokenizer) == 50368
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")] == list(
        range(50280, 50285)
    )
    encoded = tokenizer("baka, dufe.")["input_ids"]
    assert encoded[0] == 50281 and encoded[-1] == 50282
    model, _ = pylate_model.load(None, "tiny", 42, "cpu")
    assert model.tokenizer.convert_tokens_to_ids(["[Q] ", "[D] "]) == [50368, 50369]
    assert model.tokenizer.pad_token_id == 50284  # padding forced to [MASK] for query expansion
    assert sorted(model.skiplist) == sorted(tokenizer.convert_tokens_to_ids(list(string.punctuation)))
    assert model[0].auto_model.get_input_embeddings().num_embeddings == 50370
    assert model[1].linear.out_features == 128 and model[1].linear.bias is None
    assert (model.query_length, model.document_length, model.attend_to_expansion_tokens) == (48, 300, False)


def test_a_local_checkpoint_directory_loads_like_a_hub_id(tmp_path):
    from harness.stacks import pylate_model

    saved = pylate_model.materialize("tiny", 42)  # a directory laid out like the published checkpoint
    model, source = pylate_model.load(str(saved), "full", 42, "cpu")
    assert source == f"local:{saved}"
    assert model.query_length == 48 and model.document_length == 300
    result = cell(tmp_path, model_source=str(saved), steps=1, warmup_steps=0)
    assert result.outcome == "ok" and result.env.model_source == f"local:{saved}"


def test_a_local_dataset_directory_replaces_the_synthetic_set(tmp_path):
    import datasets

    rows = msmarco.synthetic_triplets(20, seed=7)
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "data" / "train.parquet"))
    dataset, source = msmarco.load_triplets(str(tmp_path / "data"), n_rows=12, seed=0)
    assert len(dataset) == 20 and dataset[0]["query"] == rows["query"][0]  # the whole split: one stream
    assert source.startswith("local:") and source.endswith(":rows=20")
    shorter, _ = msmarco.load_triplets(str(tmp_path / "data"), n_rows=4, seed=0)
    assert shorter["query"] == dataset["query"]
    with pytest.raises(ValueError, match="fewer than the 21"):
        msmarco.load_triplets(str(tmp_path / "data"), n_rows=21, seed=0)


def test_one_seed_names_one_stream_of_batches():
    """The first batches of a 2-step run are those of a 4-step run; another seed draws others."""
    from toy_stack import first_batches

    def batches(steps, seed=42):
        return first_batches("pylate", 4, steps, seed, keys=lambda key: key.endswith("input_ids"))

    first = batches(2)
    assert first == batches(4)
    assert first != batches(2, seed=7)
    dataset, source = msmarco.load_triplets(None, n_rows=8, seed=42)
    assert len(dataset) == msmarco.STREAM_ROWS and source.endswith(f"stream={msmarco.STREAM_ROWS}")
    assert dataset[3] == msmarco.triplet(42, 3) and dataset[3]["query"] == msmarco.synthetic_triplets(4, 42)["query"][3]
    with pytest.raises(ValueError, match="exceed the synthetic stream"):
        msmarco.load_triplets(None, n_rows=msmarco.STREAM_ROWS + 1, seed=42)


def test_synthetic_triplets_have_msmarco_lengths():
    from harness.stacks import pylate_model

    rows = msmarco.synthetic_triplets(3000, seed=0)
    passage_words = np.array([len(p.split()) for p in rows["positive"] + rows["negative"]])
    query_words = np.array([len(q.split()) for q in rows["query"]])
    assert 53 <= passage_words.mean() <= 59 and 6.0 <= query_words.mean() <= 6.8
    assert passage_words.max() > 2.5 * passage_words.mean()  # a long tail, as in MS MARCO
    tokenizer = pylate_model.build_tokenizer()
    tokens = np.array([len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in rows["positive"][:500]])
    assert 62 <= tokens.mean() <= 80  # ~70 word pieces per passage
    unknown = sum(tokenizer(p)["input_ids"].count(50280) for p in rows["positive"][:200])
    assert unknown == 0
    assert rows == msmarco.synthetic_triplets(3000, seed=0)  # seeded
    assert lexicon.vocabulary()["[MASK]"] == 50284


def test_the_notebook_runs_one_cell_in_a_fresh_kernel_with_papermill(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from harness.results import load_result

    root = Path(__file__).resolve().parent.parent
    output = tmp_path / "cell.json"
    executed = tmp_path / "executed.ipynb"
    papermill = Path(sys.executable).parent / "papermill"
    completed = subprocess.run(
        [papermill, root / "notebooks" / "pylate.ipynb", executed, "-k", "python3", "--cwd", root,
         "-p", "batch", "4", "-p", "steps", "1", "-p", "warmup_steps", "0", "-p", "regime", "grad-checkpoint",
         "-p", "output", str(output)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = load_result(output)
    # the notebook's parameters became the spec (device and preset "auto": the CPU and the tiny model here)
    assert result.spec == TrainSpec(stack="pylate", regime="grad-checkpoint", batch_size=4, steps=1, warmup_steps=0, device="cpu",
                                    preset="tiny")  # fmt: skip
    assert result.outcome == "ok" and result.grid is None
    assert result.provenance.notebook_sha256 == provenance.file_sha256(root / "notebooks" / "pylate.ipynb")
    notebook = json.loads(executed.read_text())
    shown = "".join(str(o.get("data", {})) for c in notebook["cells"] for o in c.get("outputs", []))
    assert "4×2×300×128" in shown and "step peak allocated" in shown
