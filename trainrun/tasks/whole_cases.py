"""Segmenting whole cases in their own geometry, for ``trainrun predict`` and ``trainrun ensemble``.

A case is read from its NIfTI files and prepared as the runs' training cases were
(:class:`Preparation`: cropped to its body's box, each channel normalised by its scheme, the store's
mask rule and the training set's CT statistics, resampled to the training store's spacing as nnU-Net
resamples an image), segmented by each run (the task's sliding windows and mirroring) with their
logits averaged (nnU-Net's predictor's rule for the folds it is given), and brought back as
nnU-Net exports a prediction: the logits resampled to the cropped box (linearly; by nearest
neighbour across slices where the spacing is anisotropic), post-processed, made classes (the
arg-max, or each region's sigmoid over 0.5 from the outermost in), put into the whole volume
(background outside the box) and written in the task's label values with the input's affine and
header. Dice is computed there, against the case's own label file. ``tests/test_nnunet_agreement.py``
holds the preparation and the export equal to nnU-Net's.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trainrun.atomic_io import atomic_write
from trainrun.data.decathlon import UNNAMED, class_lookup, read_image, read_label, voxel_spacing
from trainrun.data.fingerprint import body_box, body_mask
from trainrun.data.resampling import IMAGE_ORDER, LOGIT_ORDER, resampled_channels, resampled_size, separate_axis
from trainrun.data.volume_store import normalisation, normalised
from trainrun.errors import DataError
from trainrun.tasks.segmentation import Segmentation, region_masks, volume_dice, without_small_enhancing


@dataclass(frozen=True)
class Preparation:
    """How the runs' training cases were prepared: each channel's scheme, the CT statistics, the
    voxel spacing (None: each case is segmented at its own), each class's label value, and whether
    z-scored channels were normalised over the body alone."""

    channels: tuple[str, ...]
    schemes: tuple[str, ...]
    ct: dict[int, dict]
    spacing: tuple[float, ...] | None
    values: tuple[int, ...]
    use_mask: bool = True

    @classmethod
    def of(cls, reference: dict | None, described: dict | None, classes: int) -> Preparation:
        """From the training store's index (``reference``) where there is one, else from the
        folder's ``dataset.json`` (``described``, the Decathlon's form), else every channel z-scored
        and the classes' values 0 to ``classes - 1``."""
        if reference is not None:
            normalised_as = reference.get("normalisation", {})
            channels = tuple(reference["channels"])
            schemes = tuple(normalised_as.get("schemes") or [normalisation(name) for name in channels])
            ct = {int(channel): stats for channel, stats in normalised_as.get("ct", {}).items()}
            values = tuple(reference.get("label_values") or range(classes))
            spacing = tuple(reference.get("spacing") or ()) or None
            return cls(channels, schemes, ct, spacing, values, normalised_as.get("mask", True))
        if described is not None:
            channels = tuple(described["modality"][key] for key in sorted(described["modality"], key=int))
            values = tuple(sorted(int(value) for value in described["labels"]))
            return cls(channels, tuple(normalisation(name) for name in channels), {}, None, values)
        return cls((), (), {}, None, tuple(range(classes)))


@dataclass
class PreparedCase:
    """A case as the models read it, and where it came from."""

    volume: torch.Tensor  # (C, d, h, w) float32 at the training spacing
    box: tuple[slice, ...]  # the crop's place in the case's (D, H, W)
    shape: tuple[int, ...]  # the case's (D, H, W)
    cropped: tuple[int, ...]  # the crop's (D, H, W) before resampling
    spacing: tuple[float, ...]  # the case's voxel spacing
    target: tuple[float, ...]  # the spacing the models read it at


