"""A ResNet for 8-32 px images (digits, MNIST, CIFAR-sized data).

torchvision's ResNets cut the input by 4 in the stem (stride-2 7x7 conv and max-pool), which
leaves nothing of an 8 px image. This one keeps torchvision's ``BasicBlock`` and swaps the stem
for a stride-1 3x3 convolution, as the CIFAR ResNets of He et al. do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock

from trainrun.data.interface import TextFacts
from trainrun.models.initializers import initialize
from trainrun.schema import ModelConfig


def group_norm(channels: int) -> nn.GroupNorm:
    """Group normalisation with up to 8 groups: per-sample, so independent of how a batch is split."""
    return nn.GroupNorm(min(8, channels), channels)


class SmallResNet(nn.Module):
    """Stem, then one stage per entry of ``blocks`` (channels doubling, stride 2 after the first).

    ``norm`` "group" swaps every BatchNorm for :func:`group_norm`, which makes a step's result
    independent of the number of ranks the batch is split over.
    """

    def __init__(
        self, num_classes: int, width: int = 32, blocks: Sequence[int] = (1, 1, 1), norm: str = "batch"
    ) -> None:
        super().__init__()
        self.norm_layer: Callable[[int], nn.Module] = group_norm if norm == "group" else nn.BatchNorm2d
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = self.norm_layer(width)
        self.relu = nn.ReLU(inplace=True)
        stages, channels = [], width
        for index, count in enumerate(blocks):
            out_channels = width * 2**index
            stride = 1 if index == 0 else 2
            stages.append(self._stage(channels, out_channels, count, stride))
            channels = out_channels
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def _stage(self, in_channels: int, out_channels: int, count: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or in_channels != out_channels:
            downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                self.norm_layer(out_channels),
            )
        norm = self.norm_layer
        blocks = [BasicBlock(in_channels, out_channels, stride, downsample, norm_layer=norm)]
        blocks += [BasicBlock(out_channels, out_channels, norm_layer=norm) for _ in range(count - 1)]
        return nn.Sequential(*blocks)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.layers(self.relu(self.bn1(self.conv1(images))))
        return self.fc(torch.flatten(self.avgpool(features), 1))


def build(config: ModelConfig, text: TextFacts | None = None) -> SmallResNet:
    """``model=resnet_small``, initialised with ``model.initializers``."""
    small = config.resnet_small
    model = SmallResNet(config.num_classes, width=small.width, blocks=small.blocks, norm=small.norm)
    initialize(model, config.initializers, config.num_classes)
    return model
