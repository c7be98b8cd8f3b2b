"""Masked-language-model pretraining: token stores, sequences, BERT masking, the task, whole runs."""

import csv
import dataclasses
import json
import math
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import read_metrics, resume_after_step_6, run_here

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.specs.masked_head import MaskedHeadConfig
from trainrun.config import check
from trainrun.core.checkpoint import list_checkpoints
from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.core.events import Event
from trainrun.data.interface import TextFacts
from trainrun.data.masked_text import IGNORED, MaskedSequences, cached_store, collate_masked
from trainrun.data.store_writer import write_token_store
from trainrun.data.token_store import (
    TokenStore,
    check_token_dtype,
    load_tokenizer,
    read_documents,
    split_documents,
)
from trainrun.data.torch_loader import AugmentedDataset
from trainrun.errors import ConfigError, DataError, FileFormatError
from trainrun.models.bert import build_bert
from trainrun.models.build import build_model
from trainrun.schema import BertConfig, DataConfig, ModelConfig, TextConfig
from trainrun.tasks.masked_lm import MaskedTokenEvaluator, masked_cross_entropy

DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A token store keeps every document's token ids back to back.",
    "Short one.",
    "Masked language models predict the tokens that were hidden from them, one position at a time, "
    "from the words on both sides.",
] * 30


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "store"
    train, val = split_documents(DOCUMENTS, 0.1, seed=0)
    return write_token_store(train, val, path, vocab_size=200)


def test_token_store_layout_and_round_trip(store):
    meta = json.loads((store / "store.json").read_text())
    assert meta["format"] == "trainrun-tokens/2" and meta["dtype"] == "uint16" and meta["vocab_size"] <= 200
    assert meta["train"]["documents"] + meta["val"]["documents"] == len(DOCUMENTS)
    train = TokenStore.open(store, "train")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(store / "tokenizer.json"))
    decoded = {tokenizer.decode(document.tolist()).replace(" ", "") for document in train.documents()}
    assert decoded == {document.lower().replace(" ", "") for document in DOCUMENTS}  # lower-cased WordPiece
    assert len(train.offsets) == meta["train"]["documents"] + 1 and train.offsets[-1] == len(train.tokens)
    assert train.special("[PAD]") == 0 and train.special("[MASK]") == 4


