"""``data=token_mix``: several corpora mixed in set proportions of the training windows.

Each corpus of the list ``data.mix`` is a token store (``path``) or a set of llm.c shards (``train``,
``val``), opened as ``data=token_stream`` or ``data=token_shards`` opens it, and all share one
tokenizer. An epoch of the mixture has as many windows as the corpora together; corpus ``k`` of
weight ``w_k`` gives ``w_k`` of them (largest remainders), so a corpus given more than its size is
read more than once an epoch and one given less is read in part, each epoch carrying on where the
last stopped. Within a corpus, pass ``p`` over its windows visits them in the order of an affine
permutation ``q -> (a·q + b) mod n`` drawn from (seed, corpus, pass): a part read in one epoch is
spread over the whole corpus, not its first files. Which window sample ``(epoch, index)`` is
depends on nothing else, so the torch loader's (seed, epoch)-keyed order, its resume and any number
of ranks read the mixture as they read one corpus (Megatron's blends and MosaicML streaming's
streams weigh corpora alike; written here because neither library reads trainrun's stores).

Validation reads each corpus's own validation windows (its first ``data.text.val_tokens`` tokens,
as its kind reads them where unset); each batch says which corpus each window comes from, so the
task scores each corpus apart: ``eval_loss/<name>`` per corpus, and ``eval_loss`` their mean
weighted as training weighs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.causal_text import TokenWindows, stream_datasets, window_batch
from trainrun.data.interface import Datasets, TextFacts
from trainrun.data.token_shards import check_shards, shard_datasets
from trainrun.errors import DataError
from trainrun.schema import DataConfig


def shares(weights: list[float], total: int) -> np.ndarray:
    """``total`` split in proportion to ``weights``: floors, then one more for the largest remainders."""
    exact = np.asarray(weights, dtype=np.float64) / sum(weights) * total
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[: total - int(counts.sum())]] += 1
    return counts


@cache
def affine_order(seed: int, corpus: int, passes: int, windows: int) -> tuple[int, int]:
    """(a, b) of pass ``passes`` over a corpus of ``windows`` windows: a coprime to it, so that
    ``q -> (a·q + b) mod windows`` visits every window once."""
    generator = np.random.default_rng([seed, corpus, passes])
    while True:
        multiplier = int(generator.integers(1, max(2, windows)))
        if math.gcd(multiplier, windows) == 1:
            return multiplier, int(generator.integers(0, windows))


def gathered(corpora: list[TokenWindows], corpus: np.ndarray, window: np.ndarray) -> torch.Tensor:
    """Window ``window[i]`` of corpus ``corpus[i]`` for each i, as one batch: each corpus's windows
    gathered at once (:meth:`TokenWindows.__getitems__`), in the batch's order."""
    batch = torch.empty((len(corpus), corpora[0].max_seq_len + 1), dtype=torch.int64)
    for k in np.unique(corpus).tolist():
        rows = np.flatnonzero(corpus == k)
        batch[torch.from_numpy(rows)] = corpora[k].__getitems__(window[rows].tolist())
    return batch


