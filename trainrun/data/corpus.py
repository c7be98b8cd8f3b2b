"""Text corpora read as a stream of records, one file and one batch at a time, with bounded memory.

A corpus is a file, a folder of files (every file under it, in name order) or a folder that
Hugging Face ``datasets``' ``save_to_disk`` wrote. Each file kind is named by its suffix:

- ``.txt``: documents separated by blank lines (a record is a block of lines);
- ``.jsonl``, ``.ndjson``, ``.json``: one JSON record per line, the text in ``text_field``;
- any of these compressed: ``.gz`` (gzip) or ``.zst`` (Zstandard), read as a stream;
- ``.parquet``: the ``text_field`` column, one row group at a time (pyarrow);
- a ``save_to_disk`` folder: its Arrow files (a ``DatasetDict``'s splits in its own order).

Any other file is refused by name, never read as text nor skipped in silence. Records are numbered
in stream order from 0, empty ones and those whose text is null too (they hold no document: they are
dropped and counted later): the number is where a resumed write continues. A corpus's own splits
are kept (:func:`own_splits`): a ``DatasetDict``'s validation split, or files whose names say so
(C4's ``c4-validation.*.json.gz``), are the store's validation, the rest its training; elsewhere a
keyed hash of each document's text decides (:func:`held_out`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import numpy as np

from trainrun.atomic_io import read_json
from trainrun.errors import DataError

TEXT_KINDS = {".txt": "text", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
COMPRESSIONS = (".gz", ".zst")
READABLE = ".txt, .jsonl, .ndjson or .json (each also .gz or .zst), .parquet, or a folder datasets' save_to_disk wrote"
HF_FOLDER_FILES = ("state.json", "dataset_dict.json")  # what marks a save_to_disk folder (a Dataset, a DatasetDict)
# a split's name, or a word of a file's name between - _ . or its ends, that marks a corpus's own split
SPLIT_WORDS = re.compile(r"(?:^|[-_.])(validation|valid|val|dev|test)(?=[-_.]|$)")
HELD_OUT_RULE = "own splits, else BLAKE2b of the text keyed by the seed"  # store.json's split_rule
LEFT_OUT = "left out"  # a test split beside a validation split: neither trained on nor scored, not read


@dataclass(frozen=True)
class CorpusFile:
    """One file of a corpus and how it is read: ``text``, ``jsonl``, ``parquet`` or ``arrow``."""

    path: Path
    kind: str
    compression: str = ""  # "", ".gz" or ".zst"
    split: str | None = None  # "train", "val" or LEFT_OUT where the corpus's own splits say; None: held_out decides

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def file_kind(path: Path) -> CorpusFile:
    """How ``path`` is read, from its suffixes; one line naming it if write-text does not read its kind."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else ""
    last = suffixes[-1] if suffixes else ""
    if last == ".parquet" and not compression:
        return CorpusFile(path, "parquet")
    if last in TEXT_KINDS:
        return CorpusFile(path, TEXT_KINDS[last], compression)
    raise DataError(f"corpus file '{path}' is of a kind write-text does not read (it reads {READABLE})")


def corpus_files(source: str | Path, split: str | None = None) -> list[CorpusFile]:
    """Every file of the corpus at ``source``, in reading order, each of a kind it reads, its own
    splits kept (``split``: the one that is the validation, :func:`own_splits`)."""
    root = Path(source).expanduser()
    if root.is_file():
        named = [(file_kind(root), root.name)]
    elif not root.is_dir():
        raise DataError(f"corpus '{source}' is neither a file nor a folder")
    elif any((root / name).is_file() for name in HF_FOLDER_FILES):
        named = saved_dataset_files(root)
    else:
        files = sorted(path for path in root.rglob("*") if path.is_file() and not _hidden(path.relative_to(root)))
        if not files:
            raise DataError(f"corpus folder '{root}' holds no file (it reads {READABLE})")
        named = [(file_kind(path), path.name) for path in files]
    if split is None:
        return own_splits(named) if root.is_dir() else [file for file, _ in named]
    return chosen_split(named, split, source)


def split_word(name: str) -> str:
    """``val``, ``test`` or ``train``: the split a split's or a file's name says it holds."""
    found = SPLIT_WORDS.search(name.lower())
    if found is None:
        return "train"
    return "test" if found[1] == "test" else "val"


