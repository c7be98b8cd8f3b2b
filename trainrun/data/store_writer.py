"""``trainrun write-text``'s writer: a corpus streamed into a token store of shards, resumably.

Records are read in order (:mod:`trainrun.data.corpus`), split by the corpus's own splits or a keyed
hash of their text (:func:`~trainrun.data.corpus.held_out`), and tokenized a batch at a time (at most
``BATCH_DOCUMENTS`` documents and ``BATCH_CHARACTERS`` characters, so books or code files do not hold
gigabytes in flight) with
``tokenizers``' batch encoding, in ``workers`` processes (a bounded number of batches in flight,
results taken in order). Token ids go straight to the open shard files; a shard closes after the
batch that brings its training part to ``shard_tokens`` tokens, with the validation documents of the
same records beside it, and ``progress.json`` then records it (its record range, sizes, SHA-256).
Memory is bounded by the batches in flight and one shard's document lengths, whatever the corpus.

The store is written in ``.<name>.partial`` beside it. A killed or interrupted write keeps every
finished shard there; the same command run again checks them and continues after the last (the
records before it are counted, not tokenized), so the store it finishes is the one an uninterrupted
write gives. When the store is complete, ``store.json`` is written and the folder renamed into place.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trainrun.atomic_io import atomic_directory, atomic_write_json, read_json
from trainrun.data.corpus import HELD_OUT_RULE, LEFT_OUT, CorpusFile, corpus_files, held_out, records
from trainrun.data.encoding import Encoder, encode
from trainrun.data.token_store import TEXT_VAL_FRACTION, file_sha256, load_tokenizer, store_facts, train_tokenizer
from trainrun.errors import ConfigError, DataError, FileFormatError
from trainrun.schema import DataConfig, TextConfig

FORMAT = "trainrun-tokens/2"
BATCH_DOCUMENTS = 1024  # documents tokenized per task: fixed, so shard boundaries do not depend on the workers
BATCH_CHARACTERS = 2**23  # and characters (8 Mi: at most 32 MB of text a batch, beyond one longer document)
# records that hold no document (their text null, or empty): counted per shard and in store.json
WITHOUT_TEXT = ("null_records", "empty_records")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class CorpusSettings:
    """What decides a store's contents (a resumed write must be given the same)."""

    text_field: str = "text"
    vocab_size: int = TextConfig.vocab_size
    tokenizer_kind: str = TextConfig.tokenizer
    tokenizer_sample: int = 50_000  # documents a vocabulary is trained on, drawn seeded from the training ones
    val_fraction: float = TEXT_VAL_FRACTION
    split_seed: int = DataConfig.split_seed
    dtype: str = "auto"
    shard_tokens: int = 2**24  # training tokens per shard (the validation part of its records beside it)
    split: str | None = None  # the corpus's own split that is the validation (None: validation, else test)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:06d}"


class ShardWriter:
    """One shard's two parts, written as token batches arrive: ``<split>-NNNNNN.bin`` (ids) and
    ``.idx.npy`` (document offsets), with a running SHA-256 of the ids."""

    def __init__(self, folder: Path, index: int, dtype: str) -> None:
        self.folder, self.index, self.dtype = folder, index, np.dtype(dtype)
        self.files = {split: open(folder / f"{shard_name(split, index)}.bin", "wb") for split in SPLITS}
        self.hashes = {split: hashlib.sha256() for split in SPLITS}
        self.lengths: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
        self.tokens = dict.fromkeys(SPLITS, 0)
        self.without_text: Counter[str] = Counter()  # records of the shard's range that held none

    def add(self, split: str, ids: np.ndarray, lengths: np.ndarray) -> None:
        data = ids.astype(self.dtype, copy=False).tobytes()
        self.files[split].write(data)
        self.hashes[split].update(data)
        self.lengths[split].append(lengths)
        self.tokens[split] += len(ids)

    def close(self, records_end: int) -> dict:
        """Flush both parts to disk; what ``progress.json`` and ``store.json`` say of the shard."""
        entry: dict = {"index": self.index, "records_end": records_end}
        entry |= {key: self.without_text[key] for key in WITHOUT_TEXT}
        for split in SPLITS:
            handle = self.files[split]
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            lengths = np.concatenate([*self.lengths[split], np.zeros(0, np.int64)])
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            np.save(self.folder / f"{shard_name(split, self.index)}.idx.npy", offsets)
            entry[split] = {
                "name": shard_name(split, self.index),
                "documents": len(lengths),
                "tokens": self.tokens[split],
                "sha256": self.hashes[split].hexdigest(),
            }
        return entry

    def discard(self) -> None:
        for handle in self.files.values():
            handle.close()