class MixedWindows(Dataset):
    """The training windows of several corpora in set proportions (the module's rule). Torch's
    loader asks for ``(epoch, index)`` keys through :meth:`gather_keyed`; an index alone is read
    as epoch 0's."""

    def __init__(self, corpora: list[TokenWindows], weights: list[float]) -> None:
        self.corpora = corpora
        self.sizes = np.array([len(windows) for windows in corpora], dtype=np.int64)
        self.counts = shares(weights, int(self.sizes.sum()))  # each corpus's windows an epoch
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.gather_keyed(0, [(0, index)])[0]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.gather_keyed(0, [(0, index) for index in indices])

    def source_windows(self, seed: int, epochs: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(corpus, window in it) of each sample ``(epochs[i], index[i])``."""
        if index.size and (index.min() < 0 or index.max() >= len(self)):
            raise IndexError(f"window index out of range (0 to {len(self) - 1})")
        corpus = np.searchsorted(self.starts, index, side="right") - 1
        read = epochs * self.counts[corpus] + index - self.starts[corpus]  # the corpus's windows read before
        size = self.sizes[corpus]
        passes, position = read // size, read % size
        window = np.empty_like(index)
        for k, p in set(zip(corpus.tolist(), passes.tolist(), strict=True)):
            chosen = (corpus == k) & (passes == p)
            multiplier, offset = affine_order(seed, k, p, int(self.sizes[k]))
            window[chosen] = (multiplier * position[chosen] + offset) % self.sizes[k]
        return corpus, window

    def gather_keyed(self, seed: int, keys: list[tuple[int, int]]) -> torch.Tensor:
        """The windows of samples ``(epoch, index)`` under the run's ``seed``, gathered a corpus at a time."""
        epochs = np.array([epoch for epoch, _ in keys], dtype=np.int64)
        index = np.array([index for _, index in keys], dtype=np.int64)
        return gathered(self.corpora, *self.source_windows(seed, epochs, index))


class SourcedWindows(Dataset):
    """Every corpus's validation windows one after another; a batch is ``{"windows", "source"}``,
    the corpus of each window by its place in ``data.mix``."""

    def __init__(self, corpora: list[TokenWindows]) -> None:
        self.corpora = corpora
        self.starts = np.concatenate([[0], np.cumsum([len(windows) for windows in corpora])])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        index = np.asarray(indices, dtype=np.int64)
        corpus = np.searchsorted(self.starts, index, side="right") - 1
        windows = gathered(self.corpora, corpus, index - self.starts[corpus])
        return {"windows": windows, "source": torch.from_numpy(corpus)}


def sourced_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A validation batch as :meth:`SourcedWindows.__getitems__` gathered it, handed on as it is."""
    return batch


def source_config(config: DataConfig, index: int) -> tuple[DataConfig, Callable[[DataConfig, Placement], Datasets]]:
    """The config corpus ``index`` of ``data.mix`` is read with, and the builder that reads it (a
    store as ``data=token_stream`` reads one, shards as ``data=token_shards`` does)."""
    source = config.mix[index]
    if source.path and not (source.train or source.val):
        return dataclasses.replace(config, path=source.path, train=None, val=None), stream_datasets
    if source.train and source.val and not source.path:
        shards = config.shards
        if config.text.val_tokens is not None:
            shards = dataclasses.replace(shards, val_tokens=config.text.val_tokens)
        return dataclasses.replace(config, path=None, train=source.train, val=source.val, shards=shards), shard_datasets
    raise DataError(
        f"bad value for 'data.mix.{index}' ({source.name}): give a token store (path) or llm.c shards "
        "(train and val globs), not both"
    )


@contextlib.contextmanager
def named_errors(config: DataConfig, index: int) -> Iterator[None]:
    """Corpus ``index``'s data errors said with its key under ``data.mix``."""
    try:
        yield
    except DataError as error:
        raise type(error)(f"data.mix.{index} ({config.mix[index].name}): {error}") from error


def check_mix_files(config: DataConfig) -> None:
    """Each corpus's files are what its kind reads (shards: headers and ids, before the run), and
    all share one tokenizer."""
    for index in range(len(config.mix)):
        own, build = source_config(config, index)
        if build is shard_datasets:
            with named_errors(config, index):
                check_shards(own)
    mix_datasets(config)


def open_corpus(config: DataConfig, index: int, placement: Placement) -> Datasets:
    """Corpus ``index``'s datasets, any error of its files naming it by its place under ``data.mix``."""
    own, build = source_config(config, index)
    with named_errors(config, index):
        return build(own, placement)


def same_vocabulary(config: DataConfig, facts: list[TextFacts]) -> None:
    """Every corpus speaks the first one's tokenizer, its documents delimited alike; else one line."""
    first = facts[0]
    for index, other in enumerate(facts[1:], start=1):
        differs = [
            what
            for what, same in (
                ("delimiter layout (llm.c shards begin documents, token stores end them)",
                 other.separator_begins == first.separator_begins),
                (f"vocabulary ({other.vocab_size:,} against {first.vocab_size:,})",
                 other.vocab_size == first.vocab_size),
                (f"separator id ({other.separator} against {first.separator})", other.separator == first.separator),
                ("tokenizer.json", tokenizer_text(other.tokenizer_file) == tokenizer_text(first.tokenizer_file)),
            )
            if not same
        ]  # fmt: skip
        if differs:
            raise DataError(
                f"bad value for 'data.mix.{index}' ({config.mix[index].name}): its {differs[0]} differs from "
                f"{config.mix[0].name}'s; the corpora of a mixture share one tokenizer "
                "(write-text --tokenizer FIRST_STORE/tokenizer.json)"
            )


def tokenizer_text(path: Path | None) -> str | None:
    return path.read_text(encoding="utf-8") if path is not None and path.is_file() else None


def mix_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """The mixture's training windows and every corpus's validation windows, each batch sourced."""
    opened = [open_corpus(config, index, placement) for index in range(len(config.mix))]
    same_vocabulary(config, [sets.text for sets in opened])
    weights = [source.weight for source in config.mix]
    training = MixedWindows([sets.train for sets in opened], weights)
    evaluation = SourcedWindows([sets.val for sets in opened])
    facts = dataclasses.replace(
        opened[0].text,
        sources=tuple(source.name for source in config.mix),
        source_weights=tuple(weight / sum(weights) for weight in weights),
    )
    return Datasets(training, evaluation, window_batch, facts, eval_collate=sourced_batch)
