"""What each operation of an image loader costs one thread of this machine, on real photographs:
the per-operation rates ``trainrun estimate`` composes a loader's time from (``trainrun/estimate/readings.yaml``,
``image_ops``, which this prints).

The images: the natural photographs scikit-image and scikit-learn ship (astronaut, chelsea, coffee,
rocket, Hubble's deep field, and scikit-learn's china and flower), each cut into random crops of
40-100 % of its area at aspect 3:4-4:3, flipped at random, resized to a longer side of 500 px
(ImageNet's commonest size: 500 x 375 and 375 x 500) and re-encoded as JPEG at a quality drawn
from 95-100: these photographs are smoother than ImageNet's, and at those qualities their files
come to ImageNet's mean of about 110 kB an image (ILSVRC2012's training archive: 138 GB for
1,281,167 images), which decides most of a decode's cost; the bench prints the mean it reached.

Timed on one thread (torch, OpenCV, the DataLoader and FFCV each held to one), as the run does it:

- ``decode``: PIL's decode of a whole file to RGB (``data.decode=full``), a megapixel;
- ``worker``: the rest of an image's way through one persistent DataLoader worker of trainrun's
  folder data at each side: the random-resized crop and flip, reading the file, collating and
  handing the batch over (the worker's epoch less the decode);
- ``augment``: one ``RandAugment`` operation (severity 10 of 21 levels, drawn as the run draws
  them) in that worker, half of what depth 2 adds to its epoch;
- ``draft``: that worker's whole image under ``data.decode=full``'s alternative, ``draft``;
- ``ffcv_jpeg`` and ``ffcv_raw``: FFCV's decode, random-resized crop and flip of an image stored as
  JPEG or as raw pixels (``proportion`` storage mixes them), from one FFCV thread's epoch.

    .venv/bin/python bench/loader_ops.py [--images 300] [--sides 96 128 176 224] [--epoch 1600]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from trainrun.algorithms.randaugment import SEVERITY_LEVELS

PHOTOGRAPHS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field")
LONGER_SIDE = 500
QUALITY = (95, 100)
SEVERITY = 10
CLASSES = 10


def photographs() -> list[np.ndarray]:
    """The natural photographs scikit-image and scikit-learn ship, as RGB arrays."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    return [getattr(skimage.data, name)() for name in PHOTOGRAPHS] + list(load_sample_images().images)


def imagenet_like(count: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEG files cut from the photographs (module docstring)."""
    rng, sources, files = np.random.default_rng(seed), photographs(), []
    for index in range(count):
        source = sources[index % len(sources)]
        height, width = source.shape[:2]
        area, aspect = rng.uniform(0.4, 1.0) * height * width, np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        crop_w, crop_h = min(width, int(round((area * aspect) ** 0.5))), min(height, int(round((area / aspect) ** 0.5)))
        top, left = rng.integers(0, height - crop_h + 1), rng.integers(0, width - crop_w + 1)
        image = Image.fromarray(source[top : top + crop_h, left : left + crop_w])
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        scale = LONGER_SIDE / max(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=int(rng.integers(QUALITY[0], QUALITY[1] + 1)))
        files.append(buffer.getvalue())
    return files


def per_item(function: Callable[[object], object], items: list, rounds: int = 5) -> float:
    """The fastest of ``rounds`` of the seconds an item of ``function`` over ``items`` (what else the
    host runs only slows a round)."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for item in items:
            function(item)
        times.append((time.perf_counter() - started) / len(items))
    return min(times)


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def write_folder(root: Path, files: list[bytes]) -> Path:
    """An ImageNet-style folder (train and val, ``CLASSES`` classes) of ``files``."""
    for split in ("train", "val"):
        for index, data in enumerate(files):
            folder = root / split / f"class{index % CLASSES}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{index}.jpg").write_bytes(data)
    return root


def worker_epoch(root: Path, side: int, decode: str, depth: int, epoch: int) -> float:
    """Seconds an image through one persistent DataLoader worker of trainrun's folder data at
    ``side`` (``data.decode``), with ``depth`` RandAugment operations after the crop and flip, as a run
    adds them; the fastest of three epochs of ``epoch`` images after the worker's start."""
    from torch.utils.data import DataLoader, RandomSampler

    from trainrun.config import check
    from trainrun.data.folder import folder_datasets

    overrides = [f"data.path={root}", f"data.resolution={side}", f"data.decode={decode}", f"data.num_classes={CLASSES}"]
    train = folder_datasets(check(["data=folder", *overrides])[0].data).train
    if depth:
        augment = v2.RandAugment(num_ops=depth, magnitude=SEVERITY, num_magnitude_bins=SEVERITY_LEVELS)
        train.transform = v2.Compose([train.transform, augment])
    sampler = RandomSampler(train, replacement=True, num_samples=epoch)  # long epochs: their ends cost little
    loader = DataLoader(train, batch_size=32, sampler=sampler, num_workers=1, drop_last=True, persistent_workers=True)
    list(loader)
    seconds = []
    for _ in range(3):
        started, images = time.perf_counter(), 0
        for batch, _ in loader:
            images += len(batch)
        seconds.append((time.perf_counter() - started) / images)
    return min(seconds)


