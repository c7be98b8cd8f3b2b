"""trainrun's GPT as a ``transformers`` ``GPT2LMHeadModel``, where it has GPT-2's shape.

GPT-2's block is trainrun's with ``positions: learned``, ``norm: layernorm``, ``mlp: gelu``, no
QK-norm, no soft-cap and no ALiBi; each weight maps to one of GPT-2's (its ``Conv1D`` layers hold
the transpose of a ``Linear``'s weight; missing biases are zeros) and the configuration says exact
GELU. The vocabulary is trainrun's padded one (a multiple of 64): logits past the store's own
vocabulary are the padding rows'.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from trainrun.atomic_io import atomic_directory


def gpt2_mismatch(model: torch.nn.Module) -> str | None:
    """Why ``model`` is not a GPT-2 (one phrase), or None if it is one."""
    config = model.config
    differences = {
        "positions are not learned": config.positions != "learned" or model.positions is None,
        "its norm is RMSNorm": config.norm != "layernorm",
        "it normalises queries and keys": config.qk_norm,
        "its MLP is ReLU²": config.mlp != "gelu",
        "its logits are soft-capped": config.logit_softcap is not None,
        "it masks attention by document": config.document_mask,
        "its attention is windowed": model.window is not None,
        "it has value embeddings": config.value_embeddings > 0,
    }
    return next((reason for reason, differs in differences.items() if differs), None)


def to_gpt2(model: torch.nn.Module, end_of_text: int | None = None):
    """A ``GPT2LMHeadModel`` with ``model``'s weights (``model`` must have GPT-2's shape) whose
    beginning and end of text, where ``generate`` stops, are token ``end_of_text`` (GPT-2's own
    50256 would lie outside a store's vocabulary)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = model.config
    hf_config = GPT2Config(
        vocab_size=model.embed.num_embeddings,
        n_positions=config.max_seq_len,
        n_embd=config.width,
        n_layer=config.layers,
        n_head=config.heads,
        activation_function="gelu",
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=model.final_norm.eps,
        tie_word_embeddings=config.tie_head,
        bos_token_id=end_of_text,
        eos_token_id=end_of_text,
    )
    gpt2 = GPT2LMHeadModel(hf_config)
    state = {"transformer.wte.weight": model.embed.weight, "transformer.wpe.weight": model.positions.weight}
    state |= _norm("transformer.ln_f", model.final_norm)
    for index, block in enumerate(model.blocks):
        prefix = f"transformer.h.{index}"
        state |= _norm(f"{prefix}.ln_1", block.attention_norm) | _norm(f"{prefix}.ln_2", block.mlp_norm)
        for name, linear in (
            ("attn.c_attn", block.attention.qkv),
            ("attn.c_proj", block.attention.proj),
            ("mlp.c_fc", block.mlp.up),
            ("mlp.c_proj", block.mlp.proj),
        ):
            state[f"{prefix}.{name}.weight"] = linear.weight.T  # Conv1D: (in, out)
            state[f"{prefix}.{name}.bias"] = (
                linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
            )
    state["lm_head.weight"] = model.head.weight
    missing, unexpected = gpt2.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=False)
    if unexpected or [name for name in missing if not name.endswith(".attn.bias")]:
        raise RuntimeError(f"GPT-2 export: missing {missing}, unexpected {unexpected}")
    return gpt2.eval()


def _norm(prefix: str, norm: torch.nn.LayerNorm) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": norm.weight, f"{prefix}.bias": norm.bias}


def export_gpt2(model: torch.nn.Module, tokenizer_file: Path, separator: int, directory: Path) -> None:
    """Write ``model`` and its tokenizer as a ``save_pretrained`` folder (atomically)."""
    save_pretrained(lambda eos: to_gpt2(model, eos), tokenizer_file, separator, directory)


def save_pretrained(exported: Callable, tokenizer_file: Path, separator: int, directory: Path) -> None:
    """Write ``exported(end of text id)``, a ``transformers`` model, and the run's tokenizer as a
    ``save_pretrained`` folder (atomically); the document ``separator`` is the tokenizer's end of
    text (and the model's beginning and end of text, where ``generate`` stops, as ``trainrun
    sample`` does), its [UNK] and [PAD] where it has them."""
    from transformers import PreTrainedTokenizerFast

    from trainrun.data.token_store import load_tokenizer
    from trainrun.models.weights import quiet_transformers

    loaded = load_tokenizer(tokenizer_file)
    named = {"unk_token": "[UNK]", "pad_token": "[PAD]"}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=loaded,
        eos_token=loaded.id_to_token(separator),
        **{role: token for role, token in named.items() if loaded.token_to_id(token) is not None},
    )
    with atomic_directory(directory) as partial, quiet_transformers():
        exported(tokenizer.eos_token_id).save_pretrained(partial)
        tokenizer.save_pretrained(partial)
