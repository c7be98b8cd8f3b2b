"""A segmentation data set's fingerprint, as nnU-Net v2 takes it before it plans: each training
case's spacing, its size after cropping to the body (the voxels non-zero in any channel, holes
filled) and that size's share of the whole, and a sample of its foreground intensities; and what
nnU-Net decides from them, which trainrun's preparation follows:

- the **target spacing**: the median of the cases' spacings, except where the data are anisotropic
  (the coarsest axis over 3x the others) and coarse in voxels too (that axis's median size under a
  third of the others'): there the 10th percentile along it (ACDC-like data), never finer than the
  other axes;
- the **z-scoring mask**: MRI-like channels are z-scored over the body alone where cropping left
  under 75 % of the image (median over cases; BraTS), else over the whole cropped box;
- the **CT statistics**: the 0.5 and 99.5 percentiles, mean and standard deviation of 10^8
  foreground voxels drawn with replacement, an equal number a case (``RandomState(1234)`` a case,
  each channel in turn, in nnU-Net's voxel order). A case keeps each drawn voxel's value and the
  times it was drawn, not the draws, so that a small data set's sample stays small on disk; the
  statistics over the counts are those over the draws.

``tests/test_nnunet_agreement.py`` holds each against nnU-Net's own fingerprint and planner.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainrun.data.resampling import ANISOTROPY
from trainrun.errors import DataError

FOREGROUND_VOXELS = 10**8  # nnU-Net's sample of the training set's foreground intensities, split equally by case
SAMPLE_SEED = 1234  # nnU-Net's seed for each case's draw
MASK_BELOW = 0.75  # nnU-Net's: z-score over the body where cropping left under this share of the image
TARGET_PERCENTILE = 10  # nnU-Net's target spacing along a coarse, thin axis
DRAW_CHUNK = 1 << 22  # draws made at a time (the stream is the same in chunks), bounding a case's memory


def body_mask(image: np.ndarray) -> np.ndarray:
    """The voxels non-zero in any channel of ``image`` (C, D, H, W), holes filled (nnU-Net's
    ``create_nonzero_mask``: zeros inside the body are body)."""
    from scipy.ndimage import binary_fill_holes

    return binary_fill_holes((image != 0).any(axis=0))


def body_box(mask: np.ndarray) -> tuple[slice, ...]:
    """The (D, H, W) box of a :func:`body_mask`."""
    if not mask.any():
        raise DataError("a case has no non-zero voxel in any channel")
    return tuple(slice(int(where.min()), int(where.max()) + 1) for where in np.nonzero(mask))


def case_fingerprint(
    image: np.ndarray, label: np.ndarray, spacing: Sequence[float], channels: int, cases: int
) -> dict[str, np.ndarray]:
    """One case's part of the fingerprint: its ``spacing``, its size after cropping and that size's
    share, and for the first ``channels`` channels the foreground values drawn (``values_C``) and
    the times each was (``counts_C``), :data:`FOREGROUND_VOXELS` // ``cases`` draws a channel."""
    box = body_box(body_mask(image))
    cropped, foreground = image[(slice(None), *box)], label[box] > 0
    shape = [side.stop - side.start for side in box]
    found = {
        "spacing": np.asarray(spacing, float),
        "shape": np.asarray(shape),
        "relative_size": np.asarray(np.prod(shape) / np.prod(label.shape)),
    }
    draws, random = int(FOREGROUND_VOXELS // cases), np.random.RandomState(SAMPLE_SEED)
    for channel in range(channels):
        values = cropped[channel][foreground]
        counts = np.zeros(len(values), np.int64)
        for start in range(0, draws if len(values) else 0, DRAW_CHUNK):
            counts += np.bincount(random.randint(0, len(values), min(DRAW_CHUNK, draws - start)), minlength=len(values))
        drawn = counts > 0
        found |= {f"values_{channel}": values[drawn], f"counts_{channel}": counts[drawn]}
    return found


def target_spacing(spacings: Sequence[Sequence[float]], shapes: Sequence[Sequence[int]]) -> tuple[float, ...]:
    """The spacing every case is resampled to (the module's docstring; nnU-Net's
    ``determine_fullres_target_spacing``)."""
    spacings = np.vstack(spacings).astype(float)
    target = np.percentile(spacings, 50, 0)
    sizes = np.percentile(np.vstack(shapes), 50, 0)
    coarsest = int(np.argmax(target))
    others = [axis for axis in range(len(target)) if axis != coarsest]
    anisotropic = target[coarsest] > ANISOTROPY * max(target[others])
    thin = sizes[coarsest] * ANISOTROPY < min(sizes[others])
    if anisotropic and thin:
        along = np.percentile(spacings[:, coarsest], TARGET_PERCENTILE)
        if along < max(target[others]):
            along = max(max(target[others]), along) + 1e-5
        target[coarsest] = along
    return tuple(float(side) for side in target)


def uses_mask(relative_sizes: Sequence[float]) -> bool:
    """Whether z-scored channels are normalised over the body alone (the module's docstring)."""
    return bool(np.median(relative_sizes) < MASK_BELOW)


def ct_statistics(values: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """The CT statistics of every case's drawn ``values`` each drawn ``counts`` times: as
    ``numpy.percentile`` (linear), mean and standard deviation give them over the draws."""
    order = np.argsort(values, kind="stable")
    values, counts = values[order].astype(np.float64), counts[order]
    total = int(counts.sum())
    if total == 0:
        raise DataError("no training case has a foreground voxel: the CT statistics need some")
    ends = np.cumsum(counts)

    def percentile(q: float) -> float:  # numpy's linear method over the sorted draws
        index = q / 100 * (total - 1)
        below = int(np.floor(index))
        low, high = (values[np.searchsorted(ends, k, side="right")] for k in (below, min(below + 1, total - 1)))
        fraction, difference = index - below, high - low
        return float(high - difference * (1 - fraction) if fraction >= 0.5 else low + difference * fraction)

    mean = float((values * counts).sum() / total)
    std = float(np.sqrt((counts * (values - mean) ** 2).sum() / total))
    return {"lower": percentile(0.5), "upper": percentile(99.5), "mean": mean, "std": std}
