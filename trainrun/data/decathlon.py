"""The Medical Segmentation Decathlon layout (``dataset.json``, ``imagesTr/``, ``labelsTr/``) read into
a volume store (:mod:`trainrun.data.volume_store`), and nnU-Net v2's raw layout as it is
(``channel_names``, ``labels`` name: value, ``file_ending``, ``imagesTr/CASE_0000.nii.gz`` a file a
channel), read as the same cases, prepared as nnU-Net v2 prepares them for its 3d_fullres plan.

A first pass takes the data set's fingerprint (:mod:`trainrun.data.fingerprint`: each case's
spacing, size after cropping to the body, and foreground intensities where a channel is CT), from
which come the target spacing, whether MRI-like channels are z-scored over the body alone, and the
CT statistics. Then each case is cropped to its body, each channel normalised as its ``modality``
name says (:func:`~trainrun.data.volume_store.normalisation`), and the case resampled to the target
spacing as nnU-Net resamples (:mod:`trainrun.data.resampling`: images by cubic splines, labels by
each class's resized indicator, nearest neighbour across a low-resolution axis). Arrays are in the
axis order nnU-Net reads NIfTI, (z, y, x). ``tests/test_nnunet_agreement.py`` holds the store equal
to nnU-Net's preprocessing of the same folder.

Cases are read in ``data.num_workers`` processes (in this one at 0), one case at a time in each, so
memory is bounded by a case per worker whatever the task's size; a line reports progress every few
cases. Each case's files are written whole or not at all, and a preparation started again (after a
kill) takes only the fingerprints and cases missing. Written here rather than with nnU-Net's
preprocessing, which needs its own folder layout, environment and plans, and pins its own stack.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from trainrun.atomic_io import atomic_write, read_json
from trainrun.data.fingerprint import case_fingerprint, ct_statistics, target_spacing, uses_mask
from trainrun.data.resampling import IMAGE_ORDER, resampled_channels, resampled_labels, resampled_size, separate_axis
from trainrun.data.volume_store import case_written, normalisation, preprocess, stored, write_arrays, write_index
from trainrun.errors import DataError

NIFTI_ENDINGS = (".nii.gz", ".nii")
CHANNEL_SUFFIX = re.compile(r"(?P<case>.+)_(?P<channel>\d{4})")  # nnU-Net v2's CASE_0000: a file a channel
UNNAMED = 255  # the class of a label value dataset.json does not name
PROGRESS_SECONDS = 10  # at most one progress line this often (and one at the end)
FINGERPRINTING = ("taking the fingerprint of", "fingerprinted")  # CaseProgress's words for the first pass
Case = tuple[str, tuple[Path, ...], Path]  # a training case: its name, its image file(s), its label file


def read_decathlon_case(image_files: tuple[Path, ...], label_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One case as (C, D, H, W) float32 and (D, H, W): NIfTI's (x, y, z[, channel]) as (z, y, x),
    nnU-Net's order, from one file of every channel (the Decathlon's) or one file a channel (nnU-Net v2's)."""
    image, label = read_image(image_files), read_label(label_file)
    if image.shape[1:] != label.shape:
        raise DataError(f"{image_files[0].name}: image {image.shape[1:]} and label {label.shape} differ in size")
    return image, label


def read_image(image_files: tuple[Path, ...]) -> np.ndarray:
    """A case's image as (C, D, H, W) float32 (:func:`read_decathlon_case`); its channel files' sizes
    were checked from their headers first (:func:`check_image_cases`, by every command that reads cases)."""
    arrays = [_nifti(file).astype(np.float32, copy=False) for file in image_files]
    for file, array in zip(image_files, arrays, strict=True):
        _check_volume(file, array.shape, len(image_files) > 1)
    image = arrays[0] if len(arrays) == 1 else np.stack(arrays, axis=-1)
    if image.ndim == 3:
        image = image[..., None]
    return image.transpose(3, 2, 1, 0)


def read_label(label_file: Path) -> np.ndarray:
    """A case's label values as (D, H, W) uint8 (:func:`read_decathlon_case`)."""
    return np.rint(_nifti(label_file)).astype(np.uint8).transpose(2, 1, 0)


