"""A step on one GPU from its operations and the GPU's datasheet, for ``trainrun estimate``.

The fake pass records every aten operation a step runs (:class:`Operation`: its FLOPs, the bytes it
reads and writes, its kind and the dimensions that decide how well it runs). Each is timed on the
run's GPU as described by its hardware group's datasheet (:class:`Device`: the dense peak at the
run's precision, the memory bandwidth, the architecture):

- matrix products on the tensor cores, at the share of their full rate a large one is fed at
  (``matmul``), less as each of its GEMM dimensions shrinks: a factor ``d / (d + half_dimension)``
  a dimension; never faster than the peak at the run's precision, which is the full rate but on a
  GeForce part, whose FP32-accumulate products run at half of it (``peak_fp16_accumulate_tflops``);
- convolutions as the same products (their implicit GEMM, per group; a grouped one whose groups the
  tensor cores' tiles do not fit as a float32 run's products, on the CUDA cores at the float32 peak,
  :mod:`~trainrun.estimate.layout`), but never faster than their kernels' traffic allows:
  ``convolution_intensity`` FLOPs for each byte at the memory's share of the bandwidth. cuDNN's
  implicit GEMMs re-read their tiles, so a GPU whose peak outruns its memory (an
  A100, an H100) computes a ResNet's convolutions at a third or a quarter of its peak, and one whose
  memory keeps up (a GeForce part at half the peak) at its matrix products' share;
- attention as a fused (flash) kernel runs it, at its own share (``attention``), less for short
  sequences and narrow heads by the same factor;
- everything else (element-wise operations, norms, reductions, depthwise convolutions, copies) at
  the share of the memory bandwidth such kernels reach (``memory``);
- each issued by the host in the floor an operation costs however small (``floor_s``: its dispatch
  and launch; an eager step under selective activation checkpointing pays its policy's Python time
  an operation on top, ``policy_s``), which hides behind the kernels already queued on the GPU: a
  step is as long as its kernels where they queue up, as long as its issue where they do not.

A compiled step is timed as inductor's kernels (:func:`fused_kernels`). The shares are one set a GPU
architecture generation (:class:`Generation`), fitted once on a declared fit set and used unchanged
for every model: ``generations.yaml``, written by ``bench/fit_generations.py``. A generation
trainrun has no fit for is timed with the nearest fitted one's, and says so. Written here because
no library times a training step from a datasheet.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from trainrun.errors import ConfigError
from trainrun.estimate.layout import CUDA_CORES
from trainrun.estimate.operations import (
    ATTENTION,
    CONVOLUTION,
    DEPTHWISE,
    FLOAT8,
    FLOAT8_CAST_BYTES,
    GROUPED,
    MEMORY,
    SYNC,
    Operation,
)
from trainrun.schema import TrainConfig

if TYPE_CHECKING:
    from trainrun.core.time import Timeline
    from trainrun.estimate.memory import MethodWork

GENERATIONS = Path(__file__).with_name("generations.yaml")
ERRORS = Path(__file__).with_name("errors.yaml")  # the validation's error by basis (bench/estimate_validation.py)
BASES = ("measured", "datasheet, fitted generation", "datasheet, unfitted generation")
GB = 1e9
# convolutions of several groups, whose kernels the datasheet does not time well: the share of a step
# above which the estimate says so (:func:`several_groups_notes`), and how its note begins
SEVERAL_GROUPS, SEVERAL_GROUPS_SHARE = (GROUPED, DEPTHWISE, CUDA_CORES), 0.05
SEVERAL_GROUPS_NOTE = "depthwise and grouped convolutions"
# what a group must state for its GPU to be timed from its datasheet
DATASHEET_FACTS = ("peak_tflops", "memory_gb_s", "device_memory_gb", "architecture")


@dataclass(frozen=True)
class Generation:
    """What one GPU architecture generation's kernels reach (module docstring), and how it is known."""

    name: str
    matmul: float
    convolution_intensity: float  # a convolution's FLOPs a byte of its traffic at the memory's share (inf: none)
    attention: float
    memory: float
    half_dimension: float
    floor_s: float
    policy_s: float
    fitted_on: tuple[str, ...]  # the fit set's rows
    borrowed_from: str | None = None  # an unfitted generation timed with this fitted one's shares

    @property
    def traffic_bound(self) -> bool:
        """Whether its convolutions are bounded by their kernels' traffic (a fit may find no intensity)."""
        return math.isfinite(self.convolution_intensity)


