"""``trainrun write`` and ``trainrun write-text``: data sets written once for fast loading.

Each command parses its own arguments (defaults from the schema or the writer they drive) and calls
the writers in :mod:`trainrun.data.write` (.beton files) and :mod:`trainrun.data.token_store`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from trainrun.atomic_io import read_json
from trainrun.data.token_store import (
    BUILTIN_CORPORA,
    TEXT_VAL_FRACTION,
    TOKEN_DTYPES,
    check_token_dtype,
    check_vocab_size,
    read_documents,
    split_documents,
    write_token_store,
)
from trainrun.data.write import WriteSettings, source_dataset, write_beton
from trainrun.errors import ConfigError
from trainrun.fields import choices_of
from trainrun.schema import DataConfig, TextConfig


def write_command(argv: list[str]) -> int:
    """``trainrun write SRC OUT.beton``: an image folder or a built-in set to an FFCV file."""
    defaults = WriteSettings()
    parser = argparse.ArgumentParser(
        prog="trainrun write",
        description="Write an ImageFolder tree (SRC/<class>/*.jpg) or a built-in set (digits, mnist5k, "
        "synthetic) to an FFCV .beton with an RGB 'image' and an integer 'label' field.",
    )
    parser.add_argument("source", help="a folder of class folders, or digits | mnist5k | synthetic")
    parser.add_argument("out", type=Path, help="the .beton file to write (atomically)")
    parser.add_argument("--mode", choices=["raw", "jpg", "proportion"], default=defaults.mode)
    parser.add_argument("--max-resolution", type=int, default=defaults.max_resolution)
    parser.add_argument("--jpeg-quality", type=int, default=defaults.jpeg_quality)
    parser.add_argument("--compress-probability", type=float, default=defaults.compress_probability)
    parser.add_argument("--workers", type=int, default=defaults.num_workers)
    parser.add_argument("--split", choices=["train", "val"], default="train", help="built-in sets: which split")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("overrides", nargs="*", help="data.* overrides for built-in sets, e.g. data.num_samples=4096")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"'{args.out}' exists; pass --overwrite to replace it")
    if not 0 <= args.compress_probability <= 1:
        raise ConfigError(f"bad value for '--compress-probability': {args.compress_probability} (0 to 1)")
    settings = WriteSettings(
        mode=args.mode,
        max_resolution=args.max_resolution,
        jpeg_quality=args.jpeg_quality,
        compress_probability=args.compress_probability,
        num_workers=args.workers,
    )
    console = Console(highlight=False)
    builtin = _builtin_data_config(args.source, args.overrides)
    console.print(f"reading {args.source} ({args.split} split)" if builtin else f"reading image folder {args.source}")
    write_beton(source_dataset(args.source, args.split, builtin), args.out, settings, console)
    return 0


def _builtin_data_config(source: str, overrides: list[str]):
    """The data config of built-in set ``source`` (None for a folder), with ``data.*`` overrides."""
    from trainrun.config import compose
    from trainrun.registry import names
    from trainrun.validation import validate

    if source not in names("data"):
        return None
    return validate(compose([f"data={source}", *overrides])).data


def write_text_command(argv: list[str]) -> int:
    """``trainrun write-text CORPUS STORE``: a text corpus to a token store for language-model training."""
    parser = argparse.ArgumentParser(
        prog="trainrun write-text",
        description="Tokenize a corpus (a .txt file of blank-line-separated documents, a .jsonl file of "
        f'{{"text": ...}} lines, a folder of such files, or {", ".join(BUILTIN_CORPORA)}) into a token store: '
        "a tokenizer trained on the training documents (WordPiece for masked LM, byte-level BPE for causal LM) "
        "or a given tokenizer.json (--tokenizer), token ids per split.",
    )
    parser.add_argument("corpus", help="a file, a folder, or " + " | ".join(BUILTIN_CORPORA))
    parser.add_argument("out", type=Path, help="the token store (a folder) to write, atomically")
    parser.add_argument("--vocab-size", type=int, default=TextConfig.vocab_size, help="vocabulary to train")
    parser.add_argument(
        "--tokenizer-kind",
        choices=choices_of(TextConfig, "tokenizer"),
        default=TextConfig.tokenizer,
        help="tokenizer to train: wordpiece (BERT's; masked and causal LM) or bpe (GPT-2's byte-level; causal LM)",
    )
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json (Hugging Face tokenizers) to use instead")
    parser.add_argument(
        "--val-fraction", type=float, default=TEXT_VAL_FRACTION, help="documents held out for evaluation"
    )
    parser.add_argument("--split-seed", type=int, default=DataConfig.split_seed)
    parser.add_argument(
        "--dtype", choices=["auto", *TOKEN_DTYPES], default="auto", help="token id type (auto: the smallest that fits)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"'{args.out}' exists; pass --overwrite to replace it")
    if args.dtype != "auto" and args.tokenizer is None:
        check_token_dtype(args.vocab_size, args.dtype)
    if not 0 < args.val_fraction < 1:
        raise ConfigError(f"bad value for '--val-fraction': {args.val_fraction} (between 0 and 1)")
    if args.tokenizer is None:
        check_vocab_size(args.vocab_size, args.tokenizer_kind)
    if args.tokenizer is not None and not args.tokenizer.is_file():
        raise ConfigError(f"bad value for '--tokenizer': '{args.tokenizer}' does not exist")
    console = Console(highlight=False)
    console.print(f"reading {args.corpus}")
    documents = read_documents(args.corpus)
    train, val = split_documents(documents, args.val_fraction, args.split_seed)
    console.print(f"tokenizing {len(train):,} training and {len(val):,} validation documents")
    write_token_store(train, val, args.out, args.vocab_size, args.tokenizer, args.dtype, args.tokenizer_kind)
    meta = read_json(args.out / "store.json")
    console.print(
        f"wrote {meta['train']['tokens']:,} training and {meta['val']['tokens']:,} validation tokens "
        f"(vocabulary {meta['vocab_size']:,}, {meta['dtype']}) to {args.out}",
        soft_wrap=True,
    )
    if args.tokenizer is None and meta["vocab_size"] < args.vocab_size:
        console.print(
            f"note: the vocabulary is {meta['vocab_size']:,} tokens, fewer than --vocab-size {args.vocab_size:,}: "
            "a tokenizer learns no more merges or words than its corpus holds (a larger corpus gives more)",
            soft_wrap=True,
        )
    return 0
