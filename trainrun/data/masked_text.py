"""Masked-language-model samples from a token store: sequences cut, padded and masked on the fly.

A sample is ``[CLS] tokens [SEP]`` padded to ``max_seq_len``. ``packing="pad"`` cuts each document
into pieces of at most ``max_seq_len - 2`` tokens (the pieces of short documents are mostly
padding, as in the published BERT runs); ``"pack"`` lays the documents end to end with ``[SEP]``
between them and cuts that stream into full pieces. Masking follows BERT: each ordinary token is
chosen with probability ``mlm_probability``; a chosen token becomes ``[MASK]`` (80 %), a random
ordinary token (10 %) or stays (10 %), and only chosen tokens have labels (-100 elsewhere).
Training draws come from torch's default generator, which :class:`~trainrun.data.torch_loader.
AugmentedDataset` seeds per (seed, epoch, sample); evaluation masks are fixed per sample.

Everything a training step would otherwise compute on the device, with a read-back, comes with
the batch from the loader's workers (:func:`collate_masked`): each sequence's real-token count
(``lengths``) and number of predicted positions (``predict_counts``), both kept on the host, and
the positions to predict with their labels in (batch, slots) tensors padded to the batch's most.
From the counts the host knows which slots are real (:func:`predicted_slots`), so the output head
runs on exactly the predicted rows. (MLPerf pads to one fixed maximum because it masks a fixed
count; with BERT's per-token draws the count varies, and a fixed maximum would run the head on
padding.) Every one of these is per sequence, so micro-batches slice them like the rest.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.cache import cache_prefix, write_once
from trainrun.data.interface import Datasets, TextFacts
from trainrun.data.store_writer import write_token_store
from trainrun.data.token_store import (
    SPECIAL_TOKENS,
    TEXT_VAL_FRACTION,
    TokenStore,
    builtin_corpus_file,
    builtin_tokenizer_file,
    file_sha256,
    read_documents,
    split_documents,
)
from trainrun.errors import DataError
from trainrun.schema import DataConfig

IGNORED = -100  # the label of tokens that are not predicted (torch's cross-entropy ignore_index)


def collate_masked(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A batch of :class:`MaskedSequences` samples: stacked, with ``lengths``, ``predict_counts``
    and each sequence's ``predict_positions`` (padded with 0, the always-real [CLS]) and
    ``predicted_labels`` (padded with -100) in slots of the batch's most."""
    batch = {key: torch.stack([sample[key] for sample in samples]) for key in ("input_ids", "attention_mask", "labels")}
    counts = torch.tensor([len(sample["predict_positions"]) for sample in samples])
    slots = max(1, int(counts.max()))
    positions = torch.zeros(len(samples), slots, dtype=torch.int64)
    for row, sample in enumerate(samples):
        positions[row, : counts[row]] = sample["predict_positions"]
    used = torch.arange(slots)[None, :] < counts[:, None]
    batch["lengths"] = batch["attention_mask"].sum(1)
    batch["predict_counts"] = counts
    batch["predict_positions"] = positions
    batch["predicted_labels"] = torch.where(used, batch["labels"].gather(1, positions), IGNORED)
    return batch


@torch.compiler.disable
def predicted_slots(counts: torch.Tensor, width: int, device: torch.device) -> torch.Tensor:
    """The flat indices, into (batch, ``width``) slots, of each sequence's first ``counts`` slots
    (its predictions), row-major; built on the host from host counts (read as numbers: trainrun
    estimate's fake tensors run this with the loader's real counts), then sent to ``device``."""
    return torch.from_numpy(slots_of(np.asarray(counts.tolist(), dtype=np.int64), width)).to(device, non_blocking=True)


def slots_of(counts: np.ndarray, width: int) -> np.ndarray:
    """:func:`predicted_slots` of host ``counts`` as numbers: NumPy, half the time torch's host ops took
    (27 against 56 us for 256 sequences of 128 slots, one thread)."""
    starts = np.cumsum(counts) - counts
    within = np.arange(int(counts.sum())) - np.repeat(starts, counts)
    return np.repeat(np.arange(len(counts)) * width, counts) + within


