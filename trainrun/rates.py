"""The rates trainrun has measured, which ``trainrun estimate`` times a run with (``rates.yaml``).

A GPU row is the model FLOPs utilisation of one architecture family at one precision, compiled or
not, on one GPU: measured by a command in ``docs/benchmarks.md`` (its rate at its shape, and the
utilisation that is by trainrun's own FLOP count of that shape), or fitted on one named published
result where trainrun has not run on that GPU (``calibrated``; at most one a family and GPU). A
loader row is what one CPU core decodes and augments for a task's loader at a resolution,
measured on trainrun's CPU machine; a node's loaders have its ``hardware.cpu_cores``. The
estimate scales the row that fits by the run's FLOPs and samples, and says which row it used.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("rates.yaml")


@dataclass(frozen=True)
class GpuRate:
    """A family's utilisation of one GPU's bf16 peak at a precision, compiled or not."""

    family: str
    gpu: str
    precision: str
    compile: bool
    mfu: float
    basis: str  # measured: trainrun's reading; calibrated: fitted on the published result it names
    rate: str  # the reading (or the published result) in its own units
    shape: tuple[str, ...]  # the run's overrides it was measured at (its FLOPs are trainrun's count)
    source: str  # the command, date and device (docs/benchmarks.md), or the publication
    reading: tuple[float, str] | None = None  # measured: the rate and its unit (img/s, tokens/s, seq/s, crops/s)
    real_tokens: float | None = None  # measured on masked text: the share of real tokens
    vocab: int | None = None  # measured on text: the vocabulary, where not the model's published one

    def describe(self, gpu: str) -> str:
        """One line: which row, and on which GPU where it was measured on another of the same architecture."""
        where = self.gpu if self.gpu == gpu else f"{self.gpu}, applied to {gpu} (same architecture)"
        compiled = "compiled" if self.compile else "eager"
        return f"{self.family} {self.precision} {compiled} on {where}: {self.mfu:.1%} MFU, {self.basis} ({self.rate})"


@dataclass(frozen=True)
class LoaderRate:
    """What one CPU core of a task's loader delivers at a training resolution."""

    task: str
    loader: str  # data.loader
    resolution: int | None  # the side it decodes at (images), None where it does not apply
    per_core: float
    unit: str  # img/s, tokens/s, crops/s
    source: str
    crop: tuple[int, ...] | None = None  # the crop it was measured at (volumes): the rate scales with its voxels


@dataclass(frozen=True)
class Rates:
    architectures: dict[str, str]
    gpu: tuple[GpuRate, ...]
    loader: tuple[LoaderRate, ...]

    def gpu_rate(self, family: str | None, gpu: str | None, precision: str, compile: bool) -> GpuRate | None:
        """The row for ``family`` at ``precision`` (fp8 read as bf16, amp as fp16 AMP), compiled or not,
        on ``gpu``, else on another GPU of its architecture; None where none was measured."""
        precision = "bf16" if precision == "fp8" else precision
        fitting = [row for row in self.gpu if (row.family, row.precision, row.compile) == (family, precision, compile)]
        same = [row for row in fitting if row.gpu == gpu]
        architecture = self.architectures.get(gpu or "")
        sibling = [row for row in fitting if architecture and self.architectures.get(row.gpu) == architecture]
        return (same or sibling or [None])[0]

    def loader_rate(
        self, task: str, loader: str, resolution: int | None, crop: tuple[int, ...] | None = None
    ) -> LoaderRate | None:
        """The measured row of ``task``'s ``loader`` nearest ``resolution`` (a decode costs much the
        same at nearby sides: most of it is the JPEG's, whatever the crop), or for a ``crop`` of as
        many axes, scaled to its voxels; None where none was measured."""
        rows = [row for row in self.loader if (row.task, row.loader) == (task, loader)]
        if crop is not None:
            rows = [row for row in rows if row.crop is not None and len(row.crop) == len(crop)]
            if rows:
                row = rows[0]
                return replace(row, per_core=row.per_core * math.prod(row.crop) / math.prod(crop), crop=crop)
        if not rows:
            return None
        if resolution is None or any(row.resolution is None for row in rows):
            return rows[0]
        return min(rows, key=lambda row: abs(row.resolution - resolution))


@functools.cache
def rates() -> Rates:
    """The table in ``rates.yaml``."""
    table = yaml.safe_load(TABLE.read_text())
    gpu = tuple(
        GpuRate(**{**row, "shape": tuple(row["shape"]), "reading": tuple(row["reading"]) if "reading" in row else None})
        for row in table["gpu"]
    )
    loader = tuple(
        LoaderRate(**{**row, "crop": tuple(row["crop"]) if row.get("crop") else None}) for row in table["loader"]
    )
    return Rates(table["architectures"], gpu, loader)