def test_a_store_written_before_separators_were_recorded_ends_its_documents_with_sep(store, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(store, old)
    meta = json.loads((old / "store.json").read_text())
    assert meta.pop("separator") == "[SEP]"
    (old / "store.json").write_text(json.dumps(meta))
    assert TokenStore.open(old, "train").separator == TokenStore.open(store, "train").special("[SEP]") == 3


def test_token_ids_are_stored_in_a_type_that_holds_the_vocabulary(store, tmp_path):
    assert TokenStore.open(store, "train").tokens.dtype == np.uint16
    wide = write_token_store(DOCUMENTS[:20], DOCUMENTS[20:24], tmp_path / "wide", vocab_size=120, dtype="uint32")
    assert TokenStore.open(wide, "train").tokens.dtype == np.uint32
    with pytest.raises(ConfigError, match="'--dtype': uint16 holds 65,536 token ids; the vocabulary has 70,000"):
        check_token_dtype(70_000, "uint16")
    result = run_here(
        "write-text", "stdlib_docs", str(tmp_path / "never"), "--vocab-size", "70000", "--dtype", "uint16"
    )
    assert result.returncode == 2 and "the vocabulary has 70,000" in result.stderr and not (tmp_path / "never").exists()
    meta = json.loads((wide / "store.json").read_text())
    (wide / "store.json").write_text(json.dumps({**meta, "vocab_size": 70_000, "dtype": "uint16"}))
    with pytest.raises(DataError, match="a vocabulary of 70,000 does not fit uint16 ids"):
        TokenStore.open(wide, "train")


def test_a_store_with_another_tokenizer_is_refused(store, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text().replace("[MASK]", "[MASQ]"))
    with pytest.raises(DataError, match="is not the tokenizer the store was written with"):
        TokenStore.open(copy, "train")


def test_padded_samples_cut_each_document_and_packed_ones_fill_every_slot(store):
    train = TokenStore.open(store, "train")
    lengths = np.diff(train.offsets)
    padded = MaskedSequences(train, 12, "pad", 0.15)
    assert len(padded) == sum(math.ceil(n / 10) for n in lengths)
    bodies = [padded.tokens(i) for i in range(len(padded))]
    assert np.array_equal(np.concatenate(bodies), np.asarray(train.tokens, dtype=np.int64))
    packed = MaskedSequences(train, 12, "pack", 0.15)
    sep = train.special("[SEP]")
    stream = np.concatenate([np.append(np.asarray(d, dtype=np.int64), sep) for d in train.documents()])
    assert len(packed) == math.ceil(len(stream) / 10)
    assert np.array_equal(np.concatenate([packed.tokens(i) for i in range(len(packed))]), stream)
    assert all(len(packed.tokens(i)) == 10 for i in range(len(packed) - 1))  # no padding but in the last
    item = padded[0]
    n = len(bodies[0]) + 2
    assert item["attention_mask"].tolist() == [1] * n + [0] * (12 - n)
    assert item["input_ids"][n:].eq(train.special("[PAD]")).all()


def test_masking_chooses_ordinary_tokens_at_the_rate_and_replaces_80_10_10(store):
    train = TokenStore.open(store, "train")
    data = MaskedSequences(train, 64, "pack", 0.3)
    torch.manual_seed(0)
    chosen = ordinary = masked = kept = 0
    for _ in range(40):
        for index in range(len(data)):
            item = data[index]
            original = torch.cat([torch.tensor([2]), torch.from_numpy(data.tokens(index)), torch.tensor([3])])
            n = len(original)
            labels, inputs = item["labels"][:n], item["input_ids"][:n]
            is_chosen = labels != IGNORED
            assert torch.equal(labels[is_chosen], original[is_chosen])  # labels are the original tokens
            assert not is_chosen[original < 5].any()  # [CLS], [SEP] and the other specials never
            ordinary += int((original >= 5).sum())
            chosen += int(is_chosen.sum())
            masked += int((inputs[is_chosen] == 4).sum())
            kept += int((inputs[is_chosen] == original[is_chosen]).sum())
    assert chosen / ordinary == pytest.approx(0.3, abs=0.01)
    assert masked / chosen == pytest.approx(0.8, abs=0.02)
    assert kept / chosen == pytest.approx(0.1 + 0.1 / (train.vocab_size - 5), abs=0.02)  # a random draw may hit it


def test_a_given_tokenizer_may_put_its_special_tokens_anywhere(tmp_path):
    """Special tokens at the end of the vocabulary (as a user's tokenizer may have them) are never
    masked, and random replacements come from above them."""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=True)
    tokenizer.train_from_iterator(DOCUMENTS, vocab_size=150, special_tokens=["[UNK]"], show_progress=False)
    tokenizer.add_special_tokens(["[PAD]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    path = write_token_store(DOCUMENTS[:100], DOCUMENTS[100:], tmp_path / "store", 150, tmp_path / "tokenizer.json")
    train = TokenStore.open(path, "train")
    specials = sorted(train.meta["special"].values())
    assert specials[1:] == list(range(train.vocab_size - 4, train.vocab_size))  # all but [UNK] at the end
    data = MaskedSequences(train, 40, "pad", 0.5)
    torch.manual_seed(0)
    for index in range(len(data)):
        item = data[index]
        chosen = item["labels"] != IGNORED
        assert not torch.isin(item["labels"][chosen], torch.tensor(specials)).any()
        assert chosen[0].item() is False and item["input_ids"][0] == train.special("[CLS]")
        replaced = item["input_ids"][chosen]
        assert (replaced < train.vocab_size).all()
        assert not torch.isin(replaced[replaced != train.special("[MASK]")], torch.tensor(specials)).any()


def test_evaluation_masks_are_fixed_and_training_masks_keyed_to_seed_epoch_and_sample(store):
    val = MaskedSequences(TokenStore.open(store, "val"), 32, "pad", 0.5, fixed_masks=True)
    assert torch.equal(val[1]["labels"], val[1]["labels"]) and not torch.equal(val[0]["labels"], val[1]["labels"])
    train = AugmentedDataset(MaskedSequences(TokenStore.open(store, "train"), 32, "pad", 0.5), seed=3)
    first, again, later = train[(0, 5)], train[(0, 5)], train[(1, 5)]
    assert torch.equal(first["labels"], again["labels"]) and not torch.equal(first["labels"], later["labels"])


def test_the_loss_and_metrics_count_only_masked_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    labels = torch.full((2, 5), IGNORED)
    labels[0, 1], labels[1, 3], labels[1, 4] = 3, logits[1, 3].argmax(), 6
    picked = logits[labels != IGNORED]
    expected = -torch.log_softmax(picked, -1)[torch.arange(3), labels[labels != IGNORED]].mean()
    # the same three tokens as predicted slots: two per sequence, one of them padding (-100)
    slots = torch.stack([logits[0, [1, 0]], logits[1, [3, 4]]]).flatten(0, 1)
    targets = {"labels": labels, "predicted": torch.tensor([[3, IGNORED], [int(labels[1, 3]), 6]])}
    assert masked_cross_entropy(logits, targets).item() == pytest.approx(expected.item(), rel=1e-6)
    assert masked_cross_entropy(slots, targets).item() == pytest.approx(expected.item(), rel=1e-6)
    correct = int((picked.argmax(-1) == labels[labels != IGNORED]).sum())
    for outputs in (logits, slots):
        evaluator = MaskedTokenEvaluator(torch.device("cpu"), 1)
        evaluator.update(outputs, targets)
        metrics = evaluator.compute()
        assert metrics["masked_accuracy"] == pytest.approx(correct / 3)
        assert metrics["eval_loss"] == pytest.approx(expected.item(), rel=1e-6)
        assert metrics["perplexity"] == pytest.approx(math.exp(expected.item()), rel=1e-6)


def test_masked_head_gives_the_full_heads_loss_and_gradient_for_a_fraction_of_its_work(store):
    """Same loss and gradients as the head over every position; the head's matrix products fall from
    B·L rows to the N predicted rows: (B·L − N)·(2·H·H + 2·H·V) FLOPs fewer per forward."""
    from torch.utils.flop_counter import FlopCounterMode

    data = MaskedSequences(TokenStore.open(store, "train"), 32, "pack", 0.15)
    torch.manual_seed(0)
    batch = collate_masked([data[i] for i in range(8)])
    inputs = {
        key: batch[key] for key in ("input_ids", "attention_mask", "lengths", "predict_positions", "predict_counts")
    }
    targets = {"labels": batch["labels"], "predicted": batch["predicted_labels"], "counts": batch["predict_counts"]}
    config = BertConfig(hidden_dropout=0.0, attention_dropout=0.0)
    model = build_bert(config, data.vocab_size)
    results = []
    for masked in (False, True):
        if masked:
            build_algorithms({"masked_head": MaskedHeadConfig()})[0].apply(Event.INIT, SimpleNamespace(raw_model=model))
        model.zero_grad()
        with FlopCounterMode(display=False) as flops:
            logits = model(inputs)
        loss = masked_cross_entropy(logits, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()], flops.get_total_flops(), logits))
    (full, full_grads, full_flops, full_logits), (masked, masked_grads, masked_flops, masked_logits) = results
    rows = int((batch["labels"] != IGNORED).sum())
    assert int(batch["predict_counts"].sum()) == rows
    assert full_logits.shape == (8, 32, data.vocab_size) and masked_logits.shape == (rows, data.vocab_size)
    assert torch.allclose(full, masked, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(full_grads, masked_grads, strict=True))
    hidden = config.hidden_size
    assert full_flops - masked_flops == (8 * 32 - rows) * (2 * hidden * hidden + 2 * hidden * data.vocab_size)
    with pytest.raises(
        ConfigError, match=r"^algorithm 'masked_head' needs trainrun's BERT \(model=bert_\*\), not Linear$"
    ):
        build_algorithms({"masked_head": MaskedHeadConfig()})[0].apply(
            Event.INIT, SimpleNamespace(raw_model=torch.nn.Linear(2, 2))
        )


