"""The spec of ``data=text``: documents of a token store, masked for BERT (trainrun/data/masked_text.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import KindSpec


def check_loader(config: Any) -> None:
    """Text is read by the torch loader (shared by the token-store sources)."""
    if config.data.loader != "torch":
        raise ConfigError("bad value for 'data.loader': text is read with the torch loader (data.loader=torch)")


def check_store_given(config: Any) -> None:
    """A token store at ``data.path`` or a built-in corpus (shared by the token-store sources)."""
    if not config.data.path and not config.data.text.corpus:
        raise ConfigError(f"data={config.data.name} needs 'data.path' (a token store written by 'trainrun write-text')")


def check(config: Any) -> None:
    check_loader(config)
    if config.data.text.val_tokens is not None:
        raise ConfigError(
            "bad value for 'data.text.val_tokens': data=text (masked LM) validates on every held-out document; "
            "the cap is data=token_stream's"
        )
    if config.data.text.tokenizer == "bpe" and not config.data.path:
        raise ConfigError(
            "bad value for 'data.text.tokenizer': bpe has no [MASK] token for masked LM (task causal_lm); use wordpiece"
        )


def check_files(config: Any) -> None:
    """A store is given, and holds the special tokens masking needs (a byte-level BPE store has no [MASK])."""
    check_store_given(config)
    if config.data.path and Path(config.data.path).expanduser().is_dir():
        from trainrun.data.token_store import SPECIAL_TOKENS, TokenStore

        store = TokenStore.open(Path(config.data.path), "train")
        store.check_special_tokens(SPECIAL_TOKENS, "masked language modelling")


SPECS = (
    KindSpec(
        name="text",
        builder="trainrun.data.masked_text:text_datasets",
        batches="masked_text",
        check=check,
        check_files=check_files,
        reads=("path", "text"),
    ),
)