def shard_intact(folder: Path, entry: dict, itemsize: int) -> bool:
    """Whether a finished shard's files are as ``progress.json`` recorded them (sizes, index, checksum)."""
    for split in SPLITS:
        part, base = entry[split], folder / entry[split]["name"]
        ids, index = base.with_name(base.name + ".bin"), base.with_name(base.name + ".idx.npy")
        if not (ids.is_file() and index.is_file()) or ids.stat().st_size != part["tokens"] * itemsize:
            return False
        try:
            offsets = np.load(index, allow_pickle=False)
        except (ValueError, OSError, EOFError):
            return False
        if len(offsets) != part["documents"] + 1 or offsets[-1] != part["tokens"]:
            return False
        if file_sha256(ids) != part["sha256"]:
            return False
    return True


@dataclass
class Batch:
    """Up to ``BATCH_DOCUMENTS`` documents (and ``BATCH_CHARACTERS`` characters, or one longer
    document) in record order, which of them are held out, where they
    end, and how many records among them held no text (:data:`WITHOUT_TEXT`)."""

    texts: list[str]
    validation: np.ndarray
    records_end: int  # the number after the batch's last record
    position: int  # bytes of the corpus read after it
    without_text: Counter[str]


def batches(
    files: list[CorpusFile], settings: CorpusSettings, start: int, counts: dict[str, int] | None = None
) -> Iterator[Batch]:
    """The corpus's documents from record ``start`` on, in batches (records whose text is null or
    empty dropped and counted)."""

    def batch(records_end: int, position: int) -> Batch:
        held = np.array([split == "val" for split in splits], dtype=bool)  # the corpus's own splits
        unsplit = np.array([split is None for split in splits], dtype=bool)  # the hash decides these alone
        if unsplit.any():
            chosen = [text for text, hashed in zip(texts, unsplit) if hashed]
            held[unsplit] = held_out(chosen, settings.val_fraction, settings.split_seed)
        return Batch(texts, held, records_end, position, without_text)

    texts, splits, without_text, characters = [], [], Counter(), 0
    number, position = start - 1, 0
    for number, text, position, split in records(files, settings.text_field, start, counts):
        if text is None:
            without_text["null_records"] += 1
        elif not text.strip():
            without_text["empty_records"] += 1
        else:
            texts.append(text)
            splits.append(split)
            characters += len(text)
        if len(texts) == BATCH_DOCUMENTS or characters >= BATCH_CHARACTERS:
            yield batch(number + 1, position)
            texts, splits, without_text, characters = [], [], Counter(), 0
    if texts or number + 1 > start:
        yield batch(number + 1, position)