def image_cases(folder: Path, channels: int) -> list[tuple[str, tuple[Path, ...], Path | None]]:
    """The cases ``trainrun predict`` segments in ``folder`` (a task folder's ``imagesTs/``, else its
    ``imagesTr/``, else ``folder`` itself), each as (name, its image files, its label file or None):
    one file of every channel, or nnU-Net v2's ``CASE_0000`` ... a channel where every case has files
    0000 to ``channels - 1``; a label where ``labelsTs/`` (``labelsTr/``) holds one of the case's name."""
    images = next((folder / name for name in ("imagesTs", "imagesTr") if (folder / name).is_dir()), folder)
    if not images.is_dir():
        raise DataError(f"bad value for '--data': '{folder}' is not a folder")
    files = sorted(path for path in images.iterdir() if path.name.endswith(NIFTI_ENDINGS) and path.name[0] != ".")
    if not files:
        raise DataError(f"bad value for '--data': '{images}' holds no NIfTI image ({', '.join(NIFTI_ENDINGS)})")
    stems = {path: path.name[: -len(next(e for e in NIFTI_ENDINGS if path.name.endswith(e)))] for path in files}
    grouped: dict[str, list[Path]] = {}
    for path, stem in stems.items():
        match = CHANNEL_SUFFIX.fullmatch(stem)
        grouped.setdefault(match["case"] if match else stem, []).append(path)
    expected = [f"_{channel:04d}" for channel in range(channels)]
    if not all([stems[path][-5:] for path in group] == expected for group in grouped.values()):
        grouped = {stem: [path] for path, stem in stems.items()}  # each file a case of every channel
    labels = images.parent / images.name.replace("images", "labels") if "images" in images.name else None
    found = [labels / f"{name}{ending}" for name in grouped for ending in NIFTI_ENDINGS] if labels else []
    found = {path.name: path for path in found if path.is_file()}
    return [
        (name, tuple(group), next((found[name + ending] for ending in NIFTI_ENDINGS if name + ending in found), None))
        for name, group in grouped.items()
    ]


def check_image_cases(cases: Sequence[tuple[str, tuple[Path, ...], Path | None]], channels: int) -> None:
    """Every case of :func:`image_cases` (or a task folder's) is a volume of ``channels`` channels
    whose label, if any, has its size, read from the files' headers alone: one line naming the first
    file that is not, before a command writes anything."""
    for _, images, label in cases:
        shapes = [tuple(_nifti(file, header_only=True).get_data_shape()) for file in images]
        for file, shape in zip(images, shapes, strict=True):
            _check_volume(file, shape, len(images) > 1)
        _check_one_size(images, shapes)
        found = len(images) if len(images) > 1 else (shapes[0][3] if len(shapes[0]) == 4 else 1)
        if found != channels:
            raise DataError(f"'{images[0]}' has {found} channel(s); the runs' models take {channels}")
        if label is not None and (labelled := tuple(_nifti(label, header_only=True).get_data_shape())) != shapes[0][:3]:
            raise DataError(f"'{label}' is {_sides(labelled)}, its image '{images[0]}' {_sides(shapes[0][:3])}")


def _check_one_size(files: Sequence[Path], shapes: Sequence[tuple[int, ...]]) -> None:
    """A case's channel files are of one size: one line naming the first that differs and both sizes."""
    for file, shape in zip(files, shapes, strict=True):
        if shape != shapes[0]:
            raise DataError(
                f"'{file}' is {_sides(shape)}, '{files[0]}' of the same case {_sides(shapes[0])}: "
                "a case's channels are of one size"
            )


def _check_volume(file: Path, shape: tuple[int, ...], one_of_channels: bool) -> None:
    """A NIfTI image is a volume (x, y, z), or with every channel on a 4th axis where it is a case's only file."""
    if len(shape) < 3:
        raise DataError(
            f"'{file}' is a {len(shape)}-D image ({_sides(shape)}); cases are volumes (x, y, z): "
            "save a 2-D image as one slice (x, y, 1)"
        )
    most = 3 if one_of_channels else 4
    if len(shape) > most:
        kind, axes = ("a channel's own file", "x, y, z") if one_of_channels else ("a case's file", "x, y, z, channel")
        dimensions = f"'{file}' is a {len(shape)}-D image ({_sides(shape)})"
        raise DataError(f"{dimensions}; {kind} has at most {most} axes ({axes})")


def _sides(shape: Sequence[int]) -> str:
    return " x ".join(str(side) for side in shape)


