"""What a run needs at its real size, computed on this machine without allocating it (``trainrun
estimate``). Read top to bottom:

- :mod:`~trainrun.estimate.memory`: one rank of the run as fake tensors over a fake process group of
  ``launcher.devices x launcher.nnodes`` ranks, its memory at the peak of a step and of an evaluation
  micro-batch, its FLOPs;
- :mod:`~trainrun.estimate.operations`: every operation a step runs, with its FLOPs, bytes, kind and
  GEMM shape, attention as a GPU's fused kernel runs it;
- :mod:`~trainrun.estimate.device`: those operations timed on the GPU its hardware group's datasheet
  describes, at the shares its architecture generation's kernels reach (``generations.yaml``);
- :mod:`~trainrun.estimate.loader`: the node's loaders, by their operations' costs on its CPUs;
- :mod:`~trainrun.estimate.exchange`: what the GPUs exchange, as NCCL runs it, and what the compute hides;
- :mod:`~trainrun.estimate.counts`: a step's and an evaluation's FLOPs, and the share of the peak they reach;
- :mod:`~trainrun.estimate.schedule`: the run's phases along its schedule, evaluations and budgets;
- :mod:`~trainrun.estimate.datasheets`: what trainrun has measured (``readings.yaml``).

This module puts them together: the run's time to its target where the steps to it are known, its
cost, and where it does not fit, the largest setting that does, which is also what
``device_train_microbatch_size=auto`` takes under fsdp. Not counted: the CUDA context and the
allocator's fragmentation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from trainrun import kinds
from trainrun.core.microbatches import Microbatching
from trainrun.data.interface import TextFacts
from trainrun.errors import ConfigError
from trainrun.estimate.device import check_datasheet
from trainrun.estimate.exchange import Traffic, step_traffic
from trainrun.estimate.memory import Memory, RunShape, fake_world, measure
from trainrun.estimate.schedule import Phase, RunTime, time_run
from trainrun.schema import TrainConfig
from trainrun.tasks.base import Task, build_task

CHECKPOINTING_ORDER = ("none", "selective", "full")  # least recomputation first


@dataclass
class Estimate:
    """One rank's memory, a step's FLOPs and the run's time along its schedule, as :func:`estimate`
    computes them."""

    ranks: int
    nodes: int
    mesh: str  # how the ranks hold the model: whole copies, shards, or shards within a node
    micro_batch: int  # samples a forward/backward pass
    passes: int  # micro-batches a step, per rank
    eval_micro_batch: int
    activation_checkpointing: str
    vocab_size: int | None
    vocab_source: str
    real_token_share: float | None  # a masked language model's tokens among its positions
    held: dict[str, float]
    peak: dict[str, float]
    peak_gb: float
    eval_peak_gb: float
    step_flops: float  # a plain step at the run's full shapes, all ranks
    tokens_per_step: int | None  # samples x window for language models
    device_memory_gb: float | None
    peak_tflops: float | None
    mfu: float
    rate: str  # how the GPUs are timed, in words (their datasheet and generation, or the stated MFU)
    rate_basis: str  # measured, datasheet of a fitted or an unfitted generation, stated, not described
    loader: str | None  # the measured loader row, in words
    step_seconds: float | None  # a plain step on the GPUs at ``mfu``
    phases: list[dict[str, Any]]  # the schedule's phases: share, size, FLOPs, GPU and loader seconds, bottleneck
    eval_flops: float  # one evaluation, all ranks
    eval_seconds: float | None
    eval_gpu_seconds: float | None  # its forward passes on the GPUs
    eval_loader_seconds: float | None  # its samples through the node's loaders (None: not timed)
    evaluations: int | None  # to what ``time_to`` names
    schedule_steps: int | None  # to max_duration, or a budget's (None: epochs without data.samples, untimed)
    steps: int | None  # to what ``time_to`` names
    hours: float | None  # training and evaluation, to what ``time_to`` names
    cost: float | None
    fitting: str | None = None  # where the run as given does not fit: the largest setting that does
    notes: list[str] = field(default_factory=list)
    time_to: str = "schedule"  # target: the steps to it are known; schedule: max_duration's
    target_source: str | None = None  # how the steps to the target are known: --steps, target_samples
    stop_at: float | None = None  # the quality the run stops at, where it stops early
    short_of_target: int | None = None  # the target's steps, where max_duration ends the run before them

    @property
    def stops_before_the_schedule(self) -> bool:
        """The run stops at a target whose steps are not known here: ``hours`` and ``cost`` are the
        whole schedule's, an upper bound, never the run's."""
        return self.time_to == "schedule" and self.stop_at is not None and self.short_of_target is None

    @property
    def highest_gb(self) -> float:
        """The higher of the step's and the evaluation's peaks: what must fit."""
        return max(self.peak_gb, self.eval_peak_gb)

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory_gb is None else self.highest_gb <= self.device_memory_gb

    @property
    def bottlenecks(self) -> list[str]:
        """Each phase's bottleneck, in order, without repeats: what holds the run back, and when."""
        named = [phase["bottleneck"] for phase in self.phases if phase["bottleneck"]]
        return [name for index, name in enumerate(named) if index == 0 or named[index - 1] != name]

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``: where the run stops before its schedule ends, the schedule's time and cost
        are ``schedule_hours`` and ``schedule_cost``, and ``hours`` and ``cost`` (the run's) are null."""
        values = asdict(self) | {"fits": self.fits, "bottlenecks": self.bottlenecks}
        if self.stops_before_the_schedule:
            values |= {"hours": None, "cost": None, "schedule_hours": self.hours, "schedule_cost": self.cost}
        return values


def world_of(config: TrainConfig) -> tuple[int, int]:
    """(ranks, nodes): ``launcher.devices`` a node times its nodes (``auto``: one; the command sets it)."""
    devices = 1 if config.launcher.devices == "auto" else int(config.launcher.devices)
    return devices * config.launcher.nnodes, config.launcher.nnodes


def vocabulary(config: TrainConfig, vocab: int | None) -> tuple[int | None, str]:
    """The vocabulary the model is built over, and where it came from: ``vocab``, else the store at
    ``data.path``, else the tokenizer the model kind is published with (a language model's)."""
    if vocab is not None:
        return vocab, "--vocab"
    published = kinds.spec_of("model", config.model.name).published_vocab
    published = published(config) if callable(published) else published
    if published is None and kinds.task_spec(config.task.name).batches in ("token_windows", "masked_text"):
        return config.data.text.vocab_size, "data.text.vocab_size (a module of your own); --vocab to change"
    if published is None:  # not a language model
        return None, ""
    if config.data.path:
        from trainrun.data.token_store import TokenStore

        store = TokenStore.open(config.data.path, "train")
        return store.vocab_size, f"the token store at data.path ({config.data.path})"
    return published, f"model={config.model.name}'s published tokenizer; --vocab to change"


def real_tokens(config: TrainConfig, task: Task, given: float | None) -> tuple[float, str] | None:
    """A masked language model's share of real tokens among its positions, and where it came from:
    ``given``, else the store at ``data.path``, else every position (said); None for other tasks."""
    if not hasattr(task, "real_token_share"):
        return None
    if given is not None:
        return given, "--real-tokens"
    if config.data.path:
        return task.real_token_share(config), f"the store at data.path ({config.data.path})"
    return 1.0, "full windows assumed: --real-tokens, or data.path to read the store's"


def run_shape(config: TrainConfig, vocab: int | None, share: float = 1.0) -> RunShape:
    """The run's ranks and batches; ``auto`` micro-batches start at the whole per-rank batch, as ``auto`` does."""
    ranks, nodes = world_of(config)
    per_rank_batch = config.train_batch_size // ranks
    micro_batch = Microbatching.parse(config.device_train_microbatch_size).size or per_rank_batch
    vocab_size, source = vocabulary(config, vocab)
    text = TextFacts(vocab_size, config.data.text.max_seq_len, None, 0, real_token_share=share) if vocab_size else None
    eval_micro_batch = min(max(1, config.eval_batch_size // ranks), micro_batch)
    checkpointing = config.parallel.activation_checkpointing
    return RunShape(ranks, nodes, per_rank_batch, micro_batch, eval_micro_batch, text, source, checkpointing)


def fitting_shapes(shape: RunShape) -> Iterator[RunShape]:
    """What to try when a run does not fit, in the order ``auto`` and a user would: each smaller
    micro-batch (halving, as ``auto`` does), then at one sample each stronger activation checkpointing."""
    size = shape.micro_batch
    while size > 1:
        size //= 2
        yield dataclasses.replace(shape, micro_batch=size, eval_micro_batch=min(shape.eval_micro_batch, size))
    stronger = CHECKPOINTING_ORDER[CHECKPOINTING_ORDER.index(shape.checkpointing) + 1 :]
    for mode in stronger:
        yield dataclasses.replace(shape, micro_batch=1, eval_micro_batch=1, checkpointing=mode)


def sized_task(config: TrainConfig) -> Task:
    """The run's task, which must give the estimate a batch of its shapes."""
    task = build_task(config.task.name, config.data)
    if not hasattr(task, "example_batch"):
        raise ConfigError(f"bad value for 'task': trainrun estimate does not size task {config.task.name} yet")
    return task


HARDWARE_TO_COPY = "conf/hardware/8xh100_aws.yaml"  # a group that states every fact a step needs


def exchanged(config: TrainConfig, shape: RunShape, memory: Memory, notes: list[str]) -> Traffic | None:
    """What the run's GPUs exchange a step, where the hardware says its links (a note where it does
    not); None on one GPU."""
    if shape.ranks < 2:
        return None
    missing = hardware_gaps(config, shape)
    if missing:
        notes.append(f"the exchange between GPUs is not timed: hardware={config.hardware.name} states no {missing[0]}")
        return None
    return step_traffic(config, memory.held, shape.ranks, shape.nodes, shape.passes, memory.units)


def hardware_gaps(config: TrainConfig, shape: RunShape) -> list[str]:
    """The facts of ``hardware`` a step of this run needs that it does not state: its CPUs where its
    loader is timed, its links where GPUs exchange within a node, its network where nodes do."""
    from trainrun.estimate.loader import loader_timed

    hardware, per_node, loads = config.hardware, shape.ranks // shape.nodes, loader_timed(config)
    needed = [
        ("cpu_cores", loads), ("cpu_speed", loads), ("link_gb_s", per_node > 1), ("network_gbit_s", shape.nodes > 1),
    ]  # fmt: skip
    return [name for name, needs in needed if needs and getattr(hardware, name) is None]


def check_hardware(config: TrainConfig, shape: RunShape) -> None:
    """A hardware group that names its GPU (one trainrun times) states what a step of this run needs
    besides: its CPU cores (the loader), its links within a node and its network across nodes."""
    missing = hardware_gaps(config, shape)
    if config.hardware.gpu is not None and missing:
        raise ConfigError(
            f"bad value for 'hardware': {config.hardware.name} states no {', '.join(missing)}, which a step of this "
            f"run needs (set hardware.{missing[0]}=..., or start from {HARDWARE_TO_COPY})"
        )


def check_task_flags(
    config: TrainConfig, task: Task, case_shape: list[int] | None, real_token_share: float | None
) -> None:
    """``--case-shape`` is a segmentation run's, ``--real-tokens`` a masked language model's: given to
    another task, one line rather than a flag silently ignored."""
    if case_shape is not None and not hasattr(task, "windows_a_case"):
        raise ConfigError(
            f"bad value for '--case-shape': task={config.task.name} has no whole cases to window "
            "(it sizes segmentation's validation cases)"
        )
    if real_token_share is not None and not hasattr(task, "real_token_share"):
        raise ConfigError(
            f"bad value for '--real-tokens': task={config.task.name} pads no positions "
            "(it is the share of real tokens in a masked language model's windows)"
        )


def first_fitting(
    config: TrainConfig, shape: RunShape, task: Task, limit: float, whole: Memory
) -> tuple[RunShape, Memory] | tuple[None, None]:
    """The first of :func:`fitting_shapes` whose step and evaluation fit ``limit`` GB, and its memory.
    ``whole`` is ``shape``'s, which does not fit: what it holds between steps stays and the rest
    shrinks with the micro-batch, so the search starts at the largest halving that predicts to fit and
    walks to the first that does (one pass or two, not one a halving; the same answer while a smaller
    micro-batch needs no more memory)."""
    tried = list(fitting_shapes(shape))
    halvings = [candidate for candidate in tried if candidate.checkpointing == shape.checkpointing]
    held = sum(whole.held.values())
    predicted = [held + (whole.highest - held) * smaller.micro_batch / shape.micro_batch for smaller in halvings]
    start = next((index for index, peak in enumerate(predicted) if peak <= limit), len(halvings) - 1)
    memories: dict[int, Memory] = {}

    def fits(index: int) -> bool:
        memories[index] = measure(config, tried[index], task)
        return memories[index].highest <= limit

    if halvings and fits(start):
        while start > 0 and fits(start - 1):
            start -= 1
        return tried[start], memories[start]
    for index in range(start + 1 if halvings else 0, len(tried)):
        if fits(index):
            return tried[index], memories[index]
    return None, None


# dynamo off: a method that compiles parts of the model (fused_layers, BERT's layers) would have dynamo
# look at every frame of every call under the fake tensors, which run eager all the same (the same
# operations recorded; bert_large_lamb's estimate 49.5 s -> 31.4 s of CPU here)
@torch._dynamo.config.patch(disable=True)
def estimate(
    config: TrainConfig,
    vocab: int | None = None,
    mfu: float | None = None,
    peak_tflops: float | None = None,
    steps: int | None = None,
    case_shape: list[int] | None = None,
    real_token_share: float | None = None,
    steps_source: str = "--steps",
) -> Estimate:
    """One rank's memory at the peak of a training step and of an evaluation micro-batch, for
    ``config`` at its size, and the run's time along its schedule (:mod:`trainrun.estimate.schedule`)
    at the measured rate that fits (or ``mfu``) of the hardware group's peak (or ``peak_tflops``), to
    the target where its steps are known (``steps``, else the recipe's ``target_samples``), else to
    ``max_duration``. Under ``device_train_microbatch_size=auto`` the micro-batch is the largest that
    fits, as ``auto`` settles; a run that does not fit is told the largest setting that does."""
    task = sized_task(config)
    check_task_flags(config, task, case_shape, real_token_share)
    share = real_tokens(config, task, real_token_share)
    shape, limit = run_shape(config, vocab, share[0] if share else 1.0), config.hardware.device_memory_gb
    check_datasheet(config)
    check_hardware(config, shape)
    notes, fitting, auto = [], None, config.device_train_microbatch_size == "auto"
    if share is not None:
        notes.append(f"real tokens: {share[0]:.0%} of the positions ({share[1]})")
    if config.target_samples is not None and config.stop_at is None:
        notes.append(
            f"target_samples={config.target_samples} not used: the run sets no stop_at, it trains to max_duration"
        )
    if config.precision == "fp8":
        notes.append("precision=fp8's memory counted as bf16's (torchao's float8 layers keep bf16-sized activations)")
    with fake_world(shape.ranks):
        memory = measure(config, shape, task)
        if limit and memory.highest > limit:
            smaller, smaller_memory = first_fitting(config, shape, task, limit, memory)
            if smaller is not None and auto and smaller.checkpointing == shape.checkpointing:
                notes.append(f"device_train_microbatch_size=auto settles at {smaller.micro_batch} here")
                shape, memory = smaller, smaller_memory
            elif smaller is not None:
                fitting = f"micro-batches of {smaller.micro_batch}, activation checkpointing {smaller.checkpointing}"
        elif auto:
            notes.append("device_train_microbatch_size=auto keeps the whole per-rank batch here")
    traffic = exchanged(config, shape, memory, notes)
    run_time = time_run(
        config, task, shape.text, shape.ranks, (mfu, peak_tflops), case_shape, traffic, memory.optimizer,
        memory.methods, micro_batch=shape.micro_batch, checkpointing=shape.checkpointing,
        eval_micro_batch=shape.eval_micro_batch,
    )  # fmt: skip
    return assembled(config, shape, memory, run_time, fitting, notes, (steps, steps_source), share)


def auto_microbatch(config: TrainConfig, limit: float) -> int | None:
    """``device_train_microbatch_size=auto`` decided before a sharded run starts (where a pass retried
    after running out of memory would leave the other ranks in a gather): the largest micro-batch,
    halving from the per-rank batch as ``auto`` does, whose step and evaluation fit ``limit`` GB at
    the run's checkpointing; None if not even one sample does."""
    task, shape = sized_task(config), run_shape(config, None)
    with fake_world(shape.ranks):
        whole = measure(config, shape, task)
        if whole.highest <= limit:
            return shape.micro_batch
        smaller, _ = first_fitting(config, shape, task, limit, whole)
    return smaller.micro_batch if smaller is not None and smaller.checkpointing == shape.checkpointing else None


def mesh_name(config: TrainConfig, shape: RunShape) -> str:
    """How the run's ranks hold the model, in words."""
    if config.parallel.name != "fsdp":
        return "whole copies (ddp)"
    if shape.nodes > 1 and shape.ranks % shape.nodes == 0:
        return f"shards over {shape.ranks // shape.nodes} a node, replicated over {shape.nodes} nodes (HSDP)"
    return f"shards over {shape.ranks}"


def run_hours(run_time: RunTime, to_target: int | None) -> tuple[int | None, float | None, int | None]:
    """(steps, hours, evaluations) to the target where its steps are known, else to ``max_duration``;
    where the schedule's length is not known, the given steps at the plain step's time."""
    counted = to_target if to_target is not None else run_time.steps
    seconds = run_time.seconds_to(counted) if counted else None
    if seconds is None and counted and run_time.step_seconds:
        seconds = counted * run_time.step_seconds
    evaluations = run_time.evaluations_to(counted) if counted else None
    return counted, (seconds / 3600 if seconds else None), evaluations


def reachable_target(
    config: TrainConfig, run_time: RunTime, steps: tuple[int | None, str], notes: list[str]
) -> tuple[int | None, str | None, int | None]:
    """(steps, source) to the target where known and within the schedule, and the target's steps where
    ``max_duration`` (or what a budget buys) ends the run before them (said)."""
    to_target, source = target_steps(config, *steps)
    if not (to_target and run_time.steps and to_target > run_time.steps):
        return to_target, source, None
    aimed = config.stop_at is not None
    what = f"the target's {to_target:,} steps ({source})" if aimed else f"the {to_target:,} steps of {source}"
    end = f", before stop_at={config.stop_at:g} at the target's pace" if aimed else ""
    notes.append(f"{what} are past max_duration={config.max_duration}'s {run_time.steps:,}: the run ends there{end}")
    return None, None, to_target


def assembled(
    config: TrainConfig,
    shape: RunShape,
    memory: Memory,
    run_time: RunTime,
    fitting: str | None,
    notes: list[str],
    steps: tuple[int | None, str] = (None, "--steps"),
    share: tuple[float, str] | None = None,
) -> Estimate:
    """The estimate with the run's time to the target where its steps are known, else to
    ``max_duration``, and its cost at the hardware's price for every node."""
    hardware = config.hardware
    to_target, target_source, short_of_target = reachable_target(config, run_time, steps, notes)
    counted, hours, evaluations = run_hours(run_time, to_target)
    cost = hours * hardware.price_per_hour * config.launcher.nnodes if hours and hardware.price_per_hour else None
    text = shape.text
    return Estimate(
        ranks=shape.ranks,
        nodes=shape.nodes,
        mesh=mesh_name(config, shape),
        micro_batch=shape.micro_batch,
        passes=shape.passes,
        eval_micro_batch=shape.eval_micro_batch,
        activation_checkpointing=shape.checkpointing,
        vocab_size=text.vocab_size if text else None,
        vocab_source=shape.vocab_source,
        real_token_share=share[0] if share else None,
        held=memory.held,
        peak=memory.peak,
        peak_gb=memory.peak["total"],
        eval_peak_gb=round(memory.eval_peak, 3),
        step_flops=run_time.step_flops,
        tokens_per_step=config.train_batch_size * text.max_seq_len if text else None,
        device_memory_gb=hardware.device_memory_gb,
        peak_tflops=run_time.peak_tflops,
        mfu=run_time.mfu,
        rate=run_time.rate,
        rate_basis=run_time.rate_basis,
        loader=run_time.loader,
        step_seconds=run_time.step_seconds,
        phases=[phase_dict(phase) for phase in run_time.phases],
        eval_flops=run_time.eval_flops,
        eval_seconds=run_time.eval_seconds,
        eval_gpu_seconds=run_time.eval_gpu_seconds,
        eval_loader_seconds=run_time.eval_loader_seconds,
        evaluations=evaluations,
        schedule_steps=run_time.steps,
        steps=counted,
        hours=hours,
        cost=cost,
        fitting=fitting,
        notes=notes + run_time.notes,
        time_to="target" if to_target is not None else "schedule",
        target_source=target_source,
        stop_at=config.stop_at,
        short_of_target=short_of_target,
    )


def target_steps(config: TrainConfig, steps: int | None, source: str) -> tuple[int | None, str | None]:
    """The steps to ``stop_at`` where known, and how: ``steps`` (from ``source``: ``--steps``, finished
    runs), else the recipe's ``target_samples``."""
    if steps is not None:
        return steps, source
    if config.target_samples is not None and config.stop_at is not None:  # the samples to stop_at
        return math.ceil(config.target_samples / config.train_batch_size), f"target_samples={config.target_samples:,}"
    return None, None


def phase_dict(phase: Phase) -> dict[str, Any]:
    return dataclasses.asdict(phase) | {"bottleneck": phase.bottleneck, "seconds": phase.seconds}
