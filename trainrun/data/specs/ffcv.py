"""The spec of ``data=beton``: a user's .beton files, read by FFCV's loader (trainrun/data/ffcv.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import KindSpec


def check(config: Any) -> None:
    if config.data.loader != "ffcv":
        raise ConfigError("data=beton reads .beton files: it needs data.loader=ffcv")


def check_files(config: Any) -> None:
    for key in ("train", "val"):
        path = getattr(config.data, key)
        if not path:
            raise ConfigError(f"data=beton needs 'data.{key}' (a .beton file written by 'trainrun write')")
        if not Path(path).expanduser().is_file():
            raise ConfigError(f"bad value for 'data.{key}': '{path}' does not exist")


SPECS = (
    KindSpec(
        name="beton",
        builder="trainrun.data.ffcv:beton_files",
        batches="images",
        check=check,
        check_files=check_files,
        reads=("train", "val"),
    ),
)
