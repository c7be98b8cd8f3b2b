"""Stochastic depth on residual blocks, with ``torchvision.ops.StochasticDepth``: torchvision's ResNet
blocks, and any block with drop-path layers of its own (every timm family but its ResNets, whose
``model.kwargs.drop_path_rate`` adds them), whose layers take the method's rates.

At INIT each ``BasicBlock`` / ``Bottleneck`` becomes a :class:`StochasticBlock` whose residual
branch passes through ``StochasticDepth(p_i)``; with ``distribution=linear`` block i of N gets
p_i = (i + 1) / N · drop_rate (ResNet-50: 16 blocks). ``sample`` mode drops the branch per
sample (torchvision's ``row``), ``block`` mode for the whole batch (``batch``). torchvision
rescales kept branches by 1 / (1 − p) in training and is the identity at evaluation, where
Composer leaves training unscaled and multiplies by (1 − p) at evaluation: the same expectation.
The block's own layers are kept, so initialisation and other surgery (BlurPool) survive.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck
from torchvision.ops import StochasticDepth as DropPath

from trainrun.algorithms.base import ModelSurgery
from trainrun.algorithms.specs.stochastic_depth import StochasticDepthConfig

DROP_PATH = "drop_path"  # the name timm gives a block's drop-path layers (drop_path, drop_path1, drop_path2)


class StochasticBlock(nn.Module):
    """A torchvision residual block whose branch may be dropped."""

    def __init__(self, block: BasicBlock | Bottleneck, p: float, mode: str) -> None:
        super().__init__()
        self.block = block
        self.drop = DropPath(p, "row" if mode == "sample" else "batch")

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        out = b.relu(b.bn1(b.conv1(x)))
        if isinstance(b, Bottleneck):
            out = b.relu(b.bn2(b.conv2(out)))
            return b.bn3(b.conv3(out))
        return b.bn2(b.conv2(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.block.downsample is None else self.block.downsample(x)
        return self.block.relu(identity + self.drop(self.branch(x)))


def drop_rates(count: int, drop_rate: float, distribution: str) -> list[float]:
    """Drop probability of each of ``count`` blocks, first to last."""
    if distribution == "uniform":
        return [drop_rate] * count
    return [(index + 1) / count * drop_rate for index in range(count)]


def drop_path_blocks(model: nn.Module) -> list[tuple[nn.Module, list[str]]]:
    """The blocks that carry their own drop-path layers (timm's ``drop_path``, ``drop_path1``,
    ``drop_path2``: the identity unless ``drop_path_rate`` is set), with those layers' names, in
    network order."""
    found = []
    for block in model.modules():
        names = [name for name, child in block.named_children() if name.startswith(DROP_PATH)]
        if names:
            found.append((block, names))
    return found


def apply_stochastic_depth(model: nn.Module, config: StochasticDepthConfig) -> list[nn.Module]:
    """Wrap every torchvision residual block in place, or set every block's own drop-path layers
    (a timm model's); return the new modules in network order."""
    if blocks := drop_path_blocks(model):
        rates = drop_rates(len(blocks), config.drop_rate, config.distribution)
        changed = []
        for (block, names), p in zip(blocks, rates, strict=True):
            for name in names:
                setattr(block, name, DropPath(p, "row" if config.mode == "sample" else "batch"))
                changed.append(getattr(block, name))
        return changed
    places = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, BasicBlock | Bottleneck)
    ]
    wrapped = []
    for (parent, name, block), p in zip(places, drop_rates(len(places), config.drop_rate, config.distribution)):
        wrapper = StochasticBlock(block, p, config.mode)
        setattr(parent, name, wrapper)
        wrapped.append(wrapper)
    return wrapped


class StochasticDepth(ModelSurgery):
    name = "stochastic_depth"
    surgery = staticmethod(apply_stochastic_depth)
    finds = "residual blocks (torchvision's, or blocks with drop-path layers, timm's)"
