"""A generated corpus of ordinary English-like text, as Parquet and .jsonl.gz, for the corpus benches.

Words are drawn from the standard library's docstrings (this Python's own English prose, about
1.5 MB) by a seeded bigram model of them: each word follows the previous one as often as it does
there, so the text has English's word frequencies, word lengths and short-range order (which is
what a tokenizer's speed depends on). Sentences average 15 words, paragraphs 5 sentences, and a
document holds 50-1,000 words (about 3 KB on average). Both files hold the same
documents, each as a ``{"id", "text"}`` record; writing streams, with bounded memory.

    .venv/bin/python bench/make_corpus.py OUT_DIR --mb 200 [--seed 0]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import time
from itertools import chain
from pathlib import Path

import numpy as np

from trainrun.data.token_store import stdlib_docstrings


class Bigrams:
    """The docstrings' words and, for each, the words that follow it there (with repeats: as often as they do)."""

    def __init__(self) -> None:
        words = re.findall(r"\b(?:[A-Za-z][a-z']+|a|I)\b", " ".join(stdlib_docstrings()))  # words, not code
        vocabulary = sorted(set(words))
        index = {word: number for number, word in enumerate(vocabulary)}
        ids = np.array([index[word] for word in words])
        order = np.argsort(ids[:-1], kind="stable")
        self.following = ids[1:][order]  # each word's followers, grouped by word
        self.counts = np.bincount(ids[:-1], minlength=len(vocabulary))
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.words = np.array(vocabulary, dtype=object)
        self.starts = np.array([index[word] for word in words if word[0].isupper()])

    def documents(self, generator: np.random.Generator, count: int) -> list[str]:
        """``count`` documents of 50-1,000 words, walked side by side: a sentence ends after a word
        with probability 1/15 (and its paragraph with 1/5 of those); the next starts from a capitalised word."""
        lengths = generator.integers(50, 1001, count)
        steps = int(lengths.max())
        ends = generator.random((count, steps)) < 1 / 15
        paragraphs = ends & (generator.random((count, steps)) < 1 / 5)
        chosen = np.empty((count, steps), dtype=np.int64)
        current = self.starts[generator.integers(len(self.starts), size=count)]
        for step in range(steps):
            chosen[:, step] = current
            following = self.following[
                self.offsets[current] + (generator.random(count) * self.counts[current]).astype(np.int64)
            ]
            restart = self.starts[generator.integers(len(self.starts), size=count)]
            current = np.where(ends[:, step] | (self.counts[current] == 0), restart, following)
        endings = np.where(paragraphs, ".\n\n", np.where(ends, ". ", " ")).astype(object)
        texts = []
        for row, length in enumerate(lengths):
            pieces = chain.from_iterable(zip(self.words[chosen[row, :length]], endings[row, :length]))
            texts.append("".join(pieces).rstrip() + ".")
        return texts


def write_corpus(out: Path, megabytes: float, seed: int) -> dict:
    """``corpus.parquet`` and ``corpus.jsonl.gz`` in ``out`` holding about ``megabytes`` MB of text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    model, generator = Bigrams(), np.random.default_rng(seed)
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    target, written, count, started = megabytes * 1e6, 0, 0, time.perf_counter()
    with (
        pq.ParquetWriter(out / "corpus.parquet", schema) as parquet,
        gzip.open(out / "corpus.jsonl.gz", "wt", 1) as lines,
    ):
        while written < target:
            texts = model.documents(generator, 2000)
            ids = list(range(count, count + len(texts)))
            parquet.write_table(pa.table({"id": ids, "text": texts}, schema=schema))
            lines.write("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, texts)))
            written += sum(len(text.encode()) for text in texts)
            count += len(texts)
            print(f"\r{written / 1e6:,.0f} MB of text, {count:,} documents", end="", flush=True)
    print()
    summary = {"documents": count, "text_bytes": written, "seconds": round(time.perf_counter() - started, 1)}
    (out / "corpus.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--mb", type=float, default=200, help="megabytes of text (UTF-8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    summary = write_corpus(args.out, args.mb, args.seed)
    sizes = {name: (args.out / name).stat().st_size / 1e6 for name in ("corpus.parquet", "corpus.jsonl.gz")}
    print(
        f"{summary['documents']:,} documents, {summary['text_bytes'] / 1e6:,.0f} MB of text in {summary['seconds']} s; "
        + ", ".join(f"{name} {size:,.0f} MB" for name, size in sizes.items())
    )


if __name__ == "__main__":
    main()
