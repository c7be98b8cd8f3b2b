"""TrivialAugment Wide (Müller and Hutter, 2021) through torchvision's ``v2.TrivialAugmentWide``.

One operation and one magnitude drawn uniformly per training image, no hyperparameters to tune
beyond the number of magnitude levels. Added to the training images' pipeline at FIT_START like
:mod:`trainrun.algorithms.randaugment`; torch DataLoader path only.
"""

from trainrun.algorithms.randaugment import ImageAugmentation, transform
from trainrun.schema import TrivialAugmentConfig


class TrivialAugment(ImageAugmentation):
    name = "trivialaugment"


def build(config: TrivialAugmentConfig) -> TrivialAugment:
    return TrivialAugment(transform(config))
