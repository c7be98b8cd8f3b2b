"""Volumes from one voxel spacing to another as nnU-Net v2 resamples them, on scikit-image's and
SciPy's interpolators (the ones nnU-Net calls), so that a case prepared or predicted here has
nnU-Net's values: images by cubic splines (order 3), predicted logits linearly (order 1), labels
by each class's indicator resized linearly and the arg-max taken (the nearest neighbour's class
where it ties for the lead), every one of them in-plane only and by nearest neighbour across a
low-resolution axis where the spacing is anisotropic (nnU-Net's separate z). Arrays are (C, D, H,
W) or (D, H, W) in the axis order nnU-Net reads NIfTI (z, y, x); spacings in mm in that order.

Written here rather than imported from nnU-Net, whose package pins its own network, augmentation
and I/O stack; ``tests/test_nnunet_agreement.py`` holds every function equal to nnU-Net's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

ANISOTROPY = 3.0  # nnU-Net's: a spacing whose coarsest side is over 3x its finest is resampled apart
IMAGE_ORDER = 3  # nnU-Net's spline order for images; across a separate axis, nearest neighbour
LOGIT_ORDER = 1  # and for predicted logits brought back to a case's grid
LABEL_ORDER = 1  # each class's indicator, before the arg-max


def separate_axis(spacing: Sequence[float], target: Sequence[float]) -> int | None:
    """The axis resampled apart from the others going from ``spacing`` to ``target``: the coarsest
    of ``spacing`` where its coarsest side is over :data:`ANISOTROPY` times its finest, else of
    ``target`` where that is so; None where neither is anisotropic or the coarsest side is shared
    by two axes (nnU-Net's ``determine_do_sep_z_and_axis``)."""
    for sides in (spacing, target):
        sides = np.asarray(sides, dtype=float)
        if sides.max() / sides.min() > ANISOTROPY:
            coarsest = np.flatnonzero(sides.max() / sides == 1)
            return int(coarsest[0]) if len(coarsest) == 1 else None
    return None


def resampled_size(shape: Sequence[int], spacing: Sequence[float], target: Sequence[float]) -> list[int]:
    """The size of a volume of ``shape`` voxels of ``spacing`` mm at ``target`` mm a voxel (nnU-Net's
    ``compute_new_shape``: the same arithmetic, so that the same half-voxel rounds alike)."""
    return [max(1, int(round(have / want * side))) for side, have, want in zip(shape, spacing, target, strict=True)]


def resampled_channels(volume: np.ndarray, size: Sequence[int], axis: int | None, order: int) -> np.ndarray:
    """Each channel of ``volume`` (C, D, H, W) at ``size``, in its dtype: by splines of ``order``
    in 3D, or within each slice across ``axis`` and by nearest neighbour along it."""
    if tuple(volume.shape[1:]) == tuple(size):
        return volume
    out = np.empty((volume.shape[0], *size), dtype=volume.dtype)
    for channel, values in enumerate(volume):
        out[channel] = _resampled(values.astype(float), size, axis, lambda plane, shape: _resize(plane, shape, order))
    return out


def resampled_labels(label: np.ndarray, size: Sequence[int], axis: int | None) -> np.ndarray:
    """A label map (D, H, W, integer values) at ``size``: each value's indicator resized linearly
    and the value of the highest taken, the nearest neighbour's value where it ties for the highest,
    else the lowest of those tied (batchgenerators' ``resize_segmentation``, nnU-Net's); across a
    separate ``axis``, nearest neighbour."""
    if tuple(label.shape) == tuple(size):
        return label
    out = _resampled(label.astype(float), size, axis, _labels_resized)
    return out.astype(label.dtype)


def _resampled(
    volume: np.ndarray, size: Sequence[int], axis: int | None, resize: Callable[[np.ndarray, tuple], np.ndarray]
) -> np.ndarray:
    """``volume`` (D, H, W, float64) at ``size`` by ``resize`` in 3D, or by ``resize`` on each slice
    across ``axis`` then nearest neighbour along it (nnU-Net's ``resample_data_or_seg``)."""
    if axis is None:
        return resize(volume, tuple(size))
    plane = tuple(side for index, side in enumerate(size) if index != axis)
    slices = np.moveaxis(volume, axis, 0)
    resized = np.stack([resize(one, plane) for one in slices])
    resized = np.moveaxis(resized, 0, axis)
    if resized.shape[axis] == size[axis]:
        return resized
    from scipy.ndimage import map_coordinates

    grid = np.mgrid[tuple(slice(0, side) for side in size)].astype(float)
    for index, (have, want) in enumerate(zip(resized.shape, size, strict=True)):
        grid[index] = have / want * (grid[index] + 0.5) - 0.5  # align_corners=False, as skimage's resize
    return map_coordinates(resized, grid, order=0, mode="nearest")


def _resize(values: np.ndarray, shape: tuple, order: int) -> np.ndarray:
    from skimage.transform import resize

    return resize(values, shape, order, mode="edge", anti_aliasing=False)


def _labels_resized(values: np.ndarray, shape: tuple) -> np.ndarray:
    """A label map (float64 values) at ``shape``: the values' indicators resized by
    :data:`LABEL_ORDER`, the winner per voxel as :func:`resampled_labels` says, one indicator at a time."""
    from skimage.transform import resize

    def resized(array: np.ndarray, order: int) -> np.ndarray:
        return resize(array, shape, order, mode="edge", clip=True, anti_aliasing=False)

    labels = np.unique(values)
    if len(labels) == 1:
        return np.full(shape, labels[0])
    nearest = resized(values, 0)
    best = winner = nearest_score = None
    for label in labels:
        score = resized((values == label).astype(float), LABEL_ORDER)
        if best is None:
            best, winner, nearest_score = score, np.full(shape, label), np.where(nearest == label, score, 0.0)
            continue
        winner = np.where(score > best, label, winner)
        nearest_score = np.where(nearest == label, score, nearest_score)
        np.maximum(best, score, out=best)
    return np.where((nearest_score == best) & (nearest_score > 0), nearest, winner)
