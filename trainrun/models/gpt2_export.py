"""trainrun's GPT and ``transformers``' ``GPT2LMHeadModel``, both ways, where it has GPT-2's shape.

GPT-2's block is trainrun's with ``positions: learned``, ``norm: layernorm``, a GELU MLP (published
GPT-2's is the tanh approximation, ``mlp: gelu_tanh``), no QK-norm, no soft-cap and no ALiBi; each
weight maps to one of GPT-2's (:func:`gpt2_names`: its ``Conv1D`` layers hold the transpose of a
``Linear``'s weight; missing biases are zeros). The export (:func:`to_gpt2`) and the import of a
published folder (:func:`gpt2_state`, ``model.weights``) read the same table. The vocabulary is
trainrun's padded one (a multiple of 64): logits past the store's own vocabulary are the padding
rows', which an import leaves as the model initialised them (the model never returns them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from trainrun.atomic_io import atomic_directory
from trainrun.errors import ConfigError
from trainrun.models.specs.gpt import SETTINGS, TANH_GELUS, mlp_of


def gpt2_mismatch(model: torch.nn.Module) -> str | None:
    """Why ``model`` is not a GPT-2 (one phrase), or None if it is one."""
    config = model.config
    differences = {
        "positions are not learned": config.positions != "learned" or model.positions is None,
        "its norm is RMSNorm": config.norm != "layernorm",
        "it normalises queries and keys": config.qk_norm,
        "its MLP is ReLU²": config.mlp == "relu2",
        "its logits are soft-capped": config.logit_softcap is not None,
        "it masks attention by document": config.document_mask,
        "its attention is windowed": model.window is not None,
        "it has value embeddings": config.value_embeddings > 0,
    }
    return next((reason for reason, differs in differences.items() if differs), None)


def gpt2_names(layers: int) -> list[tuple[str, str, bool]]:
    """(GPT-2's name, trainrun's, whether GPT-2 holds the transpose) of every weight of ``layers`` blocks."""
    names = [("transformer.wte.weight", "embed.weight", False), ("transformer.wpe.weight", "positions.weight", False)]
    names += [(f"transformer.ln_f.{kind}", f"final_norm.{kind}", False) for kind in ("weight", "bias")]
    for index in range(layers):
        ours, theirs = f"blocks.{index}", f"transformer.h.{index}"
        for norm, hf in (("attention_norm", "ln_1"), ("mlp_norm", "ln_2")):
            names += [(f"{theirs}.{hf}.{kind}", f"{ours}.{norm}.{kind}", False) for kind in ("weight", "bias")]
        for hf, linear in LINEARS:
            names += [(f"{theirs}.{hf}.weight", f"{ours}.{linear}.weight", True)]
            names += [(f"{theirs}.{hf}.bias", f"{ours}.{linear}.bias", False)]
    return [*names, ("lm_head.weight", "head.weight", False)]


LINEARS = (("attn.c_attn", "attention.qkv"), ("attn.c_proj", "attention.proj"), ("mlp.c_fc", "mlp.up"))
LINEARS += (("mlp.c_proj", "mlp.proj"),)


def hf_gpt2_config(model: torch.nn.Module, end_of_text: int | None = None):
    """The ``transformers`` ``GPT2Config`` of trainrun's GPT ``model``."""
    from transformers import GPT2Config

    config = model.config
    return GPT2Config(
        vocab_size=model.embed.num_embeddings,
        **{theirs: getattr(config, ours) for ours, theirs in SETTINGS.items()},
        activation_function=TANH_GELUS[0] if config.mlp == "gelu_tanh" else "gelu",
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=model.final_norm.eps,
        bos_token_id=end_of_text,
        eos_token_id=end_of_text,
    )


def to_gpt2(model: torch.nn.Module, end_of_text: int | None = None):
    """A ``GPT2LMHeadModel`` with ``model``'s weights (``model`` must have GPT-2's shape) whose
    beginning and end of text, where ``generate`` stops, are token ``end_of_text`` (GPT-2's own
    50256 would lie outside a store's vocabulary)."""
    from transformers import GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(hf_gpt2_config(model, end_of_text))
    ours = model.state_dict()
    state = {}
    for theirs, name, transposed in gpt2_names(model.config.layers):
        if name in ours:
            state[theirs] = ours[name].T if transposed else ours[name]
        elif name.endswith(".bias"):  # a GPT without biases: GPT-2's are zeros
            weight = ours[name.removesuffix(".bias") + ".weight"]
            state[theirs] = weight.new_zeros(weight.shape[0])
    missing, unexpected = gpt2.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=False)
    if unexpected or [name for name in missing if not name.endswith(".attn.bias")]:
        raise RuntimeError(f"GPT-2 export: missing {missing}, unexpected {unexpected}")
    return gpt2.eval()


def gpt2_state(model: torch.nn.Module, source: Path) -> dict[str, torch.Tensor]:
    """trainrun's state dict for ``model`` from a published ``GPT2LMHeadModel`` folder (``config.json``
    checked, every weight by :func:`gpt2_names`, names with or without ``transformer.``; the padding
    rows of the vocabulary kept as initialised); one line naming the first difference or missing weight."""
    from trainrun.models.published import PublishedTensors, published_config
    from trainrun.models.weights import KEY

    mismatch = published_gpt2_mismatch(model, published_config(source))
    if mismatch:
        raise ConfigError(f"bad value for '{KEY}': '{source}' does not fit the model: {mismatch}")
    published = PublishedTensors(source)
    tensors = {name.removeprefix("transformer."): name for name in published}  # GPT-2's hub files lack the prefix
    state = {name: value.detach().clone() for name, value in model.state_dict().items()}
    for theirs, name, transposed in gpt2_names(model.config.layers):
        found = tensors.get(theirs.removeprefix("transformer."))
        if found is None and name == "head.weight":  # a tied head: the embedding
            found = tensors.get("wte.weight")
        if found is None:
            raise ConfigError(f"bad value for '{KEY}': '{source}' lacks the weight '{theirs}'")
        tensor = published[found].T if transposed else published[found]
        state[name][: tensor.shape[0]] = tensor  # the embedding and head: the published rows of the padded ones
    return state


def published_gpt2_mismatch(model: torch.nn.Module, published) -> str | None:
    """The first way a published GPT-2 config differs from trainrun's GPT ``model`` (one phrase), or None."""
    if published.model_type != "gpt2":
        return f"it is a {published.model_type} model, not a GPT-2"
    reason = gpt2_mismatch(model)
    if reason is not None:
        return f"a GPT-2 cannot hold this GPT: {reason}"
    if not model.config.bias:
        return "GPT-2's linear layers have biases: set model.gpt.bias=true"
    if published.vocab_size != model.vocab_size:
        return f"its vocabulary is {published.vocab_size:,}, the data's {model.vocab_size:,} (the store's tokenizer)"
    for setting, key in SETTINGS.items():
        value, wanted = getattr(published, key), getattr(model.config, setting)
        if value != wanted:
            return f"its {key} is {value}, model.gpt.{setting} {wanted}"
    activation = published.activation_function
    if mlp_of(activation) != model.config.mlp:
        return f"its activation is {activation}: set model.gpt.mlp={mlp_of(activation)}"
    return None


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
