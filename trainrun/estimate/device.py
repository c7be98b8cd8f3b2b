"""A step on the GPUs, for ``trainrun estimate``: the utilisation row that fits the run (measured,
calibrated, stated or assumed), float8's share at its peak, the operations timed one by one (the
optimizer's step), and what the GPUs exchange a step over their links and network, with what the
compute does not hide. Written here because the rows and the exchange are trainrun's own model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainrun import kinds
from trainrun.data.interface import TextFacts
from trainrun.estimate.datasheets import GpuRate, rates, run_key
from trainrun.schema import TrainConfig

if TYPE_CHECKING:
    from trainrun.core.time import Timeline
    from trainrun.estimate.memory import MethodWork

DEFAULT_MFU = 0.4  # where no rate was measured: the utilisation assumed, said as unmeasured
BACKWARD_SHARE = 2 / 3  # of a step's compute: the backward, which DDP's bucketed all-reduce overlaps
GB = 1e9


@dataclass(frozen=True)
class Traffic:
    """What one GPU sends in a step: to the other GPUs of its node and to other nodes (bytes), the
    GPUs a node (who share its network), and the share of the step's compute that hides it (DDP: the
    backward; FSDP: the whole step, prefetched)."""

    within_node: float
    across_nodes: float
    per_node: int
    hidden_by: float

    def seconds(self, config: TrainConfig) -> float:
        """At the node's link bandwidth and its network's share a GPU (0 where nothing crosses)."""
        hardware = config.hardware
        seconds = self.within_node / (hardware.link_gb_s * GB) if self.within_node else 0.0
        if self.across_nodes:
            seconds += self.across_nodes / (hardware.network_gbit_s / 8 * GB / self.per_node)
        return seconds


def exposed_seconds(link: float, hidden_by: float, compute: float) -> float:
    """What of ``link`` seconds of exchange the step's ``compute`` seconds do not hide."""
    return max(0.0, link - hidden_by * compute)


def step_traffic(config: TrainConfig, held: dict[str, float], ranks: int, nodes: int) -> Traffic:
    """A step's exchange as NCCL does it: DDP all-reduces the gradients (reduce-scatter and
    all-gather within a node, all-reduce of a node's share across nodes); FSDP2 all-gathers the
    weights for the forward and again for the backward and reduce-scatters the gradients within its
    shard group, and HSDP all-reduces each shard's gradients across nodes. ``held``: one rank's GB."""
    per_node = ranks // nodes
    sharded = config.parallel.name == "fsdp" and ranks > 1
    group = per_node if sharded and nodes > 1 else ranks if sharded else 1
    weights, gradients = held.get("weights", 0.0) * group * GB, held.get("gradients", 0.0) * group * GB
    across = 2 * (nodes - 1) / nodes * gradients / per_node if nodes > 1 else 0.0
    if sharded:
        return Traffic((per_node - 1) / per_node * (2 * weights + gradients), across, per_node, 1.0)
    return Traffic(2 * (per_node - 1) / per_node * gradients, across, per_node, BACKWARD_SHARE)


@dataclass(frozen=True)
class Roofline:
    """One GPU as a step's operations see it: each at the slower of its FLOPs at the dense peak and
    its bytes at the memory's bandwidth, never under the floor of its dispatch and launch
    (:func:`operations_seconds`); ``fused`` (a compiled step): as the kernels :func:`fused_kernels` makes."""

    peak_flops: float  # FLOP/s
    bandwidth_gb_s: float
    fused: bool = False

    def utilisation(self, operations: list[tuple[float, float]]) -> float:
        """The share of the peak ``operations`` reach on the roofline."""
        flops = sum(flops for flops, _ in operations)
        kernels = fused_kernels(operations) if self.fused else operations
        return flops / (operations_seconds(tuple(kernels), self.peak_flops, self.bandwidth_gb_s) * self.peak_flops)


