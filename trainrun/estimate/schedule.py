"""A run's time along its schedule, for ``trainrun estimate``: the schedule read at the middle of
each fiftieth of the run, each method's change to a step's work there
(:meth:`~trainrun.core.engine.Algorithm.step_work`: a resolution, a sequence length, a share of
the pixels or samples, passes added), contiguous equal steps grouped into phases; each phase's
FLOPs counted on the model as the run builds it (:func:`trainrun.estimate.memory.pass_flops`), timed
on the GPUs at the rate row that fits with the optimizer's operations and the exchange the compute
does not hide (:mod:`trainrun.estimate.device`), and through the node's loaders
(:mod:`trainrun.estimate.loader`), the slower of the two being the phase's bottleneck;
evaluations at their resolution, interval and windows added. Written here because the schedule,
the methods and the rates are trainrun's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trainrun.algorithms import build_algorithms
from trainrun.core.time import Time, Timeline, TimeUnit
from trainrun.core.work import StepWork
from trainrun.data.interface import TextFacts
from trainrun.estimate.datasheets import GpuRate
from trainrun.estimate.device import (
    Roofline,
    Traffic,
    effective_throughput,
    exposed_seconds,
    float8_share,
    gpu_row,
    methods_seconds,
    optimizer_seconds,
)
from trainrun.estimate.loader import (
    crop_of,
    evaluation_loader_seconds,
    images_decoded,
    loader_in_words,
    loader_notes,
    loader_seconds,
    loader_threads,
    loader_timed,
)
from trainrun.schema import TrainConfig, budget_seconds
from trainrun.tasks.base import Task

if TYPE_CHECKING:
    from trainrun.estimate.memory import MethodWork

POINTS = 50  # the schedule is read at the middle of each fiftieth of the run
COUNTED_SIZES = 6  # more distinct sizes than this: FLOPs counted at three, fitted by a quadratic in the size
LINKS_NAMED = 0.1  # exchange the compute does not hide, as a share of it, that names the links the bottleneck


@dataclass
class Phase:
    """Consecutive steps of equal work: a share of the run, its step's FLOPs and time."""

    start: float  # fractions of the run's schedule
    end: float
    resolution: int | None
    sequence_length: int | None
    step_flops: float  # all ranks
    gpu_seconds: float | None  # a step on the GPUs at the rate row's utilisation
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
class Timing:
    """The run's phases, evaluation and rates, and where they came from."""

    phases: list[Phase]
    rate: str  # the GPU row used, in words
    rate_basis: str  # measured, calibrated, stated (--mfu) or unmeasured
    mfu: float  # the plain step's: the row's, moved by the roofline where the row has one
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


def timeline_of(config: TrainConfig, notes: list[str]) -> Timeline | None:
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


def bought_timeline(config: TrainConfig, phases: list[Phase], notes: list[str]) -> Timeline | None:
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


def interval_timeline(config: TrainConfig, timeline: Timeline | None) -> Timeline:
    """Where a method's interval becomes steps: the run's ``timeline``, else (a budget, whose length
    the rate decides) one of no planned length, on which ep, ba and sp convert and ``dur`` spans none."""
    return timeline or Timeline(batches_an_epoch(config), config.train_batch_size, max_batches=0)


def base_work(config: TrainConfig, text: TextFacts | None) -> StepWork:
    """A plain step's work at the run's shapes, before the methods change it."""
    side = config.data.resolution if images_decoded(config) else None
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