def test_corpora_files_folders_and_bad_text(tmp_path):
    (tmp_path / "a.txt").write_text("first document\nstill first\n\nsecond document\n")
    (tmp_path / "b.jsonl").write_text('{"text": "third"}\n\n{"text": "fourth"}\n')
    assert read_documents(str(tmp_path)) == ["first document\nstill first", "second document", "third", "fourth"]
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    with pytest.raises(DataError, match=r"corpus file '.*bad.txt' is not UTF-8 \(line 1\)"):
        read_documents(str(tmp_path / "bad.txt"))
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(DataError, match="has no text"):
        read_documents(str(tmp_path / "empty.txt"))
    assert len(read_documents("stdlib_docs")) > 1000


LANGUAGE = ["task=masked_lm", "data=text", "model=bert_tiny"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task=masked_lm"], "bad value for 'data.name': 'digits' (with task=masked_lm it must be text)"),
        (
            [*LANGUAGE, "data.text.corpus=stdlib_docs", "algorithms=[blurpool]"],
            "'blurpool' does not apply to task masked_lm",
        ),
        (["algorithms=[masked_head]"], "algorithm 'masked_head' does not apply to task image_classification"),
        (
            [*LANGUAGE, "data.text.corpus=stdlib_docs", "data.text.max_seq_len=1024"],
            "'data.text.max_seq_len': 1024 is more than",
        ),
        (LANGUAGE, "data=text needs 'data.path'"),
        (
            [*LANGUAGE, "data.text.corpus=stdlib_docs", "data.text.tokenizer=bpe"],
            "bad value for 'data.text.tokenizer': bpe has no",  # [MASK] token for masked LM
        ),
        ([*LANGUAGE, "data.text.corpus=stdlib_docs", "loss=bce"], "bad value for 'loss': 'bce'"),
    ],
)
def test_bad_language_configs_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check(overrides)


@pytest.mark.slow
def test_write_text_and_train_a_tiny_bert(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(read_documents("stdlib_docs")[:400]))
    written = run_here("write-text", str(corpus), str(tmp_path / "store"), "--vocab-size", "1000")
    assert written.returncode == 0, written.stderr
    assert written.stdout.splitlines()[-1].startswith("wrote ") and "(vocabulary 1,000, uint16)" in written.stdout
    again = run_here("write-text", str(corpus), str(tmp_path / "store"))
    assert again.returncode == 2 and "pass --overwrite" in again.stderr
    run_dir = tmp_path / "run"
    args = [*LANGUAGE, f"data.path={tmp_path / 'store'}", "data.text.max_seq_len=32", "data.text.packing=pack"]
    args += ["optimizer=adamw", "optimizer.lr=2e-3", "train_batch_size=32", "max_duration=60ba", "eval_interval=30ba"]
    args += ["algorithms=[masked_head]", "device_train_microbatch_size=16"]  # the head's rows split too
    result = run_here(*args, "progress=false", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    assert "masked-token accuracy" in result.stdout and "seq/s" in result.stdout
    first, last = read_metrics(run_dir)
    # 60 steps leave a tiny BERT predicting frequent tokens, so its accuracy may stall or dip by a
    # token between the two evaluations (each run trains another vocabulary); its loss falls.
    assert last["eval_loss"] < first["eval_loss"] and min(first["masked_accuracy"], last["masked_accuracy"]) > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["quality_metric"] == "masked_accuracy" and summary["task"] == "masked_lm"
    assert summary["best_masked_accuracy"] == max(first["masked_accuracy"], last["masked_accuracy"])
    _the_export_is_what_transformers_loads_and_what_a_next_run_starts_from(run_dir, tmp_path / "store")


def _the_export_is_what_transformers_loads_and_what_a_next_run_starts_from(run_dir, store_path):
    from transformers import AutoTokenizer, BertForMaskedLM

    trained = torch.load(sorted((run_dir / "checkpoints").glob("*.pt"))[-1], weights_only=True)["model"]
    exported = BertForMaskedLM.from_pretrained(run_dir / "hf_model").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf_model")
    encoded = tokenizer(["Return the number of items in a container."], return_tensors="pt")
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])[0] == "[CLS]"
    config = ModelConfig(name="bert", bert=BertConfig(layers=2, hidden_size=128, heads=2, intermediate_size=512))
    ours = build_bert(config.bert, tokenizer.vocab_size).eval()
    ours.load_state_dict(trained)
    with torch.no_grad():
        expected = ours({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})
        assert torch.equal(exported(**encoded).logits, expected)
    text = TextFacts(tokenizer.vocab_size, 32, run_dir / "hf_model" / "tokenizer.json", tokenizer.sep_token_id)
    started = build_model(dataclasses.replace(config, weights=str(run_dir / "hf_model")), text)
    assert all(torch.equal(value, trained[key]) for key, value in started.state_dict().items())
    assert build_model(
        dataclasses.replace(config, weights=str(sorted((run_dir / "checkpoints").glob("*.pt"))[-1])), text
    )
    wider_bert = dataclasses.replace(config.bert, hidden_size=64, heads=2)
    wider = dataclasses.replace(config, bert=wider_bert, weights=str(run_dir / "hf_model"))
    with pytest.raises(ConfigError, match="'model.weights': '.*hf_model' has another shape for the model's weight"):
        build_model(wider, text)
    with pytest.raises(ConfigError, match="'.*' is a Hugging Face folder; only a BERT, GPT or Llama reads one"):
        build_model(ModelConfig(weights=str(run_dir / "hf_model")))


