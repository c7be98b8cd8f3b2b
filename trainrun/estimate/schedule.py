"""A run's time along its schedule, for ``trainrun estimate``: the schedule read at the middle of
each fiftieth of the run, each method's change to a step's work there
(:meth:`~trainrun.core.engine.Algorithm.step_work`: a resolution, a sequence length, a share of
the pixels or samples, passes added), contiguous equal steps grouped into phases; each phase's
FLOPs counted on the model as the run builds it (:func:`trainrun.estimate.memory.pass_flops`), timed
on the GPUs from its operations on their datasheet (:mod:`trainrun.estimate.device`) with the
optimizer's operations and the exchange the compute does not hide (:mod:`trainrun.estimate.exchange`),
and through the node's loaders
(:mod:`trainrun.estimate.loader`), the slower of the two being the phase's bottleneck;
evaluations at their resolution, interval and windows added. Written here because the schedule,
the methods and the loaders are trainrun's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainrun.algorithms import build_algorithms
from trainrun.core.time import Time, Timeline, TimeUnit
from trainrun.core.work import StepWork
from trainrun.data.interface import TextFacts
from trainrun.estimate.counts import FlopCounts, evaluation_flops, step_flops
from trainrun.estimate.device import (
    Device,
    Gpus,
    Operation,
    basis_of,
    datasheet_gaps,
    device_of,
    float8_notes,
    float8_speedup,
    methods_seconds,
    optimizer_seconds,
    peak_at,
    several_groups_notes,
)
from trainrun.estimate.exchange import NO_TRAFFIC, Traffic
from trainrun.estimate.loader import (
    crop_of,
    evaluation_loader_seconds,
    image_batches,
    loader_in_words,
    loader_notes,
    loader_seconds,
    loader_threads,
    loader_timed,
)
from trainrun.estimate.memory import float8_share
from trainrun.schema import TrainConfig, budget_seconds
from trainrun.tasks.base import Task

if TYPE_CHECKING:
    from trainrun.estimate.memory import MethodWork

POINTS = 50  # the schedule is read at the middle of each fiftieth of the run
LINKS_NAMED = 0.1  # exchange the compute does not hide, as a share of it, that names the links the bottleneck


@dataclass
class Phase:
    """Consecutive steps of equal work: a share of the run, its step's FLOPs and time."""

    start: float  # fractions of the run's schedule
    end: float
    resolution: int | None
    sequence_length: int | None
    step_flops: float  # all ranks
    gpu_seconds: float | None  # a step on the GPUs, from its operations
    loader_seconds: float | None  # a step's samples through the node's loaders (None: unmeasured)
    link_seconds: float = 0.0  # a step's gradients and shards between the GPUs and nodes
    exposed_link_seconds: float = 0.0  # of those, what the compute does not hide

    @property
    def bottleneck(self) -> str | None:
        if self.gpu_seconds is None:
            return None
        if self.loader_seconds is not None and self.loader_seconds > self.gpu_seconds + self.exposed_link_seconds:
            return "loader"
        if self.exposed_link_seconds > LINKS_NAMED * self.gpu_seconds:
            return "links"
        return "GPU" if self.loader_seconds is not None else "GPU (loader not timed)"

    @property
    def seconds(self) -> float | None:
        """A step's time: the GPUs' with the exchange they do not hide, or the loader's where slower."""
        if self.gpu_seconds is None:
            return None
        return max(self.gpu_seconds + self.exposed_link_seconds, self.loader_seconds or 0.0)


