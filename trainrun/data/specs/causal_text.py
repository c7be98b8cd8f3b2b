"""The spec of ``data=token_stream``: a token store read as one stream of windows (trainrun/data/causal_text.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainrun.data.specs.masked_text import check_loader, check_store_given
from trainrun.errors import ConfigError
from trainrun.kinds import KindSpec


def check(config: Any) -> None:
    """The torch loader, and a validation cap of whole windows."""
    check_loader(config)
    text = config.data.text
    if text.val_tokens is not None and text.val_tokens % text.max_seq_len:
        raise ConfigError(
            f"bad value for 'data.text.val_tokens': {text.val_tokens:,} (a multiple of data.text.max_seq_len, "
            f"{text.max_seq_len:,}: validation reads whole windows)"
        )


def check_files(config: Any) -> None:
    """A store is given; one at ``data.path`` holds the validation tokens asked for (``data.text.val_tokens``)."""
    check_store_given(config)
    if config.data.path:
        from trainrun.data.causal_text import validation_windows

        validation_windows(Path(config.data.path).expanduser(), config.data)


SPECS = (
    KindSpec(
        name="token_stream",
        builder="trainrun.data.causal_text:stream_datasets",
        batches="token_windows",
        check=check,
        check_files=check_files,
        reads=("path", "text"),
    ),
)