@pytest.mark.slow
@pytest.mark.distributed
def test_one_rank_two_ranks_and_micro_batches_train_the_same_bert(tmp_path):
    """Masks keyed to (seed, epoch, sample), no dropout, and the loss a mean over the step's
    predicted tokens on all ranks: 2 gloo ranks, and 1 rank in micro-batches of 8, train the
    1-rank whole-batch BERT to float summation order. (With each rank's own mean they differed by
    1e-5 to 1.2e-3 in the losses after 20 Adam steps: the ranks' masked counts differ.)"""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(read_documents("stdlib_docs")[:300]))
    assert run_here("write-text", str(corpus), str(tmp_path / "store"), "--vocab-size", "800").returncode == 0
    args = [*LANGUAGE, f"data.path={tmp_path / 'store'}", "data.text.max_seq_len=32", "data.text.packing=pack"]
    args += ["model.bert.hidden_dropout=0", "model.bert.attention_dropout=0", "optimizer=adamw", "optimizer.lr=2e-3"]
    args += ["train_batch_size=32", "max_duration=20ba", "eval_interval=20ba", "progress=false"]
    splits = {"one": [], "two": ["launcher.devices=2"], "micro": ["device_train_microbatch_size=8"]}
    for name, split in splits.items():
        result = run_here(*args, *split, f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
    (first,) = read_metrics(tmp_path / "one")
    trained = torch.load(list_checkpoints(tmp_path / "one" / "checkpoints")[-1], weights_only=True)["model"]
    for name in ("two", "micro"):
        (other,) = read_metrics(tmp_path / name)
        for key in ("train_loss", "eval_loss", "masked_accuracy"):
            assert other[key] == pytest.approx(first[key], rel=1e-5, abs=1e-6), (name, key)
        weights = torch.load(list_checkpoints(tmp_path / name / "checkpoints")[-1], weights_only=True)["model"]
        for key, value in trained.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=2e-5, msg=f"{name} {key}")


@pytest.mark.slow
def test_a_bert_run_resumed_mid_epoch_ends_where_the_uninterrupted_one_ends(tmp_path):
    """Dropout on, masks drawn per (seed, epoch, sample): resuming at step 6 of a 700-step epoch
    gives the uninterrupted run's weights bit for bit, and its metrics."""
    args = [
        *LANGUAGE,
        "data.text.corpus=stdlib_docs",
        "data.text.max_seq_len=32",
        "data.text.packing=pack",
        "optimizer=adamw",
    ]
    args += ["optimizer.lr=2e-3", "train_batch_size=16", "eval_interval=5ba"]
    expected, got = resume_after_step_6(args, tmp_path)
    assert all(torch.equal(expected["model"][key], got["model"][key]) for key in expected["model"])


@pytest.mark.slow
def test_sweep_and_report_draw_the_trade_off_curve_of_masked_accuracy(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        *LANGUAGE,
        "data.text.corpus=stdlib_docs",
        "data.text.max_seq_len=32",
        "data.text.packing=pack",
        "optimizer=adamw",
    ]
    args += ["optimizer.lr=2e-3", "scheduler.t_warmup=1ba", "train_batch_size=16", "max_duration=12ba"]
    result = run_here("sweep", *args, "budgets=[0.5,1.0]", "seeds=[0]", f"out={sweep}")  # its runs: processes
    assert result.returncode == 0, result.stderr
    report = run_here("report", str(sweep), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "masked-token accuracy" in text
    rows = list(csv.DictReader((tmp_path / "report" / "report.csv").open()))
    assert [float(row["budget"]) for row in rows] == [0.5, 1.0]
    assert all(0 < float(row["masked_accuracy_mean"]) < 1 for row in rows)
    assert (tmp_path / "report" / "tradeoff_time.png").is_file()


def _node_store(rank, cache_dirs, port, queue):
    """One rank of a 2-node run (each its node's local rank 0, each node its own cache); forked, so one
    thread, away from the parent's OpenMP pool."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    config = DataConfig(name="text", cache_dir=cache_dirs[rank], text=TextConfig(corpus="stdlib_docs", vocab_size=300))
    path = cached_store(config, Placement(rank=rank, world_size=2, local_rank=0))
    queue.put((rank, str(path), (path / "tokenizer.json").read_text()))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
def test_every_node_writes_the_built_in_corpus_with_rank_0s_tokenizer(tmp_path):
    """A node whose cache holds the corpus under another vocabulary rewrites it with rank 0's."""
    cache_dirs = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    config = DataConfig(name="text", cache_dir=cache_dirs[1], text=TextConfig(corpus="stdlib_docs", vocab_size=300))
    stale = cached_store(config, SINGLE_PROCESS)
    train, val = split_documents(DOCUMENTS, 0.1, seed=0)
    write_token_store(train, val, stale, vocab_size=300)  # the same place, another vocabulary
    queue = mp.get_context("fork").SimpleQueue()  # forked: no interpreter, torch or trainrun to start again
    mp.start_processes(_node_store, args=(cache_dirs, 29547, queue), nprocs=2, start_method="fork")
    results = dict((rank, (path, tokenizer)) for rank, path, tokenizer in (queue.get(), queue.get()))
    assert results[0][0] != results[1][0] and results[1][0] == str(stale)
    assert results[0][1] == results[1][1]
    stores = [TokenStore.open(Path(results[rank][0]), "train") for rank in (0, 1)]
    assert np.array_equal(stores[0].tokens, stores[1].tokens)


def _store_with(tmp_path, name, train, val):
    return write_token_store(train, val, tmp_path / name, vocab_size=120)


def test_text_datasets_read_a_store_with_the_configs_lengths_packing_and_masking_rates(tmp_path):
    from trainrun.data.masked_text import text_datasets

    store = _store_with(tmp_path, "store", DOCUMENTS[:40], DOCUMENTS[40:44])
    config = DataConfig(name="text", path=str(store), text=TextConfig(max_seq_len=24, packing="pack"))
    config.text.mlm_probability, config.text.eval_mlm_probability = 0.3, 0.2
    sets = text_datasets(config)
    train, val = sets
    assert sets.collate is collate_masked  # predicted positions padded per batch
    assert sets.text == TextFacts(
        vocab_size=train.store.vocab_size,
        max_seq_len=24,
        tokenizer_file=store / "tokenizer.json",
        separator=train.store.special("[SEP]"),
    )
    assert (train.max_seq_len, train.packing, train.mlm_probability, train.fixed_masks) == (24, "pack", 0.3, False)
    assert (val.max_seq_len, val.packing, val.mlm_probability, val.fixed_masks) == (24, "pack", 0.2, True)
    assert train.store.offsets[-1] > val.store.offsets[-1] > 0 and train.tokenizer_file == store / "tokenizer.json"
    for name, train_docs, val_docs, missing in (
        ("no-val", DOCUMENTS, [], "validation"),
        ("no-train", [], DOCUMENTS, "training"),
    ):
        empty = _store_with(tmp_path, name, train_docs, val_docs)
        with pytest.raises(DataError, match=rf"^token store '.*{name}' has no {missing} text$"):
            text_datasets(DataConfig(name="text", path=str(empty)))
    assert len(MaskedSequences(TokenStore.open(tmp_path / "no-val", "val"), 24, "pad", 0.15)) == 0


@pytest.fixture
def small_builtin_corpus(monkeypatch):
    """The built-in corpus stands for 40 short documents (the standard library's take seconds to tokenize)."""
    import trainrun.data.masked_text as masked_text

    monkeypatch.setattr(masked_text, "read_documents", lambda corpus: DOCUMENTS[:40] if corpus == "stdlib_docs" else [])


def test_a_built_in_corpus_is_written_once_per_identity_into_the_cache(tmp_path, small_builtin_corpus):
    from trainrun.data.masked_text import text_datasets

    config = DataConfig(
        name="text", cache_dir=str(tmp_path / "cache"), text=TextConfig(corpus="stdlib_docs", vocab_size=100)
    )
    path = cached_store(config, SINGLE_PROCESS)
    assert path.parent == tmp_path / "cache" and path.name.endswith("-tokens")
    written = (path / "store.json").stat().st_mtime_ns
    assert cached_store(config, SINGLE_PROCESS) == path and (path / "store.json").stat().st_mtime_ns == written
    other_vocabulary = dataclasses.replace(config, text=dataclasses.replace(config.text, vocab_size=90))
    assert cached_store(other_vocabulary, SINGLE_PROCESS) != path  # another vocabulary
    assert cached_store(dataclasses.replace(config, split_seed=1), SINGLE_PROCESS) != path  # another split
    train, val = text_datasets(config)
    assert train.store.path == val.store.path == path
    byte_level = dataclasses.replace(config, text=dataclasses.replace(config.text, tokenizer="bpe", vocab_size=300))
    bpe = cached_store(byte_level, SINGLE_PROCESS)  # another tokenizer kind: its own store, of that kind
    assert bpe != path and json.loads((bpe / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert json.loads((path / "tokenizer.json").read_text())["model"]["type"] == "WordPiece"


def test_the_built_in_corpus_and_its_default_tokenizer_are_the_same_on_every_machine(tmp_path, monkeypatch):
    """The documents are trainrun's shipped snapshot whatever Python is installed, and a store of the
    default vocabulary takes the shipped tokenizer, so two fresh caches hold the same ids (WordPiece
    training upstream gives another vocabulary on each try)."""
    import sysconfig

    from trainrun.data.token_store import builtin_tokenizer_file, file_sha256, read_documents

    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path / "no-python")})
    documents = read_documents("stdlib_docs")
    assert len(documents) == 5829 and all(documents)
    stores = []
    for cache in ("one", "two"):  # the data as a run composes it (conf/data/stdlib_docs.yaml's split)
        overrides = ["task=masked_lm", "model=bert_tiny", "data=stdlib_docs", f"data.cache_dir={tmp_path / cache}"]
        stores.append(cached_store(check(overrides)[0].data, SINGLE_PROCESS))
    shipped = builtin_tokenizer_file("stdlib_docs", "wordpiece", TextConfig().vocab_size)
    assert file_sha256(stores[0] / "tokenizer.json") == file_sha256(stores[1] / "tokenizer.json")
    assert (
        json.loads((stores[0] / "tokenizer.json").read_text())["model"]["vocab"]
        == json.loads(shipped.read_text())["model"]["vocab"]
    )
    assert file_sha256(stores[0] / "train-000000.bin") == file_sha256(stores[1] / "train-000000.bin")


