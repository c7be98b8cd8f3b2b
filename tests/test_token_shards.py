"""data=token_shards: llm.c / modded-nanogpt shards, written here with NumPy by the format's own rule
(a 256 x int32 header: magic, version, token count; then the tokens), read and trained on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_here

from trainrun.data.token_pieces import ConcatenatedTokens
from trainrun.errors import DataError, FileFormatError

GPT2 = (20240520, 1, np.uint16)
LLAMA3 = (20240801, 7, np.uint32)


def write_shard(path: Path, tokens: np.ndarray, shard_format: tuple = GPT2) -> Path:
    """A shard as llm.c's ``write_datafile`` lays it out."""
    magic, version, dtype = shard_format
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens)
    with open(path, "wb") as handle:
        handle.write(header.tobytes())
        handle.write(np.asarray(tokens, dtype=dtype).tobytes())
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict:
    """Standard-library docstrings tokenized by a byte-level BPE, each document after <|endoftext|>:
    three training shards and one validation shard, with the tokenizer.json beside them."""
    from trainrun.data.token_store import read_documents, train_tokenizer

    folder = tmp_path_factory.mktemp("shards")
    documents = read_documents("stdlib_docs")[:1500]
    tokenizer = train_tokenizer(documents[100:], 512, kind="bpe")
    tokenizer.save(str(folder / "tokenizer.json"))
    eot = tokenizer.token_to_id("<|endoftext|>")

    def stream(texts: list[str]) -> np.ndarray:
        return np.concatenate([[eot, *encoded.ids] for encoded in tokenizer.encode_batch(texts)])

    train = stream(documents[100:])
    for index, piece in enumerate(np.array_split(train, 3)):
        write_shard(folder / f"tiny_train_{index:06d}.bin", piece)
    write_shard(folder / "tiny_val_000000.bin", stream(documents[:100]))
    return {"folder": folder, "train": train, "eot": eot}


def shard_args(shards: dict) -> list[str]:
    folder = shards["folder"]
    return [
        "task=causal_lm",
        "data=token_shards",
        f"data.train={folder}/tiny_train_*.bin",
        f"data.val={folder}/tiny_val_*.bin",
        f"data.shards.tokenizer={folder}/tokenizer.json",
        "data.shards.val_tokens=4096",
        "data.text.max_seq_len=32",
        "model=gpt_tiny",
    ]


def test_windows_cross_shard_boundaries_and_a_batch_is_gathered_at_once(shards):
    from trainrun.config import compose
    from trainrun.data.interface import datasets
    from trainrun.validation import validate

    config = validate(compose(shard_args(shards)), files=False)
    sets = datasets(config.data)
    train, stream = sets.train, shards["train"]
    assert isinstance(train.tokens, ConcatenatedTokens) and len(train.tokens.pieces) == 3
    assert len(train) == (len(stream) - 1) // 32
    boundary = len(np.array_split(stream, 3)[0]) // 32  # the window that crosses the first shard's end
    for index in (0, boundary, len(train) - 1):
        assert train[index].tolist() == stream[index * 32 : index * 32 + 33].tolist()
    batch = train.__getitems__([boundary, 3, 0])
    assert torch.equal(batch, torch.stack([train[boundary], train[3], train[0]])) and batch.dtype == torch.int64
    assert len(sets.val) == 4096 // 32  # the first data.shards.val_tokens tokens, in order
    assert sets.text.vocab_size == 512 and sets.text.separator == shards["eot"]
    with pytest.raises(IndexError):
        train.__getitems__([len(train)])


def test_concatenated_tokens_answer_slices_and_positions_like_one_array():
    pieces = [np.arange(0, 5), np.arange(5, 6), np.arange(6, 12)]
    joined, whole = ConcatenatedTokens(pieces, np.int64), np.arange(12)
    for start, stop in ((0, 12), (3, 7), (5, 6), (4, 11), (7, 7), (11, 12)):
        assert joined[start:stop].tolist() == whole[start:stop].tolist()
    positions = np.array([[0, 5, 11], [4, 6, 3]])
    assert joined[positions].tolist() == whole[positions].tolist() and len(joined) == 12
    assert np.array_equal(np.asarray(joined), whole) and int(joined[np.int64(7)]) == 7


