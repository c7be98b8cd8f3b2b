"""The spec of ``data=folder``: image files in train/ and val/ class folders (trainrun/data/folder.py)."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import KindSpec


def check(config: Any) -> None:
    if config.data.loader == "ffcv":
        raise ConfigError(
            "data=folder reads image files with the torch loader; for FFCV write them once with "
            "'trainrun write' and use data=beton"
        )


def check_files(config: Any) -> None:
    if not config.data.path:
        raise ConfigError("data=folder needs 'data.path' (a directory with train/ and val/ subfolders)")


SPECS = (
    KindSpec(
        name="folder",
        builder="trainrun.data.folder:folder_datasets",
        batches="images",
        check=check,
        check_files=check_files,
        reads=("path",),
    ),
)
