"""Data loading: FFCV against torchvision's ImageFolder + DataLoader, same augmentations, same workers.

Generates a JPEG ImageFolder of ImageNet-like sizes (sides 300-500 px, quality 90) and writes it
to .beton files, by default three ways: the published ImageNet settings of the ResNet-50 runs
(proportion mode, longest side 500, JPEG with probability 0.5, quality 90), those of the
ResNet-18 runs (400 px, JPEG with probability 0.1), and raw pixels at 500 px (``--storage``
chooses others). The loaders read them with a random-resized crop to 176 px (scale 0.08-1, area
filter) and a horizontal flip, as uint8 (N, 3, H, W) batches, with the same number of workers:

- torchvision: ImageFolder + DataLoader, PIL decode, ``v2.RandomResizedCrop(antialias=True)``;
- FFCV as published: FFCV's Loader and pipeline as the published ImageNet scripts build them
  (their batches are channels-last views of FFCV's buffers);
- trainrun: ``FFCVData`` as ``data=imagenet_ffcv`` builds it, which also hands out channels-last
  views and changes the memory format on the device while normalising.

Each loader runs one untimed epoch (worker start-up, FFCV's one-off compilation), then the
rounds alternate the loaders epoch by epoch and each loader's median epoch counts. The files
are kept in RAM (``/dev/shm``) unless ``--dir`` says otherwise: the dataset then sits in memory
as in the published runs (``os_cache``), and the reads measure decoding, not this machine's disk.
Target: trainrun >= 3x torchvision on a 2-core machine.

    .venv/bin/python bench/loaders.py [--images 2000] [--workers 2] [--batch 128] [--rounds 5]
        [--storage proportion:500:0.5 --storage raw:256 ...] [--dir DIR]

``--hot`` measures instead the hot recipe's path, an ImageNet folder read by torch's DataLoader
(``data=folder``, RandAugment per image): trainrun's folder data decoding whole JPEGs
(``data.decode=full``) or at the scale each crop needs (``draft``), each with and without
RandAugment, and on a GPU nvJPEG (torchvision's ``decode_jpeg(device="cuda")`` on each batch's
files, the workers reading bytes and drawing crops) with the crops resized on the GPU. It prints
images/s and images/s per worker, from which the workers a GPU needs follow.

    .venv/bin/python bench/loaders.py --hot [--images 2000] [--workers 2] [--resolution 176]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from trainrun.data.write import WriteSettings, write_beton

CPU = torch.device("cpu")
CLASSES = 10
RAM_DIRECTORY = Path("/dev/shm")
TORCHVISION, PUBLISHED_FFCV, TRAINRUN = "torchvision ImageFolder + DataLoader", "FFCV as published", "trainrun FFCV"


def make_jpeg_folder(root: Path, count: int, seed: int = 0, sides: tuple[int, int] = (300, 500)) -> None:
    """``count`` photos-like JPEGs (smooth colour fields plus grain) in ``CLASSES`` class folders."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        width, height = rng.integers(sides[0], sides[1] + 1, size=2)
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((int(width), int(height)), Image.BICUBIC)
        grain = rng.normal(0, 12, (int(height), int(width), 3))
        pixels = np.clip(np.asarray(image, dtype=np.float32) + grain, 0, 255).astype(np.uint8)
        folder = root / f"class{index % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{index}.jpg", quality=90)


def timed_epoch(batches: Iterable) -> tuple[float, int]:
    """Seconds and images of one epoch, each batch's pixels touched so no loader can skip work."""
    started, images = time.perf_counter(), 0
    for batch, _labels in batches:
        batch[:, :, 0, 0].sum()
        images += len(batch)
    return time.perf_counter() - started, images


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


def published_ffcv_loader(beton: Path, resolution: int, batch: int, workers: int):
    """FFCV's Loader with the pipeline of the published ImageNet scripts (on the CPU)."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    pipelines = {
        "image": [
            RandomResizedCropRGBImageDecoder((resolution, resolution)),
            RandomHorizontalFlip(),
            ToTensor(),
            ToTorchImage(),
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


def trainrun_data(
    beton: Path, resolution: int, batch: int, workers: int, num_classes: int = CLASSES, device: torch.device = CPU
):
    """trainrun's FFCV data for ``device``, composed from ``data=imagenet_ffcv`` like a run's."""
    from trainrun.config import check
    from trainrun.data.ffcv import FFCVData

    overrides = [f"data.train={beton}", f"data.val={beton}", f"data.num_classes={num_classes}"]
    overrides += [f"data.resolution={resolution}", f"data.num_workers={workers}"]
    config = check(["data=imagenet_ffcv", *overrides])[0].data
    return FFCVData(config, batch, batch, seed=0, device=device)


def trainrun_loader(beton: Path, resolution: int, batch: int, workers: int, num_classes: int = CLASSES):
    """trainrun's FFCV training loader on the CPU."""
    return trainrun_data(beton, resolution, batch, workers, num_classes).train


