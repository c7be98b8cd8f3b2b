"""The spec of ``data=token_shards``: llm.c / modded-nanogpt token shards (trainrun/data/token_shards.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainrun.data.specs.masked_text import check_loader
from trainrun.errors import ConfigError
from trainrun.kinds import KindSpec


def check(config: Any) -> None:
    """The torch loader, and a validation length every window of which is scored whole."""
    check_loader(config)
    data = config.data
    if data.shards.val_tokens % data.text.max_seq_len:
        raise ConfigError(
            f"bad value for 'data.shards.val_tokens': {data.shards.val_tokens:,} (a multiple of data.text.max_seq_len, "
            f"{data.text.max_seq_len}, so that every validation token is scored)"
        )


def check_files(config: Any) -> None:
    """A given tokenizer exists; both globs match sound shards of one format, their ids within its vocabulary."""
    from trainrun.data.token_shards import check_shards

    tokenizer = config.data.shards.tokenizer
    if tokenizer and not Path(tokenizer).expanduser().is_file():
        raise ConfigError(f"bad value for 'data.shards.tokenizer': '{tokenizer}' does not exist")
    check_shards(config.data)


SPECS = (
    KindSpec(
        name="token_shards",
        builder="trainrun.data.token_shards:shard_datasets",
        batches="token_windows",
        check=check,
        check_files=check_files,
        reads=("train", "val", "shards", "text.max_seq_len"),
    ),
)
