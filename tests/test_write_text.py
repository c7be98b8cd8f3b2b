"""``trainrun write-text`` on corpora of every kind it reads: streamed, tokenized in workers, written
in shards, and continued after a kill to the store an uninterrupted write gives."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import run_here

from trainrun.data.corpus import held_out
from trainrun.data.store_writer import partial_folder
from trainrun.data.token_store import TokenStore, read_documents, train_tokenizer
from trainrun.errors import DataError


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return read_documents("stdlib_docs")[:1200]


@pytest.fixture(scope="module")
def tokenizer(documents, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer(documents, 600, kind="bpe").save(str(path))
    return path


def write_corpus_files(folder: Path, documents: list[str]) -> dict[str, Path]:
    """The same documents in every kind write-text reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"text": document}) + "\n" for document in documents)
    files = {"jsonl": folder / "c.jsonl", "ndjson": folder / "c.ndjson", "txt": folder / "c.txt"}
    files["jsonl"].write_text(lines)
    files["ndjson"].write_text(lines)
    files["txt"].write_text("\n\n".join(" ".join(document.split()) for document in documents))  # one line each
    files["json.gz"] = folder / "c.json.gz"
    with gzip.open(files["json.gz"], "wt") as handle:
        handle.write(lines)
    files["jsonl.zst"] = folder / "c.jsonl.zst"
    files["jsonl.zst"].write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    files["parquet"] = folder / "c.parquet"
    pq.write_table(
        pa.table({"id": list(range(len(documents))), "text": documents}), files["parquet"], row_group_size=300
    )
    return files


def decoded(store: TokenStore, tokenizer: Path) -> list[str]:
    """A store split's documents as text, in order."""
    from tokenizers import Tokenizer

    decode = Tokenizer.from_file(str(tokenizer)).decode
    return [decode(ids.tolist()) for ids in store.documents()]


def store_files(store: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(store.iterdir())}


def write_text(corpus: Path, out: Path, tokenizer: Path, *flags: str) -> str:
    """``trainrun write-text`` run in this process (no interpreter start-up): what it printed."""
    from trainrun.commands.write_text import write_text_command

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert write_text_command([str(corpus), str(out), "--tokenizer", str(tokenizer), *flags]) == 0
    return printed.getvalue()


@pytest.mark.slow
def test_every_kind_gives_the_same_store_whatever_the_workers(documents, tokenizer, tmp_path):
    files = write_corpus_files(tmp_path / "corpus", documents)
    flags = ("--shard-tokens", "20000", "--val-fraction", "0.1")
    reference = write_text(files["jsonl"], tmp_path / "jsonl", tokenizer, *flags, "--workers", "0")
    assert "shard 0: " in reference and " MB/s, " in reference  # a progress line per shard off a terminal
    expected = store_files(tmp_path / "jsonl")
    assert sum(name.startswith("train-") for name in expected) == 4  # two shards (.bin and .idx.npy each)
    for kind in ("ndjson", "json.gz", "jsonl.zst", "parquet"):
        write_text(files[kind], tmp_path / kind, tokenizer, *flags, "--workers", "2" if kind == "parquet" else "1")
        written = store_files(tmp_path / kind)
        assert {name: data for name, data in written.items() if name != "store.json"} == {
            name: data for name, data in expected.items() if name != "store.json"
        }, kind
    store = TokenStore.open(tmp_path / "jsonl", "train")
    meta = store.meta
    assert meta["format"] == "trainrun-tokens/2" and meta["train"]["documents"] + meta["val"]["documents"] == 1200
    held = held_out(documents, 0.1, 0)
    kept = [document for document, out in zip(documents, held) if not out]
    assert decoded(store, tokenizer) == kept  # in order, across shards
    # a plain-text corpus: its blank-line-separated blocks are the documents
    write_text(files["txt"], tmp_path / "txt", tokenizer, *flags)
    meta = TokenStore.open(tmp_path / "txt", "train").meta
    in_validation = int(held_out([" ".join(document.split()) for document in documents], 0.1, 0).sum())
    assert (meta["train"]["documents"], meta["val"]["documents"]) == (1200 - in_validation, in_validation)