class Progress:
    """Documents, tokens, MB/s and the time left: a rich line on a terminal, a line per shard elsewhere."""

    def __init__(self, console, total_bytes: int, start_bytes: int) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

        self.console, self.total, self.start_bytes = console, max(1, total_bytes), start_bytes
        self.started = time.perf_counter()
        self.documents = self.tokens = 0
        self.bar = None
        if console.is_terminal:
            columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn())
            self.bar = Progress(*columns, console=console, transient=True)
            self.task = self.bar.add_task("", total=self.total, completed=start_bytes)
            self.bar.start()

    def rate(self, position: int) -> float:
        return (position - self.start_bytes) / 1e6 / max(1e-9, time.perf_counter() - self.started)

    def line(self, position: int) -> str:
        rate = self.rate(position)
        left = (self.total - position) / 1e6 / rate if rate > 0 else float("nan")
        return (
            f"{self.documents:,} documents, {self.tokens:,} tokens, "
            f"{position / 1e6:,.0f} of {self.total / 1e6:,.0f} MB, {rate:.1f} MB/s, {left / 60:.1f} min left"
        )

    def update(self, documents: int, tokens: int, position: int) -> None:
        self.documents += documents
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(self.task, completed=position, description=self.line(position).rsplit(",", 1)[0])

    def shard(self, index: int, position: int) -> None:
        if self.bar is None:
            self.console.print(f"shard {index}: {self.line(position)}", soft_wrap=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _identity(files: list[CorpusFile], settings: CorpusSettings, tokenizer: Path | None) -> dict:
    """What a partial store was begun from: the files (sizes, times), the settings, a given tokenizer."""
    return {
        "format": FORMAT,
        "files": [[str(file.path.resolve()), file.size, file.path.stat().st_mtime_ns, file.split] for file in files],
        "settings": asdict(settings),
        "split_rule": HELD_OUT_RULE,
        "tokenizer": file_sha256(tokenizer) if tokenizer else None,
        "batch_documents": BATCH_DOCUMENTS,
        "batch_characters": BATCH_CHARACTERS,
    }


def partial_folder(out: Path) -> Path:
    return out.with_name(f".{out.name}.partial")


def locked(folder: Path):
    """An exclusive lock on ``folder`` (its ``lock`` file) for this process, or one line if another holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(f"another trainrun write-text is writing '{folder}' (it is locked)") from None
    return handle


def finished_shards(folder: Path, identity: dict, console) -> list[dict]:
    """The shards a partial folder begun from ``identity`` holds (none from another: it is emptied)."""
    progress = folder / "progress.json"
    saved = read_json(progress) if progress.is_file() else {}
    if saved.get("identity") == identity:
        return saved["shards"]
    if saved:
        console.print(f"note: '{folder}' was begun from another corpus or other settings: starting over")
    for path in folder.iterdir():
        if path.name != "lock":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    atomic_write_json(progress, {"identity": identity, "shards": []})
    return []


def sample_documents(files: list[CorpusFile], settings: CorpusSettings) -> list[str]:
    """A seeded uniform sample of ``tokenizer_sample`` training documents (reservoir sampling: one
    pass, only the sample held)."""
    generator, sample, seen = np.random.default_rng(settings.split_seed), [], 0
    for batch in batches(files, settings, 0):
        for text, held in zip(batch.texts, batch.validation):
            if held:
                continue
            seen += 1
            if len(sample) < settings.tokenizer_sample:
                sample.append(text)
            elif (slot := int(generator.integers(seen))) < settings.tokenizer_sample:
                sample[slot] = text
    return sample


def store_meta(facts: dict, tokenizer_sha256: str, shards: list[dict], **extra) -> dict:
    """``store.json`` of a store of ``shards``: the tokenizer's facts and each split's shards and sums."""
    meta = {"format": FORMAT, **facts, "tokenizer_sha256": tokenizer_sha256}
    meta |= {key: sum(entry.get(key, 0) for entry in shards) for key in WITHOUT_TEXT}
    for split in SPLITS:
        parts = [entry[split] for entry in shards]
        meta[split] = {
            "documents": sum(part["documents"] for part in parts),
            "tokens": sum(part["tokens"] for part in parts),
            "shards": parts,
        }
    return {**meta, **extra}


def write_corpus(
    source: str, out: Path, settings: CorpusSettings, tokenizer: Path | None, workers: int, console
) -> dict:
    """Write the corpus at ``source`` to a token store at ``out`` (resuming a killed write of the
    same corpus and settings); return its ``store.json``."""
    files = corpus_files(source, settings.split)
    own = Counter(file.split for file in files)
    if own["val"]:
        names = [file.path.name for file in files if file.split == "val"]
        named = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        left = f"; {own[LEFT_OUT]} file(s) of other splits left out" if own[LEFT_OUT] else ""
        console.print(
            f"the corpus's own splits: validation from {own['val']} file(s) ({named}), training from "
            f"{own['train']}{left} (--val-fraction is not used)",
            soft_wrap=True,
        )
    if tokenizer is not None:
        store_facts(tokenizer, settings.dtype)  # a tokenizer that cannot write this store: refused before any work
    identity = _identity(files, settings, tokenizer)
    folder = partial_folder(out)
    with locked(folder):
        try:
            shards, facts = _resume(folder, identity, settings, tokenizer, files, console)
            shards = _write_shards(folder, identity, files, settings, facts["dtype"], shards, workers, console)
            meta = _finish(folder, source, settings, facts, shards)
        except (ConfigError, DataError, FileFormatError):  # a wrong corpus or setting: nothing to continue from
            shutil.rmtree(folder)
            raise
        except KeyboardInterrupt:
            console.print(f"interrupted: the finished shards stay in '{folder}'; the same command continues after them")
            raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(folder, out)
    return meta


def _resume(
    folder: Path, identity: dict, settings: CorpusSettings, tokenizer: Path | None, files: list[CorpusFile], console
) -> tuple[list[dict], dict]:
    """The shards the partial folder holds that are intact, in order, and the facts of its tokenizer
    (copied, trained on a sample, or kept from before)."""
    shards = finished_shards(folder, identity, console)
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        if tokenizer is not None:
            shutil.copyfile(tokenizer, folder / "tokenizer.json.tmp")
        else:
            console.print(f"training a {settings.tokenizer_kind} vocabulary on a sample of documents")
            trained = train_tokenizer(sample_documents(files, settings), settings.vocab_size, settings.tokenizer_kind)
            trained.save(str(folder / "tokenizer.json.tmp"))
        os.replace(folder / "tokenizer.json.tmp", tokenizer_file)
    facts = store_facts(tokenizer_file, settings.dtype, tokenizer)
    itemsize = np.dtype(facts["dtype"]).itemsize
    kept = []
    for entry in shards:
        if not shard_intact(folder, entry, itemsize):
            console.print(f"note: shard {entry['index']} is not as it was written: writing it again")
            break
        kept.append(entry)
    if kept:
        console.print(f"continuing after {len(kept)} finished shards (record {kept[-1]['records_end']:,})")
    return kept, facts


def _finish(folder: Path, source: str, settings: CorpusSettings, facts: dict, shards: list[dict]) -> dict:
    """``store.json`` of the finished shards, written; the partial folder's own files removed."""
    meta = store_meta(
        facts,
        file_sha256(folder / "tokenizer.json"),
        shards,
        corpus=str(source),
        settings=asdict(settings),
        split_rule=HELD_OUT_RULE,
    )
    if meta["train"]["tokens"] == 0 or meta["val"]["tokens"] == 0:
        split = "training" if meta["train"]["tokens"] == 0 else "validation"
        raise DataError(
            f"corpus '{source}' gave no {split} text ({meta['train']['documents'] + meta['val']['documents']:,} "
            f"documents, --val-fraction {settings.val_fraction}): give more documents or another share"
        )
    atomic_write_json(folder / "store.json", meta)
    (folder / "progress.json").unlink()
    (folder / "lock").unlink()
    return meta


def _write_shards(
    folder: Path,
    identity: dict,
    files: list[CorpusFile],
    settings: CorpusSettings,
    dtype: str,
    kept: list[dict],
    workers: int,
    console,
) -> list[dict]:
    """Tokenize the records after the ``kept`` shards into shards of ``dtype`` ids; every shard's
    entry, in order, each recorded in ``progress.json`` as it closes, with the record count of each
    file read to its end (a resumed write skips those files whole)."""
    start = kept[-1]["records_end"] if kept else 0
    saved = read_json(folder / "progress.json")
    counts = saved.get("file_records", {}) if isinstance(saved, dict) else {}
    progress = Progress(console, sum(file.size for file in files), kept[-1]["position"] if kept else 0)
    encoder = Encoder(folder / "tokenizer.json", workers)
    writer = ShardWriter(folder, len(kept), dtype)
    try:
        for batch, (ids, lengths) in encoder.map(batches(files, settings, start, counts)):
            held = np.repeat(batch.validation, lengths)
            writer.add("train", ids[~held], lengths[~batch.validation])
            writer.add("val", ids[held], lengths[batch.validation])
            progress.update(len(batch.texts), len(ids), batch.position)
            writer.without_text.update(batch.without_text)
            start, position = batch.records_end, batch.position
            if writer.tokens["train"] >= settings.shard_tokens:
                kept.append({**writer.close(start), "position": position})
                atomic_write_json(
                    folder / "progress.json", {"identity": identity, "shards": kept, "file_records": counts}
                )
                progress.shard(writer.index, position)
                writer = ShardWriter(folder, writer.index + 1, dtype)
        if writer.tokens["train"] or writer.tokens["val"] or not kept:
            kept.append({**writer.close(start), "position": progress.total})
        else:
            writer.discard()
            for split in SPLITS:
                (folder / f"{shard_name(split, writer.index)}.bin").unlink()
    finally:
        encoder.close()
        progress.stop()
    return kept


def write_token_store(
    train: list[str],
    val: list[str],
    out: Path,
    vocab_size: int,
    tokenizer_path: Path | None = None,
    dtype: str = "auto",
    kind: str = "wordpiece",
) -> Path:
    """Documents held in memory (a built-in corpus's, already split) to a one-shard store at ``out``
    (atomically): a ``kind`` vocabulary of ``vocab_size`` trained on ``train``, or the tokenizer at
    ``tokenizer_path``; token ids as ``dtype`` (``auto``: the smallest type that fits); return ``out``."""
    with atomic_directory(out) as partial:
        tokenizer_file = partial / "tokenizer.json"
        tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
        (tokenizer or train_tokenizer(train, vocab_size, kind)).save(str(tokenizer_file))
        facts = store_facts(tokenizer_file, dtype, tokenizer_path)
        writer, saved = ShardWriter(partial, 0, facts["dtype"]), load_tokenizer(tokenizer_file)
        for split, documents in zip(SPLITS, (train, val)):
            writer.add(split, *encode(documents, saved))
        meta = store_meta(facts, file_sha256(tokenizer_file), [writer.close(len(train) + len(val))])
        atomic_write_json(partial / "store.json", meta)
    return out
