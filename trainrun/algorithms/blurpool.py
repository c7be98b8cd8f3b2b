"""BlurPool (Zhang, 2019): low-pass filter before every downsampling step.

Strided convolutions with at least ``min_channels`` input channels get a depthwise
[1, 2, 1]ᵀ[1, 2, 1] / 16 blur, before the convolution (``blur_first``) or after it at stride 1;
max-pools become a stride-1 max-pool followed by a strided blur. On torchvision's ResNet-50 that
is the six strided convolutions past the stem, and the max-pool. torchvision has no such layer,
so it is written here. Surgery happens at INIT; no parameters are added (the filter is a buffer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainrun.algorithms.base import ModelSurgery
from trainrun.algorithms.specs.blurpool import BlurPoolConfig
from trainrun.models.surgery import replace_children


class Blur2d(nn.Module):
    """Depthwise binomial blur of every channel with the given stride; zero padding of 1."""

    def __init__(self, stride: int | tuple[int, int] = 1) -> None:
        super().__init__()
        taps = torch.tensor([1.0, 2.0, 1.0])
        self.register_buffer("kernel", ((taps[:, None] * taps[None, :]) / 16)[None, None], persistent=False)
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.kernel.to(x.dtype).expand(x.shape[1], 1, 3, 3)
        return F.conv2d(x, kernel, stride=self.stride, padding=1, groups=x.shape[1])


class BlurConv2d(nn.Module):
    """A strided convolution with a blur before it, or after it at stride 1."""

    def __init__(self, conv: nn.Conv2d, blur_first: bool) -> None:
        super().__init__()
        self.blur_first = blur_first
        if blur_first:
            self.blur = Blur2d()
        else:
            self.blur = Blur2d(stride=conv.stride)
            conv.stride = (1, 1)
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.blur(x)) if self.blur_first else self.blur(self.conv(x))


class BlurMaxPool2d(nn.Module):
    """Max over the pool's window at stride 1, then a blur at the pool's stride."""

    def __init__(self, pool: nn.MaxPool2d) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(pool.kernel_size, stride=1, padding=pool.padding, dilation=pool.dilation)
        self.blur = Blur2d(stride=pool.stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blur(self.pool(x))


def apply_blurpool(model: nn.Module, config: BlurPoolConfig) -> int:
    """Replace layers in place; return how many were replaced."""

    def blurred(child: nn.Module) -> nn.Module | None:
        strided_conv = isinstance(child, nn.Conv2d) and max(child.stride) > 1
        if strided_conv and config.replace_convs and child.in_channels >= config.min_channels:
            return BlurConv2d(child, config.blur_first)
        if isinstance(child, nn.MaxPool2d) and config.replace_maxpools:
            return BlurMaxPool2d(child)
        return None

    return replace_children(model, blurred)


class BlurPool(ModelSurgery):
    name = "blurpool"
    surgery = staticmethod(apply_blurpool)
    finds = "strided convolutions or max pools to blur"