class Collectives:
    """torch.distributed's broadcast and barrier as a rank of a multi-node run sees them: rank 0
    sends its tokenizer (checked), every other rank receives it."""

    def __init__(self, tokenizer: str) -> None:
        self.tokenizer, self.barriers = tokenizer, 0

    def install(self, monkeypatch, rank: int) -> None:
        monkeypatch.setattr(
            dist, "broadcast_object_list", lambda objects, src, device: self.broadcast(rank, objects, src, device)
        )
        monkeypatch.setattr(dist, "barrier", self.barrier)

    def broadcast(self, rank, objects, src, device):
        assert src == 0 and device == torch.device("cpu")
        if rank == 0:
            assert objects == [self.tokenizer]  # what rank 0 sends: its own tokenizer
        objects[0] = self.tokenizer

    def barrier(self):
        self.barriers += 1


def test_another_nodes_cache_is_rewritten_with_rank_0s_tokenizer(tmp_path, monkeypatch, small_builtin_corpus):
    node0 = DataConfig(
        name="text", cache_dir=str(tmp_path / "node0"), text=TextConfig(corpus="stdlib_docs", vocab_size=100)
    )
    node1 = dataclasses.replace(node0, cache_dir=str(tmp_path / "node1"))
    stale = cached_store(node1, SINGLE_PROCESS)
    write_token_store(DOCUMENTS[40:80], DOCUMENTS[:2], stale, vocab_size=60)  # the same place, another vocabulary
    rank0 = cached_store(node0, SINGLE_PROCESS)
    collectives = Collectives((rank0 / "tokenizer.json").read_text())
    collectives.install(monkeypatch, rank=0)
    assert cached_store(node0, Placement(rank=0, world_size=2, local_rank=0)) == rank0
    collectives.install(monkeypatch, rank=1)
    follower = Placement(rank=3, world_size=4, local_rank=1)  # not its node's writer: waits, writes nothing
    assert cached_store(node1, follower) == stale and (stale / "tokenizer.json").read_text() != collectives.tokenizer
    leader = Placement(rank=1, world_size=2, local_rank=0)
    assert cached_store(node1, leader) == stale and collectives.barriers == 3
    assert (stale / "tokenizer.json").read_text() == collectives.tokenizer
    for split in ("train", "val"):  # the same documents split the same way, the same ids
        assert np.array_equal(TokenStore.open(stale, split).tokens, TokenStore.open(rank0, split).tokens)
    rewritten = (stale / "store.json").stat().st_mtime_ns
    cached_store(node1, leader)  # the same tokenizer now: nothing rewritten
    assert (stale / "store.json").stat().st_mtime_ns == rewritten
    fresh = dataclasses.replace(node0, cache_dir=str(tmp_path / "node2"))  # a node with nothing cached yet
    assert not (cached_store(fresh, follower) / "tokenizer.json").exists()  # its writer has not written yet
    written = cached_store(fresh, leader)
    assert (written / "tokenizer.json").read_text() == collectives.tokenizer
    barriers = collectives.barriers
    cached_store(dataclasses.replace(node0, cache_dir=str(tmp_path / "single")), SINGLE_PROCESS)
    assert collectives.barriers == barriers  # one process: no collective at all


