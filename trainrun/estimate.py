"""What a run needs at its real size, computed on this machine without allocating it
(``trainrun estimate``): one rank of the run as fake tensors over a fake process group of
``launcher.devices x launcher.nnodes`` ranks (:mod:`trainrun.fake_rank`), its memory at the peak
of a step and of an evaluation micro-batch, and its step's time at a stated MFU of the hardware
group's peak; where it does not fit, the largest setting that does, which is also what
``device_train_microbatch_size=auto`` takes under fsdp. Not counted: the CUDA context and the
allocator's fragmentation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from trainrun import kinds
from trainrun.core.microbatches import Microbatching
from trainrun.core.time import Time, TimeUnit
from trainrun.data.interface import TextFacts
from trainrun.errors import ConfigError
from trainrun.fake_rank import Memory, RunShape, fake_world, measure
from trainrun.schema import TrainConfig
from trainrun.tasks.base import Task, build_task

CHECKPOINTING_ORDER = ("none", "selective", "full")  # least recomputation first


@dataclass
class Estimate:
    """One rank's memory and one step's time for a run, as :func:`estimate` computes them."""

    ranks: int
    nodes: int
    mesh: str  # how the ranks hold the model: whole copies, shards, or shards within a node
    micro_batch: int  # samples a forward/backward pass
    passes: int  # micro-batches a step, per rank
    eval_micro_batch: int
    activation_checkpointing: str
    vocab_size: int | None
    vocab_source: str
    held: dict[str, float]
    peak: dict[str, float]
    peak_gb: float
    eval_peak_gb: float
    step_flops: float
    tokens_per_step: int | None  # samples x window for language models
    device_memory_gb: float | None
    peak_tflops: float | None
    mfu: float
    step_seconds: float | None
    steps: int | None  # to what ``time_to`` names (None: max_duration in epochs, whose length needs the data)
    hours: float | None
    cost: float | None
    fitting: str | None = None  # where the run as given does not fit: the largest setting that does
    notes: list[str] = field(default_factory=list)
    time_to: str = "schedule"  # target: the steps to it were given; schedule: max_duration's
    stop_at: float | None = None  # the quality the run stops at, where it stops early

    @property
    def stops_before_the_schedule(self) -> bool:
        """The run stops at a target whose steps are not known here: ``hours`` and ``cost`` are the
        whole schedule's, an upper bound, never the run's."""
        return self.time_to == "schedule" and self.stop_at is not None

    @property
    def highest_gb(self) -> float:
        """The higher of the step's and the evaluation's peaks: what must fit."""
        return max(self.peak_gb, self.eval_peak_gb)

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory_gb is None else self.highest_gb <= self.device_memory_gb

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``: where the run stops before its schedule ends, the schedule's time and cost
        are ``schedule_hours`` and ``schedule_cost``, and ``hours`` and ``cost`` (the run's) are null."""
        values = asdict(self) | {"fits": self.fits}
        if self.stops_before_the_schedule:
            values |= {"hours": None, "cost": None, "schedule_hours": self.hours, "schedule_cost": self.cost}
        return values


def world_of(config: TrainConfig) -> tuple[int, int]:
    """(ranks, nodes) the run trains on: ``launcher.devices`` a node (``auto``: one) times its nodes."""
    devices = 1 if config.launcher.devices == "auto" else int(config.launcher.devices)
    return devices * config.launcher.nnodes, config.launcher.nnodes


def vocabulary(config: TrainConfig, vocab: int | None) -> tuple[int | None, str]:
    """The vocabulary the model is built over, and where it came from: ``vocab``, else the store at
    ``data.path``, else the tokenizer the model kind is published with (a language model's)."""
    if vocab is not None:
        return vocab, "--vocab"
    published = kinds.spec_of("model", config.model.name).published_vocab
    if published is None:  # not a language model
        return None, ""
    if config.data.path:
        from trainrun.data.token_store import TokenStore

        store = TokenStore.open(config.data.path, "train")
        return store.vocab_size, f"the token store at data.path ({config.data.path})"
    return published, f"model={config.model.name}'s published tokenizer; --vocab to change"


def run_shape(config: TrainConfig, vocab: int | None) -> RunShape:
    """The run's ranks and batches; ``auto`` micro-batches start at the whole per-rank batch, as ``auto`` does."""
    ranks, nodes = world_of(config)
    per_rank_batch = config.train_batch_size // ranks
    micro_batch = Microbatching.parse(config.device_train_microbatch_size).size or per_rank_batch
    vocab_size, source = vocabulary(config, vocab)
    text = TextFacts(vocab_size, config.data.text.max_seq_len, None, 0) if vocab_size is not None else None
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


def first_fitting(
    config: TrainConfig, shape: RunShape, task: Task, limit: float
) -> tuple[RunShape, Memory] | tuple[None, None]:
    """The first of :func:`fitting_shapes` whose step and evaluation fit ``limit`` GB, and its memory."""
    for smaller in fitting_shapes(shape):
        memory = measure(config, smaller, task)
        if memory.highest <= limit:
            return smaller, memory
    return None, None


