"""RandAugment (Cubuk et al., 2020) through torchvision's ``v2.RandAugment``.

At FIT_START the transform joins the training images' pipeline (after the crop and flip, on
uint8 tensors, in the DataLoader workers): ``depth`` operations drawn from torchvision's 14
per image. Composer draws each operation's magnitude from U(0.1, severity)/10 of its maximum;
torchvision applies a fixed magnitude. trainrun keeps the library and matches the *mean*
strength: severity s on a 21-level scale (magnitude s of bins 0..20), so severity 10 is half of
each operation's maximum, the mean of Composer's draw at severity 10. The FFCV loader compiles
its pipeline and cannot run it; that is refused at start-up.
"""

from torchvision.transforms import v2

from trainrun.algorithms.base import ImageAugmentation
from trainrun.algorithms.specs.randaugment import RandAugmentConfig

SEVERITY_LEVELS = 21


class RandAugment(ImageAugmentation):
    name = "randaugment"

    @staticmethod
    def make_transform(config: RandAugmentConfig) -> v2.Transform:
        return v2.RandAugment(num_ops=config.depth, magnitude=config.severity, num_magnitude_bins=SEVERITY_LEVELS)

    def operations_an_image(self) -> float:
        return float(self.config.depth)