def own_splits(files: list[tuple[CorpusFile, str]]) -> list[CorpusFile]:
    """The corpus's files with its own splits kept, from each file's split or file name: the
    validation files (or, where there are none, the test files) are the store's validation and the
    rest its training; test files beside validation ones are :data:`LEFT_OUT` (neither trained on
    nor scored). Where no name marks a split, every file's ``split`` stays None (the hash decides)."""
    words = [split_word(name) for _, name in files]
    if set(words) == {"train"}:
        return [file for file, _ in files]
    validation = "val" if "val" in words else "test"
    splits = {validation: "val", "train": "train"}
    return [replace(file, split=splits.get(word, LEFT_OUT)) for (file, _), word in zip(files, words)]


def chosen_split(files: list[tuple[CorpusFile, str]], split: str, source: str | Path) -> list[CorpusFile]:
    """``write-text --split NAME``: the files whose split (a ``DatasetDict``'s) or a word of whose
    name is ``split`` are the validation; the other files that name a split are left out, the rest
    trained on. One line if none is so named."""
    word = re.compile(rf"(?:^|[-_.]){re.escape(split.lower())}(?=[-_.]|$)")
    marked = [word.search(name.lower()) is not None for _, name in files]
    if not any(marked):
        names = ", ".join(dict.fromkeys(name for _, name in files[:20]))
        raise DataError(f"bad value for '--split': no split or file of '{source}' is named '{split}' ({names})")
    return [
        replace(file, split="val" if chosen else "train" if split_word(name) == "train" else LEFT_OUT)
        for (file, name), chosen in zip(files, marked)
    ]


def _hidden(relative: Path) -> bool:
    """A dot-file or a file in a dot-folder (version control, editors' state): not part of a corpus."""
    return any(part.startswith(".") for part in relative.parts)


def saved_dataset_files(root: Path) -> list[tuple[CorpusFile, str]]:
    """The Arrow files of a ``save_to_disk`` folder, each with its split's name: a Dataset's in
    ``state.json``'s order, a DatasetDict's splits in ``dataset_dict.json``'s."""
    if (root / "dataset_dict.json").is_file():
        splits = _json_object(root / "dataset_dict.json").get("splits", [])
        return [(file, split) for split in splits for file, _ in saved_dataset_files(root / split)]
    state = _json_object(root / "state.json")
    names = [entry["filename"] for entry in state.get("_data_files", []) if "filename" in entry]
    missing = [name for name in names if not (root / name).is_file()]
    if not names or missing:
        raise DataError(f"'{root}' is a damaged datasets folder: state.json names {missing or 'no'} Arrow files")
    return [(CorpusFile(root / name, "arrow"), "") for name in names]


def _json_object(path: Path) -> dict:
    """The JSON object in ``path`` (a save_to_disk folder's description); one line naming it if not."""
    content = read_json(path)
    if not isinstance(content, dict):
        raise DataError(f"'{path}' is not a JSON object")
    return content


class CountingReader(io.RawIOBase):
    """A binary file that counts the bytes read from disk (the progress of a compressed stream)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.consumed = handle, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self.handle.readinto(buffer)
        self.consumed += count or 0
        return count

    def close(self) -> None:
        self.handle.close()
        super().close()


def _decompressed(raw: IO[bytes], compression: str) -> IO[bytes]:
    if compression == ".gz":
        return gzip.GzipFile(fileobj=raw)
    if compression == ".zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def _text_lines(file: CorpusFile, counter: CountingReader) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of a text file, decoded as UTF-8; one line naming the file if not."""
    stream = io.TextIOWrapper(io.BufferedReader(_decompressed(counter, file.compression)), encoding="utf-8")
    number = 0
    try:
        for number, line in enumerate(stream, 1):
            yield number, line
    except UnicodeDecodeError:
        raise DataError(f"corpus file '{file.path}' is not UTF-8 (line {number + 1})") from None
    except (OSError, EOFError) as error:  # gzip's and zstandard's damaged streams
        raise DataError(f"corpus file '{file.path}' is damaged after line {number} ({error})") from None


def _json_text(file: CorpusFile, number: int, line: str, field: str) -> str | None:
    """The ``field`` of line ``number`` of a JSON-lines file ('' for a blank line, None where it is null)."""
    if not line.strip():
        return ""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"corpus file '{file.path}' line {number} is not a JSON record ({error.msg})") from None
    if isinstance(record, dict) and field in record and record[field] is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        raise DataError(
            f"corpus file '{file.path}' line {number} has no \"{field}\" string "
            f'(one {{"{field}": ...}} per line; --text-field names another field)'
        )
    return record[field]