@functools.cache
def generation_table() -> dict:
    """``generations.yaml`` as written: the fitted ``generations`` and the ``nearest`` fitted one of
    each other architecture."""
    return yaml.safe_load(GENERATIONS.read_text())


def known_architectures() -> list[str]:
    """Every architecture a hardware group may name: the fitted ones and those that borrow."""
    table = generation_table()
    return sorted({*table["generations"], *table["nearest"]} - {"default"})


@functools.cache
def generations() -> dict[str, Generation]:
    """The fitted generations of ``generations.yaml``, by architecture."""
    fitted = {}
    for name, values in generation_table()["generations"].items():
        fitted[name] = Generation(name=name, **{**values, "fitted_on": tuple(values["fitted_on"])})
    return fitted


def generation_of(architecture: str) -> Generation:
    """``architecture``'s fitted generation, else the nearest fitted one's shares (``generations.yaml``'s
    ``nearest``), said in its ``borrowed_from``."""
    fitted = generations()
    if architecture in fitted:
        return fitted[architecture]
    nearest = generation_table()["nearest"]
    borrowed = fitted[nearest.get(architecture, nearest["default"])]
    return Generation(**{**borrowed.__dict__, "name": architecture, "borrowed_from": borrowed.name})


@dataclass(frozen=True)
class Device:
    """One GPU as a step's operations see it: its peak (FLOP/s) at the run's precision, its memory
    bandwidth (GB/s), its generation's shares; compiled (inductor's kernels) and under selective
    checkpointing's policy, or not."""

    peak_flops: float
    bandwidth_gb_s: float
    generation: Generation
    compiled: bool = False
    checkpoint_policy: bool = False
    float8_flops: float | None = None  # the float8 peak (FLOP/s); None: float8 products at the peak
    full_rate_flops: float | None = None  # the tensor cores' full rate where the peak is half of it; None: the peak
    cuda_core_flops: float | None = None  # the float32 peak, of a kernel off the tensor cores; None: the peak

    def operation_seconds(self, operation: Operation) -> float:
        """The GPU's time of ``operation``: the slowest of its FLOPs as its kernel is fed (its share of
        the full rate, less for narrow shapes), its FLOPs at the peak, and its bytes at the memory's
        share of the bandwidth."""
        generation = self.generation
        moving = operation.moved / (self.bandwidth_gb_s * GB * generation.memory)
        if not operation.flops or operation.kind in (MEMORY, DEPTHWISE):
            return moving
        shape = math.prod(dim / (dim + generation.half_dimension) for dim in operation.dims)
        fed = operation.flops / (self.rate(operation.kind) * shape)
        return max(fed, operation.flops / self.peak(operation.kind), moving)

    def issue_seconds(self) -> float:
        """The host's time to issue a kernel: the floor an operation costs (dispatch and launch), and
        selective checkpointing's policy where it runs in Python."""
        return self.generation.floor_s + (self.generation.policy_s if self.checkpoint_policy else 0.0)

    def rate(self, kind: str) -> float:
        """The FLOP/s a large operation of ``kind`` (matmul, convolution, attention) is fed at here: its
        kind's share of the tensor cores' full rate (a convolution never faster than its kernels'
        traffic allows). Where the run's precision computes at half that rate (a GeForce part's
        FP32-accumulate products), the same kernels keep the halved tensor cores busy, and the peak
        bounds an operation instead (:meth:`operation_seconds`)."""
        generation = self.generation
        full = self.peak(kind) if kind in (FLOAT8, CUDA_CORES) else self.full_rate_flops or self.peak_flops
        fed = full * (generation.attention if kind == ATTENTION else generation.matmul)
        if kind in (CONVOLUTION, GROUPED, CUDA_CORES):
            return min(fed, self.bandwidth_gb_s * GB * generation.memory * generation.convolution_intensity)
        return fed

    def peak(self, kind: str) -> float:
        """The dense peak (FLOP/s) an operation of ``kind`` computes at: the float8 one for a float8
        product and the float32 one for a kernel on the CUDA cores where the datasheet states them, else
        the run precision's."""
        stated = {FLOAT8: self.float8_flops, CUDA_CORES: self.cuda_core_flops}.get(kind)
        return stated or self.peak_flops

    def seconds(self, operations: list[Operation] | tuple[Operation, ...]) -> float:
        """Seconds of ``operations`` run in order on this GPU (as inductor's kernels where compiled):
        the host issues them one after another (:meth:`issue_seconds`), and the GPU runs each once it
        is issued and the one before it has finished, so that a kernel's issue hides behind the
        kernels queued before it, but not past a point where the host waits for the GPU (:data:`SYNC`)."""
        issue, issued, finished = self.issue_seconds(), 0.0, 0.0
        for kernel in self.kernels(operations):
            if kernel.kind == SYNC:  # the host waits for the GPU: nothing is queued past this
                issued = max(issued, finished)
                continue
            issued += issue
            finished = max(finished, issued) + self.operation_seconds(kernel)
        return finished

    def kernels(self, operations: list[Operation] | tuple[Operation, ...]) -> list[Operation] | tuple[Operation, ...]:
        """The kernels ``operations`` run as here: inductor's where compiled (:func:`fused_kernels`)."""
        return fused_kernels(operations) if self.compiled else operations

    def share_in(self, operations: list[Operation], kinds: tuple[str, ...]) -> float:
        """The share of ``operations``' kernel time here that the kernels of ``kinds`` take."""
        timed = [(kernel.kind, self.operation_seconds(kernel)) for kernel in self.kernels(operations)]
        return sum(seconds for kind, seconds in timed if kind in kinds) / max(sum(s for _, s in timed), 1e-12)

    def eager(self) -> Device:
        """This GPU running operations one by one (the optimizer's step, a method's work beside the passes)."""
        return dataclasses.replace(self, compiled=False, checkpoint_policy=False)

    def utilisation(self, operations: list[Operation], model_flops: float) -> float:
        """The share of the peak ``model_flops`` reach when ``operations`` run them (MFU: the
        operations may recompute, the model's FLOPs count once)."""
        return model_flops / (self.seconds(operations) * self.peak_flops)