def estimate(
    config: TrainConfig,
    vocab: int | None = None,
    mfu: float = 0.4,
    peak_tflops: float | None = None,
    steps: int | None = None,
) -> Estimate:
    """One rank's memory at the peak of a training step and of an evaluation micro-batch, and the
    step's time at ``mfu`` of the hardware group's peak (or ``peak_tflops``), for ``config`` at its
    size, and the run's to ``steps`` (default: to ``max_duration``). Under
    ``device_train_microbatch_size=auto`` the micro-batch is the largest that fits, as ``auto``
    settles; a run that does not fit is told the largest setting that does."""
    task = sized_task(config)
    shape, limit = run_shape(config, vocab), config.hardware.device_memory_gb
    notes, fitting, auto = [], None, config.device_train_microbatch_size == "auto"
    if config.precision == "fp8":
        notes.append("precision=fp8 counted as bf16 (torchao's float8 layers keep bf16-sized activations or less)")
    with fake_world(shape.ranks):
        memory = measure(config, shape, task)
        if limit and memory.highest > limit:
            smaller, smaller_memory = first_fitting(config, shape, task, limit)
            if smaller is not None and auto and smaller.checkpointing == shape.checkpointing:
                notes.append(f"device_train_microbatch_size=auto settles at {smaller.micro_batch} here")
                shape, memory = smaller, smaller_memory
            elif smaller is not None:
                fitting = f"micro-batches of {smaller.micro_batch}, activation checkpointing {smaller.checkpointing}"
        elif auto:
            notes.append("device_train_microbatch_size=auto keeps the whole per-rank batch here")
    return timed(config, shape, memory, mfu, peak_tflops, fitting, notes, steps)


def auto_microbatch(config: TrainConfig, limit: float) -> int | None:
    """``device_train_microbatch_size=auto`` decided before a sharded run starts (where a pass retried
    after running out of memory would leave the other ranks in a gather): the largest micro-batch,
    halving from the per-rank batch as ``auto`` does, whose step and evaluation fit ``limit`` GB at
    the run's checkpointing; None if not even one sample does."""
    task, shape = sized_task(config), run_shape(config, None)
    halved = [smaller for smaller in fitting_shapes(shape) if smaller.checkpointing == shape.checkpointing]
    candidates = [shape, *halved]
    with fake_world(shape.ranks):
        for candidate in candidates:
            if measure(config, candidate, task).highest <= limit:
                return candidate.micro_batch
    return None


def mesh_name(config: TrainConfig, shape: RunShape) -> str:
    """How the run's ranks hold the model, in words."""
    if config.parallel.name != "fsdp":
        return "whole copies (ddp)"
    if shape.nodes > 1 and shape.ranks % shape.nodes == 0:
        return f"shards over {shape.ranks // shape.nodes} a node, replicated over {shape.nodes} nodes (HSDP)"
    return f"shards over {shape.ranks}"


def steps_to_the_end(config: TrainConfig) -> int | None:
    """The run's steps to ``max_duration`` where it says them: in steps or samples (epochs need the data)."""
    duration = Time.parse(config.max_duration)
    if duration.unit is TimeUnit.BATCH:
        return int(duration.value)
    if duration.unit is TimeUnit.SAMPLE:
        return math.ceil(duration.value / config.train_batch_size)
    return None


def timed(
    config: TrainConfig,
    shape: RunShape,
    memory: Memory,
    mfu: float,
    peak_tflops: float | None,
    fitting: str | None,
    notes: list[str],
    steps: int | None = None,
) -> Estimate:
    """The estimate with the step's time at ``mfu``, and the run's to ``steps`` (default: to
    ``max_duration``, where it is in steps or samples) and its cost."""
    hardware = config.hardware
    peak_tflops = peak_tflops or hardware.peak_tflops
    step_seconds = memory.step_flops / (shape.ranks * peak_tflops * 1e12 * mfu) if peak_tflops else None
    time_to = "target" if steps is not None else "schedule"
    steps = steps if steps is not None else steps_to_the_end(config)
    hours = steps * step_seconds / 3600 if steps and step_seconds else None
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
        held=memory.held,
        peak=memory.peak,
        peak_gb=memory.peak["total"],
        eval_peak_gb=round(memory.eval_peak, 3),
        step_flops=memory.step_flops,
        tokens_per_step=config.train_batch_size * text.max_seq_len if text else None,
        device_memory_gb=hardware.device_memory_gb,
        peak_tflops=peak_tflops,
        mfu=mfu,
        step_seconds=step_seconds,
        steps=steps,
        hours=hours,
        cost=cost,
        fitting=fitting,
        notes=notes,
        time_to=time_to,
        stop_at=config.stop_at,
    )
