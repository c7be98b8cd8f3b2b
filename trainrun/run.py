"""Build a run's components from a validated config and train them in one process (one rank).

:func:`train` reads top to bottom: join the process group, build data, model and timeline, the
loggers, the state, the trainer; resume; say what will run; fit. Each step is a named builder here.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from trainrun import kinds, run_files
from trainrun.algorithms import build_algorithms
from trainrun.algorithms.specs import SPECS
from trainrun.atomic_io import atomic_write_text
from trainrun.core import checkpoint, distributed, heartbeat, host_memory, parallel, preemption
from trainrun.core.accounts import CudaEventClock, TimeAccounts
from trainrun.core.budget import WallClockBudget
from trainrun.core.distributed import Placement
from trainrun.core.engine import Callback, Engine
from trainrun.core.microbatches import Microbatching
from trainrun.core.precision import Precision, resolve_precision
from trainrun.core.preemption import PreemptionSignal
from trainrun.core.seeding import seed_everything
from trainrun.core.state import State
from trainrun.core.time import Time, Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data.build import DataSpec, build_data
from trainrun.data.interface import TextFacts
from trainrun.errors import RunPreempted
from trainrun.kinds import Capability
from trainrun.loggers.console import ConsoleLogger
from trainrun.loggers.step_times import StepTimeLogger
from trainrun.loggers.time_to_quality import TimeToQualityLogger
from trainrun.models.build import build_model
from trainrun.optim.optimizers import build_optimizer
from trainrun.optim.schedules import build_scheduler, warmup_batches
from trainrun.provenance import provenance
from trainrun.registry import builder
from trainrun.schema import TrainConfig, budget_seconds
from trainrun.tasks.base import Task, build_task


def train(config: TrainConfig, run_dir: Path, config_yaml: str) -> State:
    """Train ``config``; rank 0 writes config.yaml, metrics.jsonl, summary.json and checkpoints.

    A scheduler's notice (core/preemption.py) is listened for from the start to the end: one that
    comes while the run is set up (a long build or a resume) stops it at its first loss check, and
    one that comes while rank 0 waits on its requeue is ignored; neither ends the rank as SIGUSR1's
    default would.
    """
    notice = PreemptionSignal()
    notice.listen()
    try:
        return train_listening(config, run_dir, config_yaml, notice)
    finally:
        notice.stop_listening()


def train_listening(config: TrainConfig, run_dir: Path, config_yaml: str, notice: PreemptionSignal) -> State:
    """:func:`train` once ``notice`` listens."""
    if config.host_memory == "reuse":
        host_memory.reuse_freed_memory()
    placement, device = distributed.join(config.device, config.deterministic, config.launcher.timeout_minutes)
    replicas = replica_groups(config, placement, device)
    lost = functools.partial(heartbeat.end_this_rank, requeue=config.launcher.requeue)
    nodes = heartbeat.start(config.launcher.node_timeout, on_lost=lost)
    console = Console(stderr=False, quiet=not placement.is_main)
    precision = build_precision(config.precision, device, config.compile, console)
    data = build_data(config.data, config.train_batch_size, config.eval_batch_size, config.seed, placement, device)
    model = build_seeded_model(config, data)
    timeline, budget = plan_timeline(config, data)
    task = build_task(config.task.name, config.data)
    stop_after = timeline.to_batches(config.profile_prefix) if config.profile_prefix else None
    logs = RunLogs.build(config, run_dir, task, model, placement, device, console, stop_after, budget)
    state = build_state(config, model, data, task, timeline, precision, placement, device)
    warn_about_the_schedule(config, state, budget)
    settings = trainer_settings(config, run_dir, stop_after, budget, notice, replicas)
    engine = Engine(build_algorithms(config.algorithms), logs.callbacks)
    trainer = Trainer(state, optimization(config, timeline), engine, settings)
    offset = resume(config, trainer, logs, console)
    if placement.is_main:
        atomic_write_text(run_dir / run_files.CONFIG, config_yaml)
    print_banner(config, run_dir, state, task, console, budget)
    ended = False  # without an error: the heartbeat then says this node is done, not lost
    try:
        trainer.fit(offset)
        if trainer.replicas is not None:
            trainer.replicas.ended()
        finished = state.stop_reason != preemption.STATUS
        if finished and config.export and config.checkpoint.save_final and config.profile_prefix is None:
            export(config, state, engine, task, run_dir, console)
        ended = True
    except BaseException as error:
        logs.record_failure(state, error)
        if distributed.lost_a_peer(error):
            heartbeat.await_verdict(config.launcher.node_timeout)
        raise
    finally:
        if nodes is not None:
            nodes.stop(ended)
        if trainer.replicas is not None:
            trainer.replicas.shutdown()
        state.model = distributed.unwrapped(state.model)
        distributed.leave()
    if not finished:
        stopped_for_the_scheduler(config, state, placement.rank)
    return state


def replica_groups(config: TrainConfig, placement: Placement, device: torch.device) -> Any:
    """Under ``launcher.fault_tolerance=replicas``, this rank's place among the nodes (torchft, an
    optional extra, imported only then); None otherwise."""
    if config.launcher.fault_tolerance != "replicas":
        return None
    from trainrun.core.replicas import Replicas

    settings = config.launcher
    shrink = settings.replica_batch == "shrink"
    return Replicas(placement, device, settings.node_timeout, settings.rendezvous_timeout, settings.requeue, shrink)


def stopped_for_the_scheduler(config: TrainConfig, state: State, rank: int) -> None:
    """A run stopped by a scheduler's notice: rank 0 requeues its Slurm job (``launcher.requeue``);
    one line saying so, and :data:`~trainrun.core.preemption.EXIT_CODE`."""
    requeued = preemption.requeue_slurm_job() if rank == 0 and config.launcher.requeue else None
    raise RunPreempted(
        f"stopped at step {state.batch} by {preemption.SIGNAL.name} (a scheduler's notice), its checkpoint written"
        f"{'; ' + requeued if requeued else '; resume=auto continues it'}"
    )


def export(config: TrainConfig, state: State, engine: Engine, task: Task, run_dir: Path, console: Console) -> None:
    """Rank 0 writes what the task exports of the weights the final evaluation scored; a sharded
    model is gathered whole to rank 0 for it first (every rank takes part)."""
    sharded = parallel.is_sharded(state.raw_model)
    with engine.evaluated_model(state):
        whole = parallel.whole_state(state.raw_model) if sharded else None
        if state.is_main and not sharded:
            write_export(task, state, run_dir, console)
    if state.is_main and sharded:
        with swapped_model(state, config, whole):
            write_export(task, state, run_dir, console)


def write_export(task: Task, state: State, run_dir: Path, console: Console) -> None:
    for line in task.export(state, run_dir):
        console.print(line, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def swapped_model(state: State, config: TrainConfig, weights: dict[str, torch.Tensor]):
    """``state.model`` replaced, for the block, by the run's model on the host holding ``weights``."""
    model, state.model = state.model, model_holding(config, state.data.text, weights)
    try:
        yield
    finally:
        state.model = model