def _nifti(path: Path, header_only: bool = False):
    """The array of the NIfTI file ``path`` (its header alone with ``header_only``), or one line
    naming the file when it is not one."""
    import nibabel

    try:
        image = nibabel.load(path)
        return image.header if header_only else np.asarray(image.dataobj)
    except (nibabel.filebasedimages.ImageFileError, OSError, EOFError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"'{path}' is not a readable NIfTI image ({reason})") from None


def read_manifest(source: Path) -> tuple[Path, dict]:
    """The task folder ``source``'s ``dataset.json``: its path, and what it says (checked)."""
    manifest = source / "dataset.json"
    if not manifest.is_file():
        raise DataError(f"bad value for 'data.path': '{source}' has no dataset.json (the Decathlon layout)")
    described = read_json(manifest)
    if isinstance(described, dict) and "channel_names" in described:
        described = nnunet_v2_manifest(source, manifest, described)
    _check_manifest(manifest, described)
    return manifest, described


def nnunet_v2_manifest(source: Path, manifest: Path, described: dict) -> dict:
    """nnU-Net v2's ``dataset.json`` (``channel_names``, ``labels`` name: value, ``file_ending``;
    ``imagesTr/CASE_XXXX`` a file a channel, ``labelsTr/CASE``) in the Decathlon's form: ``modality``,
    ``labels`` value: name, and a training entry a label file, its image the case's channel files."""
    ending, labels, channels = (
        described.get("file_ending", ".nii.gz"),
        described.get("labels"),
        described["channel_names"],
    )
    if not isinstance(labels, dict) or not all(isinstance(value, int) for value in labels.values()):
        raise DataError(
            f"'{manifest}' labels must give each name one integer value (region lists, nnU-Net's region "
            "training, are not read: name the label values and set data.segmentation.regions)"
        )
    if not isinstance(channels, dict):
        raise DataError(f"'{manifest}' has no 'channel_names' object (nnU-Net v2's layout)")
    _check_channel_files(source, manifest, ending, {int(key) for key in channels if str(key).isdigit()})
    training = [
        {
            "image": [
                f"imagesTr/{label.name[: -len(ending)]}_{int(key):04d}{ending}" for key in sorted(channels, key=int)
            ],
            "label": f"labelsTr/{label.name}",
        }
        for label in sorted((source / "labelsTr").glob(f"*{ending}"))
        if not label.name.startswith(".")  # macOS's ._ files beside the cases
    ]
    return {"modality": channels, "labels": {str(value): name for name, value in labels.items()}, "training": training}


def _check_channel_files(source: Path, manifest: Path, ending: str, listed: set[int]) -> None:
    """Every channel file in ``imagesTr/`` (``CASE_XXXX``) is of a channel ``channel_names`` lists: a
    file of another would be left out of training silently (one line naming the first few)."""
    images = source / "imagesTr"
    suffix = re.compile(rf"_(\d{{4}}){re.escape(ending)}$")
    unlisted = sorted(
        path.name
        for path in (images.iterdir() if images.is_dir() else ())
        if (match := suffix.search(path.name)) and int(match[1]) not in listed and not path.name.startswith(".")
    )
    if unlisted:
        shown = ", ".join(unlisted[:3]) + (f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else "")
        numbers = ", ".join(f"{channel:04d}" for channel in sorted(listed))
        raise DataError(
            f"'{manifest}' channel_names lists {len(listed)} channel(s) ({numbers}) "
            f"but imagesTr holds files of others: {shown}; name every channel in channel_names"
        )


def channel_names(described: dict) -> list[str]:
    """The channels ``dataset.json`` names (its ``modality``), in channel order."""
    return [described["modality"][key] for key in sorted(described["modality"], key=int)]


def decathlon_listing(source: Path) -> tuple[dict, list[Case]]:
    """``dataset.json`` and its training cases as (name, image files, label file): one image file
    holding every channel (the Decathlon's) or one a channel (nnU-Net v2's)."""
    manifest, described = read_manifest(source)
    cases = []
    for entry in described["training"]:
        named = [entry["image"]] if isinstance(entry["image"], str) else entry["image"]
        images, label = tuple(source / name for name in named), source / entry["label"]
        for file in (*images, label):
            if not file.is_file():
                raise DataError(f"{manifest}: '{file.relative_to(source)}' is listed but missing")
        cases.append((label.name.split(".")[0], images, label))
    if len(cases) < 2:
        raise DataError(f"{manifest} lists {len(cases)} training case(s); a train/validation split needs 2")
    return described, sorted(cases)


