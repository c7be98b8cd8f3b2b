"""MixUp (Zhang et al., 2018) through torchvision's ``v2.MixUp``.

At AFTER_DATALOADER (the whole batch, before any micro-batching) one λ ~ Beta(α, α) is drawn
per batch and x' = λ·x + (1 − λ)·x[perm], y' = λ·onehot(y) + (1 − λ)·onehot(y[perm]);
torchvision pairs each sample with its neighbour in the batch (``roll(1)``), a permutation,
where Composer draws a random one and keeps λ ≤ 0.5 for the partner: the same distribution of
mixtures, the field's implementation.
"""

from torchvision.transforms import v2

from trainrun.algorithms.base import BatchMixing


class MixUp(BatchMixing):
    name = "mixup"
    transform_class = v2.MixUp
