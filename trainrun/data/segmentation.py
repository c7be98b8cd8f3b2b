"""Segmentation volumes: the Medical Segmentation Decathlon layout, a built-in synthetic BraTS, and
nnU-Net's preprocessing, biased crops and augmentations.

Both sources are written once into ``data.cache_dir`` as a *volume store*, a folder of NumPy arrays
read memory-mapped (as the token store serves text): per case ``<name>_image.npy`` (float16,
(C, D, H, W), cropped to the body and normalised as nnU-Net does: :mod:`trainrun.data.decathlon`),
``<name>_label.npy`` (uint8, (D, H, W)) and ``<name>_locations.npy`` (int32 rows of class, d, h,
w: up to 10,000 voxels of each foreground class, nnU-Net's sample for its biased crops), with
``index.json`` naming the cases, channels and classes.

Training samples are crops of ``data.segmentation.patch_size`` ((H, W): one axial slice; (D, H,
W): a block), ``samples_per_volume`` per case and epoch; a share ``foreground_oversampling`` of
them is centred on a voxel of a foreground class chosen at random among those present (nnU-Net's
rule), the rest placed uniformly. Every draw (crop, flips, noise, blur, brightness, contrast)
comes from torch's default generator, which the loader seeds with (seed, epoch, sample): a
sample is cut and augmented alike on any number of ranks and workers. Written here rather than
with MONAI's random transforms, which draw from generators of their own. Validation samples are
whole volumes; the task evaluates them slice by slice (2D) or by sliding windows (3D).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from trainrun.core.distributed import SINGLE_PROCESS, Placement
from trainrun.data.cache import cache_prefix, write_once_per_node
from trainrun.data.decathlon import decathlon_listing, write_decathlon
from trainrun.data.interface import Datasets
from trainrun.data.volume_store import STORE_VERSION, VolumeStore, case_written, write_case, write_index
from trainrun.errors import DataError
from trainrun.schema import DataConfig, SegmentationDataConfig

SYNTHETIC_MODALITIES = ("FLAIR", "T1w", "T1gd", "T2w")  # the Decathlon brain-tumour task's channels
OPEN_CASES = 32  # cases a loader process keeps mapped (two file descriptors each), the least recently read closed
SYNTHETIC_LABELS = ("background", "edema", "non-enhancing tumour", "enhancing tumour")


# ------------------------------------------------------------------------------ sources
def synthetic_case(index: int, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Case ``index`` of the built-in synthetic BraTS: four MRI-like channels (D, H, W) of a brain
    with an irregular tumour of nested regions (edema around an enhancing rim around a
    non-enhancing core), smooth texture, a bias field, per-case gains and noise. Every tenth case
    has no enhancing rim and every twentieth no tumour, as real cases lack a class."""
    rng = np.random.default_rng([index, 0x5E6])
    grid = np.stack(np.meshgrid(*(np.linspace(-1, 1, side, dtype=np.float32) for side in shape), indexing="ij"))

    def smooth(amplitude: float) -> np.ndarray:  # low-frequency noise at the volume's size
        coarse = torch.from_numpy(rng.standard_normal((1, 1, 4, 4, 4)).astype(np.float32))
        return F.interpolate(coarse, size=tuple(shape), mode="trilinear", align_corners=True)[0, 0].numpy() * amplitude

    def inside(centre: np.ndarray, radii: np.ndarray, wobble: float) -> np.ndarray:
        distance = np.sqrt((((grid - centre[:, None, None, None]) / radii[:, None, None, None]) ** 2).sum(0))
        return distance + smooth(wobble) < 1

    brain = inside(np.zeros(3), rng.uniform(0.8, 0.95, 3), 0.05)
    label = np.zeros(shape, np.uint8)
    if index % 20 != 19:
        centre = rng.uniform(-0.35, 0.35, 3)
        whole = rng.uniform(0.22, 0.4, 3)
        core = whole * rng.uniform(0.5, 0.7)
        label[inside(centre, whole, 0.15) & brain] = 1
        label[inside(centre, core, 0.1) & brain] = 3 if index % 10 != 9 else 2
        label[inside(centre, core * rng.uniform(0.4, 0.6), 0.1) & brain] = 2
    tissue = np.array([0.6, 0.7, 0.65, 0.55], np.float32)
    offsets = np.array(  # per label (rows) and channel (FLAIR, T1, T1gd, T2)
        [[0, 0, 0, 0], [0.35, -0.08, 0.04, 0.3], [0.2, -0.18, 0.0, 0.45], [0.15, -0.04, 0.5, 0.15]], np.float32
    )
    image = np.empty((4, *shape), np.float32)
    bias = 1 + smooth(0.1)
    for channel in range(4):
        value = tissue[channel] + smooth(0.08) + offsets[label, channel]
        value = value * bias * rng.uniform(0.8, 1.25) + rng.standard_normal(shape).astype(np.float32) * 0.12
        image[channel] = np.where(brain, np.maximum(value, 0.01), 0.0)
    return image, label


