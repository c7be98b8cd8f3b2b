"""The specs of ``data=synthetic_brats`` (generated BraTS-like volumes) and ``data=decathlon`` (a
Medical Segmentation Decathlon task folder), both read by trainrun/data/segmentation.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import KindSpec


def check(config: Any) -> None:
    if config.data.loader != "torch":
        raise ConfigError("bad value for 'data.loader': volumes are read with the torch loader (data.loader=torch)")


def check_synthetic(config: Any) -> None:
    """Enough cases for the folds, a 3-D shape, and BraTS's 4 channels and 4 labels."""
    check(config)
    segmentation, unet = config.data.segmentation, config.model.unet
    if segmentation.synthetic_cases < segmentation.folds:
        raise ConfigError(
            f"bad value for 'data.segmentation.synthetic_cases': {segmentation.synthetic_cases} "
            f"(at least data.segmentation.folds, {segmentation.folds}: each fold holds out at least one case)"
        )
    if len(segmentation.synthetic_shape) != 3 or min(segmentation.synthetic_shape) < 2:
        raise ConfigError(
            f"bad value for 'data.segmentation.synthetic_shape': {list(segmentation.synthetic_shape)} "
            "(depth, height, width, each at least 2)"
        )
    if unet.in_channels != 4 or config.data.num_classes != 4:
        raise ConfigError(
            "bad value for 'model.unet.in_channels': synthetic_brats has 4 channels and 4 labels "
            f"(got in_channels {unet.in_channels}, data.num_classes {config.data.num_classes})"
        )


def check_decathlon_files(config: Any) -> None:
    """A Decathlon folder whose dataset.json names as many channels as the model takes (a convolution
    would otherwise fail at the first step, or a trained model at its first held-out case)."""
    from trainrun.data.decathlon import channel_names, read_manifest

    path = config.data.path
    if not (path and (Path(path).expanduser() / "dataset.json").is_file()):
        raise ConfigError(f"data=decathlon needs 'data.path': a Decathlon task folder with dataset.json (got '{path}')")
    manifest, described = read_manifest(Path(path).expanduser())
    channels = channel_names(described)
    if len(channels) != config.model.unet.in_channels:
        raise ConfigError(
            f"bad value for 'model.unet.in_channels': {config.model.unet.in_channels}, but '{manifest}' names "
            f"{len(channels)} channel(s) ({', '.join(map(str, channels))})"
        )


def named_by_folder(composed: Any) -> dict[str, tuple[int, str]]:
    """``model.unet.in_channels`` and ``data.num_classes`` as the task folder's dataset.json names
    them (nnU-Net reads both from there); nothing where there is no folder to read yet."""
    from trainrun.data.decathlon import channel_names, read_manifest

    path = (composed.get("data") or {}).get("path")
    if not path or not (Path(str(path)).expanduser() / "dataset.json").is_file():
        return {}
    manifest, described = read_manifest(Path(str(path)).expanduser())
    channels, labels = (
        channel_names(described),
        [described["labels"][key] for key in sorted(described["labels"], key=int)],
    )
    return {
        "model.unet.in_channels": (
            len(channels),
            f"'{manifest}' names {len(channels)} channel(s) ({', '.join(channels)})",
        ),
        "data.num_classes": (len(labels), f"'{manifest}' names {len(labels)} label(s) ({', '.join(labels)})"),
    }


SPECS = (
    KindSpec(
        name="synthetic_brats",
        builder="trainrun.data.segmentation:segmentation_datasets",
        batches="volumes",
        check=check_synthetic,
        reads=("segmentation",),
    ),
    KindSpec(
        name="decathlon",
        builder="trainrun.data.segmentation:segmentation_datasets",
        batches="volumes",
        check=check,
        check_files=check_decathlon_files,
        reads=("path", "segmentation"),
        fills=named_by_folder,
    ),
)
