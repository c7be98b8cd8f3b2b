"""CutMix (Yun et al., 2019) through torchvision's ``v2.CutMix``.

At AFTER_DATALOADER (the whole batch, before any micro-batching) one box per batch, of area
fraction 1 − λ with λ ~ Beta(α, α), is pasted from each sample's partner (``roll(1)``); labels
are mixed with λ adjusted to the clipped box.
"""

from torchvision.transforms import v2

from trainrun.algorithms.base import BatchMixing


class CutMix(BatchMixing):
    name = "cutmix"
    transform_class = v2.CutMix
