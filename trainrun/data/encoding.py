"""Batches of documents to token ids with Hugging Face ``tokenizers``, in worker processes, in order.

``tokenizers`` encodes a batch on several threads of one process, but a corpus writer's Python
work around it (reading, parsing, splitting, writing) is one core's: worker processes, one
tokenizer thread each, spread the encoding over the cores while the writer reads on.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import chain
from multiprocessing import get_context
from pathlib import Path

import numpy as np

_TOKENIZER = None


def _start_worker(path: str, parent: int) -> None:
    """A worker's start: one tokenizer thread (workers share the cores), the tokenizer it encodes
    with, and a watch that ends it when ``parent`` does."""
    global _TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by tokenizers when it encodes
    from tokenizers import Tokenizer

    _TOKENIZER = Tokenizer.from_file(path)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()


def _end_with(parent: int) -> None:
    """Exit once ``parent`` is gone: a writer killed (SIGKILL) shuts no worker down, which would wait on forever."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def encode(texts: list[str], tokenizer=None) -> tuple[np.ndarray, np.ndarray]:
    """(every text's token ids end to end, each text's length) with ``tokenizer`` (in a worker, its
    own by default), through ``encode_batch_fast`` where ``tokenizers`` has it (no character offsets)."""
    tokenizer = tokenizer or _TOKENIZER
    batch_encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    ids = [item.ids for item in batch_encode(texts, add_special_tokens=False)]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum())), lengths


class Encoder:
    """Batches of texts to token ids, in order: in ``workers`` processes (each with one tokenizer
    thread, so that they do not compete), or in this one when ``workers`` is 0 (``tokenizers``'
    own threads). At most two batches per worker are in flight."""

    def __init__(self, tokenizer_file: Path, workers: int) -> None:
        self.pool, self.tokenizer = None, None
        if workers > 0:
            self.pool = ProcessPoolExecutor(
                workers,
                mp_context=get_context("spawn"),
                initializer=_start_worker,
                initargs=(str(tokenizer_file), os.getpid()),
            )
        else:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.limit = 2 * max(1, workers)

    def map(self, batches: Iterator) -> Iterator:
        """(batch, (ids, lengths)) for each ``batch`` (whose ``texts`` are encoded), in order."""
        if self.pool is None:
            yield from ((batch, encode(batch.texts, self.tokenizer)) for batch in batches)
            return
        pending: deque[tuple[object, Future]] = deque()
        for batch in batches:
            pending.append((batch, self.pool.submit(encode, batch.texts)))
            if len(pending) >= self.limit:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