def model_holding(config: TrainConfig, text: TextFacts | None, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The run's model, as its methods left its structure, on the host holding ``weights`` (a whole
    state dict); a model that can is built on the meta device and set from them (no initial values
    drawn: for an 8B Llama, 8e9 of them)."""
    meta_init = Capability.META_INIT in kinds.offers(config)
    with torch.device("meta") if meta_init else contextlib.nullcontext():
        model = build_model(config.model, text)
    for method in build_algorithms(config.algorithms):
        method.rebuild(model)
    if meta_init:
        model.to_empty(device="cpu")
        model.initialise(weights)
    else:
        model.load_state_dict(weights)
    return model


def build_precision(name: str, device: torch.device, compiled: bool, console: Console) -> Precision:
    """The precision ``name`` asks for as this device runs it, with a note where it differs or is slow."""
    precision, notes = resolve_precision(name, device, compiled)
    for note in notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    return precision


def build_seeded_model(config: TrainConfig, data: DataSpec) -> torch.nn.Module:
    """The model with the same initial weights on every rank (and the same surgery at INIT); each
    training step then seeds its rank's draws (:func:`~trainrun.core.seeding.seed_step`). Where the
    run shards it, a model that can is built on the meta device (the trainer materialises each
    rank's shards): no rank holds it whole."""
    seed_everything(config.seed)
    on_meta = Capability.META_INIT in kinds.offers(config) and parallel.shards(parallelism(config))
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        return build_model(config.model, data.text)


def parallelism(config: TrainConfig) -> parallel.Parallelism:
    """How the run's ranks share its model, as the trainer reads it."""
    settings = config.parallel
    return parallel.Parallelism(
        settings.name,
        settings.reshard_after_forward,
        settings.activation_checkpointing,
        settings.checkpoint_every,
        settings.selective_products,
    )


def plan_timeline(config: TrainConfig, data: DataSpec) -> tuple[Timeline, WallClockBudget | None]:
    """The run's timeline, and the budget that re-plans it when ``max_duration`` is wall-clock or money."""
    max_duration, stretch = Time.parse(config.max_duration), config.scale_schedule_ratio
    if not max_duration.unit.is_budget:
        return Timeline.for_run(max_duration, data.batches_per_epoch, config.train_batch_size, stretch), None
    budget = WallClockBudget(budget_seconds(config), config.max_duration)
    return Timeline.for_budget(data.batches_per_epoch, config.train_batch_size, stretch), budget


def optimization(config: TrainConfig, timeline: Timeline):
    """What the trainer calls with the final model (after surgery) to get its optimizer and schedule."""

    def build(final_model: torch.nn.Module):
        optimizer = build_optimizer(final_model, config.optimizer, config.train_batch_size, timeline)
        return optimizer, build_scheduler(optimizer, config.scheduler, timeline)

    return build


@dataclass
class RunLogs:
    """Rank 0's files and console: time to quality, step times, the live console, extra loggers."""

    quality: TimeToQualityLogger
    steps: StepTimeLogger
    callbacks: list[Callback]
    rank: int

    @classmethod
    def build(
        cls,
        config: TrainConfig,
        run_dir: Path,
        task: Task,
        model: torch.nn.Module,
        placement: Placement,
        device: torch.device,
        console: Console,
        stop_after: int | None,
        budget: WallClockBudget | None,
    ) -> RunLogs:
        rank = placement.data_rank  # the run's: under fault_tolerance=replicas, node 0's first rank is 0
        quality = TimeToQualityLogger(
            run_dir,
            task,
            config.quality_targets,
            profile_prefix=stop_after,
            varying_cost=[name for name in config.algorithms if SPECS[name].varying_step_cost],
            provenance=provenance(device, placement.data_ranks, model, placement.replicas) if rank == 0 else None,
            budget_seconds=budget.seconds if budget else None,
        )
        steps = StepTimeLogger(run_dir, config.log_interval)
        callbacks: list[Callback] = []
        if rank == 0:  # the console last: it shows the notices the others add at the same event
            extra = [builder("logger", name)(run_dir, config) for name in config.loggers]
            callbacks = [quality, steps, *extra, ConsoleLogger(quality, live=config.progress, console=console)]
        return cls(quality, steps, callbacks, rank)

    def resume_from(self, batch: int) -> None:
        if self.rank == 0:
            self.quality.resume_from(batch)
            self.steps.resume_from(batch)

    def record_failure(self, state: State, error: BaseException) -> None:
        """summary.json says how the run ended (rank 0), without hiding ``error`` behind a write error."""
        if self.rank == 0:
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            with contextlib.suppress(OSError):  # a full disk must not hide the error that ended the run
                self.quality.write_summary(state, status, str(error) or type(error).__name__)
            for callback in self.callbacks:
                with contextlib.suppress(Exception):  # nor a tracker that cannot be reached
                    callback.run_failed(state, error)


def build_state(
    config: TrainConfig,
    model: torch.nn.Module,
    data: DataSpec,
    task: Task,
    timeline: Timeline,
    precision: Precision,
    placement: Placement,
    device: torch.device,
) -> State:
    """The state the trainer starts from (no optimizer yet: it is built after model surgery)."""
    clock = CudaEventClock() if device.type == "cuda" else None
    return State(
        model=model,
        optimizer=None,
        timeline=timeline,
        device=device,
        precision=precision,
        rank=placement.rank,
        world_size=placement.world_size,
        replica=placement.replica,
        replicas=placement.replicas,
        loss_fn=task.loss(config.loss),
        task=task,
        data=data,
        num_classes=config.model.num_classes,
        train_resolution=config.data.resolution,
        accounts=TimeAccounts(clock, record_steps=placement.is_main),
    )


def warn_about_the_schedule(config: TrainConfig, state: State, budget: WallClockBudget | None) -> None:
    """A warmup longer than the whole run never reaches the learning rate the user set."""
    warmup = warmup_batches(config.scheduler, state.timeline)
    if budget is None and warmup > state.timeline.max_batches:
        state.warn(
            f"scheduler.t_warmup={config.scheduler.t_warmup} ({warmup} steps) is longer than the whole run "
            f"(max_duration={config.max_duration}, {state.timeline.max_batches} steps): the learning rate never "
            f"reaches optimizer.lr"
        )


def trainer_settings(
    config: TrainConfig,
    run_dir: Path,
    stop_after: int | None,
    budget: WallClockBudget | None,
    notice: PreemptionSignal,
    replicas: Any = None,
) -> TrainerSettings:
    return TrainerSettings(
        eval_interval=config.eval_interval,
        log_interval=config.log_interval,
        checkpoint_dir=checkpoint.directory(run_dir),
        checkpoint_interval=config.checkpoint.interval,
        checkpoint_keep=config.checkpoint.keep,
        checkpoint_final=config.checkpoint.save_final,
        compile=config.compile,
        seed=config.seed,
        stop_after=stop_after,
        stop_at=config.stop_at,
        microbatching=Microbatching.parse(config.device_train_microbatch_size),
        budget=budget,
        parallel=parallelism(config),
        async_checkpoints=config.checkpoint.async_save,
        preemption=notice,
        replicas=replicas,
    )


def resume(config: TrainConfig, trainer: Trainer, logs: RunLogs, console: Console) -> dict[str, Any] | None:
    """Load the checkpoint ``resume`` names, if any; the time accounts to go on from. With
    ``resume=auto`` and no checkpoint yet the run starts over, and so do its records."""
    resume_path = checkpoint.resolve_resume(config.resume, trainer.settings.checkpoint_dir)
    if resume_path is None:
        if config.resume is not None:
            logs.resume_from(0)
        return None
    offset = trainer.load_checkpoint(resume_path)
    state = trainer.state
    if trainer.replicas is not None:
        trainer.replicas.start_at(state.batch)
    logs.resume_from(state.batch)
    console.print(f"resumed from {resume_path} at epoch {state.epoch}, batch {state.batch}")
    return offset


def print_banner(
    config: TrainConfig, run_dir: Path, state: State, task: Task, console: Console, budget: WallClockBudget | None
) -> None:
    """One line saying what will run where, and what the task wants the user to know."""
    length = (
        f"{budget.seconds:.0f} s of training ({config.max_duration})"
        if budget
        else f"{state.timeline.max_batches} steps"
    )
    console.print(
        f"run dir {run_dir} | {config.model.name} on {config.data.name} ({config.data.loader}) | "
        f"{state.device} {config.precision} | {state.data_ranks} rank(s)"
        f"{f' on {state.replicas} replica nodes' if state.replicas > 1 else ''} | "
        f"{length} of {config.train_batch_size}",
        highlight=False,
        soft_wrap=True,
    )
    for line in task.startup_notes(state):
        console.print(line, highlight=False, soft_wrap=True)