@dataclass
class RunTime:
    """The run's time: its phases, its evaluations, its plain step, and how its GPUs were timed."""

    phases: list[Phase]
    rate: str  # how the GPUs are timed, in words
    rate_basis: str  # measured, datasheet of a fitted or an unfitted generation, stated (--mfu), not described
    mfu: float  # the plain step's share of the peak, from its operations (or stated)
    peak_tflops: float | None  # a GPU's
    loader: str | None  # the loader row used, in words (None: no measured loader rate fits)
    steps: int | None  # to max_duration, or what a budget buys (None: epochs without the data's size)
    step_flops: float  # a plain step at the run's full shapes, all ranks
    step_seconds: float | None  # that step on the GPUs at ``mfu``, with the exchange its compute does not hide
    eval_flops: float  # one evaluation, all ranks
    eval_gpu_seconds: float | None  # its forward passes on the GPUs
    eval_loader_seconds: float | None  # its samples through the node's loaders (None: not timed)
    eval_interval_steps: int | None
    notes: list[str]

    @property
    def eval_seconds(self) -> float | None:
        """An evaluation's time: its forward passes or its samples through the loaders, whichever is
        slower (the loaders feed it as they feed a step)."""
        if self.eval_gpu_seconds is None or self.eval_loader_seconds is None:
            return self.eval_gpu_seconds
        return max(self.eval_gpu_seconds, self.eval_loader_seconds)

    def train_seconds(self, until: float = 1.0) -> float | None:
        """Training seconds from the start to ``until`` of the schedule."""
        per_step = mean_step_seconds(self.phases, until)
        return None if self.steps is None or per_step is None else self.steps * per_step

    def seconds_to(self, steps: int | None = None) -> float | None:
        """Training and evaluation seconds to ``steps`` (default: the whole schedule)."""
        if self.steps is None:
            return None
        steps = self.steps if steps is None else steps
        training = self.train_seconds(min(1.0, steps / self.steps))
        if training is None:
            return None
        return training + (self.evaluations_to(steps) or 0) * (self.eval_seconds or 0.0)

    def evaluations_to(self, steps: int) -> int | None:
        """Evaluations in ``steps``: at every interval and at the end, as the trainer evaluates."""
        return math.ceil(steps / self.eval_interval_steps) if self.eval_interval_steps else None


def mean_step_seconds(phases: list[Phase], until: float = 1.0) -> float | None:
    """A step's seconds over the schedule from its start to ``until``, each phase weighted by its share of
    the run (which the run's length does not change): ``until`` of a run's steps take that many times
    this. None where a phase is not timed."""
    if any(phase.seconds is None for phase in phases):
        return None
    return sum(max(0.0, min(phase.end, until) - phase.start) * phase.seconds for phase in phases)


def planned_timeline(config: TrainConfig, notes: list[str]) -> Timeline | None:
    """The run's timeline as the run plans it (:func:`trainrun.run.plan_timeline`'s, with an epoch of
    ``data.samples``); None where ``max_duration`` is a budget, or in epochs of a size not said."""
    duration = Time.parse(config.max_duration)
    if duration.unit.is_budget:
        return None
    batches_per_epoch = batches_an_epoch(config)
    if duration.unit is TimeUnit.EPOCH and not batches_per_epoch:
        notes.append("max_duration in epochs needs the data set's size: set data.samples=[TRAIN,VAL]")
        return None
    return Timeline.for_run(duration, batches_per_epoch, config.train_batch_size, config.scale_schedule_ratio)


def batches_an_epoch(config: TrainConfig) -> int:
    """Steps an epoch of ``data.samples``; 0 where its size is not said."""
    return samples_an_epoch(config) // config.train_batch_size if config.data.samples else 0


def budget_timeline(config: TrainConfig, phases: list[Phase], notes: list[str]) -> Timeline | None:
    """A budget's timeline as the run re-plans it (:mod:`trainrun.core.budget`): the steps its
    training seconds buy at the phases' mean step, which the run's length does not change (phases
    are shares of it); evaluations do not spend a budget. None where ``max_duration`` is not a budget,
    or (said) where a phase is not timed."""
    budget = Time.parse(config.max_duration)
    if not budget.unit.is_budget:
        return None
    mean = mean_step_seconds(phases)
    if mean is None:
        notes.append(f"max_duration={config.max_duration} is a budget: its steps are not known without a step's time")
        return None
    seconds = budget_seconds(config)
    steps, per_epoch = max(1, int(seconds / mean)), batches_an_epoch(config)
    epochs = f" ({steps / per_epoch:,.1f} epochs)" if per_epoch else ""
    hours = f" ({seconds / 3600:,.3g} h of training at the hardware's price)" if budget.unit is TimeUnit.DOLLAR else ""
    notes.append(
        f"max_duration={config.max_duration}{hours} buys {steps:,} steps{epochs} at {mean:.3g} s a step over the "
        "schedule, as the run re-plans; evaluations are outside a budget"
    )
    return Timeline(per_epoch, config.train_batch_size, steps, config.scale_schedule_ratio)


