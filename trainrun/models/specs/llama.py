"""The spec of ``model=llama*``: Llama 3 (trainrun/models/llama.py)."""

from __future__ import annotations

from typing import Any

from trainrun.algorithms.specs import sequence_limit
from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec
from trainrun.models.specs import check_even_heads, check_window_limit, refuse_initializers


def check(config: Any) -> None:
    """Heads of an even size, key/value heads that divide the heads, windows within the rotary tables."""
    refuse_initializers(config, "normal(0, 0.02) per weight, output projections scaled by depth")
    llama = config.model.llama
    check_even_heads("llama", llama.width, llama.heads)
    if llama.heads % llama.kv_heads:
        raise ConfigError(
            f"bad value for 'model.llama.kv_heads': {llama.kv_heads} does not divide model.llama.heads {llama.heads}"
        )
    if llama.rope_factor is not None and llama.rope_high_freq_factor <= llama.rope_low_freq_factor:
        raise ConfigError(
            f"bad value for 'model.llama.rope_high_freq_factor': {llama.rope_high_freq_factor} is not more than "
            f"model.llama.rope_low_freq_factor {llama.rope_low_freq_factor}"
        )
    check_window_limit(config, sequence_limit(config.algorithms) or (llama.max_seq_len, "model.llama.max_seq_len"))


SPECS = (
    KindSpec(
        name="llama",
        builder="trainrun.models.llama:build",
        batches="token_windows",
        offers=frozenset({Capability.HIDDEN_MATRICES, Capability.TRANSFORMER_BLOCKS, Capability.META_INIT}),
        check=check,
        published_vocab=128_256,  # Llama 3's tokenizer
    ),
)
