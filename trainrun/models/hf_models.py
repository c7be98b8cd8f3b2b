"""Any architecture transformers builds from a config (``model=transformers model.arch=TYPE``), through
its Auto classes: ``AutoConfig.for_model`` (or a local folder's ``config.json``, ``model.path``) with
``model.config``'s settings and the data's vocabulary, ``AutoModelForCausalLM`` or
``AutoModelForMaskedLM`` by the run's task, attention as transformers chooses it (its fused kernel where the
architecture has one); nothing is downloaded. Where the folder holds weights, the
run starts from them (continued pretraining)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainrun.data.interface import TextFacts
from trainrun.schema import ModelConfig

AUTO_CLASSES = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM"}  # by the run's task
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


class LanguageModel(nn.Module):
    """A transformers language model as trainrun's tasks call it: a causal model takes a batch of token
    ids, a masked one the batch's ``input_ids`` and ``attention_mask``; both return every position's
    logits (batch, sequence, vocabulary)."""

    def __init__(self, model: nn.Module, masked: bool) -> None:
        super().__init__()
        self.model = model
        self.masked = masked

    @property
    def blocks(self) -> list[nn.Module]:
        """The architecture's repeated blocks, as transformers names them (``_no_split_modules``; a
        class that occurs once, such as embeddings, is not a block): FSDP2's units, activation
        checkpointing's."""
        named = set(getattr(self.model, "_no_split_modules", None) or ())
        found = [module for module in self.model.modules() if type(module).__name__ in named]
        return [module for module in found if sum(type(other) is type(module) for other in found) > 1]

    @property
    def transformers_class(self) -> str:
        return type(self.model).__name__

    def forward(self, inputs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        if self.masked:
            return self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        return self.model(input_ids=inputs, use_cache=False).logits

    def export_pretrained(self, tokenizer_file: Path, separator: int, directory: Path) -> str | None:
        """Write the model and the run's tokenizer as a ``save_pretrained`` folder (atomically): a causal
        model's with the separator as its end of text, a masked model's as BERT's export writes it."""
        from trainrun.atomic_io import atomic_directory
        from trainrun.models.gpt2_export import save_pretrained
        from trainrun.models.weights import hugging_face_tokenizer, quiet_transformers

        if not self.masked:
            save_pretrained(lambda end_of_text: self.model, tokenizer_file, separator, directory)
            return None
        with atomic_directory(directory) as partial, quiet_transformers():
            self.model.save_pretrained(partial)
            hugging_face_tokenizer(tokenizer_file).save_pretrained(partial)
        return None


SPECIAL_TOKENS = {"pad_token_id": "[PAD]", "cls_token_id": "[CLS]", "sep_token_id": "[SEP]", "mask_token_id": "[MASK]"}


def special_token_ids(text: TextFacts) -> dict[str, int | None]:
    """The config's special-token ids as the data's tokenizer has them: its [PAD], [CLS], [SEP] and
    [MASK], and the document separator as the beginning and end of text."""
    found: dict[str, int | None] = {"bos_token_id": text.separator, "eos_token_id": text.separator}
    if text.tokenizer_file is not None:
        from trainrun.data.token_store import load_tokenizer

        tokenizer = load_tokenizer(text.tokenizer_file)
        found |= {key: tokenizer.token_to_id(token) for key, token in SPECIAL_TOKENS.items()}
    return found


def hf_config(config: ModelConfig, text: TextFacts) -> Any:
    """The architecture's config: ``model.path``'s ``config.json`` or ``model.arch``'s defaults, then
    ``model.config``'s settings, the data's vocabulary and its special tokens (an id the architecture's
    defaults give past the data's vocabulary is dropped)."""
    from transformers import AutoConfig

    if config.path:
        built = AutoConfig.from_pretrained(Path(config.path).expanduser(), local_files_only=True)
        for key, value in config.config.items():
            setattr(built, key, value)
    else:
        built = AutoConfig.for_model(config.arch, **config.config)
    built.vocab_size = text.vocab_size
    for key, value in special_token_ids(text).items():
        if hasattr(built, key) and key not in config.config:
            setattr(built, key, value)
    for key, value in list(vars(built).items()):
        if key.endswith("_token_id") and isinstance(value, int) and value >= text.vocab_size:
            setattr(built, key, None)
    return built


def weights_folder(config: ModelConfig) -> Path | None:
    """``model.path`` where it holds weights to start from."""
    folder = Path(config.path).expanduser() if config.path else None
    return folder if folder is not None and any((folder / name).is_file() for name in WEIGHT_FILES) else None


def auto_class(head: str) -> Any:
    import transformers

    return getattr(transformers, AUTO_CLASSES[head])


def build(config: ModelConfig, text: TextFacts) -> nn.Module:
    """``model=transformers``: the architecture for the run's task, random weights (``model.path``'s where
    it has them and the model is not being built on the meta device)."""
    from trainrun.models.weights import quiet_transformers

    architecture, auto, folder = hf_config(config, text), auto_class(config.head), weights_folder(config)
    on_meta = nn.Linear(1, 1).weight.is_meta  # a build on the meta device (trainrun estimate, a method's trial)
    with quiet_transformers():
        if folder is not None and not on_meta:
            model = auto.from_pretrained(folder, config=architecture, local_files_only=True)
        else:
            model = auto.from_config(architecture)
    return LanguageModel(model, masked=config.head == "masked_lm")
