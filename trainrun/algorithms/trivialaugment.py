"""TrivialAugment Wide (Müller and Hutter, 2021) through torchvision's ``v2.TrivialAugmentWide``.

One operation and one magnitude drawn uniformly per training image, no hyperparameters to tune
beyond the number of magnitude levels. Added to the training images' pipeline at FIT_START like
:mod:`trainrun.algorithms.randaugment`; torch DataLoader path only.
"""

from torchvision.transforms import v2

from trainrun.algorithms.base import ImageAugmentation
from trainrun.algorithms.specs.trivialaugment import TrivialAugmentConfig


class TrivialAugment(ImageAugmentation):
    name = "trivialaugment"

    @staticmethod
    def make_transform(config: TrivialAugmentConfig) -> v2.Transform:
        return v2.TrivialAugmentWide(num_magnitude_bins=config.num_magnitude_bins)
