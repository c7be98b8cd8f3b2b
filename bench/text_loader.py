"""Text loading: trainrun's token store against tokenizing on the fly, and against training.

The baseline is how Mosaic BERT's and most Hugging Face pretraining scripts feed BERT: each
document tokenized when it is read (``transformers``' fast tokenizer, truncated and padded to
``--seq``) and masked by ``DataCollatorForLanguageModeling``. trainrun reads the same training
documents, tokenized once into a token store, through ``data=text``'s loader: ids sliced from the
memory-mapped file, padded and masked in the worker (documents longer than a sequence become
several sequences instead of being cut). Both run through a DataLoader with ``--workers``
workers and batch ``--batch``; rounds alternate, the best of each counts. Throughput is in real
(non-pad) tokens per second. Then the BERT training step (BERT-Tiny and BERT-Mini, AdamW, fp32,
one process) is timed on the store's batches: the share of a step that loading in the training
process costs is training tokens/s over store tokens/s. Target: the store is never the
bottleneck on 2 cores (that share well under 10 %) and beats tokenizing on the fly.

    .venv/bin/python bench/text_loader.py [--seq 128] [--batch 32] [--workers 0] [--batches 100] [--rounds 3]

``--windows`` measures instead a causal LM's loader at GPU size: windows of ``--seq`` (1,024) tokens
in batches of ``--batch`` from a token store of ``--tokens`` random ids in 16 shards and from the
same ids as llm.c token shards (``data=token_shards``), through the torch loader with 0, 1 and 2
workers, each batch gathered at once (as trainrun reads it) and window by window (as it read them
before): tokens per second, and per worker, against what one GPU of the speedrun reads.

    .venv/bin/python bench/text_loader.py --windows [--seq 1024] [--batch 64] [--tokens 100000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainrun.core.distributed import SINGLE_PROCESS
from trainrun.data.interface import datasets
from trainrun.data.masked_text import cached_store, text_datasets
from trainrun.data.token_store import read_documents, split_documents
from trainrun.data.torch_loader import TorchData
from trainrun.models.build import build_model
from trainrun.models.weights import hugging_face_tokenizer
from trainrun.optim.optimizers import build_optimizer
from trainrun.schema import BertConfig, DataConfig, ModelConfig, OptimizerConfig, TextConfig
from trainrun.tasks.masked_lm import masked_cross_entropy

MODELS = {  # Turc et al.'s small BERTs
    "BERT-Tiny": ModelConfig(name="bert", bert=BertConfig(layers=2, hidden_size=128, heads=2, intermediate_size=512)),
    "BERT-Mini": ModelConfig(name="bert", bert=BertConfig(layers=4, hidden_size=256, heads=4, intermediate_size=1024)),
}


class TokenizedOnTheFly(Dataset):
    """Documents tokenized when read, truncated and padded to ``seq`` (masking is the collator's)."""

    def __init__(self, documents: list[str], tokenizer, seq: int) -> None:
        self.documents, self.tokenizer, self.seq = documents, tokenizer, seq

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, index: int) -> dict:
        return self.tokenizer(
            self.documents[index],
            truncation=True,
            max_length=self.seq,
            padding="max_length",
            return_special_tokens_mask=True,
        )


def tokens_per_second(batches: Iterable, count: int) -> float:
    """Real tokens per second over the first ``count`` batches (the iterator's start-up included)."""
    tokens, started = 0, time.perf_counter()
    for index, batch in enumerate(batches):
        tokens += int(batch["attention_mask"].sum())
        if index + 1 == count:
            break
    return tokens / (time.perf_counter() - started)


