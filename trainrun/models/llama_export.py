"""trainrun's Llama and ``transformers``' ``LlamaForCausalLM``, both ways, with the same logits.

Each weight maps to one of Hugging Face's Llama (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``,
``gate_proj``, ``up_proj``, ``down_proj``, the two RMSNorms per layer); both rotate the halves of
each head, so no weight is permuted. The configuration carries the rotary base and Llama 3's
frequency scaling (``rope_type: llama3``). The export (:func:`to_llama`) and the import of a
published folder (:func:`llama_state`, ``model.weights``) read the same names and settings.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainrun.errors import ConfigError
from trainrun.models.specs.llama import ROPE, SETTINGS

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

    scaled = config.rope_factor is not None
    rope = {key: getattr(config, ours) for ours, key in ROPE.items() if scaled or ours == "rope_theta"}
    return LlamaConfig(
        vocab_size=vocab_size,
        **{theirs: getattr(config, ours) for ours, theirs in SETTINGS.items()},
        max_position_embeddings=max(config.max_seq_len, config.rope_original_positions + 1),
        rope_parameters={"rope_type": "llama3" if scaled else "default", **rope},
        bos_token_id=end_of_text,
        eos_token_id=end_of_text,
    )


def llama_mismatch(config, vocab_size: int, published) -> str | None:
    """The first way a published ``transformers`` Llama config differs from trainrun's settings
    ``config`` and vocabulary (one phrase naming trainrun's key), or None where it fits."""
    ours = hf_llama_config(config, vocab_size)
    if published.model_type != "llama":
        return f"it is a {published.model_type} model, not a Llama"
    if published.vocab_size != vocab_size:
        return f"its vocabulary is {published.vocab_size:,}, the data's {vocab_size:,} (the store's tokenizer)"
    for setting, attribute in SETTINGS.items():
        value, wanted = getattr(published, attribute), getattr(ours, attribute)
        if value != wanted:
            return f"its {attribute} is {value}, model.llama.{setting} {wanted}"
    theirs, wanted = dict(published.rope_parameters or {}), ours.rope_parameters
    scaled = theirs.get("rope_type") == "llama3"
    for setting, key in ROPE.items():
        if (theirs.get(key) != wanted[key]) if key in wanted else scaled:
            return f"its rope {key} is {theirs.get(key)}, model.llama.{setting} {getattr(config, setting)}"
    return None


def llama_state(model: torch.nn.Module, source: Path):  # noqa: ANN201
    """``model``'s weights in a published ``LlamaForCausalLM`` folder, under trainrun's names, read
    when asked for (its ``config.json`` checked against the model's settings first; a tied head is
    the embedding); one line naming the first difference or the first weight missing."""
    from trainrun.models.published import PublishedTensors, Renamed, published_config
    from trainrun.models.weights import KEY

    mismatch = llama_mismatch(model.config, model.vocab_size, published_config(source))
    if mismatch:
        raise ConfigError(f"bad value for '{KEY}': '{source}' does not fit the model: {mismatch}")
    tensors = PublishedTensors(source)
    names = {name: hf_name(name) for name in model.state_dict()}
    if model.config.tie_head and names["head.weight"] not in tensors:
        names["head.weight"] = hf_name("embed.weight")
    missing = next((wanted for wanted in names.values() if wanted not in tensors), None)
    if missing:
        raise ConfigError(f"bad value for '{KEY}': '{source}' lacks the weight '{missing}'")
    return Renamed(tensors, names)


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