def test_the_built_in_corpus_cache_is_named_by_the_shipped_corpus_not_the_python(
    tmp_path, monkeypatch, small_builtin_corpus
):
    """The same shipped documents under another Python are the same store; another snapshot of them
    (scripts/builtin_corpus.py run again) is another."""
    import sys

    import trainrun.data.masked_text as masked_text

    config = DataConfig(name="text", cache_dir=str(tmp_path), text=TextConfig(corpus="stdlib_docs", vocab_size=100))
    older = cached_store(config, SINGLE_PROCESS)
    monkeypatch.setattr(sys, "version", "3.12.1 (main, Apr  2 2024) [GCC 12.2.0]")
    assert cached_store(config, SINGLE_PROCESS) == older
    snapshot = tmp_path / "other.jsonl.gz"
    snapshot.write_bytes(b"another snapshot")
    monkeypatch.setattr(masked_text, "builtin_corpus_file", lambda corpus: snapshot)
    newer = cached_store(config, SINGLE_PROCESS)
    assert older != newer and older.name.startswith("stdlib_docs-") and newer.name.startswith("stdlib_docs-")


def test_samples_are_int64_framed_by_cls_and_sep_and_masks_differ_by_position(store):
    train = TokenStore.open(store, "train")
    cls, sep = train.special("[CLS]"), train.special("[SEP]")
    for length in (12, 40):  # at 12 some packed samples lie within one document
        for packing in ("pad", "pack"):
            data = MaskedSequences(train, length, packing, 0.5)
            assert all(data.tokens(i).dtype == np.int64 for i in range(len(data)))
    for packing in ("pad", "pack"):
        data = MaskedSequences(train, 40, packing, 0.5, fixed_masks=True)
        for index in range(len(data)):
            item, body = data[index], data.tokens(index)
            n = len(body) + 2
            assert item["input_ids"].dtype == item["attention_mask"].dtype == item["labels"].dtype == torch.int64
            assert item["input_ids"][0] == cls and item["input_ids"][n - 1] == sep
            chosen = int((item["labels"] != IGNORED).sum())
            ordinary = int((torch.from_numpy(body) >= 5).sum())
            if ordinary >= 20:
                assert 0 < chosen < ordinary  # each position draws its own
    data = MaskedSequences(train, 64, "pack", 0.9)
    torch.manual_seed(0)
    replaced = set()
    for index in range(len(data)):
        item = data[index]
        original = torch.cat([torch.tensor([cls]), torch.from_numpy(data.tokens(index)), torch.tensor([sep])])
        inputs = item["input_ids"][: len(original)]
        swapped = (item["labels"][: len(original)] != IGNORED) & (inputs != 4) & (inputs != original)
        replaced |= set(inputs[swapped].tolist())
    assert len(replaced) > train.vocab_size // 3  # random replacements spread over the vocabulary


def test_token_id_types_hold_exactly_their_range():
    from trainrun.data.token_store import smallest_token_dtype

    assert smallest_token_dtype(65_536) == "uint16" and smallest_token_dtype(65_537) == "uint32"
    check_token_dtype(65_536, "uint16")  # ids 0..65535 fit
    message = (
        r"^bad value for '--dtype': uint16 holds 65,536 token ids; the vocabulary has 65,537 \(choose uint32 or auto\)$"
    )
    with pytest.raises(ConfigError, match=message):
        check_token_dtype(65_537, "uint16")


def test_stores_hold_only_the_documents_tokens_and_say_how_many(store, tmp_path):
    meta = json.loads((store / "store.json").read_text())
    for split in ("train", "val"):
        opened = TokenStore.open(store, split)
        assert meta[split]["tokens"] == len(opened.tokens) == int(opened.offsets[-1]) > 0
        assert not np.isin(opened.tokens, list(meta["special"].values())).any()  # no [CLS]/[SEP] stored
    empty = write_token_store(DOCUMENTS[:8], [], tmp_path / "empty", vocab_size=60)
    val = json.loads((empty / "store.json").read_text())["val"]
    assert (empty / "val-000000.bin").stat().st_size == 0 and (val["documents"], val["tokens"]) == (0, 0)
    assert len(TokenStore.open(empty, "val").tokens) == 0
    assert TokenStore.open(empty, "train").vocab_size == 60  # the vocabulary asked for, not the trainer's default