class FlopCounts:
    """FLOPs a sample of the run at each size a phase trains at, and the share of its GPU's peak a
    micro-batch reaches on the roofline there, each found once a size (fitted where there are many:
    a quadratic in the side or length is exact for FLOPs of convolutions and attention)."""

    def __init__(self, config: TrainConfig, task: Task, text: TextFacts | None, samples: int, micro_batch: int) -> None:
        self.config, self.task, self.text, self.samples, self.micro_batch = config, task, text, samples, micro_batch
        self.counted: dict[tuple, float] = {}
        self.rooflines: dict[tuple, float] = {}

    def sized(self, resolution: int | None, length: int | None) -> tuple[TrainConfig, TextFacts | None]:
        """The run's config and text at ``resolution`` or ``length`` (None: as the run sets it)."""
        config, text = self.config, self.text
        if resolution is not None:
            config = dataclasses.replace(config, data=dataclasses.replace(config.data, resolution=resolution))
        if length is not None:
            text = dataclasses.replace(text, max_seq_len=length)
        return config, text

    def counted_at(self, resolution: int | None, length: int | None, train: bool = True) -> float:
        from trainrun.estimate.memory import pass_flops

        key = (resolution, length, train)
        if key not in self.counted:
            config, text = self.sized(resolution, length)
            self.counted[key] = pass_flops(config, self.task, text, self.samples, train) / self.samples
        return self.counted[key]

    def roofline_at(self, resolution: int | None, length: int | None, roofline: Roofline) -> float:
        """The share of the peak a training micro-batch at ``resolution`` or ``length`` reaches on ``roofline``."""
        from trainrun.estimate.memory import pass_operations

        key = (resolution, length, roofline)
        if key not in self.rooflines:
            config, text = self.sized(resolution, length)
            self.rooflines[key] = roofline.utilisation(pass_operations(config, self.task, text, self.micro_batch))
        return self.rooflines[key]

    def training(self, works: list[StepWork]) -> list[float]:
        """Forward-and-backward FLOPs a sample for each of ``works``."""
        return self.by_size(works, self.counted_at)

    def roofline(self, works: list[StepWork], roofline: Roofline) -> list[float]:
        """The roofline's share of the peak for each of ``works``."""
        return self.by_size(works, lambda resolution, length: self.roofline_at(resolution, length, roofline))

    @staticmethod
    def by_size(works: list[StepWork], found: Callable[[int | None, int | None], float]) -> list[float]:
        """``found`` at each of ``works``' sizes, or at three of many and fitted by a quadratic in the size."""
        sizes = sorted(
            {(work.resolution, work.sequence_length) for work in works}, key=lambda size: size[0] or size[1] or 0
        )
        if len(sizes) <= COUNTED_SIZES:
            return [found(work.resolution, work.sequence_length) for work in works]
        ends = [sizes[0], sizes[len(sizes) // 2], sizes[-1]]
        side = 0 if sizes[0][0] is not None else 1
        fit = np.polyfit([size[side] for size in ends], [found(*size) for size in ends], 2)
        return [float(np.polyval(fit, (work.resolution, work.sequence_length)[side])) for work in works]


def step_flops(work: StepWork, per_sample: float, batch: int) -> float:
    """A step's FLOPs (all ranks) under ``work``: its trained samples forward and backward (again for a
    second pass), its scoring forwards at a third of that, at the share of pixels kept."""
    trained = work.trained_share * (1 + work.extra_passes)
    return batch * work.pixel_share * per_sample * (trained + work.scored_share / 3)


def samples_an_epoch(config: TrainConfig) -> int:
    """Training samples an epoch: the data's, or each volume's crops (``samples_per_volume``)."""
    repeats = config.data.segmentation.samples_per_volume if crop_of(config) else 1
    return config.data.samples[0] * repeats


def evaluation_flops(
    config: TrainConfig, task: Task, counts: FlopCounts, images: bool, case_shape: list[int] | None, notes: list[str]
) -> float:
    """One evaluation's FLOPs (all ranks): the validation samples forward at the evaluation's
    resolution, or each case's windows (segmentation); 0 where the validation set's size is not said."""
    if len(config.data.samples) < 2 and not config.data.text.val_tokens:
        notes.append("evaluation not counted: its size is not said (data.samples=[TRAIN,VAL])")
        return 0.0
    if hasattr(task, "windows_a_case"):
        if case_shape is None:
            notes.append("evaluation not counted: whole cases' windows need their shape (--case-shape D H W)")
            return 0.0
        return config.data.samples[1] * task.windows_a_case(case_shape) * counts.counted_at(None, None, train=False)
    if config.data.samples:
        side = config.data.eval_resolution if images else None
        return config.data.samples[1] * counts.counted_at(side, None, train=False)
    text = counts.text
    return config.data.text.val_tokens / text.max_seq_len * counts.counted_at(None, text.max_seq_len, train=False)


@dataclass(frozen=True)
class Gpus:
    """The run's GPUs as the estimate times them: the rate row that fits, in words, and what it gives."""

    flop_rate: float | None  # all ranks' FLOP/s (None: no peak said)
    row: str
    basis: str  # measured, calibrated, stated (--mfu) or unmeasured
    mfu: float
    peak_tflops: float | None
    reference: GpuRate | None = None  # the rate row, where one fits


def gpus_of(
    config: TrainConfig,
    ranks: int,
    mfu: float | None,
    peak_tflops: float | None,
    float8: Callable[[], float],
    notes: list[str],
) -> Gpus:
    """``ranks`` GPUs at the row that fits (or ``mfu``) of ``peak_tflops`` (default: the hardware's),
    with precision=fp8's ``float8()`` share of the FLOPs at the float8 peak."""
    utilisation, described, basis, row = gpu_row(config, mfu)
    peak = peak_tflops or config.hardware.peak_tflops
    flop_rate = ranks * peak * 1e12 * utilisation if peak else None
    if flop_rate and config.precision == "fp8":
        flop_rate = effective_throughput(config, flop_rate, float8(), notes)
    return Gpus(flop_rate, described, basis, utilisation, peak, row)


def roofline_slowdowns(counts: FlopCounts, works: list[StepWork], gpus: Gpus, notes: list[str]) -> list[float]:
    """For each of ``works`` (the plain step's last), how much slower than the row's utilisation the
    GPUs compute it: the share of the peak the row's shape reaches on the roofline of the GPU it was
    read on over the run's own there (smaller sides and micro-batches, memory-bound methods reach
    less); 1 where the row has no roofline. The row's GPU, not the run's: a sibling's other memory
    bandwidth moves a published run less than its roofline says (docs/estimate.md)."""
    row = gpus.reference
    if row is None or row.roofline is None or row.memory_gb_s is None or not gpus.peak_tflops:
        return [1.0] * len(works)
    roofline = Roofline(gpus.peak_tflops * 1e12, row.memory_gb_s, fused=row.compile)
    shares = counts.roofline(works, roofline)
    notes.append(
        f"on the roofline of the row's GPU ({gpus.peak_tflops:g} TFLOP/s, {row.memory_gb_s:g} GB/s) this run's "
        f"micro-batches of {counts.micro_batch} reach {min(shares):.1%}-{max(shares):.1%} of the peak where the "
        f"row's shape reaches {row.roofline:.1%}: its utilisation moves with it"
    )
    return [row.roofline / share for share in shares]


def beside_passes(
    config: TrainConfig,
    optimizer: tuple[tuple[float, float], ...] | None,
    methods: tuple[MethodWork, ...],
    flop_rate: float,
    timeline: Timeline | None,
    notes: list[str],
) -> float:
    """A rank's step besides its passes: its optimizer's operations and its methods' work, each
    method's spread over the steps of its interval (on a budget, :func:`interval_timeline`'s)."""
    seconds = optimizer_seconds(config, optimizer, flop_rate, notes)
    every = interval_timeline(config, timeline)
    return seconds + methods_seconds(methods, flop_rate, config.hardware.memory_gb_s, every, notes)


def timing(
    config: TrainConfig,
    task: Task,
    text: TextFacts | None,
    ranks: int,
    mfu: float | None,
    peak_tflops: float | None,
    case_shape: list[int] | None = None,
    traffic: Traffic | None = None,
    optimizer: tuple[tuple[float, float], ...] | None = None,
    methods: tuple[MethodWork, ...] = (),
    *,
    micro_batch: int,
) -> Timing:
    """The run's phases and evaluations on ``ranks`` GPUs of ``peak_tflops`` (default: the group's) at
    the row that fits, with each rank's work beside its passes, its loaders, and ``traffic`` at the
    links (what the compute does not hide); ``micro_batch``: a rank's, on the roofline."""
    base = base_work(config, text)
    read = phases_of(config, base)
    counts = FlopCounts(config, task, text, samples=2, micro_batch=micro_batch)
    per_sample = counts.training([work for _, _, work in read])
    plain_sample = counts.counted_at(base.resolution, base.sequence_length)
    notes: list[str] = []
    timeline = timeline_of(config, notes)
    gpus = gpus_of(config, ranks, mfu, peak_tflops, lambda: float8_share(config, text, plain_sample), notes)
    *slowdowns, plain_slowdown = roofline_slowdowns(counts, [work for _, _, work in read] + [base], gpus, notes)
    throughput = gpus.flop_rate
    stepping = beside_passes(config, optimizer, methods, throughput / ranks, timeline, notes) if throughput else 0.0
    per_node = max(1, ranks // config.launcher.nnodes)
    threads = loader_threads(config, per_node)
    link, hidden = (traffic.seconds(config), traffic.hidden_by) if traffic is not None else (0.0, 0.0)
    phases = []
    for (start, end, work), flops, slowdown in zip(read, per_sample, slowdowns, strict=True):
        total = step_flops(work, flops, config.train_batch_size)
        compute = total / throughput * slowdown if throughput else None
        exposed = exposed_seconds(link, hidden, compute) if compute is not None else 0.0
        gpu = compute + stepping if compute is not None else None
        loader = loader_seconds(config, work, threads)
        phases.append(Phase(start, end, work.resolution, work.sequence_length, total, gpu, loader, link, exposed))
    timeline = timeline or bought_timeline(config, phases, notes)
    plain = plain_sample * config.train_batch_size
    eval_flops = evaluation_flops(config, task, counts, base.resolution is not None, case_shape, notes)
    plain_compute = plain / throughput * plain_slowdown if throughput else None
    step = plain_compute + stepping + exposed_seconds(link, hidden, plain_compute) if plain_compute else None
    return Timing(
        phases=phases,
        rate=gpus.row,
        rate_basis=gpus.basis,
        mfu=gpus.mfu / plain_slowdown,
        peak_tflops=gpus.peak_tflops,
        loader=loader_in_words(config, read[0][2], threads, per_node) if threads and loader_timed(config) else None,
        steps=timeline.max_batches if timeline else None,
        step_flops=plain,
        step_seconds=step,
        eval_flops=eval_flops,
        eval_gpu_seconds=eval_flops / throughput if throughput else None,
        eval_loader_seconds=evaluation_loader_seconds(config, threads),
        eval_interval_steps=timeline.to_batches(config.eval_interval) if timeline else None,  # 0: epochs of no size
        notes=notes + loader_notes(config, threads),
    )


def target_steps(config: TrainConfig, steps: int | None, source: str) -> tuple[int | None, str | None]:
    """The steps to ``stop_at`` where known, and how: ``steps`` (from ``source``: ``--steps``, finished
    runs), else the recipe's ``target_samples``."""
    if steps is not None:
        return steps, source
    if config.target_samples is not None and config.stop_at is not None:  # the samples to stop_at
        return math.ceil(config.target_samples / config.train_batch_size), f"target_samples={config.target_samples:,}"
    return None, None


def as_dict(phase: Phase) -> dict[str, Any]:
    return dataclasses.asdict(phase) | {"bottleneck": phase.bottleneck, "seconds": phase.seconds}