def _check_manifest(manifest: Path, described: object) -> None:
    """``dataset.json`` names its channels (``modality``), its labels and its training cases."""
    if not isinstance(described, dict):
        raise DataError(f"'{manifest}' is not a Decathlon dataset.json (a JSON object with modality, labels, training)")
    for key, kind in (("modality", dict), ("labels", dict), ("training", list)):
        if not isinstance(described.get(key), kind):
            raise DataError(
                f"'{manifest}' has no '{key}' {'object' if kind is dict else 'list'} (the Decathlon layout)"
            )
    if not all(str(key).isdigit() for key in described["modality"]):
        raise DataError(f"'{manifest}' modality keys are not channel numbers: {sorted(described['modality'])}")
    for number, entry in enumerate(described["training"], 1):
        image = entry.get("image") if isinstance(entry, dict) else None
        if not (
            (isinstance(image, str) or (isinstance(image, list) and all(isinstance(name, str) for name in image)))
            and isinstance(entry.get("label"), str)
        ):
            raise DataError(f"'{manifest}' training case {number} needs an 'image' and a 'label' path")


def voxel_spacing(image_file: Path) -> tuple[float, float, float]:
    """A case's voxel size in mm along the store's (D, H, W) axes: NIfTI's z, y, x (its header alone)."""
    x, y, z = (float(size) for size in _nifti(image_file, header_only=True).get_zooms()[:3])
    return z, y, x


def resampled(image: np.ndarray, label: np.ndarray, spacing: tuple, target: tuple) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (C, D, H, W) and ``label`` (D, H, W) from ``spacing`` to ``target`` mm a voxel, as
    nnU-Net's preprocessing resamples them (:mod:`trainrun.data.resampling`)."""
    size = resampled_size(label.shape, spacing, target)
    axis = separate_axis(spacing, target)
    return resampled_channels(image, size, axis, IMAGE_ORDER), resampled_labels(label, size, axis)


def class_lookup(values: Sequence[int]) -> np.ndarray:
    """Label value -> class index, for uint8 label maps: the values as dataset.json lists them
    (BraTS21's 0, 1, 2, 4) become classes 0 .. K-1, and any other value :data:`UNNAMED`."""
    lookup = np.full(256, UNNAMED, np.uint8)
    lookup[list(values)] = np.arange(len(values))
    return lookup