def test_a_given_tokenizers_post_processor_adds_no_cls_or_sep_to_the_stored_documents(store, tmp_path):
    """A tokenizer.json from the Hub (bert-base-uncased's) frames every encoding with [CLS] ... [SEP];
    the store keeps the documents' own tokens, and samples add the frame themselves."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer.from_file(str(store / "tokenizer.json"))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    given = write_token_store(DOCUMENTS[:8], DOCUMENTS[:2], tmp_path / "given", 100, tmp_path / "tokenizer.json")
    tokens = TokenStore.open(given, "train").tokens
    assert len(tokens) > 0 and not np.isin(tokens, [cls, sep]).any()


def test_a_read_only_store_opens_and_damaged_or_foreign_ones_are_named(store, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    for path in copy.iterdir():
        path.chmod(0o444)  # a data set on read-only shared storage
    tokens = TokenStore.open(copy, "train").tokens
    assert len(tokens) > 0 and not tokens[:1].flags.writeable  # mapped read-only: a bug cannot write to the store
    for path in copy.iterdir():
        path.chmod(0o644)
    with pytest.raises(
        DataError, match=r"^'.*nowhere' is not a token store \(no store\.json; write one with 'trainrun write-text'\)$"
    ):
        TokenStore.open(tmp_path / "nowhere", "train")
    meta = json.loads((copy / "store.json").read_text())
    (copy / "store.json").write_text(json.dumps({**meta, "format": "trainrun-tokens/0"}))
    with pytest.raises(DataError, match=r"^'.*copy' is a token store of another format \(trainrun-tokens/0\)$"):
        TokenStore.open(copy, "train")
    (copy / "store.json").write_text(json.dumps({**meta, "vocab_size": 65_536}))  # ids up to 65,535: uint16 holds them
    TokenStore.open(copy, "train")
    (copy / "store.json").write_text(json.dumps({**meta, "dtype": "float32"}))
    with pytest.raises(DataError, match=r"does not fit float32 ids$"):
        TokenStore.open(copy, "train")
    (copy / "store.json").write_text(json.dumps(meta))
    (copy / "train-000000.bin").write_bytes((copy / "train-000000.bin").read_bytes()[:-2])  # one uint16 token short
    expected = (
        rf"^'.*train-000000\.bin' holds {meta['train']['tokens'] - 1} tokens, its index says {meta['train']['tokens']}$"
    )
    with pytest.raises(DataError, match=expected):
        TokenStore.open(copy, "train")
    (copy / "tokenizer.json").write_text("{}")
    with pytest.raises(DataError, match=r"^'.*copy/tokenizer\.json' is not the tokenizer the store was written with$"):
        TokenStore.open(copy, "train")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda s: (s / "store.json").write_text("[1, 2]"),
            r"'.*store\.json' is not a trainrun token store's description \(list\)$",
        ),
        (
            lambda s: (s / "train-000000.idx.npy").write_bytes(b"not numpy"),
            r"'.*train-000000\.idx\.npy' is not a token store index \(a NumPy \.npy file\): ",
        ),
        (
            lambda s: np.save(s / "train-000000.idx.npy", np.ones((2, 2))),
            r"'.*train-000000\.idx\.npy' is not a token store index \(rising document offsets from 0\)$",
        ),
        (lambda s: np.save(s / "train-000000.idx.npy", np.array([1, 5])), r"\(rising document offsets from 0\)$"),
        (lambda s: np.save(s / "train-000000.idx.npy", np.array([0.0, 5.0])), r"\(rising document offsets from 0\)$"),
        (
            lambda s: (s / "train-000000.bin").unlink(),
            r"^token store '.*damaged' has no train-000000\.bin: write it again with 'trainrun write-text'$",
        ),
        (
            lambda s: (s / "store.json").write_text(json.dumps({"format": "trainrun-tokens/1", "dtype": "uint16"})),
            r"^'.*store\.json' lacks vocab_size, special, tokenizer_sha256: write the store again with "
            r"'trainrun write-text'$",
        ),
    ],
)
def test_damaged_store_files_are_refused_naming_the_file_and_what_is_wrong(store, tmp_path, damage, message):
    damaged = tmp_path / "damaged"
    shutil.copytree(store, damaged)
    damage(damaged)
    with pytest.raises((DataError, FileFormatError), match=message):
        TokenStore.open(damaged, "train")


def test_a_file_that_is_not_a_tokenizer_json_is_named_with_the_parsers_first_line(tmp_path):
    (tmp_path / "tok.json").write_text("{}")
    with pytest.raises(
        FileFormatError, match=r"^'.*tok\.json' is not a tokenizer\.json of the tokenizers library \(\w"
    ):
        load_tokenizer(tmp_path / "tok.json")
    with pytest.raises(FileFormatError, match=r"\(.*\)$") as caught:
        load_tokenizer(tmp_path / "tok.json")
    assert "\n" not in str(caught.value) and "Model missing" in str(caught.value)  # the parser's own words


def test_a_tokenizer_parse_failure_without_words_is_named_by_its_type(tmp_path, monkeypatch):
    import tokenizers

    class SilentParseError(Exception):
        pass

    class Unreadable:  # tokenizers' Tokenizer, as when its parser raises an error with no message
        @staticmethod
        def from_file(path: str):
            raise SilentParseError()

    monkeypatch.setattr(tokenizers, "Tokenizer", Unreadable)
    with pytest.raises(FileFormatError, match=r"tokenizers library \(SilentParseError\)$"):
        load_tokenizer(tmp_path / "tok.json")


def test_a_json_lines_corpus_names_the_file_and_line_of_a_bad_record(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "fine"}\n{"text": 3}\n')
    with pytest.raises(
        DataError,
        match=r'^corpus file \'.*corpus\.jsonl\' line 2 has no "text" string \(one \{"text": \.\.\.\} per line; '
        r"--text-field ",
    ):
        read_documents(str(corpus))
    corpus.write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(
        DataError, match=r"^corpus file '.*corpus\.jsonl' line 2 is not a JSON record \(Expecting value\)$"
    ):
        read_documents(str(corpus))


def test_a_given_tokenizer_without_bert_special_tokens_serves_causal_lm_only(store, tmp_path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(store / "tokenizer.json"))
    text = tokenizer.to_str().replace('"[MASK]"', '"[MASQ]"').replace('"[PAD]"', '"[PAAD]"')
    (tmp_path / "tokenizer.json").write_text(text)
    out = write_token_store(DOCUMENTS[:4], DOCUMENTS[:2], tmp_path / "out", 100, tmp_path / "tokenizer.json")
    train = TokenStore.open(out, "train")
    assert train.meta["separator"] == "[SEP]" and train.separator == tokenizer.token_to_id("[SEP]")
    assert set(train.meta["special"]) == {"[UNK]", "[CLS]", "[SEP]"}
    with pytest.raises(
        DataError,
        match=r"^token store '.*out' has no \[PAD\], \[MASK\] token: masked language modelling needs a WordPiece "
        r"store \(trainrun write-text with --tokenizer-kind wordpiece, or a --tokenizer that has them\)$",
    ):
        MaskedSequences(train, 32, "pad", 0.15)
    with pytest.raises(DataError, match=r"^token store '.*out' has no \[PAD\], \[MASK\] token"):
        check([*LANGUAGE, f"data.path={out}"])  # before a run starts
    (tmp_path / "none.json").write_text(text.replace('"[SEP]"', '"[SEQ]"'))
    with pytest.raises(
        DataError,
        match=r"^tokenizer '.*none\.json' has no token to end a document with \(one of \[SEP\], <\|endoftext\|>, "
        r"<\|end_of_text\|>, </s>\)$",
    ):
        write_token_store(DOCUMENTS[:4], DOCUMENTS[:2], tmp_path / "out2", 100, tmp_path / "none.json")


def test_corpus_folders_read_every_file_of_a_known_kind_and_refuse_the_others_by_name(tmp_path):
    (tmp_path / "a.txt").write_text("first\n\nsecond")
    (tmp_path / "b.txt").write_text("third")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: main")  # hidden: not part of the corpus
    assert read_documents(str(tmp_path)) == ["first", "second", "third"]
    (tmp_path / "notes.md").write_text("not a corpus file")
    with pytest.raises(
        DataError, match=r"^corpus file '.*notes\.md' is of a kind write-text does not read \(it reads "
    ):
        read_documents(str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"^corpus folder '.*empty' holds no file \(it reads \.txt, "):
        read_documents(str(tmp_path / "empty"))
    with pytest.raises(DataError, match=r"^corpus 'no_such' is neither a file nor a folder$"):
        read_documents("no_such")


def test_a_store_written_before_shards_opens_unchanged(store, tmp_path):
    """``trainrun-tokens/1``: one ``<split>.bin`` and ``<split>.idx.npy`` per split, no shard list."""
    old = tmp_path / "old"
    shutil.copytree(store, old)
    meta = json.loads((old / "store.json").read_text())
    for split in ("train", "val"):
        for suffix in (".bin", ".idx.npy"):
            (old / f"{split}-000000{suffix}").rename(old / f"{split}{suffix}")
        meta[split] = {key: meta[split][key] for key in ("documents", "tokens")}
    (old / "store.json").write_text(json.dumps({**meta, "format": "trainrun-tokens/1"}))
    for split in ("train", "val"):
        before, now = TokenStore.open(old, split), TokenStore.open(store, split)
        assert np.array_equal(before.tokens, now.tokens) and np.array_equal(before.offsets, now.offsets)


def test_document_splits_are_seeded_and_keep_one_document_aside_unless_there_is_only_one():
    documents = [f"document {i}" for i in range(20)]
    train, val = split_documents(documents, 0.01, seed=0)
    assert len(val) == 1 and len(train) == 19 and sorted(train + val) == sorted(documents)
    assert split_documents(documents, 0.2, seed=0) == split_documents(documents, 0.2, seed=0)
    assert split_documents(documents, 0.2, seed=0)[1] != split_documents(documents, 0.2, seed=1)[1]
    assert split_documents(["only"], 0.5, seed=0) == (["only"], [])
    assert split_documents(["one", "two"], 0.5, seed=0)[1] in (["one"], ["two"])


def test_the_standard_librarys_docstrings_leave_out_tests_gui_code_and_short_ones(tmp_path, monkeypatch):
    import sysconfig

    from trainrun.data.token_store import stdlib_docstrings

    root = tmp_path / "lib"
    long_text = "x" * 40
    for folder in ("site-packages", "test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "json"):
        (root / folder).mkdir(parents=True)
        (root / folder / "mod.py").write_text(f'"""{folder} {long_text}"""\n')
    (root / "a_broken.py").write_text("def (:\n")  # not Python: skipped, the rest still read
    (root / "b_latin1.py").write_bytes(b'"""caf\xe9"""\n')  # not UTF-8: skipped
    (root / "c.py").write_text(f'"""{"y" * 39}"""\ndef f():\n    """{"z" * 40}"""\n')
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(root)})
    assert stdlib_docstrings() == ["z" * 40, f"json {long_text}"]


def test_the_standard_library_is_read_while_other_threads_parse_python(tmp_path, monkeypatch):
    """Finalizers run by a collection inside the read's parse may let another thread parse Python
    (numba does when it compiles); the read still succeeds (CPython 3.11 failed it with
    'AST constructor recursion depth mismatch' unless the collector was paused)."""
    import ast
    import gc
    import sysconfig
    import threading
    import weakref

    from trainrun.data.token_store import stdlib_docstrings

    root = tmp_path / "lib"
    root.mkdir()
    functions = (f'def f{i}(x):\n    """docstring {i:040d}"""\n    return x + {i}\n' for i in range(400))
    (root / "big.py").write_text("".join(functions))
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(root)})
    stop = threading.Event()

    def parse_deeper(depth: int):
        return parse_deeper(depth - 1) if depth else ast.parse("x = 1\n" * 50)

    def parse_until_stopped():
        while not stop.is_set():
            parse_deeper(16)

    class Cycle:
        pass

    parser = threading.Thread(target=parse_until_stopped, daemon=True)
    parser.start()
    try:
        for _ in range(5):
            for _ in range(1000):  # garbage whose collection runs Python code
                cycle = Cycle()
                cycle.itself = cycle
                weakref.finalize(cycle, sum, range(100))
                del cycle
            assert len(stdlib_docstrings()) == 400
    finally:
        stop.set()
        parser.join()
    assert gc.isenabled()  # collection resumes after the read
    gc.disable()
    try:
        stdlib_docstrings()
        assert not gc.isenabled()  # and a collector paused by the caller stays paused
    finally:
        gc.enable()


def test_write_text_says_when_the_corpus_gives_a_smaller_vocabulary_than_asked(tmp_path, capsys):
    from trainrun.commands.write_text import write_text_command

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"the cat sat on mat {index}, a dog ran to park {index}" for index in range(40)))
    assert (
        write_text_command([str(corpus), str(tmp_path / "store"), "--tokenizer-kind", "bpe", "--vocab-size", "4096"])
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("note: the vocabulary is ") and "fewer than --vocab-size 4,096" in last


def test_document_pieces_cut_every_document_as_a_loop_over_them_would():
    from trainrun.data.masked_text import document_pieces

    lengths = np.random.default_rng(0).integers(0, 40, 2_000)
    lengths[[0, 5, -1]] = 0  # empty documents give no piece
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    starts, ends = document_pieces(offsets, 7)
    expected = [
        (piece, min(piece + 7, end)) for start, end in zip(offsets[:-1], offsets[1:]) for piece in range(start, end, 7)
    ]
    assert list(zip(starts.tolist(), ends.tolist())) == expected
