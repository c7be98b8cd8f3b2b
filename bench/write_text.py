"""Writing a corpus for training: ``trainrun write-text`` against Hugging Face ``datasets``, same machine, same run.

The corpus is one ``bench/make_corpus.py`` wrote (``corpus.parquet`` or ``corpus.jsonl.gz``), the
tokenizer a byte-level BPE of ``--vocab`` tokens trained here once on its first 20,000 documents,
and both sides use it:

- trainrun: ``trainrun write-text CORPUS STORE --tokenizer T --workers N`` (a store of shards with a
  5 % validation split);
- datasets: what nanoGPT's and the transformers examples' data preparation does: ``load_dataset``
  (converting the corpus to its Arrow cache), ``map`` with the same tokenizer (``transformers``' fast
  tokenizer on the same tokenizer.json, batched, ``num_proc=N``, ids only), then the ids written to
  one flat uint16 file in 1,024 contiguous pieces (nanoGPT's ``prepare.py``). Its cache lives in the
  run's own folder, so its Arrow files count as its work; it splits off no validation set.

Each is a fresh process; the peak resident memory is the sum over its process tree (workers
included), sampled every 0.1 s. Throughput is the corpus's text megabytes (UTF-8) over wall seconds.
With ``--kill``, trainrun's write is then killed (SIGKILL) at half its measured time and run again:
the bench checks the second run finishes the store byte for byte as the uninterrupted one, and
prints its time against the first run's remaining time.

    .venv/bin/python bench/write_text.py CORPUS_DIR [--kind parquet] [--workers 1 2] [--peers datasets] [--kill]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve()


class PeakMemory(threading.Thread):
    """The largest sum of resident memory of process ``pid`` and its children, sampled every 0.1 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process, self.peak, self.running = psutil.Process(pid), 0, True

    def run(self) -> None:
        while self.running:
            try:
                tree = [self.process, *self.process.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)


