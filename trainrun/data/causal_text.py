"""Causal-language-model data: a token store read as one stream of documents, each followed by a
separator token, cut into windows of ``max_seq_len + 1`` tokens (inputs and their next tokens).

Windows are indexed, so the torch loader's sampler orders them by (seed, epoch) and a resume
skips into an epoch without reading what it skips; the validation windows are the stream's first
ones in order (those of the first ``data.text.val_tokens`` tokens where set), the same on any
number of ranks. The separator is the store's (``[SEP]`` in a
WordPiece store, ``<|endoftext|>`` in a byte-level BPE one, as GPT-2's). Windows are gathered from the store's
memory-mapped tokens as asked for: no copy of the stream is made.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.interface import Datasets, TextFacts
from trainrun.data.masked_text import cached_store
from trainrun.data.token_pieces import ConcatenatedTokens
from trainrun.data.token_store import TokenStore
from trainrun.errors import DataError
from trainrun.schema import DataConfig


class TokenWindows(Dataset):
    """Window ``i``: positions ``i·L … i·L + L`` of a token stream (L + 1 tokens), as int64.

    The stream is ``tokens`` with, where ``document_ends`` is given (a store's documents are kept
    bare), the ``separator`` after each document; llm.c's shards hold their separators already.
    ``windows`` caps how many are read (validation on a fixed number of tokens). A batch of windows
    is gathered in one indexing of the tokens (``__getitems__``, which torch's loader calls with a
    batch's indices): no Python work per window. Nothing is drawn at random, so a batch read at once
    equals its windows read one by one.
    """

    def __init__(
        self,
        tokens: np.ndarray | ConcatenatedTokens,
        max_seq_len: int,
        separator: int,
        document_ends: np.ndarray | None = None,
        windows: int | None = None,
    ) -> None:
        self.tokens, self.max_seq_len, self.separator = tokens, max_seq_len, separator
        self.separators = None
        length = len(tokens)
        if document_ends is not None:
            # where each document's separator sits in the stream: after its tokens and the separators before it
            self.separators = document_ends + np.arange(len(document_ends))
            length += len(self.separators)
        self.windows = max(0, (length - 1) // max_seq_len) if windows is None else windows

    @classmethod
    def of_store(cls, store: TokenStore, max_seq_len: int, tokens: int | None = None) -> TokenWindows:
        """The windows of one split of a token store: its documents, each followed by its separator;
        with ``tokens`` (``data.text.val_tokens``), only the windows of the stream's first that many
        tokens: one line where the split holds fewer (fewer would be scored than asked)."""
        windows = cls(store.tokens, max_seq_len, store.separator, store.offsets[1:])
        if tokens is not None:
            if tokens // max_seq_len > windows.windows:
                raise DataError(
                    f"bad value for 'data.text.val_tokens': {tokens:,}, but the store's validation split holds "
                    f"{windows.windows * max_seq_len:,} tokens in windows of {max_seq_len} (data.text.max_seq_len): "
                    "give at most that, or leave it unset to score them all"
                )
            windows.windows = tokens // max_seq_len
        return windows

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        index = np.asarray(indices, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.windows):
            raise IndexError(f"window index out of range (0 to {self.windows - 1})")
        positions = index[:, None] * self.max_seq_len + np.arange(self.max_seq_len + 1)
        if self.separators is None:
            return torch.from_numpy(self.tokens[positions].astype(np.int64))
        before = np.searchsorted(self.separators, positions)  # separators before each position (or at it)
        is_separator = self.separators[np.minimum(before, len(self.separators) - 1)] == positions
        tokens = self.tokens[np.where(is_separator, 0, positions - before)].astype(np.int64)
        return torch.from_numpy(np.where(is_separator, self.separator, tokens))


def window_batch(batch: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """A batch of windows as the loader collates it: gathered at once already, or stacked from single windows."""
    return batch if isinstance(batch, torch.Tensor) else torch.stack(batch)


def store_path(config: DataConfig, placement: Placement) -> Path:
    """The token store at ``data.path``, or a built-in corpus's (written once to the cache)."""
    return Path(config.path).expanduser() if config.path else cached_store(config, placement)


def validation_windows(path: Path, config: DataConfig) -> TokenWindows:
    """The validation windows of the store at ``path``: its held-out split, capped at
    ``data.text.val_tokens`` (one line where it holds fewer)."""
    return TokenWindows.of_store(TokenStore.open(path, "val"), config.text.max_seq_len, config.text.val_tokens)


def stream_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Training and validation windows of the store at ``data.path`` or of a built-in corpus."""
    path = store_path(config, placement)
    train, length = TokenStore.open(path, "train"), config.text.max_seq_len
    training = TokenWindows.of_store(train, length)
    evaluation = validation_windows(path, config)
    for name, windows in (("training", training), ("validation", evaluation)):
        if len(windows) == 0:
            raise DataError(f"token store '{path}' has no {name} window of {length + 1} tokens (data.text.max_seq_len)")
    facts = TextFacts(train.vocab_size, length, path / "tokenizer.json", train.separator)
    return Datasets(training, evaluation, window_batch, facts)
