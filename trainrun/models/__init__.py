"""Model builders: torchvision ResNets, a ResNet for 8-32 px images and Hugging Face BERT."""

from __future__ import annotations

from torch import nn

from trainrun.models.initializers import initialize
from trainrun.models.resnet import build_resnet
from trainrun.models.small import SmallResNet
from trainrun.models.weights import load_weights
from trainrun.schema import ModelConfig


def build_model(config: ModelConfig, vocab_size: int | None = None) -> nn.Module:
    """The network named by ``config``, initialised with its ``initializers`` (ResNets) or loaded
    from ``weights``; a BERT takes the vocabulary of the run's token store."""
    if config.name == "bert":
        from trainrun.models.bert import build_bert

        model = build_bert(config.bert, vocab_size)
    elif config.name == "resnet_small":
        small = config.resnet_small
        model = SmallResNet(config.num_classes, width=small.width, blocks=small.blocks, norm=small.norm)
    else:
        model = build_resnet(config.name, config.num_classes)
    if config.name != "bert":
        initialize(model, config.initializers, config.num_classes)
    if config.weights:
        load_weights(model, config.weights)
    return model
