"""Bases that several speed-up methods share: what they have in common, written once."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torchvision.transforms import v2

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.core.work import StepWork
from trainrun.errors import ConfigError


class ModelSurgery(Algorithm):
    """A method that changes the model once, at INIT, before the optimizer and DDP see it.

    Subclasses set ``surgery = staticmethod(f)`` with ``f(model, config)`` returning what it
    changed (a count or the new modules), and ``finds``, what it looks for: a model with none of
    it is told so in a warning, since the method then has no effect.
    """

    events = frozenset({Event.INIT})
    surgery: ClassVar[Any]
    finds: ClassVar[str]

    def apply(self, event: Event, state: State) -> None:
        self.operate(state)

    def rebuild(self, model: torch.nn.Module) -> None:
        self.surgery(model, self.config)

    def operate(self, state: State) -> bool:
        """Run the surgery on the model; warn and return False when it changed nothing."""
        if self.surgery(state.raw_model, self.config):
            return True
        state.warn(f"{self.name}: the model has no {self.finds}; nothing changed")
        return False


class TrainingResolution(Algorithm, ABC):
    """Trains at :meth:`target_size`: decoded at that size by the loader when it can (asked at each
    EPOCH_START) and :attr:`loader_decodes`, otherwise each larger training batch is shrunk on the
    device at AFTER_DATALOADER."""

    events = frozenset({Event.EPOCH_START, Event.AFTER_DATALOADER})
    decoding = False  # the loader decodes at the target size this epoch
    loader_decodes = True  # ask a loader that can decode at any size to decode at the target size

    @abstractmethod
    def target_size(self, state: State) -> int:
        """The side length to train at now."""

    @abstractmethod
    def shrink(self, images: torch.Tensor, size: int) -> torch.Tensor:
        """A batch made ``size`` x ``size`` on the device."""

    def match(self, event: Event, state: State) -> bool:
        return event is Event.EPOCH_START or (event is Event.AFTER_DATALOADER and not self.decoding)

    def apply(self, event: Event, state: State) -> None:
        size = self.target_size(state)
        if event is Event.EPOCH_START:
            self.decoding = self.loader_decodes and state.data is not None and state.data.set_train_resolution(size)
        elif size < state.inputs.shape[-1]:
            state.inputs = self.shrink(state.inputs, size)


class BatchMixing(Algorithm):
    """Applies a torchvision batch transform (MixUp, CutMix) to the training batch."""

    events = frozenset({Event.AFTER_DATALOADER})
    transform_class: type[v2.Transform]

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.transform = None

    def apply(self, event: Event, state: State) -> None:
        if self.transform is None:
            self.transform = self.transform_class(alpha=self.config.alpha, num_classes=state.num_classes)
        state.inputs, state.targets = self.transform(state.inputs, state.targets)

    def device_work(self, state: State) -> tuple[Callable[[], object], str]:
        """The transform on a batch of the state's inputs' and targets' shapes, every step. Made and run on
        real tensors: it draws its mixing weight as a number, which fake tensors cannot give."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            transform = self.transform_class(alpha=self.config.alpha, num_classes=state.num_classes)
            images = torch.zeros(state.inputs.shape, dtype=state.inputs.dtype)
            labels = torch.zeros(state.targets.shape, dtype=state.targets.dtype)

        def mix() -> object:
            with unset_fake_temporarily():
                return transform(images, labels)

        return mix, "1ba"


class ImageAugmentation(Algorithm, ABC):
    """Adds a per-image torchvision transform to the training data at FIT_START."""

    events = frozenset({Event.FIT_START})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.transform = self.make_transform(config)

    @staticmethod
    @abstractmethod
    def make_transform(config: Any) -> v2.Transform:
        """The per-image transform ``config`` describes."""

    def operations_an_image(self) -> float:
        """The image operations the transform runs on each image."""
        return 1.0

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        """Each training image costs the loader these operations more."""
        return dataclasses.replace(work, image_ops=work.image_ops + self.operations_an_image())

    def apply(self, event: Event, state: State) -> None:
        if not state.data.add_train_transform(self.transform):
            raise ConfigError(f"algorithm '{self.name}' needs the torch DataLoader path (data.loader=torch)")
