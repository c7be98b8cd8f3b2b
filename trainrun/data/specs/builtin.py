"""The specs of the built-in image sets: ``data=digits|mnist5k`` (images that packages ship) and
``data=synthetic`` (generated), read by trainrun/data/builtin.py."""

from __future__ import annotations

from trainrun.kinds import KindSpec

SPECS = (
    KindSpec(name="digits", builder="trainrun.data.builtin:builtin_datasets", batches="images"),
    KindSpec(name="mnist5k", builder="trainrun.data.builtin:builtin_datasets", batches="images"),
    KindSpec(name="synthetic", builder="trainrun.data.builtin:synthetic_datasets", batches="images"),
)