@pytest.mark.slow
def test_a_folder_datasets_save_to_disk_wrote_is_read_as_its_arrow_files(documents, tokenizer, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": documents, "n": list(range(len(documents)))}).save_to_disk(
        tmp_path / "saved", max_shard_size="200KB"
    )
    assert len(list((tmp_path / "saved").glob("*.arrow"))) > 1
    files = write_corpus_files(tmp_path / "corpus", documents)
    write_text(tmp_path / "saved", tmp_path / "from_saved", tokenizer)
    write_text(files["jsonl"], tmp_path / "from_jsonl", tokenizer)
    for split in ("train", "val"):
        saved, lines = TokenStore.open(tmp_path / "from_saved", split), TokenStore.open(tmp_path / "from_jsonl", split)
        assert np.array_equal(np.asarray(saved.tokens), np.asarray(lines.tokens))


@pytest.mark.slow
def test_a_killed_write_continues_to_the_store_an_uninterrupted_one_gives(documents, tokenizer, tmp_path):
    corpus = tmp_path / "big.jsonl.gz"
    with gzip.open(corpus, "wt") as handle:
        for round_index in range(6):
            for document in documents:
                handle.write(json.dumps({"text": f"{round_index}: {document}"}) + "\n")
    args = ["write-text", str(corpus), "--tokenizer", str(tokenizer), "--shard-tokens", "20000", "--workers", "1"]
    whole = run_here(*args[:2], str(tmp_path / "whole"), *args[2:])
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-m", "trainrun", *args[:2], str(out), *args[2:]], stdout=subprocess.DEVNULL
    )
    progress = partial_folder(out) / "progress.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if progress.is_file() and len(json.loads(progress.read_text())["shards"]) >= 3:
            workers = psutil.Process(process.pid).children(recursive=True)
            os.kill(process.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    process.wait()
    assert process.returncode == -signal.SIGKILL and not out.exists()
    assert workers and psutil.wait_procs(workers, timeout=10)[1] == []  # its workers end with it
    finished = len(json.loads(progress.read_text())["shards"])
    again = run_here(*args[:2], str(out), *args[2:])
    assert again.returncode == 0, again.stderr
    assert f"continuing after {finished} finished shards" in again.stdout
    assert store_files(out) == store_files(tmp_path / "whole") and not partial_folder(out).exists()


def test_unreadable_kinds_are_refused_by_name_and_nothing_is_left(tokenizer, tmp_path):
    for name in ("corpus.csv", "corpus.jsonl.bz2", "corpus.md"):
        (tmp_path / name).write_text("text")
        result = run_here("write-text", str(tmp_path / name), str(tmp_path / "out"), "--tokenizer", str(tokenizer))
        assert result.returncode == 2 and result.stderr.strip() == (
            f"trainrun: error: corpus file '{tmp_path / name}' is of a kind write-text does not read (it reads .txt, "
            ".jsonl, .ndjson or .json (each also .gz or .zst), .parquet, or a folder datasets' save_to_disk wrote)"
        )
    (tmp_path / "array.json").write_text('[{"text": "a"},\n {"text": "b"}]\n')
    result = run_here("write-text", str(tmp_path / "array.json"), str(tmp_path / "out"), "--tokenizer", str(tokenizer))
    assert (
        result.returncode == 2 and "'" + str(tmp_path / "array.json") + "' line 1 is not a JSON record" in result.stderr
    )
    (tmp_path / "broken.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:-30])
    result = run_here(
        "write-text", str(tmp_path / "broken.jsonl.gz"), str(tmp_path / "out"), "--tokenizer", str(tokenizer)
    )
    assert (
        result.returncode == 2
        and f"corpus file '{tmp_path / 'broken.jsonl.gz'}' is damaged after line" in result.stderr
    )
    (tmp_path / "other.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=r"^corpus file '.*other\.parquet' is not a readable parquet file \("):
        read_documents(str(tmp_path / "other.parquet"))
    assert not (tmp_path / "out").exists() and not partial_folder(tmp_path / "out").exists()


def test_the_validation_share_is_a_seeded_hash_of_each_documents_text():
    texts = [f"document {index}" for index in range(200_000)]
    held = held_out(texts, 0.05, seed=0)
    assert abs(held.mean() - 0.05) < 0.003  # the share asked for
    assert np.array_equal(held[1000:2000], held_out(texts[1000:2000], 0.05, seed=0))  # whatever the batch
    assert np.array_equal(held[::-1], held_out(texts[::-1], 0.05, seed=0))  # whatever the order
    assert (held != held_out(texts, 0.05, seed=1)).any() and not held_out(texts, 0.0, 0).any()
    assert not held_out(texts[:1], 1e-9, 0).any()  # the first document is not held out at any fraction


@pytest.mark.slow
def test_documents_keep_their_split_when_files_are_added_to_the_corpus(documents, tokenizer, tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus_files(corpus, documents[600:])  # c.jsonl among others: only it is read below
    jsonl = corpus / "c.jsonl"
    write_text(jsonl, tmp_path / "before", tokenizer, "--val-fraction", "0.2")
    grown = tmp_path / "grown"
    grown.mkdir()
    (grown / "a.jsonl").write_text("".join(json.dumps({"text": document}) + "\n" for document in documents[:600]))
    (grown / "c.jsonl").write_bytes(jsonl.read_bytes())  # the earlier corpus, now after another file
    write_text(grown, tmp_path / "after", tokenizer, "--val-fraction", "0.2")
    for split in ("train", "val"):
        before = decoded(TokenStore.open(tmp_path / "before", split), tokenizer)
        after = decoded(TokenStore.open(tmp_path / "after", split), tokenizer)
        assert before and set(before) <= set(after), split  # every earlier document on the same side


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["DatasetDict", "C4 folder"])
def test_a_corpus_keeps_its_own_validation_split_and_leaves_its_test_split_out(documents, tokenizer, tmp_path, layout):
    """A DatasetDict's validation split (or C4's c4-validation.* files) is the store's validation,
    its train split (c4-train.*) the training; a test split beside them is in neither."""
    parts = {"train": documents[:800], "validation": documents[800:1000], "test": documents[1000:1200]}
    corpus = tmp_path / "corpus"
    if layout == "DatasetDict":
        datasets = pytest.importorskip("datasets")
        splits = {name: datasets.Dataset.from_dict({"text": texts}) for name, texts in parts.items()}
        datasets.DatasetDict(splits).save_to_disk(corpus)
    else:
        corpus.mkdir()
        for name, texts in parts.items():
            halves = np.array_split(np.arange(len(texts)), 2) if name == "train" else [np.arange(len(texts))]
            for index, chosen in enumerate(halves):
                with gzip.open(corpus / f"c4-{name}.{index:05d}-of-{len(halves):05d}.json.gz", "wt") as handle:
                    handle.writelines(json.dumps({"text": texts[i], "url": "u"}) + "\n" for i in chosen)
    printed = write_text(corpus, tmp_path / "store", tokenizer)
    assert "the corpus's own splits: validation from 1 file(s)" in printed
    assert "1 file(s) of other splits left out" in printed
    assert decoded(TokenStore.open(tmp_path / "store", "val"), tokenizer) == parts["validation"]
    assert decoded(TokenStore.open(tmp_path / "store", "train"), tokenizer) == parts["train"]
    meta = TokenStore.open(tmp_path / "store", "train").meta
    assert meta["split_rule"].startswith("own splits")
    # --split test: the test split is the validation, the validation split left out
    printed = write_text(corpus, tmp_path / "by_test", tokenizer, "--split", "test")
    assert "1 file(s) of other splits left out" in printed
    assert decoded(TokenStore.open(tmp_path / "by_test", "val"), tokenizer) == parts["test"]
    assert decoded(TokenStore.open(tmp_path / "by_test", "train"), tokenizer) == parts["train"]
    result = run_here("write-text", str(corpus), str(tmp_path / "no"), "--tokenizer", str(tokenizer), "--split", "dev")
    assert result.returncode == 2 and f"bad value for '--split': no split or file of '{corpus}' is named 'dev'" in (
        result.stderr
    )
    assert not (tmp_path / "no").exists() and len(result.stderr.strip().splitlines()) == 1


def test_a_text_field_names_another_json_field_or_column(tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"document number {i} of a corpus with a body field" for i in range(60)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": text}) + "\n" for text in texts))
    pq.write_table(pa.table({"body": texts}), tmp_path / "c.parquet")
    for name in ("c.jsonl", "c.parquet"):
        missing = run_here("write-text", str(tmp_path / name), str(tmp_path / "out"), "--tokenizer", str(tokenizer))
        assert missing.returncode == 2 and (
            'no "text" string' in missing.stderr or "no 'text' column" in missing.stderr
        )
        out = tmp_path / f"out_{name}"
        write_text(tmp_path / name, out, tokenizer, "--text-field", "body", "--val-fraction", "0.2")
        meta = json.loads((out / "store.json").read_text())
        assert meta["train"]["documents"] + meta["val"]["documents"] == 60 and meta["settings"]["text_field"] == "body"


def test_records_without_text_are_skipped_counted_said_and_kept_in_the_store(documents, tokenizer, tmp_path):
    """Null texts (a Parquet column's, a JSON record's) and empty ones hold no document: the store
    holds the others, and the write says how many of each it skipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = documents[:300] * 8  # 2,400 records: three batches of 1,024 documents, a shard each
    gappy = [
        None if i % 7 == 3 else "" if i % 11 == 5 else " \n " if i % 13 == 4 else doc for i, doc in enumerate(texts)
    ]
    nulls, empties = sum(text is None for text in gappy), sum(text is not None and not text.strip() for text in gappy)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": gappy[:1200]}), corpus / "a.parquet", row_group_size=400)
    (corpus / "b.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in gappy[1200:]))
    printed = write_text(corpus, tmp_path / "store", tokenizer, "--val-fraction", "0.1", "--shard-tokens", "4000")
    assert (tmp_path / "store" / "train-000001.bin").is_file()  # counted in each shard, summed
    assert (
        f"skipped {nulls + empties:,} records without text: {nulls:,} whose 'text' is null, {empties:,} empty"
        in printed
    )
    meta = json.loads((tmp_path / "store" / "store.json").read_text())
    assert (meta["null_records"], meta["empty_records"]) == (nulls, empties) and nulls > 10 and empties > 10
    assert meta["train"]["documents"] + meta["val"]["documents"] == 2400 - nulls - empties


def test_a_batch_holds_at_most_its_characters_or_one_longer_document(tmp_path, monkeypatch):
    """Books or code files: a batch closes at ``BATCH_CHARACTERS`` as at ``BATCH_DOCUMENTS``, so the
    text in flight is bounded by bytes, not by a count of documents of any size."""
    from trainrun.data import store_writer
    from trainrun.data.corpus import corpus_files

    sizes = [10, 3000, 20, 20, 20, 5000, 10]
    corpus = tmp_path / "books.jsonl"
    corpus.write_text("".join(json.dumps({"text": "x" * size}) + "\n" for size in sizes))
    monkeypatch.setattr(store_writer, "BATCH_CHARACTERS", 1000)
    found = [
        [len(text) for text in batch.texts]
        for batch in store_writer.batches(corpus_files(corpus), store_writer.CorpusSettings(), 0)
    ]
    assert found == [[10, 3000], [20, 20, 20, 5000], [10]]


def test_a_resumed_write_skips_whole_files_whose_records_were_counted(tmp_path, monkeypatch):
    """A killed write's ``progress.json`` keeps each finished file's record count: the resumed
    write neither decompresses nor reads those files to count its way to where it stopped."""
    from trainrun.data import corpus

    files = []
    for name, count in (("a", 5), ("b", 7), ("c", 3)):
        path = tmp_path / f"{name}.jsonl.gz"
        with gzip.open(path, "wt") as handle:
            handle.writelines(json.dumps({"text": f"{name} {index}"}) + "\n" for index in range(count))
        files.append(corpus.file_kind(path))
    counts: dict[str, int] = {}
    everything = list(corpus.records(files, "text", 0, counts))
    assert counts == {str(tmp_path / f"{name}.jsonl.gz"): count for name, count in (("a", 5), ("b", 7), ("c", 3))}
    opened, read = [], corpus.file_records

    def recording(file, field, skip=0):  # noqa: ANN001
        opened.append(file.path.name)
        return read(file, field, skip)

    monkeypatch.setattr(corpus, "file_records", recording)
    resumed = list(corpus.records(files, "text", 10, counts))
    assert opened == ["b.jsonl.gz", "c.jsonl.gz"]  # a's 5 records counted before: not opened
    assert [row[:2] for row in resumed] == [row[:2] for row in everything[10:]]
