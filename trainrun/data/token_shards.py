"""``data=token_shards``: the token shards of llm.c and modded-nanogpt, read as they are.

A shard is a 256 x int32 little-endian header (a magic number, a version, the token count) and
then the tokens: magic 20240520, version 1, uint16 tokens for GPT-2's tokenizer (FineWeb's 10B
shards of the GPT-2 speedrun); magic 20240801, version 7, uint32 tokens for Llama 3's. Each
document starts with a delimiter token (GPT-2's ``<|endoftext|>``, 50256; Llama 3's
``<|begin_of_text|>``, 128000; its id in ``data.shards.tokenizer`` where one is given), the separator a
document mask reads: as modded-nanogpt counts documents, the delimiter belongs to the document it
begins (in trainrun's stores a separator ends one). The shards a glob
matches are memory-mapped in name order and read as one stream; training windows cross shard
boundaries, in the torch loader's (seed, epoch)-keyed, resumable order; validation reads the
validation stream's first ``data.shards.val_tokens`` tokens in order (each scored once, on any number of
ranks). The vocabulary (and the tokenizer that ``sample`` and the ``hf_model`` export use) is
``data.shards.tokenizer``'s where given, else the one the format names; shards holding a larger id
are refused before the run (each shard's largest id read once, then cached in ``data.cache_dir``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainrun.atomic_io import atomic_write_text
from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.cache import cache_prefix
from trainrun.data.causal_text import TokenWindows, window_batch
from trainrun.data.interface import Datasets, TextFacts
from trainrun.data.token_pieces import MappedTokens, one_array
from trainrun.data.token_store import load_tokenizer
from trainrun.errors import DataError, FileFormatError
from trainrun.schema import DataConfig

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


@dataclass(frozen=True)
class ShardFormat:
    """What a shard's magic number says: its version, token type and tokenizer."""

    version: int
    dtype: str
    tokenizer: str
    vocab_size: int  # the tokenizer's
    separator: int  # the id of the token each document starts with, in that tokenizer
    separator_token: str  # that token


FORMATS = {
    20240520: ShardFormat(
        version=1, dtype="uint16", tokenizer="GPT-2", vocab_size=50257, separator=50256, separator_token="<|endoftext|>"
    ),
    20240801: ShardFormat(
        version=7,
        dtype="uint32",
        tokenizer="Llama 3",
        vocab_size=128256,
        separator=128000,
        separator_token="<|begin_of_text|>",
    ),
}


def shard_paths(pattern: str | None, key: str) -> list[Path]:
    """The files glob ``pattern`` (``data.<key>``) matches, in name order; one line if none."""
    if not pattern:
        raise DataError(f"data=token_shards needs 'data.{key}' (a glob of llm.c token shards, '/data/fineweb_*.bin')")
    paths = sorted(Path(path) for path in glob.glob(os.path.expanduser(pattern)) if Path(path).is_file())
    if not paths:
        raise DataError(f"bad value for 'data.{key}': no file matches '{pattern}'")
    return paths


def read_header(path: Path) -> tuple[int, ShardFormat, int]:
    """(magic, format, token count) of the shard at ``path``, its size checked against its header."""
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise FileFormatError(f"'{path}' is not a token shard: {size} bytes, less than the {HEADER_BYTES}-byte header")
    magic, version, count = (int(value) for value in np.fromfile(path, dtype="<i4", count=3))
    shard_format = FORMATS.get(magic)
    if shard_format is None:
        known = ", ".join(f"{number} ({known.tokenizer})" for number, known in FORMATS.items())
        raise FileFormatError(f"'{path}' is not a token shard: magic number {magic}, not one of {known}")
    if version != shard_format.version:
        raise FileFormatError(
            f"'{path}': version {version} with magic number {magic} ({shard_format.tokenizer} shards are "
            f"version {shard_format.version})"
        )
    expected = HEADER_BYTES + count * np.dtype(shard_format.dtype).itemsize
    if count < 0 or size != expected:
        raise FileFormatError(
            f"'{path}' is truncated or damaged: its header says {count:,} tokens ({expected:,} bytes), "
            f"the file has {size:,} bytes"
        )
    return magic, shard_format, count


def open_shards(pattern: str | None, key: str) -> tuple[ShardFormat, np.ndarray]:
    """The shards ``data.<key>`` matches, headers checked and of one format, as one token array."""
    pieces, formats = [], {}
    for path in shard_paths(pattern, key):
        magic, shard_format, count = read_header(path)
        formats.setdefault(magic, path)
        if len(formats) > 1:
            first = next(iter(formats.values()))
            raise FileFormatError(f"'{path}' has magic number {magic}; '{first}' of the same glob another")
        if count:
            pieces.append(shard_tokens(path, shard_format, count))
    return shard_format, one_array(pieces, shard_format.dtype)