def training_tokens_per_second(config: ModelConfig, data: TorchData, steps: int) -> float:
    """Real tokens per second of BERT training steps on batches already loaded."""
    torch.manual_seed(0)
    model = build_model(config, data.text)
    optimizer = build_optimizer(model, OptimizerConfig(name="adamw", lr=1e-4), data.per_rank_batch)
    loaded = [batch for batch, _ in zip(data.train_batches(0), range(steps))]
    tokens, started = 0, None
    for index, batch in enumerate([loaded[0], *loaded]):  # the first step warms up, untimed
        if index == 1:
            started = time.perf_counter()
        inputs = {
            key: batch[key] for key in ("input_ids", "attention_mask", "lengths", "predict_positions", "predict_counts")
        }
        targets = {"labels": batch["labels"], "predicted": batch["predicted_labels"], "counts": batch["predict_counts"]}
        masked_cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(batch["attention_mask"].sum()) if index else 0
    return tokens / (time.perf_counter() - started)


# The speedrun's need per GPU: record 21 read 393,216 tokens a step, 1,770 steps in 176 s on 8 GPUs
# (3.95 M tokens/s in all, 0.49 M per GPU); the newest records read about 5 M/s, 0.7 M per GPU.
GPU_NEED = 0.7e6


class WindowByWindow(Dataset):
    """A windows data set read one window per call (no batch gather): how windows were read before."""

    def __init__(self, windows) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.windows[index]


def write_llmc_shard(path: Path, tokens: np.ndarray) -> None:
    """A GPT-2 uint16 shard as llm.c writes it: a 256 x int32 header (magic, version, count), the ids."""
    header = np.zeros(256, np.int32)
    header[:3] = 20240520, 1, len(tokens)
    path.write_bytes(header.tobytes() + tokens.astype(np.uint16).tobytes())


