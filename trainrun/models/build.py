"""Model builders: torchvision ResNets, a ResNet for 8-32 px images and Hugging Face BERT."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from trainrun.data.interface import TextFacts
from trainrun.models.published import same_tokenizer
from trainrun.models.weights import load_weights
from trainrun.registry import builder
from trainrun.schema import ModelConfig


def build_model(config: ModelConfig, text: TextFacts | None = None) -> nn.Module:
    """The network ``model.name`` names (:mod:`trainrun.registry`), initialised by its builder or
    loaded from ``model.weights`` (a published folder's tokenizer checked against the data's); a
    BERT or GPT takes the vocabulary of the run's token store (``text``), a GPT also its document
    separator."""
    model = builder("model", config.name)(config, text)
    if config.weights:
        if text is not None:  # a published folder's tokenizer must be the data's
            same_tokenizer(Path(config.weights).expanduser(), text.tokenizer_file)
        load_weights(model, config.weights)
    return model