def fused_kernels(operations: list[Operation] | tuple[Operation, ...]) -> list[Operation]:
    """A compiled step's kernels from its eager ``operations``, as inductor fuses them: each matrix
    product, convolution (a depthwise one too: inductor calls cuDNN for every convolution) or attention
    its own kernel, and each run of element-wise and reduction operations between them inside a
    compiled region one kernel (:func:`fused_bytes`). An operation outside the compiled regions (a
    blocks-compiled model's embeddings and head) runs as its own kernel. Written here because
    inductor says its kernels only for a real GPU's code, not a fake pass's."""
    last_read = {access.storage: index for index, operation in enumerate(operations) for access in operation.reads}
    kernels: list[Operation] = []
    chain: list[Operation] = []
    for index, operation in enumerate(operations):
        if operation.kind == MEMORY and operation.compiled:
            chain.append(operation)
            continue
        if chain:
            kernels.append(Operation(0.0, fused_bytes(chain, index - 1, last_read)))
        kernels.append(operation)
        chain = []
    return [*kernels, Operation(0.0, fused_bytes(chain, len(operations) - 1, last_read))] if chain else kernels


def fused_bytes(chain: list[Operation], end: int, last_read: dict[int, int]) -> float:
    """The bytes one fused kernel of ``chain`` (the operations up to index ``end``) moves: each tensor
    it reads from outside it, once, and each it writes that outlives it (read by a later operation,
    or never read in the pass: a gradient); a tensor made and used up within it stays on chip. An
    operation logged without its tensors moves what it moved alone."""
    made = {storage for operation in chain for storage in operation.made}
    read = {(a.storage, a.part): a.bytes for operation in chain for a in operation.reads if a.storage not in made}
    written = {
        (a.storage, a.part): a.bytes
        for operation in chain
        for a in operation.writes
        if a.storage not in made or last_read.get(a.storage, end + 1) > end
    }
    alone = sum(operation.moved for operation in chain if not (operation.reads or operation.writes))
    return float(sum(read.values()) + sum(written.values()) + alone)


def datasheet_gaps(config: TrainConfig) -> list[str]:
    """The datasheet facts of ``hardware`` a step's time needs that it does not state."""
    return [name for name in DATASHEET_FACTS if getattr(config.hardware, name) is None]


