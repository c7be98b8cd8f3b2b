"""Text corpora stored as token ids: memory-mapped files of ids and each document's start.

The layout nanoGPT and Megatron use, in shards: ``<split>-NNNNNN.bin`` holds documents' token ids
back to back (uint16 when the vocabulary fits, else uint32), ``<split>-NNNNNN.idx.npy`` the offset
of each of its documents (one more than there are documents); a split's shards, in order, are its
documents (``trainrun-tokens/2``, written by :mod:`trainrun.data.store_writer`). Stores of
``trainrun-tokens/1`` (one ``<split>.bin`` and ``<split>.idx.npy``) are read as one shard. Beside
them: ``tokenizer.json`` (a Hugging Face ``tokenizers`` tokenizer: WordPiece as BERT's or
byte-level BPE as GPT-2's, trained on training documents, or one the user gives, GPT-2's or
Llama's say) and ``store.json`` (format, dtype, sizes, special-token ids, the document separator,
the tokenizer's SHA-256, each split's shards).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainrun.atomic_io import read_json
from trainrun.data.token_pieces import ConcatenatedTokens, MappedTokens, one_array
from trainrun.errors import ConfigError, DataError, FileFormatError
from trainrun.python_parsing import parse_python

FORMATS = ("trainrun-tokens/1", "trainrun-tokens/2")  # what a store says it is: one file per split, shards
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # a WordPiece store's, which masked LM reads
END_OF_TEXT = "<|endoftext|>"  # a byte-level BPE store's one special token, as GPT-2's
# the token that ends a document in a causal stream: the first of these the tokenizer has
# (BERT's, GPT-2's, Llama 3's, Llama 2's and Mistral's)
SEPARATORS = ("[SEP]", END_OF_TEXT, "<|end_of_text|>", "</s>")
BYTE_ALPHABET = 256  # a byte-level BPE vocabulary starts from every byte
BUILTIN_CORPORA = ("stdlib_docs",)
BUILTIN = Path(__file__).with_name("builtin")  # the built-in corpora and their tokenizers (scripts/builtin_corpus.py)
TEXT_VAL_FRACTION = 0.05  # documents held out of a corpus (conf/data/stdlib_docs.yaml says the same: a test checks)
TOKEN_DTYPES = {"uint16": 2**16, "uint32": 2**32}  # how many token ids each type holds, smallest first


def stdlib_docstrings(min_chars: int = 40) -> list[str]:
    """The docstrings of this Python's standard library (modules, classes, functions), read with
    ``ast`` from the installed sources, in a fixed order: about 1.5 MB of English prose (the built-in
    corpus trainrun ships, ``scripts/builtin_corpus.py``)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages", "test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo"}
    documents = []
    for path in sorted(root.rglob("*.py")):
        if skipped & set(path.relative_to(root).parts):
            continue
        try:
            tree = parse_python(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node)
                if text and len(text) >= min_chars:
                    documents.append(text)
    return documents


def builtin_corpus_file(corpus: str) -> Path:
    """The documents of built-in ``corpus`` as trainrun ships them (JSON lines, gzipped)."""
    return BUILTIN / f"{corpus}.jsonl.gz"


def builtin_tokenizer_file(corpus: str, kind: str, vocab_size: int) -> Path:
    """Where trainrun ships built-in ``corpus``'s ``kind`` tokenizer of ``vocab_size`` (which may not exist)."""
    return BUILTIN / f"{corpus}-{kind}-{vocab_size}.json"


def read_documents(source: str) -> list[str]:
    """Every document of a built-in corpus (as trainrun ships it: the same on every machine) or of the
    corpus at ``source`` (:mod:`trainrun.data.corpus`'s kinds), in order, held in memory: for small
    corpora (the built-in ones, tests)."""
    from trainrun.data.corpus import corpus_files, records

    if source in BUILTIN_CORPORA:
        with gzip.open(builtin_corpus_file(source), "rt", encoding="utf-8") as lines:
            return [json.loads(line)["text"] for line in lines]
    documents = [text for _, text, _, _ in records(corpus_files(source), "text") if text and text.strip()]
    if not documents:
        raise DataError(f"corpus '{source}' has no text")
    return documents


STORE_KEYS = ("format", "dtype", "vocab_size", "special", "tokenizer_sha256")  # what store.json must hold