def _column_batches(file: CorpusFile, field: str) -> Iterator[tuple[object, float]]:
    """(the ``field`` column of a record batch, the share of the file read after it) of a Parquet or Arrow file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if file.kind == "parquet":
            table = pq.ParquetFile(file.path, pre_buffer=False, buffer_size=1 << 20)  # a stream, not whole columns
            names, total = table.schema_arrow.names, max(1, table.metadata.num_rows)
            batches = table.iter_batches(batch_size=4096, columns=[field] if field in names else None)
        else:
            reader = pa.ipc.open_stream(pa.memory_map(str(file.path)))
            names, total, batches = reader.schema.names, 0, reader
        if field not in names:
            raise DataError(f"corpus file '{file.path}' has no '{field}' column (it has {', '.join(names)})")
        rows = 0
        for batch in batches:
            rows += batch.num_rows
            yield batch.column(batch.schema.get_field_index(field)), rows / total if total else 0.0
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"corpus file '{file.path}' is not a readable {file.kind} file ({error})") from None


def file_records(file: CorpusFile, field: str, skip: int = 0) -> Iterator[tuple[str | None, int]]:
    """(text, bytes of the file read so far) of each record of ``file``: '' for an empty record, None
    for a null text (a column's or a JSON record's) and for each of the first ``skip``, which are passed
    over without decoding (nor JSON parsing)."""
    if file.kind in ("parquet", "arrow"):
        for column, share in _column_batches(file, field):
            position = round(share * file.size)
            if skip >= len(column):
                skip -= len(column)
                yield from ((None, position) for _ in range(len(column)))
                continue
            yield from ((None, position) for _ in range(skip))
            for text in column.slice(skip).to_pylist():
                if not isinstance(text, str | None):
                    raise DataError(f"corpus file '{file.path}' column '{field}' holds {type(text).__name__}, not text")
                yield text, position
            skip = 0
        return
    with open(file.path, "rb") as handle:
        counter = CountingReader(handle)
        if file.kind == "jsonl":
            for number, line in _text_lines(file, counter):
                yield (_json_text(file, number, line, field) if number > skip else None), counter.consumed
            return
        block: list[str] = []
        for _, line in _text_lines(file, counter):  # blocks of lines between blank lines
            if line.strip("\r\n"):
                block.append(line)
            elif block:
                yield ("".join(block).strip() if skip <= 0 else None), counter.consumed
                skip, block = skip - 1, []
        if block:
            yield ("".join(block).strip() if skip <= 0 else None), counter.consumed


def records(
    files: list[CorpusFile], field: str, start: int = 0, counts: dict[str, int] | None = None
) -> Iterator[tuple[int, str | None, int, str | None]]:
    """(record number, text or None where it is null, bytes of the corpus read so far, its file's
    own split) of every record from number ``start`` on, across ``files`` in order. The records
    before ``start`` are counted, not decoded, and a whole file before it not even read where
    ``counts`` (file path: records) knows its count; each file read to its end adds its count there."""
    number, done = 0, 0
    counts = {} if counts is None else counts
    for file in files:
        if file.split == LEFT_OUT:
            done += file.size
            continue
        known = counts.get(str(file.path))
        if known is not None and number + known <= start:  # counted when an earlier write read it
            number, done = number + known, done + file.size
            continue
        first = number
        for text, position in file_records(file, field, skip=max(0, start - number)):
            if number >= start:
                yield number, text, done + position, file.split
            number += 1
        counts[str(file.path)] = number - first
        done += file.size


def held_out(texts: list[str], fraction: float, seed: int) -> np.ndarray:
    """Which documents go to validation: those whose hash of their text (BLAKE2b, keyed by
    ``seed``) falls below ``fraction``. Keyed to content, not place: a document keeps its side when
    files are added to the corpus or its order changes, the same text is always on the same side,
    and nothing depends on how the corpus is batched, read by how many workers, or resumed."""
    key = seed.to_bytes(8, "little", signed=True)
    digests = b"".join(
        hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=key).digest() for text in texts
    )
    return (np.frombuffer(digests, dtype="<u8") >> np.uint64(11)).astype(np.float64) / 2.0**53 < fraction