def check_datasheet(config: TrainConfig) -> None:
    """A hardware group that names a GPU states its datasheet (:data:`DATASHEET_FACTS`), and a
    tensor cores' full rate no lower than its peak."""
    hardware = config.hardware
    missing = datasheet_gaps(config)
    if hardware.gpu is not None and missing:
        raise ConfigError(
            f"bad value for 'hardware': {hardware.name} names gpu {hardware.gpu} but states no "
            f"{', '.join(missing)}, which time a step from its datasheet (set hardware.{missing[0]}=...)"
        )
    full, peak = hardware.peak_fp16_accumulate_tflops, hardware.peak_tflops
    if full is not None and peak is not None and full < peak:
        raise ConfigError(
            f"bad value for 'hardware.peak_fp16_accumulate_tflops': {full:g} is below peak_tflops {peak:g}; it is "
            "the tensor cores' full rate (a GeForce part's FP16-accumulate figure, twice its peak_tflops)"
        )


def peak_at(config: TrainConfig) -> float | None:
    """A GPU's dense peak (TFLOP/s) at the precision the run computes in: bf16's (amp, bf16, fp8's
    other operations) or float32's (trainrun leaves TF32 off)."""
    hardware = config.hardware
    return hardware.peak_fp32_tflops if config.precision == "fp32" else hardware.peak_tflops


def device_of(config: TrainConfig, peak_tflops: float | None = None) -> Device | None:
    """The run's GPU (``peak_tflops``: a stated peak instead of the datasheet's); None where its
    hardware group does not describe one."""
    hardware = config.hardware
    peak = peak_tflops or peak_at(config)
    if not peak or datasheet_gaps(config):
        return None
    return Device(
        peak * 1e12,
        hardware.memory_gb_s,
        generation_of(hardware.architecture),
        compiled=config.compile,
        checkpoint_policy=config.parallel.activation_checkpointing == "selective" and not config.compile,
        float8_flops=hardware.peak_fp8_tflops * 1e12 if hardware.peak_fp8_tflops else None,
        full_rate_flops=full_rate_at(config) if peak_tflops is None else None,
        cuda_core_flops=hardware.peak_fp32_tflops * 1e12 if hardware.peak_fp32_tflops else None,
    )


def full_rate_at(config: TrainConfig) -> float | None:
    """The tensor cores' full rate (FLOP/s) where the run's products compute at half of it: a
    GeForce part's FP16-accumulate peak under amp or bf16 (its FP32-accumulate rate, torch's, is
    half); None where the peak is the full rate, and for float32, which runs without them."""
    full = config.hardware.peak_fp16_accumulate_tflops
    return full * 1e12 if full and config.precision != "fp32" else None


def basis_of(config: TrainConfig, device: Device) -> str:
    """How the run's GPU is timed: on a GPU trainrun has readings of, from the datasheet of a
    generation fitted on others, or from the datasheet of an unfitted generation (borrowing)."""
    generation = device.generation
    if generation.borrowed_from:
        return f"datasheet, unfitted generation ({generation.name}: {generation.borrowed_from}'s shares)"
    readings = {row.split(":")[0] for row in generation.fitted_on}
    if config.hardware.gpu in readings:
        return f"measured ({config.hardware.gpu} readings in the {generation.name} fit)"
    return f"datasheet, fitted generation ({generation.name})"


def basis_kind(basis: str) -> str | None:
    """Which of :data:`BASES` a run's basis (:func:`basis_of`) is; None where stated or not described."""
    return next((kind for kind in BASES if basis.startswith(kind)), None)


@functools.cache
def validation_table() -> dict:
    """``errors.yaml``: what the validation's counted predictions show, written with its table."""
    return yaml.safe_load(ERRORS.read_text())


def validation_errors() -> dict[str, float | None]:
    """The median error of the validation's counted predictions by basis; None where no counted
    prediction has that basis."""
    return validation_table()["median_error"]


def several_groups_notes(share: float) -> list[str]:
    """What the estimate of a step whose depthwise and grouped convolutions take ``share`` of its GPU
    time (at least :data:`SEVERAL_GROUPS_SHARE`) leaves out, and what the validation's counted steps
    with such a share showed (``errors.yaml``'s ``several_groups``: their published step over the
    estimate's)."""
    if share < SEVERAL_GROUPS_SHARE:
        return []
    shown = validation_table().get("several_groups") or {}
    seen = ""
    if shown:
        low, high = min(shown.values()), max(shown.values())
        seen = f"; the validation's steps with them took {low:.2f}-{high:.2f} times the estimate ({len(shown)} rows)"
    return [
        f"{SEVERAL_GROUPS_NOTE}: {share:.0%} of the step's GPU time, timed at the memory's bandwidth and as "
        "their groups' products (on the CUDA cores where no tensor-core tile fits a group), which cuDNN's "
        f"kernels for them (their backward most) do not always reach{seen}"
    ]


