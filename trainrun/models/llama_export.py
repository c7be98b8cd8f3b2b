"""trainrun's Llama as a ``transformers`` ``LlamaForCausalLM`` with the same logits.

Each weight maps to one of Hugging Face's Llama (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``,
``gate_proj``, ``up_proj``, ``down_proj``, the two RMSNorms per layer); both rotate the halves of
each head, so no weight is permuted. The configuration carries the rotary base and Llama 3's
frequency scaling (``rope_type: llama3``).
"""

from __future__ import annotations

from pathlib import Path

import torch

NAMES = {  # trainrun's name within a block -> Hugging Face's within model.layers.N
    "attention_norm": "input_layernorm",
    "attention.query": "self_attn.q_proj",
    "attention.key": "self_attn.k_proj",
    "attention.value": "self_attn.v_proj",
    "attention.out": "self_attn.o_proj",
    "mlp_norm": "post_attention_layernorm",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}


def hf_name(name: str) -> str:
    """Hugging Face's name for trainrun's weight ``name``."""
    if name.startswith("blocks."):
        _, index, rest = name.split(".", 2)
        inner = rest.removesuffix(".weight")
        return f"model.layers.{index}.{NAMES[inner]}.weight"
    outside = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    return outside.get(name, "lm_head.weight" if name == "head.weight" else name)


def hf_llama_config(config, vocab_size: int, end_of_text: int | None = None):
    """The ``transformers`` ``LlamaConfig`` of trainrun's Llama settings ``config`` (a ``LlamaConfig``
    of :mod:`trainrun.schema`), its rotary scaling included."""
    from transformers import LlamaConfig

    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_factor is not None:
        rope |= {
            "rope_type": "llama3",
            "factor": config.rope_factor,
            "low_freq_factor": config.rope_low_freq_factor,
            "high_freq_factor": config.rope_high_freq_factor,
            "original_max_position_embeddings": config.rope_original_positions,
        }
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.width,
        intermediate_size=config.ffn_hidden,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=max(config.max_seq_len, config.rope_original_positions + 1),
        rms_norm_eps=config.norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=config.tie_head,
        bos_token_id=end_of_text,
        eos_token_id=end_of_text,
    )


def to_llama(model: torch.nn.Module, end_of_text: int | None = None):
    """A ``LlamaForCausalLM`` with ``model``'s weights; ``generate`` begins and stops at ``end_of_text``."""
    from transformers import LlamaForCausalLM

    config = model.config
    hf_config = hf_llama_config(config, model.vocab_size, end_of_text)
    llama = LlamaForCausalLM(hf_config)
    state = {hf_name(name): value.detach().clone() for name, value in model.state_dict().items()}
    missing, unexpected = llama.load_state_dict(state, strict=False)
    if unexpected or [name for name in missing if not (config.tie_head and name == "lm_head.weight")]:
        raise RuntimeError(f"Llama export: missing {missing}, unexpected {unexpected}")
    return llama.eval()


def export_llama(model: torch.nn.Module, tokenizer_file: Path, separator: int, directory: Path) -> None:
    """Write ``model`` and its tokenizer as a ``save_pretrained`` folder (atomically)."""
    from trainrun.models.gpt2_export import save_pretrained

    save_pretrained(lambda eos: to_llama(model, eos), tokenizer_file, separator, directory)


def equal_logits(model: torch.nn.Module, exported, tokens: torch.Tensor) -> float:
    """The largest difference between ``model``'s logits and the exported model's on ``tokens``."""
    with torch.no_grad():
        return float((model(tokens) - exported(tokens).logits.float()).abs().max())
