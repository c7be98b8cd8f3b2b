"""What trainrun has measured (``readings.yaml``): its own readings of a step on a GPU, which the
GPU generations' shares are fitted on (``bench/fit_generations.py``) and which no estimate reads; and
its loaders' costs, which the estimate times loaders with. An image loader is timed by its
operations (``image_ops``: a decode, the rest of a DataLoader worker's way, an augmentation
operation, FFCV's decode of a JPEG or of raw pixels), each what one thread of the measuring machine
spends on an image (``bench/loader_ops.py``, on real photographs); a text or volume loader by one row
of what a thread delivers. A node's loaders do the work of its free threads at its CPU's speed
(:func:`trainrun.estimate.loader.loader_threads`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("readings.yaml")


@dataclass(frozen=True)
class GpuReading:
    """A step of one architecture family on one GPU, at a precision, compiled or not, as trainrun read it."""

    family: str
    gpu: str
    precision: str
    compile: bool
    rate: str  # the reading in words
    shape: tuple[str, ...]  # the run's overrides it was measured at
    source: str  # the command, date and device (docs/benchmarks.md)
    reading: tuple[float, str]  # the rate and its unit (img/s, tokens/s, seq/s, crops/s)
    real_tokens: float | None = None  # measured on masked text: the share of real tokens
    vocab: int | None = None  # measured on text: the vocabulary, where not the model's published one
    checkpointing: str = "none"  # parallel.activation_checkpointing it was measured with
    fit: bool = True  # in the fit set of its GPU's generation (bench/fit_generations.py)
    why: str | None = None  # why a reading is a check and not fitted

    def key(self) -> str:
        """The family, precision, compiled or eager, and checkpointing where any: what a reading is of."""
        return run_key(self.family, self.precision, self.compile, self.checkpointing)


def run_key(family: str | None, precision: str, compile: bool, checkpointing: str) -> str:
    """A run's kind as the readings name theirs (``llama bf16 eager, selective checkpointing``)."""
    words = f"{family} {precision} {'compiled' if compile else 'eager'}"
    return words if checkpointing == "none" else f"{words}, {checkpointing} checkpointing"


@dataclass(frozen=True)
class LoaderRate:
    """What one thread of the measuring machine delivers for a task's text or volume loader."""

    task: str
    loader: str  # data.loader
    per_thread: float
    unit: str  # tokens/s, crops/s
    source: str
    crop: tuple[int, ...] | None = None  # the crop it was measured at (volumes): the rate scales with its voxels


@dataclass(frozen=True)
class ImageOps:
    """Seconds one thread of the measuring machine spends on an image's operations
    (``bench/loader_ops.py``): each operation a fixed cost and one a megapixel of its output,
    fitted over the sides it was measured at."""

    source: str
    megapixels: float  # a stored image's pixels (ImageNet-like: a longer side of 500 px)
    decode_per_megapixel: float  # PIL's whole decode
    costs: dict[str, tuple[float, float]]  # worker, augment, draft, ffcv_jpeg, ffcv_raw: (s, s a megapixel)

    def at(self, operation: str, side: int) -> float:
        """``operation``'s seconds an image whose output is ``side`` pixels square."""
        fixed, per_megapixel = self.costs[operation]
        return fixed + per_megapixel * side * side / 1e6


@dataclass(frozen=True)
class Cpu:
    """How a node's threads add up against the measuring machine's (``readings.yaml``'s ``cpu``)."""

    smt_yield: float  # what a core's second thread adds, as a share of a core
    trainer_threads: int  # threads a training process keeps busy itself (not its loader's)
    image_loader_efficiency: float  # a node's image workers' share of their single-thread costs (fitted)


@dataclass(frozen=True)
class Rates:
    gpu: tuple[GpuReading, ...]
    loader: tuple[LoaderRate, ...]
    image_ops: ImageOps
    cpu: Cpu

    def loader_rate(self, task: str, loader: str, crop: tuple[int, ...] | None = None) -> LoaderRate | None:
        """The measured row of ``task``'s ``loader``, for a ``crop`` of as many axes scaled to its
        voxels; None where none was measured."""
        rows = [row for row in self.loader if (row.task, row.loader) == (task, loader)]
        if crop is not None:
            rows = [row for row in rows if row.crop is not None and len(row.crop) == len(crop)]
            if rows:
                row = rows[0]
                return replace(row, per_thread=row.per_thread * math.prod(row.crop) / math.prod(crop), crop=crop)
        return rows[0] if rows else None


@functools.cache
def rates() -> Rates:
    """The table in ``readings.yaml``."""
    table = yaml.safe_load(TABLE.read_text())
    gpu = tuple(
        GpuReading(**{**row, "shape": tuple(row["shape"]), "reading": tuple(row["reading"])}) for row in table["gpu"]
    )
    loader = tuple(
        LoaderRate(**{**row, "crop": tuple(row["crop"]) if row.get("crop") else None}) for row in table["loader"]
    )
    ops = table["image_ops"]
    costs = {name: (fixed / 1e3, per_megapixel / 1e3) for name, (fixed, per_megapixel) in ops["fitted"].items()}
    image_ops = ImageOps(ops["source"], ops["megapixels"], ops["decode_ms_per_mp"] / 1e3, costs)
    return Rates(gpu, loader, image_ops, Cpu(**table["cpu"]))