def prepared(image_files: Sequence[Path], preparation: Preparation) -> PreparedCase:
    """A case's image files read and prepared as its runs' training cases were (their shapes and
    channels checked before, from their headers: :func:`~trainrun.data.decathlon.check_image_cases`)."""
    image = read_image(tuple(image_files))
    if preparation.schemes and "ct" in preparation.schemes and not preparation.ct:
        raise DataError("the runs' CT statistics are not here (their training store's index.json): CT is not scaled")
    body = body_mask(image)
    box = body_box(body)
    schemes, ct = preparation.schemes, preparation.ct
    cropped = normalised(image[(slice(None), *box)], body[box], schemes, ct, preparation.use_mask)
    spacing = voxel_spacing(image_files[0])
    target = preparation.spacing or spacing
    size = resampled_size(cropped.shape[1:], spacing, target)
    volume = resampled_channels(cropped, size, separate_axis(spacing, target), IMAGE_ORDER)
    return PreparedCase(torch.from_numpy(volume), box, image.shape[1:], cropped.shape[1:], spacing, tuple(target))


def model_logits(task: Segmentation, model: torch.nn.Module, case: PreparedCase, device: torch.device) -> torch.Tensor:
    """One model's class (region) logits of a prepared case, on its training grid, on the host."""
    (logits,) = task.predict(model, [case.volume.to(device)])
    return logits.float().cpu()


def class_map(task: Segmentation, logits: torch.Tensor, case: PreparedCase) -> torch.Tensor:
    """The case's classes (D, H, W, uint8) from logits on its training grid, as nnU-Net exports a
    prediction: resampled to the crop, post-processed, the arg-max (or each region's sigmoid over
    0.5, nested), background outside the crop."""
    axis = separate_axis(case.target, case.spacing)  # from the training grid back: nnU-Net's order of the two
    back = torch.from_numpy(resampled_channels(logits.float().numpy(), case.cropped, axis, LOGIT_ORDER))
    back = without_small_enhancing(back, task.enhancing_min_voxels, bool(task.regions))
    classes = region_classes(task.probabilities(back) > 0.5, task.regions) if task.regions else back.argmax(0)
    whole = torch.zeros(case.shape, dtype=torch.uint8)
    whole[case.box] = classes.to(torch.uint8)
    return whole


def region_classes(member: torch.Tensor, regions: list[list[int]]) -> torch.Tensor:
    """Classes from region memberships (R, *spatial): each region, outermost first, paints the one
    class in it that no later region holds (BraTS21's whole tumour 2, core 1, enhancing 3: nnU-Net's
    ``regions_class_order``)."""
    classes = torch.zeros(member.shape[1:], dtype=torch.long)
    for index, region in enumerate(regions):
        own = set(region) - {label for later in regions[index + 1 :] for label in later}
        if len(own) != 1:
            raise DataError(f"data.segmentation.regions {regions}: region {region} has no class of its own")
        classes[member[index]] = own.pop()
    return classes


def map_dice(task: Segmentation, predicted: torch.Tensor, truth: torch.Tensor) -> list[float]:
    """Each foreground class's (region's) Dice of a class map against the case's true classes, as the
    task scores a volume (1 where both are empty)."""
    if task.regions:
        scores = region_masks(predicted[None].long(), task.regions)[0] * 2 - 1
    else:
        scores = F.one_hot(predicted.long(), task.scored + 1).movedim(-1, 0).float()
    return volume_dice(scores, truth.long(), task.regions).tolist()


def true_classes(label_file: Path, values: Sequence[int]) -> torch.Tensor:
    """A label file's classes (D, H, W): each value's place in ``values``; one line for another value."""
    classes = class_lookup(values)[read_label(label_file)]
    if (classes == UNNAMED).any():
        raise DataError(f"'{label_file}' holds a label value not among the task's {list(values)}")
    return torch.from_numpy(classes)


def write_label_map(path: Path, classes: torch.Tensor, values: Sequence[int], image_file: Path) -> None:
    """``classes`` (D, H, W) as a NIfTI label map of the task's values in the image's geometry (its
    affine and header; NIfTI's x, y, z axes from the store's z, y, x), written whole or not at all."""
    import nibabel

    source = nibabel.load(image_file)
    mapped = np.asarray(values, dtype=np.int16 if max(values) > 255 else np.uint8)[classes.numpy()]
    image = nibabel.Nifti1Image(mapped.transpose(2, 1, 0), source.affine, source.header.copy())
    image.set_data_dtype(mapped.dtype)
    image.header.set_slope_inter(1, 0)
    data = image.to_bytes()
    atomic_write(path, lambda handle: handle.write(gzip.compress(data, 6) if path.name.endswith(".gz") else data))