@dataclass(frozen=True)
class Storage:
    """How the .beton stores the images: ``mode:max_resolution[:compress_probability]``."""

    mode: str
    max_resolution: int
    compress_probability: float = 0.5

    @classmethod
    def parse(cls, text: str) -> Storage:
        mode, max_resolution, *probability = text.split(":")
        return cls(mode, int(max_resolution), *(float(value) for value in probability))

    def __str__(self) -> str:
        jpeg = f", JPEG p={self.compress_probability:g}" if self.mode == "proportion" else ""
        return f"{self.mode} {self.max_resolution} px{jpeg}{PUBLISHED.get(self, '')}"


PUBLISHED = {
    Storage("proportion", 500, 0.5): " (published ImageNet, ResNet-50)",
    Storage("proportion", 400, 0.1): " (published ImageNet, ResNet-18)",
}


def prepare(work: Path, images: int, storages: list[Storage], workers: int) -> tuple[Path, dict[Storage, Path]]:
    """The JPEG folder and a .beton per storage in ``work``, each generated or written once."""
    folder = work / f"jpeg-{images}"
    if not folder.is_dir():
        started = time.perf_counter()
        make_jpeg_folder(folder, images)
        print(f"generated {images} JPEGs in {folder} in {time.perf_counter() - started:.1f}s")
    betons = {}
    for storage in storages:
        beton = work / f"images-{images}-{storage.mode}-{storage.max_resolution}-{storage.compress_probability:g}.beton"
        if not beton.is_file():
            started = time.perf_counter()
            write_beton(ImageFolder(str(folder)), beton, WriteSettings(**asdict(storage), num_workers=workers))
            print(f"wrote {beton} ({beton.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.1f}s")
        betons[storage] = beton
    return folder, betons


class EncodedCrops(torch.utils.data.Dataset):
    """A folder's files as bytes, with each image's random-resized crop (drawn from its header) and
    flip: what workers hand to a GPU decoder."""

    def __init__(self, root: Path) -> None:
        self.samples = ImageFolder(str(root)).samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        from torchvision import transforms
        from torchvision.io import read_file

        path, label = self.samples[index]
        box = transforms.RandomResizedCrop.get_params(Image.open(path), (0.08, 1.0), (3 / 4, 4 / 3))
        return read_file(path), torch.tensor(box), bool(torch.rand(1) < 0.5), label


def transposed(items: list[tuple]) -> list[tuple]:
    """A batch of (bytes, box, flip, label) items as four tuples (the files differ in length)."""
    return list(zip(*items, strict=True))


def gpu_decoded_batches(root: Path, resolution: int, batch: int, workers: int, randaugment: bool):
    """nvJPEG: each batch's files decoded together on the GPU, cropped, resized and flipped there."""
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as F

    augment = v2.RandAugment(num_ops=1, magnitude=10, num_magnitude_bins=21) if randaugment else None
    loader = DataLoader(
        EncodedCrops(root),
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=transposed,
    )

    def epoch():
        for files, boxes, flips, labels in loader:
            images = decode_jpeg(list(files), device="cuda")
            crops = []
            for image, box, flip in zip(images, boxes, flips, strict=True):
                crop = F.resized_crop(image, *box.tolist(), [resolution, resolution], antialias=True)
                crop = F.horizontal_flip(crop) if flip else crop
                crops.append(augment(crop) if augment else crop)
            yield torch.stack(crops), torch.tensor(labels)
        torch.cuda.synchronize()

    return epoch


def hot_loaders(work: Path, args: argparse.Namespace) -> dict[str, Callable[[], Iterable]]:
    """The hot recipe's folder paths by name, each a function giving one epoch's batches."""
    from trainrun.config import check
    from trainrun.data.folder import folder_datasets
    from trainrun.data.torch_loader import TorchData

    root = work / f"folder-{args.images}-{args.sides[0]}-{args.sides[1]}"
    if not root.is_dir():
        make_jpeg_folder(root / "train", args.images, sides=tuple(args.sides))
        (root / "val").symlink_to(root / "train")
    randaugment = v2.RandAugment(num_ops=1, magnitude=10, num_magnitude_bins=21)  # the hot recipe's
    paths: dict[str, Callable[[], Iterable]] = {}
    for decode in ("full", "draft"):
        for augment in (False, True):
            overrides = [f"data.path={root}", f"data.num_classes={CLASSES}", f"data.resolution={args.resolution}"]
            overrides += [f"data.num_workers={args.workers}", f"data.decode={decode}"]
            config = check(["data=folder", *overrides])[0].data
            data = TorchData(config, folder_datasets(config), args.batch, args.batch, seed=0)
            if augment:
                data.add_train_transform(randaugment)
            name = f"trainrun folder, decode={decode}" + (" + RandAugment" if augment else "")
            paths[name] = partial(data.train_batches, 0)
    if torch.cuda.is_available():
        for augment in (False, True):
            name = "nvJPEG on the GPU" + (" + RandAugment on the GPU" if augment else "")
            paths[name] = gpu_decoded_batches(root / "train", args.resolution, args.batch, args.workers, augment)
    return paths


