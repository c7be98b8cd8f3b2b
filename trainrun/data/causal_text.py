"""Causal-language-model data: a token store read as one stream of documents, each followed by a
separator token, cut into windows of ``max_seq_len + 1`` tokens (inputs and their next tokens).

Windows are indexed, so the torch loader's sampler orders them by (seed, epoch) and a resume
skips into an epoch without reading what it skips; the validation windows are the stream's first
ones in order, the same on any number of ranks. The separator is the store's (``[SEP]`` in a
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
from trainrun.data.token_store import TokenStore
from trainrun.errors import DataError
from trainrun.schema import DataConfig


class TokenWindows(Dataset):
    """Window ``i``: tokens ``i·L … i·L + L`` of the stream (L + 1 of them), as int64."""

    def __init__(self, store: TokenStore, max_seq_len: int) -> None:
        self.store, self.max_seq_len = store, max_seq_len
        self.separator = store.separator
        # where each document's separator sits in the stream: after its tokens and the separators before it
        self.separators = store.offsets[1:] + np.arange(len(store.offsets) - 1)
        self.length = len(store.tokens) + len(self.separators)
        self.windows = (self.length - 1) // max_seq_len

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.windows:
            raise IndexError(index)
        positions = np.arange(index * self.max_seq_len, (index + 1) * self.max_seq_len + 1)
        before = np.searchsorted(self.separators, positions)  # separators before each position (or at it)
        is_separator = self.separators[np.minimum(before, len(self.separators) - 1)] == positions
        tokens = self.store.tokens[np.where(is_separator, 0, positions - before)].astype(np.int64)
        return torch.from_numpy(np.where(is_separator, self.separator, tokens))


def store_path(config: DataConfig, placement: Placement) -> Path:
    """The token store at ``data.path``, or a built-in corpus's (written once to the cache)."""
    return Path(config.path).expanduser() if config.path else cached_store(config, placement)


def stream_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Training and validation windows of the store at ``data.path`` or of a built-in corpus."""
    path = store_path(config, placement)
    train, val = TokenStore.open(path, "train"), TokenStore.open(path, "val")
    length = config.text.max_seq_len
    training, evaluation = TokenWindows(train, length), TokenWindows(val, length)
    for name, windows in (("training", training), ("validation", evaluation)):
        if len(windows) == 0:
            raise DataError(f"token store '{path}' has no {name} window of {length + 1} tokens (data.text.max_seq_len)")
    facts = TextFacts(train.vocab_size, length, path / "tokenizer.json", train.separator)
    return Datasets(training, evaluation, None, facts)
