"""The spec of ``data=token_mix``: several token stores or shard sets mixed by weight (trainrun/data/token_mix.py)."""

from __future__ import annotations

import re
from typing import Any

from trainrun.data.specs.causal_text import check as check_stream
from trainrun.errors import ConfigError
from trainrun.kinds import KindSpec

NAME = re.compile(r"[A-Za-z0-9_-]+")


def check(config: Any) -> None:
    """The torch loader and whole validation windows, as one corpus; two corpora or more, each named once."""
    check_stream(config)
    mix = config.data.mix
    if len(mix) < 2:
        raise ConfigError(
            "data=token_mix needs two corpora or more in 'data.mix' "
            "(data.mix='[{name: web, path: STORE, weight: 0.7}, {name: code, path: STORE, weight: 0.3}]')"
        )
    seen: set[str] = set()
    for index, source in enumerate(mix):
        if not source.name or not NAME.fullmatch(source.name) or source.name in seen:
            why = "is given twice" if source.name in seen else "(letters, digits, '_', '-': eval_loss/<name>)"
            raise ConfigError(f"bad value for 'data.mix.{index}.name': '{source.name or ''}' {why}")
        seen.add(source.name)


def check_files(config: Any) -> None:
    """Each corpus's files are what its kind reads, and all share one tokenizer (one line naming the corpus)."""
    from trainrun.data.token_mix import check_mix_files

    check_mix_files(config.data)


SPECS = (
    KindSpec(
        name="token_mix",
        builder="trainrun.data.token_mix:mix_datasets",
        batches="token_windows",
        check=check,
        check_files=check_files,
        reads=("mix", "text.max_seq_len", "text.val_tokens", "shards"),
    ),
)