def measure_hot(args: argparse.Namespace, work: Path) -> None:
    """Alternating timed epochs of the hot recipe's folder paths; prints images/s and per worker."""
    torch.set_num_threads(1)
    paths = hot_loaders(work, args)
    for epoch in paths.values():  # worker start-up, GPU decoder start-up
        timed_epoch(epoch())
    epochs: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, epoch in paths.items():
            seconds, images = timed_epoch(epoch())
            epochs[name].append(seconds)
    print(
        f"\n{args.images} JPEGs of {args.sides[0]}-{args.sides[1]} px, {args.resolution} px random-resized crop "
        f"+ flip, batch {args.batch}, {args.workers} workers, {args.rounds} alternating rounds, median epoch, "
        f"torch {torch.__version__}\n"
    )
    print("| path | img/s | range | img/s per worker |")
    print("| --- | ---: | ---: | ---: |")
    for name, seconds in epochs.items():
        rate = images / statistics.median(seconds)
        print(
            f"| {name} | {rate:.0f} | {images / max(seconds):.0f}-{images / min(seconds):.0f} "
            f"| {rate / max(args.workers, 1):.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--resolution", type=int, default=176)
    parser.add_argument("--rounds", type=int, default=5, help="timed epochs per loader, alternating")
    parser.add_argument(
        "--storage",
        type=Storage.parse,
        action="append",
        help="mode:max_resolution[:compress_probability], repeatable (default: both published ones and raw:500)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="keep the generated files here (reused)")
    parser.add_argument("--hot", action="store_true", help="the hot recipe's folder paths instead (see above)")
    parser.add_argument(
        "--sides", type=int, nargs=2, default=[300, 500], help="--hot: the JPEGs' shortest and longest side"
    )
    args = parser.parse_args()
    args.storage = args.storage or [*PUBLISHED, Storage("raw", 500)]
    run = measure_hot if args.hot else measure
    if args.dir:
        run(args, args.dir)
    else:  # removed afterwards: a RAM directory holds them
        ram = RAM_DIRECTORY if RAM_DIRECTORY.is_dir() else None
        with tempfile.TemporaryDirectory(prefix="trainrun-bench-", dir=ram) as work:
            run(args, Path(work))


def measure(args: argparse.Namespace, work: Path) -> None:
    """Alternating timed epochs of every loader; prints their rates and the ratios to torchvision."""
    folder, betons = prepare(work, args.images, args.storage, args.workers)
    torch.set_num_threads(1)  # the main process only iterates; the workers decode
    shape = (args.resolution, args.batch, args.workers)
    builders: dict[tuple[str, Storage | None], Callable] = {
        (TORCHVISION, None): lambda: torchvision_loader(folder, *shape)
    }
    for storage, beton in betons.items():
        builders[PUBLISHED_FFCV, storage] = partial(published_ffcv_loader, beton, *shape)
        builders[TRAINRUN, storage] = partial(trainrun_loader, beton, *shape)
    loaders, warm_up = {}, {}
    for key, build in builders.items():  # torchvision's workers fork before FFCV starts threads
        loaders[key] = build()
        warm_up[key] = timed_epoch(loaders[key])[0]
    epochs: dict[tuple[str, Storage | None], list[float]] = {key: [] for key in loaders}
    for _ in range(args.rounds):
        for key, loader in loaders.items():
            seconds, images = timed_epoch(loader)  # the same images per epoch for all: drop_last, same batch
            epochs[key].append(seconds)
    rates = {key: images / statistics.median(seconds) for key, seconds in epochs.items()}

    print(
        f"\n{args.images} JPEGs of 300-500 px, {args.resolution} px random-resized crop + flip, batch {args.batch}, "
        f"{args.workers} workers, {args.rounds} alternating rounds, median epoch, files in {folder.parent}, "
        f"torch {torch.__version__}\n"
    )
    print("| loader | .beton storage | img/s | range | x torchvision | first epoch |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (name, storage), seconds in epochs.items():
        ratio = rates[name, storage] / rates[TORCHVISION, None]
        target = " (target >= 3x)" if name == TRAINRUN else ""
        print(
            f"| {name} | {storage or 'JPEG folder'} | {rates[name, storage]:.0f} | "
            f"{images / max(seconds):.0f}-{images / min(seconds):.0f} | {ratio:.2f}x{target} | "
            f"{warm_up[name, storage]:.1f} s |"
        )


if __name__ == "__main__":
    main()