def separator_of(meta: dict) -> str:
    """The token that ends each document in the store ``meta`` describes (stores written before
    trainrun recorded it are WordPiece ones, ended by [SEP])."""
    return meta.get("separator", "[SEP]")


def load_tokenizer(path: Path):
    """The ``tokenizers`` tokenizer saved at ``path`` (a ``tokenizer.json``), or one line naming the file."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises its own exception types, one per parse failure
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise FileFormatError(f"'{path}' is not a tokenizer.json of the tokenizers library ({reason})") from None


def split_documents(documents: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """A fixed, seeded split into training and validation documents."""
    order = np.random.default_rng(seed).permutation(len(documents))
    count = max(1, round(len(documents) * val_fraction)) if len(documents) > 1 else 0
    val = sorted(order[:count].tolist())
    chosen = set(val)
    return [d for i, d in enumerate(documents) if i not in chosen], [documents[i] for i in val]


def train_tokenizer(documents: Iterable[str], vocab_size: int, kind: str = "wordpiece"):
    """A tokenizer trained on ``documents`` with Hugging Face ``tokenizers``: ``wordpiece``, BERT's
    (lower-cased, with BERT's special tokens), or ``bpe``, GPT-2's byte-level BPE (every byte in the
    vocabulary, so no text is unknown; ``<|endoftext|>`` its one special token)."""
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer

    if kind == "bpe":
        tokenizer, special = ByteLevelBPETokenizer(), [END_OF_TEXT]
    else:
        tokenizer, special = BertWordPieceTokenizer(lowercase=True), list(SPECIAL_TOKENS)
    tokenizer.train_from_iterator(documents, vocab_size=vocab_size, special_tokens=special, show_progress=False)
    return tokenizer._tokenizer  # the underlying tokenizers.Tokenizer, which saves to one JSON file


def check_vocab_size(vocab_size: int, kind: str) -> None:
    """Refuse a vocabulary too small for a ``kind`` tokenizer to be trained to, or too large for a token id type."""
    smallest, largest = BYTE_ALPHABET + 1 if kind == "bpe" else 16, max(TOKEN_DTYPES.values())
    if vocab_size < smallest:
        reason = " (every byte and <|endoftext|>)" if kind == "bpe" else ""
        raise ConfigError(f"bad value for '--vocab-size': {vocab_size} (at least {smallest} for {kind}{reason})")
    if vocab_size > largest:
        raise ConfigError(f"bad value for '--vocab-size': {vocab_size:,} (at most {largest:,}: a uint32 token id)")


def smallest_token_dtype(vocab_size: int) -> str:
    """The smallest type that holds every id of a ``vocab_size`` vocabulary (ids 0 to vocab_size - 1)."""
    return next(name for name, ids in TOKEN_DTYPES.items() if vocab_size <= ids)


def check_token_dtype(vocab_size: int, dtype: str) -> None:
    """Refuse a token id type that cannot hold every id of a ``vocab_size`` vocabulary."""
    if vocab_size > TOKEN_DTYPES[dtype]:
        raise ConfigError(
            f"bad value for '--dtype': {dtype} holds {TOKEN_DTYPES[dtype]:,} token ids; the vocabulary has "
            f"{vocab_size:,} (choose uint32 or auto)"
        )


def store_facts(tokenizer_file: Path, dtype: str, given: Path | None = None) -> dict:
    """What ``store.json`` says of the tokenizer at ``tokenizer_file``: the token id type (``auto``:
    the smallest that fits), vocabulary, special tokens and the document separator (``given``: the
    tokenizer's path as the user named it, for the line that refuses one without a separator)."""
    tokenizer = load_tokenizer(tokenizer_file)
    separator = next((token for token in SEPARATORS if tokenizer.token_to_id(token) is not None), None)
    if separator is None:
        raise DataError(
            f"tokenizer '{given or tokenizer_file}' has no token to end a document with "
            f"(one of {', '.join(SEPARATORS)})"
        )
    vocab = tokenizer.get_vocab_size()
    if dtype == "auto":
        dtype = smallest_token_dtype(vocab)
    check_token_dtype(vocab, dtype)
    special = {
        token: tokenizer.token_to_id(token)
        for token in dict.fromkeys(SPECIAL_TOKENS + SEPARATORS)
        if tokenizer.token_to_id(token) is not None
    }
    return {"dtype": np.dtype(dtype).name, "vocab_size": vocab, "special": special, "separator": separator}


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, read in 16 MB pieces (a store's shards are tens of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for piece in iter(lambda: handle.read(1 << 24), b""):
            digest.update(piece)
    return digest.hexdigest()


def _offsets(path: Path) -> np.ndarray:
    """A store's document offsets (``.idx.npy``): rising integers from 0; one line naming the file if not."""
    try:
        offsets = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise FileFormatError(f"'{path}' is not a token store index (a NumPy .npy file): {error}") from None
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) == 0 or offsets[0] != 0:
        raise FileFormatError(f"'{path}' is not a token store index (rising document offsets from 0)")
    return offsets


@dataclass
class TokenStore:
    """An opened store: one split's tokens (memory-mapped) and document offsets, and its metadata."""

    path: Path
    tokens: np.ndarray | ConcatenatedTokens  # the split's shards end to end
    offsets: np.ndarray  # each document's start in them, and their end
    meta: dict

    @classmethod
    def open(cls, path: Path, split: str) -> TokenStore:
        path = Path(path).expanduser()
        meta_path = path / "store.json"
        if not meta_path.is_file():
            raise DataError(f"'{path}' is not a token store (no store.json; write one with 'trainrun write-text')")
        meta = read_json(meta_path)
        if not isinstance(meta, dict):
            raise DataError(f"'{meta_path}' is not a trainrun token store's description ({type(meta).__name__})")
        if meta.get("format") not in FORMATS:
            raise DataError(f"'{path}' is a token store of another format ({meta.get('format')})")
        missing = [key for key in STORE_KEYS if key not in meta]
        if missing:
            raise DataError(
                f"'{meta_path}' lacks {', '.join(missing)}: write the store again with 'trainrun write-text'"
            )
        if not (path / "tokenizer.json").is_file():
            raise DataError(f"token store '{path}' has no tokenizer.json: write it again with 'trainrun write-text'")
        if file_sha256(path / "tokenizer.json") != meta["tokenizer_sha256"]:
            raise DataError(f"'{path / 'tokenizer.json'}' is not the tokenizer the store was written with")
        if meta["vocab_size"] > TOKEN_DTYPES.get(meta["dtype"], 0):
            raise DataError(f"'{meta_path}': a vocabulary of {meta['vocab_size']:,} does not fit {meta['dtype']} ids")
        names = [split] if meta["format"] == FORMATS[0] else [shard["name"] for shard in meta[split]["shards"]]
        pieces, offsets = [], [np.zeros(1, np.int64)]
        for name in names:
            for file in (f"{name}.idx.npy", f"{name}.bin"):
                if not (path / file).is_file():
                    raise DataError(f"token store '{path}' has no {file}: write it again with 'trainrun write-text'")
            shard_offsets = _offsets(path / f"{name}.idx.npy")
            file = path / f"{name}.bin"
            found, said = file.stat().st_size // np.dtype(meta["dtype"]).itemsize, int(shard_offsets[-1])
            tokens = MappedTokens(file, meta["dtype"], said) if said else []
            if found != said:
                raise DataError(f"'{path / f'{name}.bin'}' holds {found} tokens, its index says {said}")
            pieces.append(tokens)
            offsets.append(shard_offsets[1:] + offsets[-1][-1])
        tokens, offsets = one_array(pieces, meta["dtype"]), np.concatenate(offsets)
        return cls(path, tokens, offsets, meta)

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    def special(self, token: str) -> int:
        return self.meta["special"][token]

    @property
    def separator(self) -> int:
        """The id of the token that ends each document in a causal stream."""
        return self.special(separator_of(self.meta))

    def check_special_tokens(self, tokens: Iterable[str], task: str) -> None:
        """Refuse a store whose tokenizer lacks one of ``tokens``, which ``task`` reads."""
        missing = [token for token in tokens if token not in self.meta["special"]]
        if missing:
            raise DataError(
                f"token store '{self.path}' has no {', '.join(missing)} token: {task} needs a WordPiece store "
                "(trainrun write-text with --tokenizer-kind wordpiece, or a --tokenizer that has them)"
            )

    def documents(self) -> Iterator[np.ndarray]:
        for start, end in zip(self.offsets[:-1], self.offsets[1:]):
            yield self.tokens[start:end]
