"""Data loading: FFCV against torchvision's ImageFolder + DataLoader, same augmentations, same workers.

Generates a JPEG ImageFolder of ImageNet-like sizes (sides 300-500 px, quality 90) and writes it
to a .beton, by default with the published ImageNet settings (proportion mode, longest side 500,
JPEG with probability 0.5, quality 90; ``--mode``, ``--max-resolution`` and
``--compress-probability`` change them: the published ResNet-18 files are 400 px, 0.1). Both are
read for ``--epochs`` epochs with a random-resized crop to 176 px and a horizontal flip, as uint8
NCHW batches; the last epoch of each is timed, so worker start-up and FFCV's one-off compilation
(shown in the first epoch) are not counted. Target: FFCV >= 3x torchvision on a 2-core machine.

    .venv/bin/python bench/loaders.py [--images 2000] [--workers 2] [--batch 128] [--dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from trainrun.data.write import WriteSettings, write_beton

CLASSES = 10


def make_jpeg_folder(root: Path, count: int, seed: int = 0) -> None:
    """``count`` photos-like JPEGs (smooth colour fields plus grain) in ``CLASSES`` class folders."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        width, height = rng.integers(300, 501, size=2)
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((int(width), int(height)), Image.BICUBIC)
        grain = rng.normal(0, 12, (int(height), int(width), 3))
        pixels = np.clip(np.asarray(image, dtype=np.float32) + grain, 0, 255).astype(np.uint8)
        folder = root / f"class{index % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{index}.jpg", quality=90)


def timed_epochs(loader, epochs: int) -> list[float]:
    """Seconds per epoch, each batch's pixels touched so no loader can skip work."""
    seconds = []
    for _ in range(epochs):
        started = time.perf_counter()
        for images, _labels in loader:
            images[:, :, 0, 0].sum()
        seconds.append(time.perf_counter() - started)
    return seconds


def torchvision_loader(root: Path, resolution: int, batch: int, workers: int) -> DataLoader:
    transform = v2.Compose(
        [v2.RandomResizedCrop(resolution, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor()]
    )
    return DataLoader(
        ImageFolder(str(root), transform=transform),
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )


def ffcv_loader(beton: Path, resolution: int, batch: int, workers: int):
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    pipelines = {
        "image": [
            RandomResizedCropRGBImageDecoder((resolution, resolution)),
            RandomHorizontalFlip(),
            ToTensor(),
            ToTorchImage(channels_last=False),
        ],
        "label": [IntDecoder(), ToTensor(), Squeeze()],
    }
    return Loader(
        str(beton),
        batch_size=batch,
        num_workers=workers,
        order=OrderOption.RANDOM,
        os_cache=True,
        drop_last=True,
        pipelines=pipelines,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--resolution", type=int, default=176)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--mode", default="proportion", help=".beton write mode (published: proportion)")
    parser.add_argument("--max-resolution", type=int, default=500, help=".beton longest side (published: 500)")
    parser.add_argument(
        "--compress-probability", type=float, default=0.5, help="share stored as JPEG (published: 0.5; ResNet-18: 0.1)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="keep the generated files here (reused)")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="trainrun-bench-"))
    written_as = f"{args.mode}-{args.max_resolution}-{args.compress_probability:g}"
    folder, beton = work / "jpeg", work / f"images-{written_as}.beton"
    if not folder.is_dir():
        started = time.perf_counter()
        make_jpeg_folder(folder, args.images)
        print(f"generated {args.images} JPEGs in {time.perf_counter() - started:.1f}s")
    if not beton.is_file():
        started = time.perf_counter()
        settings = WriteSettings(
            mode=args.mode,
            max_resolution=args.max_resolution,
            compress_probability=args.compress_probability,
            num_workers=args.workers,
        )
        write_beton(ImageFolder(str(folder)), beton, settings)
        print(f"wrote {beton.stat().st_size / 2**20:.0f} MiB .beton in {time.perf_counter() - started:.1f}s")

    torch.set_num_threads(1)  # the main process only iterates; the workers decode
    tv = timed_epochs(torchvision_loader(folder, args.resolution, args.batch, args.workers), args.epochs)
    ff = timed_epochs(ffcv_loader(beton, args.resolution, args.batch, args.workers), args.epochs)
    images = (args.images // args.batch) * args.batch
    tv_rate, ff_rate = images / tv[-1], images / ff[-1]
    print(
        f"{args.images} images, {args.resolution}px random-resized crop + flip, batch {args.batch}, "
        f"{args.workers} workers, .beton {args.mode} max {args.max_resolution}px JPEG p={args.compress_probability:g}, "
        f"torch {torch.__version__}"
    )
    print(f"torchvision ImageFolder + DataLoader: {tv_rate:8.1f} img/s (epochs: {', '.join(f'{s:.1f}s' for s in tv)})")
    print(
        f"FFCV Loader                         : {ff_rate:8.1f} img/s (epochs: {', '.join(f'{s:.1f}s' for s in ff)}; "
        f"the first includes compilation)"
    )
    print(f"ratio FFCV/torchvision: {ff_rate / tv_rate:.2f}x  (target >= 3x)")


if __name__ == "__main__":
    main()