def method_timeline(config: TrainConfig, timeline: Timeline | None) -> Timeline:
    """Where a method's interval becomes steps: the run's ``timeline``, else (a budget, whose length
    the rate decides) one of no planned length, on which ep, ba and sp convert and ``dur`` spans none."""
    return timeline or Timeline(batches_an_epoch(config), config.train_batch_size, max_batches=0)


def base_work(config: TrainConfig, text: TextFacts | None) -> StepWork:
    """A plain step's work at the run's shapes, before the methods change it."""
    side = config.data.resolution if image_batches(config) else None
    return StepWork(full_resolution=side, resolution=side, sequence_length=text.max_seq_len if text else None)


def phases_of(config: TrainConfig, work: StepWork) -> list[tuple[float, float, StepWork]]:
    """(start, end, work) of each run of equal steps along the schedule, the methods applied in order."""
    methods = build_algorithms(config.algorithms)
    read: list[tuple[float, float, StepWork]] = []
    for point in range(POINTS):
        changed = work
        for method in methods:
            changed = method.step_work(changed, (point + 0.5) / POINTS)
        start, end = point / POINTS, (point + 1) / POINTS
        if read and read[-1][2].key() == changed.key():
            read[-1] = (read[-1][0], end, read[-1][2])
        else:
            read.append((start, end, changed))
    return read


def samples_an_epoch(config: TrainConfig) -> int:
    """Training samples an epoch: the data's, or each volume's crops (``samples_per_volume``)."""
    repeats = config.data.segmentation.samples_per_volume if crop_of(config) else 1
    return config.data.samples[0] * repeats


def gpus_of(
    config: TrainConfig,
    counts: FlopCounts,
    works: list[StepWork],
    stated: tuple[float | None, float | None],
    float8: Callable[[], float],
    notes: list[str],
) -> Gpus:
    """The run's GPUs and the share of their peak each of ``works`` reaches: from their operations on
    the hardware group's datasheet, or at ``stated``'s MFU (``--mfu``) of its peak (``--peak-tflops``,
    default the group's), precision=fp8's ``float8()`` share of the FLOPs at the float8 peak there."""
    mfu, peak_tflops = stated
    device = device_of(config, peak_tflops)
    peak = peak_tflops or peak_at(config)
    if mfu is not None:
        speedup = float8_speedup(config, float8(), notes) if config.precision == "fp8" and peak else 1.0
        return Gpus(device, peak, f"--mfu {mfu:.1%}", "stated", [mfu * speedup] * len(works))
    if device is None:
        missing = ", ".join(datasheet_gaps(config)) or "peak_fp32_tflops"
        notes.append(
            f"the GPUs are not timed: hardware={config.hardware.name} states no {missing} (--mfu to state one)"
        )
        return Gpus(None, peak, "no GPU described", "not described", [0.0] * len(works))
    notes.extend(float8_notes(config))
    shares = counts.utilisation(works, device)
    notes.extend(several_groups_notes(max(counts.several_groups.values(), default=0.0)))
    hardware, generation = config.hardware, device.generation
    fitted_on = ", ".join(generation.fitted_on)
    unfitted = f"; {generation.name} has no fit of its own" if generation.borrowed_from else ""
    fitted = f"{generation.borrowed_from or generation.name}'s shares (fitted on {fitted_on}{unfitted})"
    full = f" (its tensor cores' full rate {device.full_rate_flops / 1e12:g})" if device.full_rate_flops else ""
    described = (
        f"{hardware.gpu or hardware.name} from the datasheet: {peak:g} TFLOP/s at {config.precision}{full}, "
        f"{hardware.memory_gb_s:g} GB/s, {fitted}"
    )
    return Gpus(device, peak, described, basis_of(config, device), shares)