@pytest.mark.slow
def test_gpt_tiny_trains_on_shards_and_stops_at_a_target_loss(shards, tmp_path):
    args = [*shard_args(shards), "optimizer=adamw", "optimizer.lr=3e-3", "train_batch_size=16"]
    args += ["max_duration=40ba", "eval_interval=10ba", "progress=false"]
    result = run_here(*args, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr
    losses = [json.loads(line)["eval_loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.3
    stopped = run_here(*args, f"hydra.run.dir={tmp_path / 'stop'}", f"stop_at={losses[1] + 1e-6}")
    assert stopped.returncode == 0, stopped.stderr
    summary = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert summary["status"] == "target_reached" and summary["batches"] == 20
    assert (
        tmp_path / "run" / "hf_model" / "tokenizer.json"
    ).is_file()  # data.shards.tokenizer is exported with the model
    sampled = run_here("sample", str(tmp_path / "run"), "--prompt", "Return the", "--tokens", "4", "--temperature", "0")
    assert sampled.returncode == 0 and sampled.stdout.startswith("Return the"), sampled.stderr


def damage(folder: Path, kind: str) -> str:
    """A training glob over good shards and one damaged as ``kind`` says; the damaged file's name."""
    good = np.arange(100) % 50
    write_shard(folder / "train_000000.bin", good)
    bad = folder / "train_000001.bin"
    if kind == "magic":
        write_shard(bad, good, (20240521, 1, np.uint16))
    elif kind == "version":
        write_shard(bad, good, (20240520, 7, np.uint16))
    elif kind == "truncated":
        bad.write_bytes(write_shard(bad, good).read_bytes()[:-10])
    elif kind == "header":
        bad.write_bytes(b"\0" * 100)
    elif kind == "mixed":
        write_shard(bad, good, LLAMA3)
    write_shard(folder / "val_000000.bin", good)
    return str(bad)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("magic", r"^'{bad}' is not a token shard: magic number 20240521, not one of 20240520 \(GPT-2\), 20240801"),
        ("version", r"^'{bad}': version 7 with magic number 20240520 \(GPT-2 shards are version 1\)$"),
        ("truncated", r"^'{bad}' is truncated or damaged: its header says 100 tokens \(1,224 bytes\), the file has "),
        ("header", r"^'{bad}' is not a token shard: 100 bytes, less than the 1024-byte header$"),
        ("mixed", r"^'{bad}' has magic number 20240801; '.*train_000000.bin' of the same glob another$"),
    ],
)
def test_a_damaged_shard_is_one_line_naming_the_file(tmp_path, kind, message):
    from trainrun.data.token_shards import open_shards

    bad = damage(tmp_path, kind)
    with pytest.raises((DataError, FileFormatError), match=message.format(bad=bad)):
        open_shards(str(tmp_path / "train_*.bin"), "train")


@pytest.mark.slow
def test_bad_shards_and_an_empty_glob_stop_the_cli_before_anything_is_written(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    bad = damage(folder, "truncated")
    common = [
        "task=causal_lm",
        "data=token_shards",
        "model=gpt_tiny",
        "data.text.max_seq_len=16",
        "data.shards.val_tokens=32",
    ]
    common.append(f"data.val={folder}/val_*.bin")
    cases = {
        f"data.train={folder}/train_*.bin": f"'{bad}' is truncated or damaged",
        f"data.train={folder}/none_*.bin": f"bad value for 'data.train': no file matches '{folder}/none_*.bin'",
    }
    for override, message in cases.items():
        result = run_here(*common, override, f"hydra.run.dir={tmp_path / 'run'}")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"trainrun: error: {message}"), lines
        assert not (tmp_path / "run").exists()
    unread = run_here(*common, f"data.train={folder}/train_000000.bin", f"data.path={folder}")  # does nothing here
    assert unread.returncode == 2 and unread.stderr.startswith(
        "trainrun: error: bad key 'data.path': data=token_shards does not read it (it reads data.train, data.val, "
    )
    unscored = run_here(*common, f"data.train={folder}/train_000000.bin", "data.shards.val_tokens=20")
    assert unscored.returncode == 2 and "bad value for 'data.shards.val_tokens': 20 (a multiple of" in unscored.stderr


@pytest.mark.parametrize("tokenizer", [True, False], ids=["data.shards.tokenizer", "the format's tokenizer"])
def test_shards_with_ids_beyond_the_vocabulary_are_refused_before_the_run_in_one_line(shards, tmp_path, tokenizer):
    """The vocabulary is data.shards.tokenizer's (512 here) or, without one, GPT-2's (50,257): a
    shard holding a larger id is named with its largest id and the vocabulary, exit 2, nothing written."""
    vocab = 512 if tokenizer else 50257
    folder = tmp_path / "data"
    folder.mkdir()
    write_shard(folder / "train_000000.bin", shards["train"][:5000])
    bad = write_shard(
        folder / "train_000001.bin", [*shards["train"][:300], vocab, vocab - 1]
    )  # the smallest id refused
    write_shard(folder / "val_000000.bin", [*shards["train"][:200], vocab - 1])  # the largest id allowed
    args = [*shard_args(shards), f"data.train={folder}/train_*.bin", f"data.val={folder}/val_*.bin"]
    args += ["data.shards.val_tokens=128", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"]
    if not tokenizer:
        args.remove(f"data.shards.tokenizer={shards['folder']}/tokenizer.json")
    source = f"data.shards.tokenizer '{shards['folder']}/tokenizer.json'" if tokenizer else "the GPT-2 tokenizer"
    for _ in range(2):  # the second time from the cache
        result = run_here(*args)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        expected = f"'{bad}' holds token id {vocab:,}, beyond the vocabulary of {vocab:,} ({source}"
        assert result.stderr.startswith(f"trainrun: error: {expected}"), result.stderr
        assert not (tmp_path / "run").exists()
    assert len(list((tmp_path / "cache").glob("shard-largest-id-*.json"))) == 2  # the shards up to the bad one
    write_shard(bad, shards["train"][:300])  # the file mended: read again (its size and time changed)
    assert run_here(*args, "max_duration=1ba", "eval_interval=1ba", "progress=false").returncode == 0


def test_a_shards_largest_id_is_read_once_and_again_when_the_file_changes(tmp_path, monkeypatch):
    from trainrun.data import token_shards

    shard = write_shard(tmp_path / "a.bin", [3, 9, 4])
    shard_format, cache = token_shards.FORMATS[GPT2[0]], str(tmp_path / "cache")
    assert token_shards.largest_id(shard, shard_format, 3, cache) == 9
    monkeypatch.setattr(token_shards.np, "max", None)  # read from the cache: no pass over the tokens
    assert token_shards.largest_id(shard, shard_format, 3, cache) == 9
    monkeypatch.undo()
    write_shard(shard, [3, 11, 4, 5])
    assert token_shards.largest_id(shard, shard_format, 4, cache) == 11
    assert token_shards.largest_id(write_shard(tmp_path / "empty.bin", []), shard_format, 0, cache) == -1


def test_shard_validation_reads_the_first_val_tokens_of_the_validation_stream_in_order(shards, tmp_path):
    """By value: window i is validation tokens i·L … i·L + L (inputs and the next token), for exactly
    data.shards.val_tokens / L windows, from the start of the first validation shard on."""
    from trainrun.config import compose
    from trainrun.data.token_shards import shard_datasets
    from trainrun.validation import validate

    folder = tmp_path / "data"
    folder.mkdir()
    stream = shards["train"][:3000]
    write_shard(folder / "val_000000.bin", stream[:700])  # the stream crosses into the second shard
    write_shard(folder / "val_000001.bin", stream[700:])
    args = [*shard_args(shards), f"data.val={folder}/val_*.bin", "data.shards.val_tokens=1024"]
    data = validate(compose(args), files=False).data
    evaluation = shard_datasets(data).val
    assert len(evaluation) == 1024 // 32
    read = torch.cat([evaluation[i][:-1] for i in range(len(evaluation))])
    assert torch.equal(read, torch.as_tensor(stream[:1024], dtype=torch.int64))
    assert [int(evaluation[i][-1]) for i in range(len(evaluation))] == [int(stream[32 * (i + 1)]) for i in range(32)]


def test_a_shard_delimiter_begins_its_document_as_modded_nanogpt_counts_them(shards):
    """llm.c's shards put the delimiter before each document: every token sees exactly its own
    document's tokens, the delimiter that begins it included (modded-nanogpt's ``(tokens ==
    50256).cumsum()``), and no output depends on the document before; a trainrun store's separator
    ends its document instead."""
    from trainrun.config import compose
    from trainrun.data.interface import datasets
    from trainrun.models.build import build_model
    from trainrun.models.gpt import document_ids, visible_keys
    from trainrun.validation import validate

    config = validate(compose([*shard_args(shards), "model.gpt.document_mask=true"]), files=False)
    sets = datasets(config.data)
    model = build_model(config.model, sets.text).eval()
    assert sets.text.separator_begins and model.separator_begins
    eot = shards["eot"]
    window = next(w for w in map(sets.train.__getitem__, range(len(sets.train))) if (w[1:-1] == eot).any())[None, :-1]
    starts = (window[0] == eot).nonzero().flatten().tolist()
    assert starts and starts[-1] > 0  # a document begins inside the window
    documents = document_ids(window, eot, begins=True)
    assert torch.equal(documents, (window == eot).cumsum(1))
    visible = visible_keys(window.shape[1], None, documents, torch.device("cpu"))[0, 0]
    for query in range(window.shape[1]):
        first = max([start for start in starts if start <= query], default=0)
        assert visible[query].nonzero().flatten().tolist() == list(range(first, query + 1))
    delimiter = starts[-1]
    changed = window.clone()
    earlier = changed[0, :delimiter]  # the earlier documents' tokens, their delimiters kept
    changed[0, :delimiter] = torch.where(earlier == eot, eot, (eot + 7) % sets.text.vocab_size)
    assert not torch.equal(changed, window)
    with torch.no_grad():
        assert torch.allclose(model(window)[0, delimiter:], model(changed)[0, delimiter:], atol=1e-5)
    store_layout = torch.tensor([[5, 6, eot, 7, 8, eot]])  # a store's documents, each followed by its separator
    assert document_ids(store_layout, eot).tolist() == [[0, 0, 0, 1, 1, 1]]


def test_a_shard_in_both_the_training_and_the_validation_glob_is_refused_in_one_line(shards, tmp_path):
    folder = shards["folder"]
    args = [*shard_args(shards), f"data.val={folder}/tiny_*_000000.bin", f"hydra.run.dir={tmp_path / 'run'}"]
    result = run_here(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"trainrun: error: bad value for 'data.val': '{folder}/tiny_train_000000.bin' is")
    assert "matched by data.train" in lines[0] and not (tmp_path / "run").exists()


def test_five_thousand_shards_are_read_under_a_limit_of_256_open_files(tmp_path):
    """Each shard is mapped when read and at most ``OPEN_FILES`` mappings stay open in a process: a
    whole pass over 5,000 shards, in order and shuffled, with room for 100 descriptors more than the
    process holds (a test worker's other files counted)."""
    import resource

    from trainrun.data import token_pieces
    from trainrun.data.causal_text import TokenWindows
    from trainrun.data.token_shards import open_shards

    stream = np.arange(5000 * 40) % 500
    for index, piece in enumerate(np.split(stream, 5000)):
        write_shard(tmp_path / f"s_{index:05d}.bin", piece)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 100, hard))
    try:
        _, tokens = open_shards(f"{tmp_path}/s_*.bin", "train")
        windows = TokenWindows(tokens, 32, 0)
        in_order = windows.__getitems__(list(range(len(windows))))
        order = np.random.default_rng(0).permutation(len(windows))
        shuffled = torch.cat([windows.__getitems__(order[i : i + 64].tolist()) for i in range(0, len(order), 64)])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    expected = torch.from_numpy(stream[np.arange(len(windows))[:, None] * 32 + np.arange(33)])
    assert torch.equal(in_order, expected) and torch.equal(shuffled, expected[order])
    assert len(token_pieces._open) <= token_pieces.OPEN_FILES