def ffcv_epoch(root: Path, work: Path, mode: str, side: int, batch: int) -> float:
    """Seconds an image through one FFCV thread: decode, random-resized crop to ``side``, flip."""
    from loaders import published_ffcv_loader, timed_epoch
    from torchvision.datasets import ImageFolder

    from trainrun.data.write import WriteSettings, write_beton

    beton = work / f"{mode}.beton"
    if not beton.is_file():
        write_beton(ImageFolder(str(root)), beton, WriteSettings(mode=mode, max_resolution=LONGER_SIDE, num_workers=1))
    loader = published_ffcv_loader(beton, side, batch, 1)
    timed_epoch(loader)  # FFCV's compilation
    seconds = [timed_epoch(loader) for _ in range(5)]
    return min(s / images for s, images in seconds)


def measure(count: int, sides: list[int], epoch: int) -> dict:
    torch.set_num_threads(1)
    import cv2

    cv2.setNumThreads(1)
    files = imagenet_like(count)
    sizes = [Image.open(io.BytesIO(data)).size for data in files]  # from the headers: nothing decoded
    megapixels = statistics.mean(width * height for width, height in sizes) / 1e6
    command = f"bench/loader_ops.py --images {count} --sides {' '.join(map(str, sides))} --epoch {epoch}"
    table = {
        "source": f"{command}, {date.today()}",
        "images": count,
        "mean_kb": round(statistics.mean(len(data) for data in files) / 1e3, 1),
        "megapixels": round(megapixels, 4),
        "decode_ms_per_mp": per_item(decoded, files) * 1e3 / megapixels,
        "readings": {},
    }
    decode = table["decode_ms_per_mp"] * megapixels / 1e3
    batch = min(32, count // 2)  # FFCV's batches, whole ones only
    with tempfile.TemporaryDirectory(dir="/dev/shm") as work:
        root = write_folder(Path(work) / "folder", files)
        for side in sides:
            folder = worker_epoch(root, side, "full", 0, epoch)
            row = {
                "worker": folder - decode,
                "augment": (worker_epoch(root, side, "full", 2, epoch) - folder) / 2,
                "draft": worker_epoch(root, side, "draft", 0, epoch),
                "ffcv_jpeg": ffcv_epoch(root / "train", Path(work), "jpg", side, batch),
                "ffcv_raw": ffcv_epoch(root / "train", Path(work), "raw", side, batch),
            }
            table["readings"][side] = {name: round(seconds * 1e3, 4) for name, seconds in row.items()}
            print(f"{side} px: " + ", ".join(f"{k} {v:.3f} ms" for k, v in table["readings"][side].items()), flush=True)
    table["decode_ms_per_mp"] = round(table["decode_ms_per_mp"], 4)
    table["fitted"] = fitted(table["readings"])
    return table


def fitted(readings: dict[int, dict[str, float]]) -> dict[str, list[float]]:
    """Each operation's cost as ``[ms, ms a megapixel of output]``: least squares over the sides
    (a crop's resize and an augmentation scale with the output's pixels; a decode does not), the
    slope held at or above 0, so that one noisy side does not bend the cost of every other."""
    sides = sorted(readings)
    areas = np.array([side * side / 1e6 for side in sides])
    fits = {}
    for name in readings[sides[0]]:
        costs = np.array([readings[side][name] for side in sides])
        slope, intercept = np.polyfit(areas, costs, 1)
        if slope < 0:
            slope, intercept = 0.0, float(costs.mean())
        fits[name] = [round(float(intercept), 4), round(float(slope), 4)]
    return fits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--sides", type=int, nargs="+", default=[96, 128, 176, 224])
    parser.add_argument("--epoch", type=int, default=1600, help="images a timed DataLoader epoch")
    args = parser.parse_args()
    import yaml

    print(yaml.safe_dump({"image_ops": measure(args.images, args.sides, args.epoch)}, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