def document_pieces(offsets: np.ndarray, body: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) in the stream of every ``body``-token piece of each document (``offsets``:
    where each begins, then the end), in order: NumPy over all documents at once (a Python array a
    document was gigabytes at 30 million documents)."""
    lengths = np.diff(offsets)
    counts = -(-lengths // body)  # pieces a document (none for an empty one)
    first = np.cumsum(counts) - counts  # each document's first piece
    starts = np.arange(int(counts.sum()), dtype=np.int64)  # in place from here: one array a step
    starts -= np.repeat(first, counts)  # each piece's number within its document
    starts *= body
    starts += np.repeat(offsets[:-1], counts)
    ends = np.repeat(offsets[1:], counts)
    return starts, np.minimum(ends, starts + body, out=ends)


class MaskedSequences(Dataset):
    """The samples of one split of ``store``; ``fixed_masks`` draws each sample's mask from its index."""

    def __init__(
        self, store: TokenStore, max_seq_len: int, packing: str, mlm_probability: float, fixed_masks: bool = False
    ) -> None:
        self.store, self.max_seq_len, self.packing = store, max_seq_len, packing
        self.mlm_probability, self.fixed_masks = mlm_probability, fixed_masks
        self.vocab_size = store.vocab_size
        self.tokenizer_file = store.path / "tokenizer.json"
        store.check_special_tokens(SPECIAL_TOKENS, "masked language modelling")
        self.cls, self.sep, self.pad, self.mask = (store.special(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"))
        self.specials = torch.tensor(sorted(set(store.meta["special"].values())))
        # random replacements are ordinary tokens (a given tokenizer may place its special ones anywhere)
        vocabulary = torch.arange(store.vocab_size)
        self.ordinary_ids = vocabulary[~torch.isin(vocabulary, self.specials)]
        body, offsets = max_seq_len - 2, store.offsets
        if packing == "pad":  # each document cut into pieces of `body` tokens, all documents at once
            self.starts, self.ends = document_pieces(np.asarray(offsets, dtype=np.int64), body)
        else:  # positions in the stream of documents each followed by one [SEP]
            self.stream_offsets = offsets + np.arange(len(offsets))
            self.starts = np.arange(0, self.stream_offsets[-1], body)
            self.ends = np.minimum(self.starts + body, self.stream_offsets[-1])

    def __len__(self) -> int:
        return len(self.starts)

    def real_token_share(self) -> float:
        """The share of a sample's ``max_seq_len`` positions that hold tokens ([CLS] and [SEP] among
        them), the rest padding: what unpadding saves is the rest."""
        return float(np.mean(self.ends - self.starts + 2) / self.max_seq_len)

    def tokens(self, index: int) -> np.ndarray:
        """Sample ``index``'s tokens between [CLS] and [SEP]."""
        start, end = int(self.starts[index]), int(self.ends[index])
        if self.packing == "pad":
            return np.asarray(self.store.tokens[start:end], dtype=np.int64)
        parts, document = [], int(np.searchsorted(self.stream_offsets, start, side="right")) - 1
        while start < end:
            document_end = int(self.stream_offsets[document + 1]) - 1  # where its [SEP] sits in the stream
            take = min(end, document_end) - start
            first = int(self.store.offsets[document]) + start - int(self.stream_offsets[document])
            parts.append(np.asarray(self.store.tokens[first : first + take], dtype=np.int64))
            start += take
            if start < end:  # the document's [SEP]
                parts.append(np.array([self.sep], dtype=np.int64))
                start, document = start + 1, document + 1
        return np.concatenate(parts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        body = torch.from_numpy(self.tokens(index))
        length = len(body) + 2
        ids = torch.full((self.max_seq_len,), self.pad, dtype=torch.int64)
        ids[0], ids[1 : length - 1], ids[length - 1] = self.cls, body, self.sep
        generator = torch.Generator().manual_seed(index) if self.fixed_masks else None
        draws = torch.rand(3, self.max_seq_len, generator=generator)
        ordinary = ~torch.isin(ids, self.specials)
        chosen = ordinary & (draws[0] < self.mlm_probability)
        labels = torch.where(chosen, ids, IGNORED)
        masked = chosen & (draws[1] < 0.8)
        randomised = chosen & ~masked & (draws[1] < 0.9)
        replacements = self.ordinary_ids[(draws[2] * len(self.ordinary_ids)).long()]
        inputs = torch.where(masked, self.mask, torch.where(randomised, replacements, ids))
        attention = torch.zeros(self.max_seq_len, dtype=torch.int64)
        attention[:length] = 1
        positions = chosen.nonzero().squeeze(1)
        return {"input_ids": inputs, "attention_mask": attention, "labels": labels, "predict_positions": positions}


def text_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Training and evaluation samples of the store at ``data.path`` or of a built-in corpus (masks are
    drawn per epoch either way)."""
    path = Path(config.path).expanduser() if config.path else cached_store(config, placement)
    train, val = TokenStore.open(path, "train"), TokenStore.open(path, "val")
    if len(train.tokens) == 0 or len(val.tokens) == 0:
        raise DataError(f"token store '{path}' has no {'training' if len(train.tokens) == 0 else 'validation'} text")
    text = config.text
    training = MaskedSequences(train, text.max_seq_len, text.packing, text.mlm_probability)
    facts = TextFacts(training.vocab_size, training.max_seq_len, training.tokenizer_file, train.separator)
    evaluation = MaskedSequences(val, text.max_seq_len, text.packing, text.eval_mlm_probability, fixed_masks=True)
    return Datasets(training, evaluation, collate_masked, facts)  # predicted positions padded per batch


def shipped_tokenizer(config: DataConfig) -> Path | None:
    """The tokenizer trainrun ships for the run's built-in corpus, where the run trains on the split it
    was trained on (the corpus's: :data:`~trainrun.data.token_store.TEXT_VAL_FRACTION`, the default
    seed) at a shipped vocabulary (what it would train, the same on every machine); else None."""
    if (config.val_fraction, config.split_seed) != (TEXT_VAL_FRACTION, DataConfig().split_seed):
        return None
    shipped = builtin_tokenizer_file(config.text.corpus, config.text.tokenizer, config.text.vocab_size)
    return shipped if shipped.is_file() else None


def cached_store(config: DataConfig, placement: Placement) -> Path:
    """A built-in corpus's store in ``cache_dir``, written once per node with the tokenizer trainrun
    ships for it (:func:`shipped_tokenizer`), or one trained here, every node's then global rank 0's:
    WordPiece training is not deterministic upstream, so nodes that trained their own would give the
    same word different ids."""
    corpus, vocab_size = config.text.corpus, config.text.vocab_size
    kind = config.text.tokenizer
    identity = {"corpus": corpus, "vocab_size": vocab_size, "tokenizer": kind, "val_fraction": config.val_fraction}
    identity["split_seed"] = config.split_seed
    identity["documents"] = file_sha256(builtin_corpus_file(corpus))  # the shipped corpus, should it change
    shipped = shipped_tokenizer(config)
    identity["shipped_tokenizer"] = file_sha256(shipped) if shipped else None  # else one trained here
    prefix = cache_prefix(config.cache_dir, corpus, identity)
    path = prefix.with_name(f"{prefix.name}-tokens")
    tokenizer_file = path / "tokenizer.json"

    def write(tokenizer: str | None = None) -> None:
        train, val = split_documents(read_documents(corpus), config.val_fraction, config.split_seed)
        with tempfile.TemporaryDirectory() as folder:
            given = shipped
            if tokenizer is not None:
                given = Path(folder) / "tokenizer.json"
                given.write_text(tokenizer)
            write_token_store(train, val, path, vocab_size, given, kind=kind)

    if placement.rank == 0:
        write_once(prefix, tokenizer_file.is_file, write)
    if placement.world_size > 1:
        shared = [tokenizer_file.read_text() if placement.rank == 0 else None]
        dist.broadcast_object_list(shared, src=0, device=torch.device("cpu"))
        own = tokenizer_file.read_text() if tokenizer_file.is_file() else None
        if placement.local_rank == 0 and placement.rank != 0 and own != shared[0]:
            write(shared[0])
        dist.barrier()
    return path