def beside_passes(
    config: TrainConfig,
    device: Device | None,
    optimizer: tuple[Operation, ...] | None,
    methods: tuple[MethodWork, ...],
    timeline: Timeline | None,
    notes: list[str],
) -> float:
    """A rank's step besides its passes: its optimizer's operations and its methods' work, each
    method's spread over the steps of its interval (on a budget, :func:`method_timeline`'s)."""
    if device is None:
        return 0.0
    seconds = optimizer_seconds(device, optimizer, notes)
    return seconds + methods_seconds(device, methods, method_timeline(config, timeline), notes)


def time_run(
    config: TrainConfig,
    task: Task,
    text: TextFacts | None,
    ranks: int,
    stated: tuple[float | None, float | None] = (None, None),
    case_shape: list[int] | None = None,
    traffic: Traffic | None = None,
    optimizer: tuple[Operation, ...] | None = None,
    methods: tuple[MethodWork, ...] = (),
    *,
    micro_batch: int,
    checkpointing: str = "none",
    eval_micro_batch: int,
) -> RunTime:
    """The run's phases and evaluations on ``ranks`` GPUs, each micro-batch's operations (``micro_batch``,
    ``checkpointing``: a rank's) timed on the datasheet (or at ``stated``: ``--mfu``, ``--peak-tflops``),
    with a rank's work beside its passes, its loaders, and ``traffic`` the compute does not hide."""
    base = base_work(config, text)
    read = phases_of(config, base)
    counts = FlopCounts(config, task, text, 2, micro_batch, checkpointing, eval_micro_batch)
    per_sample = counts.training([work for _, _, work in read])
    plain_sample = counts.counted_at(base.resolution, base.sequence_length)
    notes: list[str] = []
    timeline = planned_timeline(config, notes)
    works, float8 = [work for _, _, work in read] + [base], lambda: float8_share(config, text, plain_sample)
    *shares, plain_share = (gpus := gpus_of(config, counts, works, stated, float8, notes)).utilisations
    stepping = beside_passes(config, gpus.device, optimizer, methods, timeline, notes)
    threads = loader_threads(config, per_node := max(1, ranks // config.launcher.nnodes))
    traffic, phases = traffic or NO_TRAFFIC, []
    link = traffic.seconds(config)
    for (start, end, work), flops, share in zip(read, per_sample, shares, strict=True):
        total = step_flops(work, flops, config.train_batch_size)
        compute = gpus.compute_seconds(total, ranks, share) if share else None
        exposed = traffic.exposed(config, compute) if compute is not None else 0.0
        gpu = compute + stepping if compute is not None else None
        loader = loader_seconds(config, work, threads)
        phases.append(Phase(start, end, work.resolution, work.sequence_length, total, gpu, loader, link, exposed))
    timeline = timeline or budget_timeline(config, phases, notes)
    plain = plain_sample * config.train_batch_size
    evaluation = evaluation_flops(config, task, counts, base.resolution is not None, case_shape, notes)
    plain_compute = gpus.compute_seconds(plain, ranks, plain_share) if plain_share else None
    exposed = traffic.exposed(config, plain_compute) if plain_compute else 0.0
    step = plain_compute + stepping + exposed if plain_compute else None
    return RunTime(
        phases=phases,
        rate=gpus.described,
        rate_basis=gpus.basis,
        mfu=plain_share,
        peak_tflops=gpus.peak_tflops,
        loader=loader_in_words(config, read[0][2], threads, per_node) if threads and loader_timed(config) else None,
        steps=timeline.max_batches if timeline else None,
        step_flops=plain,
        step_seconds=step,
        eval_flops=evaluation[0],
        eval_gpu_seconds=counts.evaluation_seconds(*evaluation, gpus, ranks, plain_share),
        eval_loader_seconds=evaluation_loader_seconds(config, threads),
        eval_interval_steps=timeline.to_batches(config.eval_interval) if timeline else None,  # 0: epochs of no size
        notes=notes + loader_notes(config, threads),
    )
