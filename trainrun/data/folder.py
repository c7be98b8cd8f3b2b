"""ImageNet-style folders (``<path>/train/<class>/*.jpg``, ``<path>/val/<class>/*.jpg``)."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from trainrun.errors import DataError
from trainrun.schema import DataConfig


def _image_folder(root: Path, transform: v2.Transform) -> ImageFolder:
    if not root.is_dir():
        raise DataError(f"data folder '{root}' does not exist")
    try:
        dataset = ImageFolder(str(root), transform=transform)
    except (FileNotFoundError, RuntimeError) as error:
        raise DataError(f"no images in data folder '{root}': {str(error).splitlines()[0]}") from None
    if len(dataset) == 0:
        raise DataError(f"no images in data folder '{root}'")
    return dataset


def folder_datasets(config: DataConfig) -> tuple[Dataset, Dataset]:
    """Random-resized-crop + flip for training; resize + center crop for evaluation."""
    root = Path(config.path).expanduser()
    train = _image_folder(
        root / "train",
        v2.Compose(
            [
                v2.PILToTensor(),
                v2.RandomResizedCrop(
                    config.resolution, scale=tuple(config.crop_scale), ratio=tuple(config.crop_ratio), antialias=True
                ),
                v2.RandomHorizontalFlip(),
            ]
        ),
    )
    eval_resize = config.eval_resize or config.eval_resolution
    val = _image_folder(
        root / "val",
        v2.Compose([v2.PILToTensor(), v2.Resize(eval_resize, antialias=True), v2.CenterCrop(config.eval_resolution)]),
    )
    if len(train.classes) != config.num_classes:
        raise DataError(
            f"'{root / 'train'}' has {len(train.classes)} classes but data.num_classes is {config.num_classes}"
        )
    if train.classes != val.classes:
        raise DataError(f"class folders of '{root / 'train'}' and '{root / 'val'}' differ")
    return train, val
