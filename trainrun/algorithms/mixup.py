"""MixUp (Zhang et al., 2018) through torchvision's ``v2.MixUp``.

At BEFORE_FORWARD one λ ~ Beta(α, α) is drawn per batch and x' = λ·x + (1 − λ)·x[perm],
y' = λ·onehot(y) + (1 − λ)·onehot(y[perm]); torchvision pairs each sample with its neighbour
in the batch (``roll(1)``), a permutation, where Composer draws a random one and keeps
λ ≤ 0.5 for the partner: the same distribution of mixtures, the field's implementation.
"""

from torchvision.transforms import v2

from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.schema import MixUpConfig


class BatchMixing(Algorithm):
    """Applies a torchvision batch transform (MixUp, CutMix) to the training batch."""

    events = frozenset({Event.BEFORE_FORWARD})
    order = 40  # before label smoothing, which smooths the mixed targets
    transform_class: type[v2.Transform]

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.transform = None

    def apply(self, event: Event, state: State) -> None:
        if self.transform is None:
            self.transform = self.transform_class(alpha=self.alpha, num_classes=state.num_classes)
        state.inputs, state.targets = self.transform(state.inputs, state.targets)


class MixUp(BatchMixing):
    name = "mixup"
    transform_class = v2.MixUp


def build(config: MixUpConfig) -> MixUp:
    return MixUp(config.alpha)
