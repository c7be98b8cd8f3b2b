"""The volume store: preprocessed segmentation cases as a folder of NumPy arrays read memory-mapped
(see :mod:`trainrun.data.segmentation`), nnU-Net's preprocessing of each case, and the writing of a
case (each file whole or absent, so that a killed preparation keeps what it finished)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainrun.atomic_io import atomic_write, atomic_write_text
from trainrun.data.fingerprint import body_box, body_mask

STORE_VERSION = 4  # 2: each channel normalised by its modality; 3: anisotropic cases resampled as nnU-Net does;
# 4: axes (z, y, x) as nnU-Net reads NIfTI, and nnU-Net's fingerprint, mask, interpolation and label resampling
LOCATIONS_PER_CLASS = 10_000  # nnU-Net's sample of each class's voxels for foreground crops
OUTSIDE = -1  # nnU-Net's label of the background outside the body, before the store keeps it as background
# nnU-Net v2's normalisation names (channel_names), and the modality names that mean CT
SCHEMES = {"ct": "ct", "nonorm": "none", "rescale_to_0_1": "rescale", "rgb_to_0_1": "rgb", "zscore": "zscore"}


def normalisation(channel: str) -> str:
    """How a channel named ``channel`` in dataset.json is normalised, as nnU-Net chooses: ``ct``
    (CT: clipped and scaled by the training set's foreground statistics), ``none`` (noNorm),
    ``rescale`` (rescale_to_0_1), ``rgb`` (rgb_to_0_1) or ``zscore`` (every other name: MRI's FLAIR,
    T1w, T2, ADC, ...)."""
    return SCHEMES.get(channel.casefold(), "zscore")


# ------------------------------------------------------------------------------ preprocessing
def preprocess(
    image: np.ndarray,
    label: np.ndarray,
    schemes: Sequence[str] = (),
    ct: dict[int, dict] | None = None,
    use_mask: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """nnU-Net's preprocessing of one case before resampling: crop ``image`` (C, D, H, W) and
    ``label`` (D, H, W, class indices) to the body's box (:func:`~trainrun.data.fingerprint.body_mask`),
    normalise each channel by its scheme (:func:`normalised`) and mark the background outside the
    body :data:`OUTSIDE` (nnU-Net's -1, which resampling treats as a class of its own). float32, int16."""
    body = body_mask(image)
    box = body_box(body)
    label = label[box].astype(np.int16)
    label[(label == 0) & ~body[box]] = OUTSIDE
    return normalised(image[(slice(None), *box)], label != OUTSIDE, schemes, ct, use_mask), label


def normalised(
    image: np.ndarray,
    body: np.ndarray,
    schemes: Sequence[str] = (),
    ct: dict[int, dict] | None = None,
    use_mask: bool = True,
) -> np.ndarray:
    """Each channel of a cropped ``image`` normalised by its scheme (:func:`normalisation`; z-score
    where none is given), in float32 as nnU-Net computes it: ``zscore`` over the ``body`` (the
    voxels not marked :data:`OUTSIDE`; elsewhere 0) where ``use_mask``, else over every voxel;
    ``ct`` clipped to the training set's foreground 0.5 and 99.5 percentiles and scaled by their
    mean and standard deviation (``ct[channel]``), every voxel kept (0 HU is tissue); ``rescale``
    to [0, 1]; ``rgb`` divided by 255; ``none`` as it is."""
    image = image.astype(np.float32)
    for index, channel in enumerate(image):
        scheme = schemes[index] if schemes else "zscore"
        if scheme == "ct":
            stats = ct[index]
            np.clip(channel, stats["lower"], stats["upper"], out=channel)
            channel -= stats["mean"]
            channel /= max(stats["std"], 1e-8)
        elif scheme == "rescale":
            channel -= channel.min()
            channel /= max(float(channel.max()), 1e-8)
        elif scheme == "rgb":
            channel /= 255.0
        elif scheme == "zscore" and use_mask:
            values = channel[body]
            channel[:] = np.where(body, (channel - values.mean()) / max(float(values.std()), 1e-8), 0.0)
        elif scheme == "zscore":
            mean, std = channel.mean(), channel.std()
            channel -= mean
            channel /= max(float(std), 1e-8)
    return image


def stored(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A preprocessed (and resampled) case as the store keeps it: the image float16, the label uint8
    with the background outside the body (:data:`OUTSIDE`) background again (nnU-Net's trainer's)."""
    return image.astype(np.float16), np.where(label == OUTSIDE, 0, label).astype(np.uint8)


def foreground_locations(label: np.ndarray, classes: int, seed: int) -> np.ndarray:
    """Rows of (class, d, h, w): every voxel of each foreground class, or a seeded sample of
    :data:`LOCATIONS_PER_CLASS` of them."""
    rng = np.random.default_rng(seed)
    rows = []
    for cls in range(1, classes):
        where = np.argwhere(label == cls)
        if len(where) > LOCATIONS_PER_CLASS:
            where = where[np.sort(rng.choice(len(where), LOCATIONS_PER_CLASS, replace=False))]
        rows.append(np.concatenate([np.full((len(where), 1), cls), where], axis=1))
    return np.concatenate(rows).astype(np.int32) if rows else np.zeros((0, 4), np.int32)


# ------------------------------------------------------------------------------ the store
@dataclass(frozen=True)
class VolumeStore:
    """A preprocessed set of cases in ``path`` (see the module's docstring)."""

    path: Path
    cases: tuple[str, ...]
    channels: tuple[str, ...]
    labels: tuple[str, ...]

    @classmethod
    def open(cls, path: Path) -> VolumeStore:
        index = json.loads((path / "index.json").read_text())
        return cls(path, tuple(index["cases"]), tuple(index["channels"]), tuple(index["labels"]))

    def image(self, case: int) -> np.ndarray:
        return np.load(self.path / f"{self.cases[case]}_image.npy", mmap_mode="r")

    def label(self, case: int) -> np.ndarray:
        return np.load(self.path / f"{self.cases[case]}_label.npy", mmap_mode="r")

    def locations(self, case: int) -> np.ndarray:
        return np.load(self.path / f"{self.cases[case]}_locations.npy")


def write_case(path: Path, name: str, image: np.ndarray, label: np.ndarray, classes: int) -> None:
    """Preprocess one case and add its arrays to the store being written in ``path``, each file
    whole or absent; the locations file comes last (:func:`case_written`)."""
    write_arrays(path, name, *stored(*preprocess(image, label)), classes)


def write_arrays(path: Path, name: str, image: np.ndarray, label: np.ndarray, classes: int) -> None:
    """Add a preprocessed case (float16 image, uint8 label) and its foreground voxels to the store."""
    locations = foreground_locations(label, classes, zlib.crc32(name.encode()))
    for kind, array in (("image", image), ("label", label), ("locations", locations)):
        atomic_write(path / f"{name}_{kind}.npy", lambda handle, array=array: np.save(handle, array))


def case_written(path: Path, name: str) -> bool:
    """Whether case ``name`` is whole in the store being written in ``path`` (a killed preparation
    keeps the cases it finished)."""
    return (path / f"{name}_locations.npy").is_file()


def write_index(
    path: Path,
    cases: Sequence[str],
    channels: Sequence[str],
    labels: Sequence[str],
    spacing: Sequence[float] = (),
    intensities: dict | None = None,
    values: Sequence[int] = (),
) -> None:
    """Written last: a store with an index is complete. ``spacing``: the voxels' (D, H, W) in mm;
    ``intensities``: each channel's scheme and the CT channels' statistics; ``values``: the label
    value of each class in the task's files (BraTS: 0, 1, 2, 4)."""
    index = {"version": STORE_VERSION, "cases": list(cases), "channels": list(channels), "labels": list(labels)}
    index |= {"label_values": list(values)} if values else {}
    index |= {"spacing": list(spacing)} if spacing else {}
    index |= {"normalisation": intensities} if intensities else {}
    atomic_write_text(path / "index.json", json.dumps(index, indent=1))
