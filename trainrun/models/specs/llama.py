"""The spec of ``model=llama*``: Llama 3 (trainrun/models/llama.py)."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec
from trainrun.models.specs import check_even_heads, refuse_initializers

SETTINGS = {  # trainrun's Llama setting (model.llama.*) -> transformers' LlamaConfig attribute
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "width": "hidden_size",
    "ffn_hidden": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "tie_head": "tie_word_embeddings",
}
ROPE = {  # trainrun's rotary setting -> its key in transformers' rope_parameters (Llama 3's scaling)
    "rope_theta": "rope_theta",
    "rope_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_positions": "original_max_position_embeddings",
}


def published_shape(published: dict) -> dict:
    """``model.llama.*`` from a ``LlamaForCausalLM``'s ``config.json`` (rotary settings as transformers
    4 writes them, ``rope_theta`` and ``rope_scaling``, or 5, ``rope_parameters``; the context its
    ``max_position_embeddings``); one line where it is not a Llama."""
    if published.get("model_type") != "llama":
        raise ConfigError(
            f"bad value for 'model.weights': its config.json is a {published.get('model_type')}, not a llama"
        )
    defaults = {"num_key_value_heads": published.get("num_attention_heads"), "tie_word_embeddings": False}
    defaults |= {"rms_norm_eps": 1e-6}  # transformers' LlamaConfig defaults, where config.json leaves them out
    settings = {ours: published.get(theirs, defaults.get(theirs)) for ours, theirs in SETTINGS.items()}
    rope = published.get("rope_parameters") or {
        "rope_theta": published.get("rope_theta"),
        **(published.get("rope_scaling") or {}),
    }
    scaled = rope.get("rope_type") == "llama3"
    settings |= {ours: rope.get(key) for ours, key in ROPE.items() if scaled or ours == "rope_theta"}
    return {**settings, "rope_factor": settings.get("rope_factor"), "max_seq_len": published["max_position_embeddings"]}


def check(config: Any) -> None:
    """Heads of an even size, key/value heads that divide the heads (its windows: :func:`positions`,
    which validation holds them to)."""
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


def positions(config: Any) -> tuple[int, str]:
    """Its rotary tables' length."""
    return config.model.llama.max_seq_len, "model.llama.max_seq_len"


SPECS = (
    KindSpec(
        name="llama",
        builder="trainrun.models.llama:build",
        family="llama",
        batches="token_windows",
        offers=frozenset({Capability.HIDDEN_MATRICES, Capability.TRANSFORMER_BLOCKS, Capability.META_INIT}),
        check=check,
        positions=positions,
        published_vocab=128_256,  # Llama 3's tokenizer
        published_shape=published_shape,
    ),
)
