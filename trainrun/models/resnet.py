"""torchvision's ImageNet ResNets, built without pretrained weights."""

from torch import nn
from torchvision.models import resnet

RESNETS = {
    "resnet18": resnet.resnet18,
    "resnet34": resnet.resnet34,
    "resnet50": resnet.resnet50,
    "resnet101": resnet.resnet101,
}


def build_resnet(name: str, num_classes: int) -> nn.Module:
    """torchvision ResNet ``name`` with a ``num_classes``-way head and random weights."""
    return RESNETS[name](weights=None, num_classes=num_classes)
