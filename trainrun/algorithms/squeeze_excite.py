"""Squeeze-and-excitation (Hu et al., 2018) after the model's large convolutions.

At INIT every Conv2d with min(in, out) ≥ ``min_channels`` becomes conv → SE, torchvision's
``ops.SqueezeExcitation``: global average pool → 1×1 conv to ``latent_channels`` → ReLU → 1×1
conv back → sigmoid gate per channel. ``latent_channels`` < 1 means a fraction of the conv's
output channels. Adds parameters and a little compute; gains accuracy per epoch.
"""

from __future__ import annotations

from torch import nn
from torchvision.ops import SqueezeExcitation

from trainrun.algorithms.base import ModelSurgery
from trainrun.algorithms.specs.squeeze_excite import SqueezeExciteConfig
from trainrun.models.surgery import replace_children


def latent(channels: int, latent_channels: float) -> int:
    """Width of the bottleneck for a conv with ``channels`` outputs."""
    return max(int(channels * latent_channels) if latent_channels < 1 else int(latent_channels), 1)


def apply_squeeze_excite(model: nn.Module, config: SqueezeExciteConfig) -> int:
    """Follow each large Conv2d with an SE gate, in place; return how many were added."""

    def gated(child: nn.Module) -> nn.Module | None:
        if not isinstance(child, nn.Conv2d) or min(child.in_channels, child.out_channels) < config.min_channels:
            return None
        gate = SqueezeExcitation(child.out_channels, latent(child.out_channels, config.latent_channels))
        return nn.Sequential(child, gate.to(child.weight.device))

    return replace_children(model, gated)


class SqueezeExcite(ModelSurgery):
    name = "squeeze_excite"
    surgery = staticmethod(apply_squeeze_excite)
    finds = "convolutions large enough to gate (squeeze_excite.min_channels)"
