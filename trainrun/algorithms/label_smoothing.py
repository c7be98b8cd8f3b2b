"""Label smoothing: targets become (1 - α)·onehot + α / C for the loss, and are restored after it."""

import torch

from trainrun.algorithms.specs.label_smoothing import LabelSmoothingConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.tasks.losses import dense_targets


def smooth(targets: torch.Tensor, num_classes: int, smoothing: float, dtype: torch.dtype) -> torch.Tensor:
    """Class indices or dense rows, mixed with the uniform distribution."""
    return dense_targets(targets, num_classes, dtype) * (1 - smoothing) + smoothing / num_classes


class LabelSmoothing(Algorithm):
    name = "label_smoothing"
    events = frozenset({Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def __init__(self, config: LabelSmoothingConfig) -> None:
        super().__init__(config)
        self._original = None

    def apply(self, event: Event, state: State) -> None:
        if event is Event.BEFORE_LOSS:
            self._original = state.targets
            state.targets = smooth(state.targets, state.outputs.shape[1], self.config.smoothing, torch.float32)
        else:
            state.targets = self._original
