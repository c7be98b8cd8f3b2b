"""The rates trainrun has measured, which ``trainrun estimate`` times a run with (``readings.yaml``).

A GPU row is the model FLOPs utilisation of one architecture family at one precision, compiled or
not, on one GPU: measured by a command in ``docs/benchmarks.md`` (its rate at its shape, and the
utilisation that is by trainrun's own FLOP count of that shape), or fitted on one named published
result where trainrun has not run on that GPU (``calibrated``; at most one a family and GPU). An
image loader is timed by its operations (``image_ops``: a decode, the rest of a DataLoader worker's
way, an augmentation operation, FFCV's decode of a JPEG or of raw pixels), each what one thread
of the measuring machine spends on an image (``bench/loader_ops.py``, on real photographs); a
text or volume loader by one row of what a thread delivers. A node's loaders do the work of its
free threads at its CPU's speed (:func:`trainrun.estimate.loader.loader_threads`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("readings.yaml")


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
    # parallel.activation_checkpointing it was measured with: selective checkpointing's policy runs in
    # Python for every operation of an eager step, and any recomputes the forward's operations, so a
    # row applies only to runs with the same
    checkpointing: str = "none"
    # the share of the peak ``shape`` reaches on the roofline of the GPU it was read on, at that GPU's
    # ``memory_gb_s`` (trainrun.estimate.device.Roofline): a run at other sides, methods or micro-batches
    # moves from ``mfu`` as its own roofline there moves from this
    roofline: float | None = None
    memory_gb_s: float | None = None

    def describe(self, gpu: str) -> str:
        """One line: which row, and on which GPU where it was measured on another of the same architecture."""
        where = self.gpu if self.gpu == gpu else f"{self.gpu}, applied to {gpu} (same architecture)"
        return f"{self.key()} on {where}: {self.mfu:.1%} MFU, {self.basis} ({self.rate})"

    def key(self) -> str:
        """The family, precision, compiled or eager, and checkpointing where any: what a row is for."""
        return run_key(self.family, self.precision, self.compile, self.checkpointing)


def run_key(family: str | None, precision: str, compile: bool, checkpointing: str) -> str:
    """A run's kind as the rate rows name theirs (``llama bf16 eager, selective checkpointing``)."""
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
    architectures: dict[str, str]
    gpu: tuple[GpuRate, ...]
    loader: tuple[LoaderRate, ...]
    image_ops: ImageOps
    cpu: Cpu
    operation_floor_s: float  # what a GPU operation costs however small: its dispatch and launch

    def gpu_rate(
        self, family: str | None, gpu: str | None, precision: str, compile: bool, checkpointing: str = "none"
    ) -> GpuRate | None:
        """The row for ``family`` at ``precision`` (fp8 read as bf16, amp as fp16 AMP), compiled or not,
        with ``checkpointing``, on ``gpu``, else on another GPU of its architecture; None where none
        was measured."""
        precision = "bf16" if precision == "fp8" else precision
        wanted = (family, precision, compile, checkpointing)
        fitting = [row for row in self.gpu if (row.family, row.precision, row.compile, row.checkpointing) == wanted]
        same = [row for row in fitting if row.gpu == gpu]
        architecture = self.architectures.get(gpu or "")
        sibling = [row for row in fitting if architecture and self.architectures.get(row.gpu) == architecture]
        return (same or sibling or [None])[0]

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
        GpuRate(**{**row, "shape": tuple(row["shape"]), "reading": tuple(row["reading"]) if "reading" in row else None})
        for row in table["gpu"]
    )
    loader = tuple(
        LoaderRate(**{**row, "crop": tuple(row["crop"]) if row.get("crop") else None}) for row in table["loader"]
    )
    ops = table["image_ops"]
    costs = {name: (fixed / 1e3, per_megapixel / 1e3) for name, (fixed, per_megapixel) in ops["fitted"].items()}
    image_ops = ImageOps(ops["source"], ops["megapixels"], ops["decode_ms_per_mp"] / 1e3, costs)
    return Rates(table["architectures"], gpu, loader, image_ops, Cpu(**table["cpu"]), table["operation_floor_s"])