def fused_kernels(operations: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A compiled step's kernels from its eager ``operations`` (FLOPs, bytes), as inductor fuses them:
    each matrix product, convolution or attention (an operation with FLOPs) its own kernel, and each
    run of element-wise and reduction operations between them one kernel, whose intermediates stay
    on chip: it moves what the most moving of them moves (a chain reads its input and writes its
    output once, where eager each operation reads and writes its own). Written here because inductor
    says its kernels only for a real GPU's code, not a fake pass's."""
    kernels: list[tuple[float, float]] = []
    chain = 0.0
    for flops, moved in operations:
        if flops:
            if chain:
                kernels.append((0.0, chain))
            kernels.append((flops, moved))
            chain = 0.0
        else:
            chain = max(chain, moved)
    return [*kernels, (0.0, chain)] if chain else kernels


def gpu_row(config: TrainConfig, mfu: float | None) -> tuple[float, str, str, GpuRate | None]:
    """(the utilisation, the row in words, its basis, the row): ``mfu`` where stated, else the
    measured or calibrated row that fits, else :data:`DEFAULT_MFU` said as unmeasured."""
    if mfu is not None:
        return mfu, f"--mfu {mfu:.1%}", "stated", None
    family = kinds.spec_of("model", config.model.name).family
    gpu, checkpointing = config.hardware.gpu, config.parallel.activation_checkpointing
    row = rates().gpu_rate(family, gpu, config.precision, config.compile, checkpointing)
    if row is not None:
        return row.mfu, row.describe(gpu), row.basis, row
    named = family or f"{config.model.name} {config.model.arch or config.model.target or ''}".rstrip()
    kind = run_key(named, config.precision, config.compile, checkpointing)
    missing = f"no rate measured for {kind} on {gpu or 'hardware.gpu unset'}"
    return DEFAULT_MFU, f"{missing}: {DEFAULT_MFU:.0%} MFU assumed (--mfu to state one)", "unmeasured", None


def float8_share(config: TrainConfig, text: TextFacts | None, per_sample: float) -> float:
    """Of a training sample's ``per_sample`` FLOPs, those precision=fp8 computes in float8: the
    linear layers torchao's float8 training converts (:func:`~trainrun.core.precision.float8_eligible`),
    six FLOPs a weight a token forward and backward."""
    from trainrun.core.precision import float8_eligible
    from trainrun.estimate.memory import RunShape, meta_model

    model = meta_model(config, RunShape(1, 1, 1, 1, 1, text, "", "none"))
    weights = sum(module.weight.numel() for name, module in model.named_modules() if float8_eligible(module, name))
    tokens = text.max_seq_len * (text.real_token_share or 1.0) if text else 1
    return min(1.0, 6 * weights * tokens / per_sample)


def effective_throughput(config: TrainConfig, throughput: float, float8: float, notes: list[str]) -> float:
    """FLOP/s of the run's GPUs with the ``float8`` share of its FLOPs at the hardware's float8 peak
    (precision=fp8), the rest at ``throughput``; ``throughput`` where there is none, said."""
    hardware = config.hardware
    if not float8:
        return throughput
    if not hardware.peak_fp8_tflops or not hardware.peak_tflops:
        notes.append(f"precision=fp8 timed as bf16: hardware={hardware.name} states no peak_fp8_tflops")
        return throughput
    ratio = hardware.peak_fp8_tflops / hardware.peak_tflops
    notes.append(
        f"precision=fp8: {float8:.0%} of the FLOPs (torchao's float8 linear layers) at the float8 peak, "
        f"{hardware.peak_fp8_tflops:g} TFLOP/s, at the row's utilisation; the rest at bf16's"
    )
    return throughput / (1 - float8 + float8 / ratio)


def operations_seconds(operations: tuple[tuple[float, float], ...], flop_rate: float, bandwidth_gb_s: float) -> float:
    """Seconds of ``operations`` (FLOPs, bytes) on one GPU: each at the slowest of its FLOPs at
    ``flop_rate``, its bytes at the memory's bandwidth, and the floor an eager operation costs however
    small (``readings.yaml``'s ``operation_floor_s``: its dispatch and launch)."""
    bandwidth, floor = bandwidth_gb_s * GB, rates().operation_floor_s
    return sum(max(flops / flop_rate, moved / bandwidth, floor) for flops, moved in operations)


def optimizer_seconds(
    config: TrainConfig, operations: tuple[tuple[float, float], ...] | None, flop_rate: float, notes: list[str]
) -> float:
    """A step's optimizer on each rank, its ``operations`` timed one by one (0 where not known), said."""
    if not operations:
        return 0.0
    if not config.hardware.memory_gb_s:
        notes.append(f"the optimizer's step is not timed: hardware={config.hardware.name} states no memory_gb_s")
        return 0.0
    seconds = operations_seconds(operations, flop_rate, config.hardware.memory_gb_s)
    flops, moved = (sum(values) for values in zip(*operations, strict=True))
    notes.append(
        f"optimizer: {len(operations)} operations a step on each rank, {moved / GB:.2f} GB moved and "
        f"{flops / 1e12:.3g} TFLOP: {seconds * 1e3:.2f} ms"
    )
    return seconds


def methods_seconds(
    methods: tuple[MethodWork, ...],
    flop_rate: float,
    bandwidth_gb_s: float | None,
    timeline: Timeline,
    notes: list[str],
) -> float:
    """A step's share of each method's work on the device besides the passes (``Algorithm.device_work``:
    EMA's update of its average, MixUp's and CutMix's blend), its operations timed one by one and
    spread over the steps of its interval on the run's ``timeline``; said."""
    if not methods or not bandwidth_gb_s:
        return 0.0
    total = 0.0
    for method in methods:
        steps = timeline.to_batches(method.interval)
        if not steps:
            notes.append(
                f"{method.name}'s work on the device is not timed: its interval {method.interval} has no steps"
            )
            continue
        seconds = operations_seconds(method.operations, flop_rate, bandwidth_gb_s)
        moved = sum(moved for _, moved in method.operations)
        interval = "every step" if steps == 1 else f"every {steps:,} steps"
        notes.append(
            f"{method.name}: {len(method.operations)} operations {interval} on each rank, {moved / GB:.2f} GB moved: "
            f"{seconds * 1e3:.2f} ms ({seconds / steps * 1e3:.3f} ms a step)"
        )
        total += seconds / steps
    return total