def checked_case(case: Case, channels: int, lookup: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A case's image and its label as class indices, its channels and label values checked."""
    _, image_files, label_file = case
    image, label = read_decathlon_case(image_files, label_file)
    if image.shape[0] != channels:
        raise DataError(f"{image_files[0].name} has {image.shape[0]} channel(s); dataset.json names {channels}")
    label = lookup[label]
    if (label == UNNAMED).any():
        raise DataError(f"{label_file.name} holds a label value that dataset.json's labels do not name")
    return image, label


def fingerprint_case(case: Case, channels: int, lookup: np.ndarray, drawn: int, cases: int, path: Path) -> str:
    """A case's fingerprint (:func:`~trainrun.data.fingerprint.case_fingerprint`, the first
    ``drawn`` channels' foreground drawn), kept in the store at ``path``; its name."""
    name = case[0]
    image, label = checked_case(case, channels, lookup)
    found = case_fingerprint(image, label, voxel_spacing(case[1][0]), drawn, cases)
    atomic_write(path / f"{name}_fingerprint.npz", lambda handle: np.savez(handle, **found))
    return name


def prepare_case(
    case: Case, channels: int, classes: int, lookup: np.ndarray, target: tuple, path: Path,
    schemes: tuple[str, ...] = (), ct: dict[int, dict] | None = None, use_mask: bool = True,
) -> str:  # fmt: skip
    """Read, check, normalise, resample and preprocess one case into the store at ``path``; its name."""
    name, image_files, _ = case
    image, label = checked_case(case, channels, lookup)
    prepared = resampled(*preprocess(image, label, schemes, ct, use_mask), voxel_spacing(image_files[0]), target)
    write_arrays(path, name, *stored(*prepared), classes)
    return name


def _one_thread() -> None:
    torch.set_num_threads(1)  # a worker per core: each case's arithmetic on one thread


def write_decathlon(source: Path, path: Path, workers: int = 0) -> None:
    """The task folder ``source`` as a volume store in ``path``: the missing fingerprints taken and
    the missing cases prepared (in ``workers`` processes), then the index."""
    described, cases = decathlon_listing(source)
    channels = channel_names(described)
    check_image_cases(cases, len(channels))  # from the headers, before anything is written
    values = sorted(int(key) for key in described["labels"])
    labels = [described["labels"][str(value)] for value in values]
    lookup = class_lookup(values)
    path.mkdir(parents=True, exist_ok=True)
    schemes = tuple(normalisation(channel) for channel in channels)
    ct_channels = [index for index, scheme in enumerate(schemes) if scheme == "ct"]
    drawn = max(ct_channels) + 1 if ct_channels else 0  # nnU-Net draws every channel in turn, from one stream
    unknown = [case for case in cases if not (path / f"{case[0]}_fingerprint.npz").is_file()]
    progress = CaseProgress(len(cases), len(cases) - len(unknown), source, path, FINGERPRINTING)
    run_cases(fingerprint_case, unknown, (len(channels), lookup, drawn, len(cases), path), workers, progress)
    fingerprints = [dict(np.load(path / f"{name}_fingerprint.npz")) for name, _, _ in cases]
    target = target_spacing([found["spacing"] for found in fingerprints], [found["shape"] for found in fingerprints])
    use_mask = uses_mask([float(found["relative_size"]) for found in fingerprints])
    ct = {channel: ct_statistics(*drawn_values(fingerprints, channel)) for channel in ct_channels}
    missing = [case for case in cases if not case_written(path, case[0])]
    arguments = (len(channels), len(labels), lookup, target, path, schemes, ct, use_mask)
    preparing = CaseProgress(len(cases), len(cases) - len(missing), source, path)
    run_cases(prepare_case, missing, arguments, workers, preparing)
    normalised = {"schemes": list(schemes), "ct": {str(channel): stats for channel, stats in ct.items()}}
    normalised |= {"mask": use_mask}
    write_index(path, [name for name, _, _ in cases], channels, labels, target, normalised, values)
    for name, _, _ in cases:  # what the index now says
        (path / f"{name}_fingerprint.npz").unlink(missing_ok=True)


def drawn_values(fingerprints: list[dict], channel: int) -> tuple[np.ndarray, np.ndarray]:
    """Every case's drawn foreground values of ``channel`` and the times each was drawn."""
    values, counts = ([found[f"{kind}_{channel}"] for found in fingerprints] for kind in ("values", "counts"))
    return np.concatenate(values), np.concatenate(counts)


def run_cases(
    job: Callable[..., str], cases: list[Case], arguments: tuple, workers: int, progress: CaseProgress
) -> None:
    """``job(case, *arguments)`` for each of ``cases``, in ``workers`` processes (here at 0),
    counted by ``progress``."""
    if workers == 0:
        for case in cases:
            job(case, *arguments)
            progress.done()
    else:
        context = get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(cases) or 1), context, initializer=_one_thread) as pool:
            for future in as_completed([pool.submit(job, case, *arguments) for case in cases]):
                future.result()
                progress.done()
    progress.finish()


class CaseProgress:
    """A line every :data:`PROGRESS_SECONDS` while cases are prepared: cases done, seconds a case, time left."""

    def __init__(
        self, total: int, already: int, source: Path, path: Path, words: tuple = ("preparing", "prepared")
    ) -> None:
        self.total, self.already, self.count = total, already, already
        self.doing, self.done_word = words
        self.started = self.shown = time.perf_counter()
        if already < total:
            kept = f" ({already} kept from an earlier preparation)" if already else ""
            print(f"{self.doing} {total - already} of {total} cases of {source} into {path}{kept}", flush=True)

    def line(self) -> str:
        done = self.count - self.already
        each = (time.perf_counter() - self.started) / max(done, 1)
        left = each * (self.total - self.count) / 60
        return f"{self.count}/{self.total} cases, {each:.1f} s a case, {left:.1f} min left"

    def done(self) -> None:
        self.count += 1
        if time.perf_counter() - self.shown >= PROGRESS_SECONDS:
            self.shown = time.perf_counter()
            print(f"{self.doing}: {self.line()}", flush=True)

    def finish(self) -> None:
        if self.count > self.already:
            print(f"{self.done_word}: {self.line()}", flush=True)