def shard_tokens(path: Path, shard_format: ShardFormat, count: int) -> MappedTokens:
    """The ``count`` tokens of the shard at ``path`` (at least one), mapped after its header when read."""
    return MappedTokens(path, shard_format.dtype, count, HEADER_BYTES)


def check_shards(config: DataConfig) -> None:
    """Both globs match shards of one format whose headers are sound, no shard is in both (validation
    would score tokens the model trained on), and no shard holds a token id beyond the vocabulary (an
    embedding lookup would fail at the first step: on a GPU, a device-side assert that ends the process)."""
    magics, shards, training = {}, {}, set()
    for key in ("train", "val"):
        for path in shard_paths(getattr(config, key), key):
            if key == "train":
                training.add(path.resolve())
            elif path.resolve() in training:
                raise DataError(
                    f"bad value for 'data.val': '{path}' is matched by data.train '{config.train}' too "
                    "(validation would score tokens the model trains on)"
                )
            magic, shard_format, count = shards[path] = read_header(path)
            magics.setdefault(magic, path)
    if len(magics) > 1:
        first, second = magics.values()
        raise FileFormatError(f"'{first}' and '{second}' are shards of different formats (magic numbers)")
    vocab_size, _, tokenizer_file = vocabulary(config, shard_format)
    named = f"the {shard_format.tokenizer} tokenizer its magic number names"
    source = f"data.shards.tokenizer '{tokenizer_file}'" if tokenizer_file else named
    for path, (_, shard_format, count) in shards.items():
        largest = largest_id(path, shard_format, count, config.cache_dir)
        if largest >= vocab_size:
            raise FileFormatError(
                f"'{path}' holds token id {largest:,}, beyond the vocabulary of {vocab_size:,} ({source}): "
                "its tokens are not that tokenizer's"
            )


def vocabulary(config: DataConfig, shard_format: ShardFormat) -> tuple[int, int, Path | None]:
    """(vocabulary size, the separator's id, the tokenizer file) the run trains with: data.shards.tokenizer's
    where given (one line if it lacks the format's separator), else the format's."""
    if not config.shards.tokenizer:
        return shard_format.vocab_size, shard_format.separator, None
    tokenizer_file = Path(config.shards.tokenizer).expanduser()
    tokenizer = load_tokenizer(tokenizer_file)
    separator = tokenizer.token_to_id(shard_format.separator_token)
    if separator is None:
        raise DataError(
            f"bad value for 'data.shards.tokenizer': '{tokenizer_file}' has no {shard_format.separator_token}, "
            f"which starts each document of {shard_format.tokenizer} shards"
        )
    return tokenizer.get_vocab_size(), separator, tokenizer_file


def largest_id(path: Path, shard_format: ShardFormat, count: int, cache_dir: str) -> int:
    """The largest token id in the shard at ``path`` (-1 if it has none): one pass over its tokens,
    then kept in ``cache_dir`` under the file's path, size and modification time, so that a run
    starting again reads one small file a shard (a cache that cannot be written is skipped)."""
    stat = path.stat()
    identity = {"path": str(path.resolve()), "bytes": stat.st_size, "modified_ns": stat.st_mtime_ns}
    cached = cache_prefix(cache_dir, "shard-largest-id", identity).with_suffix(".json")
    if cached.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return int(json.loads(cached.read_text())["largest_id"])
    largest = int(np.max(shard_tokens(path, shard_format, count).mapped)) if count else -1
    with contextlib.suppress(OSError):
        atomic_write_text(cached, json.dumps({**identity, "largest_id": largest}))
    return largest


def shard_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Training windows over every training shard; validation on the first ``data.shards.val_tokens`` tokens."""
    shard_format, train = open_shards(config.train, "train")
    _, val = open_shards(config.val, "val")
    length = config.text.max_seq_len
    if len(val) < config.shards.val_tokens + 1:
        raise DataError(
            f"bad value for 'data.shards.val_tokens': {config.shards.val_tokens:,}, but the shards '{config.val}' hold "
            f"{len(val):,} tokens (validation reads one more, the last target)"
        )
    vocab_size, separator, tokenizer_file = vocabulary(config, shard_format)
    training = TokenWindows(train, length, separator)
    evaluation = TokenWindows(val, length, separator, windows=config.shards.val_tokens // length)
    if len(training) == 0:
        raise DataError(f"the shards '{config.train}' hold no training window of {length + 1} tokens")
    facts = TextFacts(vocab_size, length, tokenizer_file, separator, separator_begins=True)
    return Datasets(training, evaluation, window_batch, facts)