def validation_error(basis: str) -> float | None:
    """The error the validation shows for runs timed on ``basis``; None where it shows none."""
    kind = basis_kind(basis)
    return validation_errors().get(kind) if kind else None


def float8_speedup(config: TrainConfig, float8: float, notes: list[str]) -> float:
    """How much faster the run's products compute with the ``float8`` share of its FLOPs at the
    hardware's float8 peak (precision=fp8), the rest at bf16's; 1 where there is none, said."""
    hardware = config.hardware
    if not float8:
        return 1.0
    if not hardware.peak_fp8_tflops or not hardware.peak_tflops:
        notes.append(_no_float8_peak(config))
        return 1.0
    ratio = hardware.peak_fp8_tflops / hardware.peak_tflops
    notes.append(
        f"precision=fp8: {float8:.0%} of the FLOPs (torchao's float8 linear layers) at the float8 peak, "
        f"{hardware.peak_fp8_tflops:g} TFLOP/s; the rest at bf16's"
    )
    return 1 / (1 - float8 + float8 / ratio)


def _no_float8_peak(config: TrainConfig) -> str:
    return f"precision=fp8 timed as bf16: hardware={config.hardware.name} states no peak_fp8_tflops"


def float8_notes(config: TrainConfig) -> list[str]:
    """What precision=fp8 is timed as, from the operations; none for another precision."""
    hardware = config.hardware
    if config.precision != "fp8":
        return []
    if not hardware.peak_fp8_tflops:
        return [_no_float8_peak(config)]
    return [
        f"precision=fp8: torchao's float8 linear layers' products at the float8 peak, {hardware.peak_fp8_tflops:g} "
        f"TFLOP/s, with their operands' casts ({FLOAT8_CAST_BYTES} bytes an element); the rest at bf16's"
    ]


def optimizer_seconds(device: Device, operations: tuple[Operation, ...] | None, notes: list[str]) -> float:
    """A step's optimizer on each rank, its ``operations`` timed one by one (0 where not known), said."""
    if not operations:
        return 0.0
    seconds = device.eager().seconds(operations)
    flops, moved = sum(op.flops for op in operations), sum(op.moved for op in operations)
    notes.append(
        f"optimizer: {len(operations)} operations a step on each rank, {moved / GB:.2f} GB moved and "
        f"{flops / 1e12:.3g} TFLOP: {seconds * 1e3:.2f} ms"
    )
    return seconds


def methods_seconds(device: Device, methods: tuple[MethodWork, ...], timeline: Timeline, notes: list[str]) -> float:
    """A step's share of each method's work on the device besides the passes (``Algorithm.device_work``:
    EMA's update of its average, MixUp's and CutMix's blend), its operations timed one by one and
    spread over the steps of its interval on the run's ``timeline``; said."""
    total = 0.0
    eager = device.eager()
    for method in methods:
        steps = timeline.to_batches(method.interval)
        if not steps:
            notes.append(
                f"{method.name}'s work on the device is not timed: its interval {method.interval} has no steps"
            )
            continue
        seconds = eager.seconds(method.operations)
        moved = sum(op.moved for op in method.operations)
        interval = "every step" if steps == 1 else f"every {steps:,} steps"
        notes.append(
            f"{method.name}: {len(method.operations)} operations {interval} on each rank, {moved / GB:.2f} GB moved: "
            f"{seconds * 1e3:.2f} ms ({seconds / steps * 1e3:.3f} ms a step)"
        )
        total += seconds / steps
    return total


@dataclass(frozen=True)
class Gpus:
    """The run's GPUs as the estimate times them: the device its hardware group describes (None: none
    described), each micro-batch's share of the peak, and how that is known."""

    device: Device | None
    peak_tflops: float | None  # a GPU's, at the run's precision
    described: str  # in words
    basis: str  # measured, datasheet of a fitted or an unfitted generation, stated (--mfu), not described
    utilisations: list[float]  # of each work asked for, the plain step's last

    def compute_seconds(self, flops: float, ranks: int, utilisation: float) -> float | None:
        """``flops`` (all ranks) on ``ranks`` GPUs at ``utilisation`` of the peak; None where no peak is known."""
        return flops / (ranks * self.peak_tflops * 1e12 * utilisation) if self.peak_tflops else None