def measured(command: list[str], env: dict | None = None, kill_after: float | None = None) -> dict:
    """Run ``command``; its wall seconds, peak tree memory (GB) and exit status (killed after ``kill_after`` s)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = PeakMemory(process.pid)
    sampler.start()
    if kill_after is not None:
        try:
            process.wait(kill_after)
        except subprocess.TimeoutExpired:  # as a machine's crash: the writer and its workers at once
            children = psutil.Process(process.pid).children(recursive=True)
            process.kill()
            for child in children:
                child.kill()
    output, _ = process.communicate()
    sampler.running = False
    seconds = time.perf_counter() - started
    if process.returncode not in (0, -signal.SIGKILL):
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return {"seconds": seconds, "peak_gb": sampler.peak / 1e9, "returncode": process.returncode, "output": output}


def train_bench_tokenizer(corpus: Path, vocab: int, path: Path) -> None:
    import pyarrow.parquet as pq
    from tokenizers import ByteLevelBPETokenizer

    texts = []
    for batch in pq.ParquetFile(corpus / "corpus.parquet").iter_batches(batch_size=2000, columns=["text"]):
        texts += batch.column(0).to_pylist()
        if len(texts) >= 20_000:
            break
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        texts[:20_000], vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False
    )
    tokenizer._tokenizer.save(str(path))


def datasets_job(corpus: str, kind: str, tokenizer: str, workers: int, out: str) -> None:
    """The datasets side, run in its own process: load, map-tokenize, write the ids (nanoGPT's prepare.py)."""
    import datasets
    import numpy as np
    from transformers import PreTrainedTokenizerFast

    datasets.disable_progress_bars()
    fast = PreTrainedTokenizerFast(tokenizer_file=tokenizer)
    builder = "parquet" if kind == "parquet" else "json"
    loaded = datasets.load_dataset(builder, data_files=corpus, split="train", cache_dir=str(Path(out) / "cache"))

    def tokenize(batch: dict) -> dict:
        return {"ids": fast(batch["text"], return_attention_mask=False)["input_ids"]}

    tokenized = loaded.map(
        tokenize, batched=True, num_proc=workers if workers > 1 else None, remove_columns=loaded.column_names
    )
    lengths = tokenized.map(lambda batch: {"len": [len(ids) for ids in batch["ids"]]}, batched=True, num_proc=None)
    total = int(np.sum(lengths["len"], dtype=np.int64))
    ids = np.memmap(Path(out) / "train.bin", dtype=np.uint16, mode="w+", shape=(total,))
    index = 0
    for piece in range(1024):
        shard = tokenized.shard(num_shards=1024, index=piece, contiguous=True).with_format("numpy")
        batch = np.concatenate(shard["ids"]) if len(shard) else np.zeros(0, np.uint16)
        ids[index : index + len(batch)] = batch
        index += len(batch)
    ids.flush()
    print(json.dumps({"tokens": total}))


def store_bytes(store: Path) -> dict[str, str]:
    import hashlib

    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(store.iterdir())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="a folder bench/make_corpus.py wrote")
    parser.add_argument("--kind", choices=["parquet", "jsonl.gz"], default="parquet")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--peers", nargs="*", default=["datasets"], choices=["datasets"])
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--kill", action="store_true", help="also kill a write halfway and continue it")
    parser.add_argument("--dir", type=Path, help="where stores are written (default: a temporary folder)")
    parser.add_argument("--datasets-job", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.datasets_job:
        corpus, kind, tokenizer, workers, out = args.datasets_job
        return datasets_job(corpus, kind, tokenizer, int(workers), out)
    facts = json.loads((args.corpus / "corpus.json").read_text())
    megabytes = facts["text_bytes"] / 1e6
    corpus_file = args.corpus / f"corpus.{args.kind}"
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        tokenizer = work / "tokenizer.json"
        train_bench_tokenizer(args.corpus, args.vocab, tokenizer)
        print(
            f"corpus {corpus_file} ({corpus_file.stat().st_size / 1e6:,.0f} MB on disk, {megabytes:,.0f} MB of text, "
            f"{facts['documents']:,} documents), byte-level BPE of {args.vocab:,}, {os.cpu_count()} cores"
        )
        trainrun = [str(Path(sys.executable).with_name("trainrun")), "write-text", str(corpus_file)]
        results = {}
        for workers in args.workers:
            out = work / f"trainrun_{workers}"
            command = [*trainrun, str(out), "--tokenizer", str(tokenizer), "--workers", str(workers)]
            results[("write-text", workers)] = measured(command)
            shutil.rmtree(out) if not args.kill or workers != max(args.workers) else None
            if "datasets" in args.peers:
                job = work / f"datasets_{workers}"
                job.mkdir()
                command = [sys.executable, str(HERE), str(args.corpus), "--datasets-job", str(corpus_file), args.kind]
                command += [str(tokenizer), str(workers), str(job)]
                env = {**os.environ, "HF_DATASETS_CACHE": str(job / "cache"), "TOKENIZERS_PARALLELISM": "false"}
                results[("datasets", workers)] = measured(command, env=env)
                shutil.rmtree(job)
        print(f"{'side':<10} {'workers':>7} {'wall s':>8} {'MB/s':>6} {'MB/s/worker':>11} {'peak GB':>8}")
        for (side, workers), result in results.items():
            rate = megabytes / result["seconds"]
            print(
                f"{side:<10} {workers:>7} {result['seconds']:>8.1f} {rate:>6.2f} {rate / workers:>11.2f} "
                f"{result['peak_gb']:>8.2f}"
            )
        for workers in args.workers:
            if ("datasets", workers) in results:
                ours, theirs = results[("write-text", workers)], results[("datasets", workers)]
                print(
                    f"{workers} workers: write-text {theirs['seconds'] / ours['seconds']:.2f}x as fast as datasets, "
                    f"{theirs['peak_gb'] / ours['peak_gb']:.2f}x less memory"
                )
        if args.kill:
            workers = max(args.workers)
            whole = results[("write-text", workers)]
            out = work / "killed"
            command = [*trainrun, str(out), "--tokenizer", str(tokenizer), "--workers", str(workers)]
            first = measured(command, kill_after=whole["seconds"] / 2)
            again = measured([*command, "--overwrite"])  # a write that ended before the kill starts over
            same = store_bytes(out) == store_bytes(work / f"trainrun_{workers}")
            remaining = whole["seconds"] - first["seconds"]
            print(
                f"killed at {first['seconds']:.0f} s of {whole['seconds']:.0f} s; the second run took "
                f"{again['seconds']:.0f} s = {again['seconds'] / remaining:.2f}x the first's remaining "
                f"{remaining:.0f} s; store identical: {same}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
