"""Build a run's components from a validated config and train them in one process (one rank)."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from trainrun.algorithms import build_algorithms
from trainrun.core import checkpoint, distributed
from trainrun.core.accounts import CudaEventClock, TimeAccounts
from trainrun.core.budget import WallClockBudget
from trainrun.core.engine import Engine
from trainrun.core.microbatches import Microbatching
from trainrun.core.precision import resolve_precision
from trainrun.core.state import State
from trainrun.core.time import Time, Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data import build_data
from trainrun.files import atomic_write_text
from trainrun.loggers.console import ConsoleLogger
from trainrun.loggers.steps import StepTimeLogger
from trainrun.loggers.time_to_accuracy import TimeToAccuracyLogger
from trainrun.models import build_model
from trainrun.optim.optimizers import build_optimizer
from trainrun.optim.schedules import build_scheduler, warmup_batches
from trainrun.provenance import provenance
from trainrun.schema import VARYING_STEP_COST_ALGORITHMS, TrainConfig, budget_seconds
from trainrun.tasks import build_task


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(config: TrainConfig, run_dir: Path, config_yaml: str) -> State:
    """Train ``config``; rank 0 writes config.yaml, metrics.jsonl, summary.json and checkpoints."""
    placement, device = distributed.join(config.device, config.deterministic, config.launcher.timeout_minutes)
    rank, world_size = placement.rank, placement.world_size
    console = Console(stderr=False, quiet=rank != 0)
    precision, notes = resolve_precision(config.precision, device)
    for note in notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)

    data = build_data(config.data, config.train_batch_size, config.eval_batch_size, config.seed, placement, device)
    seed_everything(config.seed)
    model = build_model(config.model, data.vocab_size)
    seed_everything(config.seed + rank)  # same initial weights; each rank its own dropout, mixing, ...
    max_duration = Time.parse(config.max_duration).scaled(config.scale_schedule_ratio)
    budget = None
    if max_duration.unit.is_budget:
        budget = WallClockBudget(budget_seconds(config), config.max_duration)
        timeline = Timeline.for_budget(data.batches_per_epoch, config.train_batch_size)
    else:
        timeline = Timeline.for_run(max_duration, data.batches_per_epoch, config.train_batch_size)

    def optimization(final_model: torch.nn.Module):
        optimizer = build_optimizer(final_model, config.optimizer, config.train_batch_size)
        return optimizer, build_scheduler(optimizer, config.scheduler, timeline, config.scale_schedule_ratio)

    stop_after = timeline.to_batches(config.profile_prefix) if config.profile_prefix else None
    varying = [name for name in config.algorithms if name in VARYING_STEP_COST_ALGORITHMS]
    task = build_task(config.task.name)
    quality_log = TimeToAccuracyLogger(
        run_dir,
        task,
        config.accuracy_targets,
        profile_prefix=stop_after,
        varying_cost=varying,
        provenance=provenance(device, world_size, config.launcher.nnodes) if rank == 0 else None,
        budget_seconds=budget.seconds if budget else None,
    )
    steps = StepTimeLogger(run_dir, config.log_interval)
    console_logger = ConsoleLogger(quality_log, live=config.progress, console=console)
    callbacks = [quality_log, steps, console_logger] if rank == 0 else []
    if rank == 0 and "tensorboard" in config.loggers:
        from trainrun.loggers.tensorboard import TensorBoardLogger

        callbacks.append(TensorBoardLogger(run_dir, config.log_interval))
    state = State(
        model=model,
        optimizer=None,
        timeline=timeline,
        device=device,
        precision=precision,
        rank=rank,
        world_size=world_size,
        loss_fn=task.loss(config.loss),
        task=task,
        data=data,
        num_classes=config.model.num_classes,
        train_resolution=config.data.resolution,
        accounts=TimeAccounts(CudaEventClock() if device.type == "cuda" else None, record_steps=rank == 0),
    )
    warmup = warmup_batches(config.scheduler, timeline, config.scale_schedule_ratio)
    if budget is None and warmup > timeline.max_batches:
        state.warn(
            f"scheduler.t_warmup={config.scheduler.t_warmup} ({warmup} steps) is longer than the whole run "
            f"(max_duration={config.max_duration}, {timeline.max_batches} steps): the learning rate never reaches "
            f"optimizer.lr"
        )
    checkpoint_dir = run_dir / "checkpoints"
    settings = TrainerSettings(
        eval_interval=config.eval_interval,
        log_interval=config.log_interval,
        checkpoint_dir=checkpoint_dir,
        checkpoint_interval=config.checkpoint.interval,
        checkpoint_keep=config.checkpoint.keep,
        checkpoint_final=config.checkpoint.save_final,
        compile=config.compile,
        stop_after=stop_after,
        stop_at=config.stop_at,
        microbatching=Microbatching.parse(config.device_train_microbatch_size),
        budget=budget,
    )
    engine = Engine(build_algorithms(config.algorithms), callbacks)
    trainer = Trainer(state, optimization, engine, settings)

    offset = None
    resume_path = checkpoint.resolve_resume(config.resume, checkpoint_dir)
    if resume_path is not None:
        offset = trainer.load_checkpoint(checkpoint.load_checkpoint(resume_path))
        if rank == 0:
            quality_log.resume_from(state.batch)
            steps.resume_from(state.batch)
        console.print(f"resumed from {resume_path} at epoch {state.epoch}, batch {state.batch}")
    if rank == 0:
        atomic_write_text(run_dir / "config.yaml", config_yaml)
    console.print(
        f"run dir {run_dir} | {config.model.name} on {config.data.name} ({config.data.loader}) | "
        f"{device} {config.precision} "
        f"| {world_size} rank(s) | "
        + (f"{budget.seconds:.0f} s of training ({config.max_duration})" if budget else f"{timeline.max_batches} steps")
        + f" of {config.train_batch_size}",
        highlight=False,
        soft_wrap=True,
    )
    if hasattr(model, "attention_kernels"):  # which fused attention kernel the device gives this run
        dtype = precision.dtype or torch.float32
        kernels = model.attention_kernels(config.data.max_seq_len, dtype, device)
        console.print(f"attention: {kernels}", highlight=False, soft_wrap=True)
    try:
        trainer.fit(offset)
        if rank == 0 and config.checkpoint.save_final and config.profile_prefix is None:
            for line in task.export(state, run_dir):
                console.print(line, highlight=False, soft_wrap=True)
    except BaseException as error:
        if rank == 0:
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            with contextlib.suppress(OSError):  # a full disk must not hide the error that ended the run
                quality_log.write_summary(state, status, str(error) or type(error).__name__)
        raise
    finally:
        distributed.leave()
    return state