def write_window_sources(folder: Path, tokens: int) -> dict[str, list[str]]:
    """A 16-shard token store and llm.c shards of the same ``tokens`` random ids; each source's data
    overrides, and a mixture of the store with itself."""
    from trainrun.data.store_writer import ShardWriter, store_meta
    from trainrun.data.token_store import stdlib_docstrings, store_facts, train_tokenizer

    store = folder / "store"
    store.mkdir()
    train_tokenizer(stdlib_docstrings()[:2000], 4096, "bpe").save(str(store / "tokenizer.json"))
    facts = store_facts(store / "tokenizer.json", "auto")
    generator = np.random.default_rng(0)
    ids = generator.integers(0, facts["vocab_size"], tokens, dtype=np.uint16)
    entries = []
    for index, piece in enumerate(np.array_split(ids, 16)):
        lengths = np.diff(np.unique(np.r_[0, generator.integers(0, len(piece), len(piece) // 1000), len(piece)]))
        writer = ShardWriter(store, index, facts["dtype"])
        writer.add("train", piece, lengths)
        writer.add("val", piece[:5000], np.array([5000]))
        entries.append(writer.close(index))
        write_llmc_shard(folder / f"shard_{index:06d}.bin", piece)
    write_llmc_shard(folder / "val_000000.bin", ids[: 2 * 8192])  # validation: a shard of its own
    digest = hashlib.sha256((store / "tokenizer.json").read_bytes()).hexdigest()
    (store / "store.json").write_text(json.dumps(store_meta(facts, digest, entries)))
    shards = [f"data.train={folder}/shard_*.bin", f"data.val={folder}/val_000000.bin", "data.shards.val_tokens=8192"]
    mix = f"data.mix=[{{name: a, path: {store}, weight: 0.7}}, {{name: b, path: {store}, weight: 0.3}}]"
    return {
        "token store": ["data=token_stream", f"data.path={store}"],
        "llm.c shards": ["data=token_shards", *shards],
        "mixture": ["data=token_mix", mix],  # the store twice, 70/30: what mixing adds to one store's reads
    }


def window_rates(args: argparse.Namespace) -> None:
    from trainrun.config import check

    with tempfile.TemporaryDirectory() as folder:
        sources = write_window_sources(Path(folder), args.tokens)
        print(
            f"windows of {args.seq} tokens, batch {args.batch}, {args.tokens:,} tokens in 16 shards, {args.batches} "
            f"batches x {args.rounds} rounds "
            f"(best, after the workers start), torch {torch.__version__}; one GPU of the speedrun reads about "
            f"{GPU_NEED / 1e6:.1f} M tokens/s"
        )
        for name, overrides in sources.items():
            for workers in (0, 1, 2):
                rates = {}
                for mode in ("batch gather", "window by window"):
                    common = [
                        "task=causal_lm",
                        "model=gpt125",
                        f"data.text.max_seq_len={args.seq}",
                    ]
                    config = check([*common, *overrides, f"data.num_workers={workers}"])[0]
                    sets = datasets(config.data)
                    data = TorchData(config.data, sets, args.batch, args.batch, seed=0)
                    if mode == "window by window":
                        data.train_set.dataset = WindowByWindow(data.train_set.dataset)
                    best = 0.0
                    for _ in zip(data.train_batches(0), range(2)):  # untimed: the workers start
                        pass
                    for round_index in range(args.rounds):
                        started, count = time.perf_counter(), 0
                        for count, _ in enumerate(data.train_batches(round_index), 1):
                            if count == args.batches:
                                break
                        best = max(best, count * args.batch * (args.seq + 1) / (time.perf_counter() - started))
                    rates[mode] = best
                per_worker = rates["batch gather"] / max(1, workers)
                print(
                    f"{name:<13} {workers} workers: {rates['batch gather'] / 1e6:6.2f} M tokens/s "
                    f"({per_worker / 1e6:.2f} M per worker, {per_worker / GPU_NEED:.1f}x a GPU's need); "
                    f"window by window {rates['window by window'] / 1e6:.2f} M "
                    f"({rates['batch gather'] / rates['window by window']:.1f}x slower)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batches", type=int, default=100, help="batches read per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="training steps timed per model")
    parser.add_argument("--windows", action="store_true", help="a causal LM's windows from a store and from shards")
    parser.add_argument("--tokens", type=int, default=100_000_000, help="--windows: random ids written")
    args = parser.parse_args()
    if args.windows:
        return window_rates(args)
    from transformers import DataCollatorForLanguageModeling

    config = DataConfig(
        name="text", num_workers=args.workers, text=TextConfig(corpus="stdlib_docs", max_seq_len=args.seq)
    )
    store = TorchData(config, text_datasets(config), args.batch, args.batch, seed=0)
    documents, _ = split_documents(read_documents(config.text.corpus), config.val_fraction, config.split_seed)
    tokenizer = hugging_face_tokenizer(cached_store(config, SINGLE_PROCESS) / "tokenizer.json")
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=config.text.mlm_probability)
    on_the_fly = DataLoader(
        TokenizedOnTheFly(documents, tokenizer, args.seq),
        batch_size=args.batch,
        shuffle=True,
        collate_fn=collator,
        num_workers=args.workers,
        drop_last=True,
    )
    rates: dict[str, list[float]] = {"tokenized on the fly": [], "token store": []}
    for round_index in range(args.rounds):
        rates["tokenized on the fly"].append(tokens_per_second(on_the_fly, args.batches))
        rates["token store"].append(tokens_per_second(store.train_batches(round_index), args.batches))
    print(
        f"{len(documents):,} training documents of {config.text.corpus}, seq {args.seq}, batch {args.batch}, "
        f"{args.workers} workers, {args.batches} batches x {args.rounds} rounds, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    for name, values in rates.items():
        print(f"{name:<21}: {max(values):>10,.0f} tokens/s best  (rounds: {', '.join(f'{v:,.0f}' for v in values)})")
    best_store = max(rates["token store"])
    print(f"ratio store / on the fly: {best_store / max(rates['tokenized on the fly']):.2f}")
    for name, model in MODELS.items():
        training = training_tokens_per_second(model, store, args.steps)
        print(
            f"{name} training: {training:,.0f} tokens/s; loading in the training process would take "
            f"{100 * training / best_store:.1f} % of a step"
        )


if __name__ == "__main__":
    main()
