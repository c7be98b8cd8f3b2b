"""The spec of ``model=gpt_*``: trainrun's GPT (trainrun/models/gpt.py)."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec
from trainrun.models.specs import check_even_heads, refuse_initializers

SETTINGS = {  # trainrun's GPT setting (model.gpt.*) -> transformers' GPT2Config attribute
    "layers": "n_layer",
    "heads": "n_head",
    "width": "n_embd",
    "max_seq_len": "n_positions",
    "tie_head": "tie_word_embeddings",
}
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # transformers' names of GELU's tanh approximation


def mlp_of(activation: str) -> str:
    """``model.gpt.mlp`` of a GPT-2 config's ``activation_function``."""
    return "gelu_tanh" if activation in TANH_GELUS else "gelu"


def published_shape(published: dict) -> dict:
    """``model.gpt.*`` from a ``GPT2LMHeadModel``'s ``config.json``: GPT-2's block (learned positions,
    LayerNorm, biases, its GELU, its dropout); one line where it is not a GPT-2."""
    if published.get("model_type") != "gpt2":
        found = published.get("model_type")
        raise ConfigError(f"bad value for 'model.weights': its config.json is a {found} model, not a gpt2")
    defaults = {"tie_word_embeddings": True}  # transformers' GPT2Config's, where config.json leaves it out
    settings = {ours: published.get(theirs, defaults.get(theirs)) for ours, theirs in SETTINGS.items()}
    activation = published.get("activation_function", TANH_GELUS[0])
    return {
        **settings, "positions": "learned", "norm": "layernorm", "bias": True, "mlp": mlp_of(activation),
        "dropout": published.get("resid_pdrop", 0.1),
    }  # fmt: skip


def check(config: Any) -> None:
    """Heads of an even size, value-embedding tables for at most half the blocks (its windows:
    :func:`positions`, which validation holds them to)."""
    refuse_initializers(config, "GPT-2's normal(0, 0.02), residual projections scaled by depth")
    gpt = config.model.gpt
    check_even_heads("gpt", gpt.width, gpt.heads)
    if 2 * gpt.value_embeddings > gpt.layers:
        raise ConfigError(
            f"bad value for 'model.gpt.value_embeddings': {gpt.value_embeddings} tables serve the first and the "
            f"last {gpt.value_embeddings} blocks, more than model.gpt.layers {gpt.layers}"
        )


def positions(config: Any) -> tuple[int, str] | None:
    """Its rotary tables' or learned positions' length; none with ALiBi's distance biases."""
    gpt = config.model.gpt
    return None if gpt.positions == "alibi" else (gpt.max_seq_len, "model.gpt.max_seq_len")


SPECS = (
    KindSpec(
        name="gpt",
        builder="trainrun.models.gpt:build",
        family="gpt",
        batches="token_windows",
        offers=frozenset(
            {Capability.ALIBI, Capability.ATTENTION_WINDOW, Capability.HIDDEN_MATRICES, Capability.TRANSFORMER_BLOCKS}
        ),
        check=check,
        positions=positions,
        published_vocab=50_257,  # GPT-2's tokenizer
        published_shape=published_shape,
    ),
)
