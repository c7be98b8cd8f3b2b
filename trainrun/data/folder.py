"""ImageNet-style folders (``<path>/train/<class>/*.jpg``, ``<path>/val/<class>/*.jpg``).

``data.decode=full`` decodes every image whole, then crops and resizes it (torchvision's
ImageFolder pipeline). ``draft`` first chooses the crop from the file's header alone, then has
libjpeg decode at 1/2, 1/4 or 1/8 scale (PIL's ``draft``, a reduced inverse DCT) wherever the crop
still spans at least the output size each way, and resizes from that: the same crops, the same
random draws, far less decoding when crops are large against the output (most ImageNet training
crops at 176 px), at some fidelity (the reduced decode is a box filter; see docs/benchmarks.md).
Files other than JPEG decode whole either way.

A file that cannot be read (not an image, truncated, an unknown format under an image's name) does
not end a long run: it is skipped with one warning naming it, a readable image takes its place,
and the run's ``summary.json`` lists it (``unreadable_files``). Checking every file before the
first step would cost an ImageNet-sized folder minutes of decoding on every new machine.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torchvision import transforms
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.interface import Datasets
from trainrun.errors import DataError
from trainrun.schema import DataConfig


class DraftCrop:
    """A random-resized crop to ``size`` of a lazily opened PIL image, decoded at the scale it needs."""

    def __init__(self, size: int, scale: tuple[float, float], ratio: tuple[float, float]) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, image: Image.Image) -> torch.Tensor:
        top, left, height, width = transforms.RandomResizedCrop.get_params(image, self.scale, self.ratio)
        full_width, full_height = image.size
        # the smallest decode in which the crop still spans ``size`` pixels each way
        image.draft("RGB", (math.ceil(full_width * self.size / width), math.ceil(full_height * self.size / height)))
        decoded = image.convert("RGB")
        x, y = decoded.width / full_width, decoded.height / full_height
        box = (round(top * y), round(left * x), max(1, round(height * y)), max(1, round(width * x)))
        return F.resized_crop(F.pil_to_tensor(decoded), *box, [self.size, self.size], antialias=True)


class DraftResize:
    """Resize the shorter side to ``size`` and center-crop ``crop``, decoding at the scale it needs."""

    def __init__(self, size: int, crop: int) -> None:
        self.size, self.crop = size, crop

    def __call__(self, image: Image.Image) -> torch.Tensor:
        width, height = image.size
        shorter = min(width, height)
        image.draft("RGB", (math.ceil(width * self.size / shorter), math.ceil(height * self.size / shorter)))
        resized = F.resize(F.pil_to_tensor(image.convert("RGB")), self.size, antialias=True)
        return F.center_crop(resized, self.crop)


UNREADABLE = (OSError, SyntaxError, Image.DecompressionBombError)  # what PIL raises for a bad file


class ReadableImages(ImageFolder):
    """An ImageFolder that skips the files it cannot read (module docstring). Which files failed is
    kept in shared memory, so the loader's worker processes and the run's own process all see it."""

    def __init__(self, root: str, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.failed = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()

    def __getitem__(self, index: int) -> tuple[Any, int]:
        for offset in range(len(self.samples)):  # the next readable file takes a failed one's place
            candidate = (index + offset) % len(self.samples)
            if self.failed[candidate]:
                continue
            try:
                return super().__getitem__(candidate)
            except UNREADABLE as error:
                self.failed[candidate] = True
                print(
                    f"trainrun: warning: skipping unreadable image '{self.samples[candidate][0]}' "
                    f"({type(error).__name__}: {error}); listed in summary.json",
                    file=sys.stderr,
                    flush=True,
                )
        raise DataError(f"no image in data folder '{self.root}' can be read")

    def unreadable_files(self) -> list[str]:
        """The files skipped so far, in the folder's order."""
        return [self.samples[index][0] for index in self.failed.nonzero().flatten().tolist()]


def _image_folder(root: Path, transform: v2.Transform, lazy: bool) -> ReadableImages:
    if not root.is_dir():
        raise DataError(f"data folder '{root}' does not exist")
    try:
        # lazily opened: draft decoding needs the file before its pixels are read
        dataset = ReadableImages(str(root), transform=transform, **({"loader": Image.open} if lazy else {}))
    except (FileNotFoundError, RuntimeError) as error:
        raise DataError(f"no images in data folder '{root}': {str(error).splitlines()[0]}") from None
    if len(dataset) == 0:
        raise DataError(f"no images in data folder '{root}'")
    return dataset


def folder_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Random-resized-crop + flip for training; resize + center crop for evaluation (decoding needs both)."""
    root = Path(config.path).expanduser()
    scale, ratio = tuple(config.crop_scale), tuple(config.crop_ratio)
    eval_resize = config.eval_resize or config.eval_resolution
    draft = config.decode == "draft"
    if draft:
        crop = DraftCrop(config.resolution, scale, ratio)
        evaluate = DraftResize(eval_resize, config.eval_resolution)
    else:
        crop = v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(config.resolution, scale, ratio, antialias=True)])
        evaluate = v2.Compose(
            [v2.PILToTensor(), v2.Resize(eval_resize, antialias=True), v2.CenterCrop(config.eval_resolution)]
        )
    train = _image_folder(root / "train", v2.Compose([crop, v2.RandomHorizontalFlip()]), draft)
    val = _image_folder(root / "val", evaluate, draft)
    if len(train.classes) != config.num_classes:
        raise DataError(
            f"'{root / 'train'}' has {len(train.classes)} classes but data.num_classes is {config.num_classes}"
        )
    if train.classes != val.classes:
        raise DataError(f"class folders of '{root / 'train'}' and '{root / 'val'}' differ")
    return Datasets(train, val)
