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
from trainrun.errors import DataError

STORE_VERSION = 3  # 2: each channel normalised by its modality; 3: anisotropic cases resampled as nnU-Net does
LOCATIONS_PER_CLASS = 10_000  # nnU-Net's sample of each class's voxels for foreground crops
FOREGROUND_SAMPLE = 10_000  # nnU-Net's sample of each case's foreground intensities for CT statistics
# nnU-Net v2's normalisation names (channel_names), and the modality names that mean CT
SCHEMES = {"ct": "ct", "nonorm": "none", "rescale_to_0_1": "rescale", "zscore": "zscore"}


def normalisation(channel: str) -> str:
    """How a channel named ``channel`` in dataset.json is normalised, as nnU-Net chooses: ``ct``
    (CT: clipped and scaled by the training set's foreground statistics), ``none`` (noNorm),
    ``rescale`` (rescale_to_0_1) or ``zscore`` (every other name: MRI's FLAIR, T1w, T2, ADC, ...)."""
    return SCHEMES.get(channel.strip().lower(), "zscore")


# ------------------------------------------------------------------------------ preprocessing
def preprocess(
    image: np.ndarray, label: np.ndarray, schemes: Sequence[str] = (), ct: dict[int, dict] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """nnU-Net's preprocessing of one case: crop ``image`` (C, D, H, W) and ``label`` (D, H, W) to
    the box of voxels non-zero in any channel, then normalise each channel by its scheme
    (:func:`normalisation`; z-score where none is given): ``zscore`` over the non-zero voxels, the
    rest set to 0; ``ct`` clipped to the training set's foreground 0.5 and 99.5 percentiles and
    scaled by its foreground mean and standard deviation (``ct[channel]``), every voxel kept (0 HU
    is tissue); ``rescale`` to [0, 1]; ``none`` as it is. float16 and uint8 for the store."""
    box = body_box(image)
    return normalised(image[(slice(None), *box)], schemes, ct), label[box].astype(np.uint8)


def body_box(image: np.ndarray) -> tuple[slice, ...]:
    """The (D, H, W) box of the voxels non-zero in any channel of ``image`` (C, D, H, W)."""
    body = (image != 0).any(axis=0)
    if not body.any():
        raise DataError("a case has no non-zero voxel in any channel")
    return tuple(slice(int(where.min()), int(where.max()) + 1) for where in np.nonzero(body))


def normalised(image: np.ndarray, schemes: Sequence[str] = (), ct: dict[int, dict] | None = None) -> np.ndarray:
    """Each channel of a cropped ``image`` normalised by its scheme (:func:`preprocess`), as float16."""
    image = image.astype(np.float32)
    body = (image != 0).any(axis=0)
    for index, channel in enumerate(image):
        scheme = schemes[index] if schemes else "zscore"
        if scheme == "ct":
            stats = ct[index]
            clipped = np.clip(channel, stats["lower"], stats["upper"])
            channel[:] = (clipped - stats["mean"]) / max(stats["std"], 1e-8)
        elif scheme == "rescale":
            low, high = float(channel.min()), float(channel.max())
            channel[:] = (channel - low) / max(high - low, 1e-8)
        elif scheme == "zscore":
            values = channel[body]
            channel[:] = np.where(body, (channel - values.mean()) / max(float(values.std()), 1e-8), 0.0)
    return image.astype(np.float16)


def foreground_sample(image: np.ndarray, label: np.ndarray, channels: Sequence[int], seed: int) -> np.ndarray:
    """(len(channels), n): up to :data:`FOREGROUND_SAMPLE` of a case's foreground voxels (label > 0)
    in each of ``channels``, drawn seeded, as nnU-Net samples them for a data set's CT statistics."""
    voxels = np.flatnonzero(label > 0)
    if len(voxels) > FOREGROUND_SAMPLE:
        voxels = np.sort(np.random.default_rng(seed).choice(voxels, FOREGROUND_SAMPLE, replace=False))
    return np.stack([image[channel].reshape(-1)[voxels] for channel in channels]).astype(np.float32)


def ct_statistics(samples: np.ndarray) -> dict[str, float]:
    """nnU-Net's intensity properties of one CT channel from every training case's foreground sample."""
    lower, upper = np.percentile(samples, [0.5, 99.5])
    return {"lower": float(lower), "upper": float(upper), "mean": float(samples.mean()), "std": float(samples.std())}


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
    write_arrays(path, name, *preprocess(image, label), classes)


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
