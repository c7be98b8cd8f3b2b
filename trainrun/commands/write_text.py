"""``trainrun write-text``: a text corpus streamed into a token store for language-model training.

The command parses and checks its own arguments (defaults from :class:`~trainrun.data.store_writer.
CorpusSettings` and the schema) and calls :mod:`trainrun.data.store_writer`; it imports no torch,
so that its memory is the corpus's batches and the tokenizer's.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from pathlib import Path

from rich.console import Console

from trainrun.atomic_io import read_json
from trainrun.data.corpus import READABLE
from trainrun.data.store_writer import CorpusSettings, write_corpus, write_token_store
from trainrun.data.token_store import (
    BUILTIN_CORPORA,
    TOKEN_DTYPES,
    check_token_dtype,
    check_vocab_size,
    read_documents,
    split_documents,
)
from trainrun.errors import ConfigError
from trainrun.fields import choices_of
from trainrun.run_files import check_output_dir
from trainrun.schema import TextConfig


def write_text_arguments(argv: list[str]) -> argparse.Namespace:
    """``trainrun write-text``'s arguments, each checked (one line naming a bad one, before any reading)."""
    defaults = CorpusSettings()
    parser = argparse.ArgumentParser(
        prog="trainrun write-text",
        description="Tokenize a corpus into a token store of shards, streaming it with bounded memory: "
        f"files of {READABLE}, a folder of them, or {', '.join(BUILTIN_CORPORA)}. A tokenizer is trained on a "
        "seeded sample of the training documents (WordPiece for masked LM, byte-level BPE for causal LM) or given "
        "(--tokenizer). A killed or interrupted write continues where it stopped when run again.",
    )
    parser.add_argument("corpus", help="a file, a folder, or " + " | ".join(BUILTIN_CORPORA))
    parser.add_argument("out", type=Path, help="the token store (a folder) to write")
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="vocabulary to train")
    parser.add_argument(
        "--tokenizer-kind",
        choices=choices_of(TextConfig, "tokenizer"),
        default=defaults.tokenizer_kind,
        help="tokenizer to train: wordpiece (BERT's; masked and causal LM) or bpe (GPT-2's byte-level; causal LM)",
    )
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json (Hugging Face tokenizers) to use instead")
    parser.add_argument(
        "--tokenizer-sample",
        type=int,
        default=defaults.tokenizer_sample,
        help="training documents a vocabulary is trained on, drawn seeded (default %(default)s)",
    )
    parser.add_argument("--text-field", default=defaults.text_field, help="the text of a JSON record or a column")
    parser.add_argument(
        "--val-fraction", type=float, default=defaults.val_fraction, help="share of documents held out for evaluation"
    )
    parser.add_argument(
        "--split",
        help="the corpus's own split that is the validation: a DatasetDict's split name or a word of its files' "
        "names (default: validation, valid, val or dev, else test); other named splits are left out",
    )
    parser.add_argument("--split-seed", type=int, default=defaults.split_seed)
    parser.add_argument(
        "--dtype", choices=["auto", *TOKEN_DTYPES], default="auto", help="token id type (auto: the smallest that fits)"
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count(), help="tokenizing processes (default: the cores, %(default)s)"
    )
    parser.add_argument(
        "--shard-tokens",
        type=int,
        default=defaults.shard_tokens,
        help="training tokens per shard (default %(default)s)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return checked(parser.parse_args(argv))


def checked(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` if their output can be written and every value is one write-text takes; else one line."""
    check_output_dir("OUT", str(args.out))
    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"'{args.out}' exists; pass --overwrite to replace it")
    if args.dtype != "auto" and args.tokenizer is None:
        check_token_dtype(args.vocab_size, args.dtype)
    if args.corpus in BUILTIN_CORPORA and args.split is not None:
        raise ConfigError(f"bad value for '--split': the built-in corpus {args.corpus} has no splits of its own")
    if not 0 < args.val_fraction < 1:
        raise ConfigError(f"bad value for '--val-fraction': {args.val_fraction} (between 0 and 1)")
    least = {"--workers": (args.workers, 0), "--shard-tokens": (args.shard_tokens, 1)}
    least |= {"--split-seed": (args.split_seed, 0)}
    for flag, (value, smallest) in {**least, "--tokenizer-sample": (args.tokenizer_sample, 1)}.items():
        if value < smallest:
            raise ConfigError(f"bad value for '{flag}': {value} (at least {smallest})")
    if args.tokenizer is None:
        check_vocab_size(args.vocab_size, args.tokenizer_kind)
    if args.tokenizer is not None and not args.tokenizer.is_file():
        raise ConfigError(f"bad value for '--tokenizer': '{args.tokenizer}' does not exist")
    return args


def write_text_command(argv: list[str]) -> int:
    """``trainrun write-text CORPUS STORE``: a text corpus to a token store for language-model training."""
    args = write_text_arguments(argv)
    console = Console(highlight=False)
    console.print(f"reading {args.corpus}")
    if args.corpus in BUILTIN_CORPORA:  # held in memory, split as a run reading it does
        train, val = split_documents(read_documents(args.corpus), args.val_fraction, args.split_seed)
        write_token_store(train, val, args.out, args.vocab_size, args.tokenizer, args.dtype, args.tokenizer_kind)
        meta = read_json(args.out / "store.json")
    else:
        settings = CorpusSettings(**{field.name: getattr(args, field.name) for field in fields(CorpusSettings)})
        meta = write_corpus(args.corpus, args.out, settings, args.tokenizer, args.workers, console)
    console.print(
        f"wrote {meta['train']['tokens']:,} training tokens ({meta['train']['documents']:,} documents) and "
        f"{meta['val']['tokens']:,} validation tokens ({meta['val']['documents']:,}) "
        f"(vocabulary {meta['vocab_size']:,}, {meta['dtype']}) to {args.out}",
        soft_wrap=True,
    )
    null, empty = meta.get("null_records", 0), meta.get("empty_records", 0)
    if null or empty:
        console.print(
            f"skipped {null + empty:,} records without text: {null:,} whose '{args.text_field}' is null, "
            f"{empty:,} empty (store.json: null_records, empty_records)",
            soft_wrap=True,
        )
    if args.tokenizer is None and meta["vocab_size"] < args.vocab_size:
        console.print(
            f"note: the vocabulary is {meta['vocab_size']:,} tokens, fewer than --vocab-size {args.vocab_size:,}: "
            "a tokenizer learns no more merges or words than its corpus holds (a larger corpus gives more)",
            soft_wrap=True,
        )
    return 0
