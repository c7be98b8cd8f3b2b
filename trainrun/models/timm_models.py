"""Any architecture in timm's registry (``model=timm model.arch=NAME``), built through timm's one door,
``timm.create_model``: random weights initialised as timm initialises them (nothing is downloaded;
``model.weights`` loads a local file in timm's layout), the data's classes, and the side of the run's
images for an architecture built for one input size (ViT, Swin, MLP-Mixer: a ``*_224`` name run at
64 px is built for 64)."""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

from torch import nn

from trainrun.data.interface import TextFacts
from trainrun.python_parsing import collector_paused
from trainrun.schema import ModelConfig

IMAGE_CHANNELS = 3  # the image loaders' RGB


def timm_library() -> ModuleType:
    """timm, imported without the deprecation warning torch gives for its TorchScript interfaces, and
    with the collector paused (its import parses Python: :mod:`trainrun.python_parsing`)."""
    with warnings.catch_warnings(), collector_paused():
        warnings.filterwarnings("ignore", message=".*torch.jit.interface", category=FutureWarning)
        import timm

    return timm


def fixed_input_size(arch: str) -> bool:
    """Whether timm builds ``arch`` for one input size (its pretrained config's ``fixed_input_size``)."""
    pretrained = timm_library().models.get_pretrained_cfg(arch)
    return bool(pretrained is not None and pretrained.fixed_input_size)


def create_arguments(config: ModelConfig) -> dict[str, Any]:
    """What ``timm.create_model`` is given besides the name: the data's classes and channels, the run's
    side where the architecture is built for one, then ``model.kwargs`` (which may set any of them)."""
    arguments: dict[str, Any] = {"num_classes": config.num_classes, "in_chans": IMAGE_CHANNELS}
    if config.image_size is not None and fixed_input_size(config.arch):
        arguments["img_size"] = config.image_size
    return arguments | dict(config.kwargs)


def build(config: ModelConfig, text: TextFacts | None = None) -> nn.Module:
    """``model=timm``: ``model.arch`` from timm's registry with random weights."""
    return timm_library().create_model(config.arch, pretrained=False, **create_arguments(config))
