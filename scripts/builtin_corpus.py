"""Write the built-in corpus trainrun ships (``trainrun/data/builtin/``): the standard library's
docstrings as this Python has them, in order (``stdlib_docs.jsonl.gz``), and the WordPiece and
byte-level BPE tokenizers of the default vocabulary trained on its default training split. Shipped so
that ``data=stdlib_docs`` and ``data=stdlib_stream`` read the same documents and ids on every machine:
the installed Python's docstrings change with its version, and WordPiece training is not
deterministic upstream (huggingface/tokenizers#1794).

    .venv/bin/python scripts/builtin_corpus.py
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainrun.data.token_store import (  # noqa: E402
    BUILTIN,
    TEXT_VAL_FRACTION,
    builtin_tokenizer_file,
    split_documents,
    stdlib_docstrings,
    train_tokenizer,
)
from trainrun.schema import DataConfig, TextConfig  # noqa: E402


def main() -> None:
    documents = stdlib_docstrings()
    lines = "".join(json.dumps({"text": text}) + "\n" for text in documents).encode()
    (BUILTIN / "stdlib_docs.jsonl.gz").write_bytes(gzip.compress(lines, 9, mtime=0))
    train, _ = split_documents(documents, TEXT_VAL_FRACTION, DataConfig().split_seed)
    vocab_size = TextConfig().vocab_size
    for kind in ("wordpiece", "bpe"):
        train_tokenizer(train, vocab_size, kind).save(
            str(builtin_tokenizer_file("stdlib_docs", kind, vocab_size)), pretty=False
        )
    print(f"{len(documents):,} documents from Python {sys.version.split()[0]}, tokenizers of {vocab_size:,}")


if __name__ == "__main__":
    main()
