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

STORE_VERSION = 1
LOCATIONS_PER_CLASS = 10_000  # nnU-Net's sample of each class's voxels for foreground crops


# ------------------------------------------------------------------------------ preprocessing
def preprocess(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """nnU-Net's preprocessing of one case: crop ``image`` (C, D, H, W) and ``label`` (D, H, W) to
    the box of voxels non-zero in any channel, z-score each channel over those voxels and set the
    rest to 0; float16 and uint8 for the store."""
    brain = (image != 0).any(axis=0)
    if not brain.any():
        raise DataError("a case has no non-zero voxel in any channel")
    box = tuple(slice(int(where.min()), int(where.max()) + 1) for where in np.nonzero(brain))
    image, label, brain = image[(slice(None), *box)].astype(np.float32), label[box], brain[box]
    for channel in image:
        values = channel[brain]
        channel[:] = np.where(brain, (channel - values.mean()) / max(float(values.std()), 1e-8), 0.0)
    return image.astype(np.float16), label.astype(np.uint8)


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
    path: Path, cases: Sequence[str], channels: Sequence[str], labels: Sequence[str], spacing: Sequence[float] = ()
) -> None:
    """Written last: a store with an index is complete. ``spacing``: the voxels' (D, H, W) in mm."""
    index = {"version": STORE_VERSION, "cases": list(cases), "channels": list(channels), "labels": list(labels)}
    index |= {"spacing": list(spacing)} if spacing else {}
    atomic_write_text(path / "index.json", json.dumps(index, indent=1))
