"""torchvision's ImageNet ResNets, built without pretrained weights."""

from torch import nn
from torchvision.models import resnet

from trainrun.data.interface import TextFacts
from trainrun.models.initializers import initialize
from trainrun.schema import ModelConfig


def build(config: ModelConfig, text: TextFacts | None = None) -> nn.Module:
    """``model=resnet18|34|50|101`` (:data:`trainrun.models.specs.resnet.RESNETS`): torchvision's network with a
    ``num_classes``-way head, random weights initialised with ``model.initializers``."""
    model = getattr(resnet, config.name)(weights=None, num_classes=config.num_classes)
    initialize(model, config.initializers, config.num_classes)
    return model