def write_synthetic(path: Path, cases: int, shape: Sequence[int]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    names = [f"synthetic_{index:03d}" for index in range(cases)]
    for index, name in enumerate(names):
        if not case_written(path, name):
            write_case(path, name, *synthetic_case(index, shape), classes=len(SYNTHETIC_LABELS))
    write_index(path, names, SYNTHETIC_MODALITIES, SYNTHETIC_LABELS)


def store_path(config: DataConfig, placement: Placement = SINGLE_PROCESS) -> Path:
    """The volume store of ``config``'s source, written first if missing (each node's local rank 0)."""
    segmentation = config.segmentation
    if config.name == "synthetic_brats":
        identity = {"cases": segmentation.synthetic_cases, "shape": list(segmentation.synthetic_shape)}

        def write(path: Path) -> None:
            write_synthetic(path, segmentation.synthetic_cases, segmentation.synthetic_shape)
    else:
        source = Path(config.path).expanduser().resolve()
        _, cases = decathlon_listing(source)
        files = [file for _, images, label in cases for file in (*images, label)]
        identity = {"source": str(source), "files": [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]}

        def write(path: Path) -> None:
            write_decathlon(source, path, config.num_workers)

    prefix = cache_prefix(config.cache_dir, config.name, {**identity, "version": STORE_VERSION})
    write_once_per_node(prefix, (prefix / "index.json").is_file, lambda: write(prefix), placement)
    return prefix


def fold_cases(cases: int, folds: int, fold: int, seed: int) -> tuple[list[int], list[int]]:
    """(training, validation) case indices: fold ``fold`` of scikit-learn's ``KFold(folds,
    shuffle=True, random_state=seed)`` over the cases in name order, Composer's split."""
    from sklearn.model_selection import KFold

    if cases < folds:
        raise DataError(
            f"bad value for 'data.segmentation.folds': {folds} but the data set has {cases} cases "
            "(each fold holds out at least one)"
        )
    train, val = list(KFold(folds, shuffle=True, random_state=seed).split(np.arange(cases)))[fold]
    return train.tolist(), val.tolist()


# ------------------------------------------------------------------------------ crops and augmentation
def by_class(locations: np.ndarray) -> list[np.ndarray]:
    """A store's location rows as the (d, h, w) voxels of each class present, in class order."""
    return [locations[locations[:, 0] == cls, 1:] for cls in np.unique(locations[:, 0])]


def biased_crop(
    image: np.ndarray, label: np.ndarray, foreground: list[np.ndarray], patch: Sequence[int], oversampling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``patch`` (D, H, W) of ``image`` and ``label``, zero-padded where the volume is smaller,
    centred with probability ``oversampling`` on a voxel of ``foreground`` (:func:`by_class`: a
    class present chosen uniformly, then one of its voxels), else placed uniformly."""
    shape = label.shape
    pad = [max(p - s, 0) for p, s in zip(patch, shape, strict=True)]
    before = [p // 2 for p in pad]
    size = [s + p for s, p in zip(shape, pad, strict=True)]
    if float(torch.rand(())) < oversampling and foreground:
        voxels = foreground[int(torch.randint(len(foreground), ()))]
        centre = voxels[int(torch.randint(len(voxels), ()))] + np.array(before)
        start = [min(max(int(c) - p // 2, 0), n - p) for c, p, n in zip(centre, patch, size, strict=True)]
    else:
        start = [int(torch.randint(n - p + 1, ())) for p, n in zip(patch, size, strict=True)]
    # the window in the volume's own coordinates, and where it lands in the patch
    source = tuple(
        slice(max(s - b, 0), min(s - b + p, n)) for s, b, p, n in zip(start, before, patch, shape, strict=True)
    )
    target = tuple(slice(w.start - (s - b), w.stop - (s - b)) for w, s, b in zip(source, start, before, strict=True))
    crop_image = torch.zeros((image.shape[0], *patch), dtype=torch.float32)
    crop_label = torch.zeros(tuple(patch), dtype=torch.int64)
    crop_image[(slice(None), *target)] = torch.from_numpy(np.asarray(image[(slice(None), *source)], dtype=np.float32))
    crop_label[target] = torch.from_numpy(np.asarray(label[source], dtype=np.int64))
    return crop_image, crop_label


def gaussian_blur(image: torch.Tensor, sigma: float) -> torch.Tensor:
    """``image`` (C, *spatial) blurred by a separable Gaussian of ``sigma`` voxels along each axis."""
    radius = max(1, math.ceil(3 * sigma))
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float32)
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    kernel /= kernel.sum()
    blurred = image
    for axis in range(1, image.dim()):
        moved = blurred.movedim(axis, -1)
        flat = moved.reshape(-1, 1, moved.shape[-1])
        flat = F.conv1d(F.pad(flat, (radius, radius), mode="replicate"), kernel.view(1, 1, -1))
        blurred = flat.reshape(moved.shape).movedim(-1, axis)
    return blurred


def augment(image: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nnU-Net's augmentations as Composer's BraTS loader draws them: a flip of each spatial axis
    (p 0.5), Gaussian noise (p 0.15, std U(0, 0.33)), Gaussian blur (p 0.15, sigma U(0.5, 1.5)),
    brightness (p 0.15, x U(0.7, 1.3)) and contrast (p 0.15, x U(0.65, 1.5) about the mean,
    clipped to the range before)."""
    for axis in range(label.dim()):
        if float(torch.rand(())) < 0.5:
            image, label = image.flip(axis + 1), label.flip(axis)
    if float(torch.rand(())) < 0.15:
        image = image + torch.randn(image.shape) * float(torch.rand(())) * 0.33
    if float(torch.rand(())) < 0.15:
        image = gaussian_blur(image, 0.5 + float(torch.rand(())))
    if float(torch.rand(())) < 0.15:
        image = image * (0.7 + 0.6 * float(torch.rand(())))
    if float(torch.rand(())) < 0.15:
        low, high, mean = image.min(), image.max(), image.mean()
        image = ((image - mean) * (0.65 + 0.85 * float(torch.rand(()))) + mean).clamp(low, high)
    return image, label


class Patches(Dataset):
    """Training crops: ``samples_per_volume`` per case (sample i reads case ``i mod cases``); a 2D
    patch is one axial slice, returned without its depth axis."""

    def __init__(self, store: VolumeStore, cases: list[int], config: SegmentationDataConfig, augmented: bool) -> None:
        self.store, self.cases, self.augmented = store, cases, augmented and config.augment
        self.samples = len(cases) * config.samples_per_volume
        self.patch = list(config.patch_size) if len(config.patch_size) == 3 else [1, *config.patch_size]
        self.flat = len(config.patch_size) == 2
        self.oversampling = config.foreground_oversampling
        self.opened: OrderedDict[int, tuple[np.ndarray, np.ndarray, list[np.ndarray]]] = OrderedDict()

    def __len__(self) -> int:
        return self.samples

    def case(self, case: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Case ``case``'s memory-mapped image and label and its foreground voxels by class, kept
        open in this process among the :data:`OPEN_CASES` last read (BraTS's 1,251 cases held open
        would be 2,502 descriptors in every loader worker)."""
        opened = self.opened.pop(case, None)
        if opened is None:
            store = self.store
            opened = store.image(case), store.label(case), by_class(store.locations(case))
            while len(self.opened) >= OPEN_CASES:
                self.opened.popitem(last=False)
        self.opened[case] = opened
        return opened

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = biased_crop(*self.case(self.cases[index % len(self.cases)]), self.patch, self.oversampling)
        if self.flat:
            image, label = image[:, 0], label[0]
        return augment(image, label) if self.augmented else (image, label)


class Volumes(Dataset):
    """Whole cases, for evaluation: (image (C, D, H, W) float32, label (D, H, W) int64)."""

    def __init__(self, store: VolumeStore, cases: list[int]) -> None:
        self.store, self.cases = store, cases

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        case = self.cases[index]
        image = torch.from_numpy(np.asarray(self.store.image(case), dtype=np.float32))
        return image, torch.from_numpy(np.asarray(self.store.label(case), dtype=np.int64))


def segmentation_datasets(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> Datasets:
    """Training crops and validation volumes of fold ``data.segmentation.fold``."""
    store = VolumeStore.open(store_path(config, placement))
    segmentation = config.segmentation
    if len(store.labels) != config.num_classes:
        raise DataError(
            f"bad value for 'data.num_classes': {config.num_classes} but {config.name} has {len(store.labels)} "
            f"labels ({', '.join(store.labels)})"
        )
    train, val = fold_cases(len(store.cases), segmentation.folds, segmentation.fold, config.split_seed)
    return Datasets(Patches(store, train, segmentation, augment), Volumes(store, val), eval_collate=list)
