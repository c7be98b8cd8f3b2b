"""The training loop: fires events, steps the optimizer, evaluates and checkpoints on schedule.

The loop never names an algorithm; everything method-specific happens in the engine's
algorithms at the events listed in :class:`~trainrun.core.events.Event`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainrun.core import checkpoint, distributed, parallel, preemption, progress
from trainrun.core.budget import WallClockBudget
from trainrun.core.compiled import CompileRecord, compile_loss, compile_model
from trainrun.core.engine import Engine
from trainrun.core.evaluation import evaluated
from trainrun.core.events import Event
from trainrun.core.microbatches import Microbatching, StepPlan, average_gradients, take
from trainrun.core.preemption import PreemptionSignal
from trainrun.core.progress import Window
from trainrun.core.seeding import draws_state, restore_draws, seed_step
from trainrun.core.sharded_checkpoint import ShardedCheckpoints, load_sharded, load_whole
from trainrun.core.state import State
from trainrun.errors import CheckpointError, TrainingDiverged, WriteError

MAX_SKIPPED_STEPS = 50  # fp16: consecutive non-finite losses the gradient scaler may skip before a run has diverged


@dataclass
class TrainerSettings:
    """When to evaluate, check the loss and checkpoint."""

    eval_interval: str
    log_interval: int
    checkpoint_dir: Path | None = None
    checkpoint_interval: str | None = None
    checkpoint_keep: int = 2
    checkpoint_final: bool = True
    compile: bool = False  # torch.compile the model after the algorithms' surgery
    seed: int = 0  # each step's random draws on each rank are keyed to (seed, step, rank)
    stop_after: int | None = None  # profile a prefix: stop after this many steps of the full schedule
    stop_at: float | None = None  # stop at the first evaluation whose quality metric reaches this
    microbatching: Microbatching = field(default_factory=Microbatching)  # gradient accumulation per process
    budget: WallClockBudget | None = None  # train until this much training time is spent
    parallel: parallel.Parallelism = field(default_factory=parallel.Parallelism)  # whole copies (DDP) or shards
    async_checkpoints: bool = False  # sharded checkpoints written in the background
    preemption: PreemptionSignal | None = None  # a scheduler's notice: checkpoint and stop (core/preemption.py)
    replicas: Any = None  # core/replicas.py's Replicas: each node a replica group that trains on when one is lost


class Trainer:
    """Runs ``state`` to its ``max_duration``; algorithms and callbacks act through ``engine``.

    ``state.task`` turns batches into inputs and targets and evaluates. ``optimization`` builds
    the optimizer and its per-step LR scheduler for the model once the algorithms have changed it
    at INIT (new layers must be optimized too). Algorithms' saved state is restored right after
    FIT_START, once each has built what it keeps (an average, a copy of the weights).
    """

    def __init__(
        self,
        state: State,
        optimization: Callable[[nn.Module], tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]],
        engine: Engine,
        settings: TrainerSettings,
    ) -> None:
        self.state = state
        self.engine, self.settings = engine, settings
        self._pending_losses: list[torch.Tensor] = []
        self.window = Window()
        self._algorithm_states: dict[str, Any] | None = None  # from a checkpoint, restored after FIT_START
        self._skipped_in_a_row = 0  # fp16: consecutive steps whose loss was not finite (the scaler skipped them)
        self.model_source = checkpoint.model_source(state.model)  # read once: what every checkpoint records
        engine.run(Event.INIT, state)  # model surgery first: the optimizer must see the final parameters
        # fp8: float8 linear layers, before sharding (which gathers them in float8)
        state.precision.convert(state.model, sharded=parallel.shards(settings.parallel))
        compute_dtype = state.precision.dtype if state.precision.dtype == torch.bfloat16 else None
        state.model = parallel.prepare(state.model, settings.parallel, compute_dtype, state.device)
        state.optimizer, self.scheduler = optimization(state.model)
        if settings.compile:
            state.compiled = CompileRecord()
            state.loss_fn = compile_loss(state.model, state.task, state.loss_fn)
            state.model = compile_model(state.model, state.warn)
        if state.world_size > 1 and not parallel.is_sharded(state.raw_model):
            # each rank keeps its own batch-norm statistics between evaluations (averaged where read)
            state.model = parallel.replicate(state.model, state.device, state.find_unused_parameters)
        self.shards = (
            ShardedCheckpoints(
                state.is_main,
                state.world_size,
                settings.checkpoint_keep,
                settings.async_checkpoints,
                on_gpu=state.device.type == "cuda",
            )
            if settings.parallel.name == "fsdp"
            else None
        )
        self.replicas = settings.replicas
        if self.replicas is not None:
            self.replicas.attach(state, lambda: progress.payload(self, self.window), self._received)

    @property
    def last_batch(self) -> int:
        """The step training ends after: the schedule's end (as planned now) or the profiled prefix's."""
        end = self.state.timeline.max_batches
        return min(end, self.settings.stop_after) if self.settings.stop_after else end

    def _steps(self, interval: str | None) -> int:
        """Steps in ``interval`` as the timeline stands now (0: never)."""
        return self.state.timeline.to_batches(interval) if interval else 0

    # ----------------------------------------------------------------------------------------
    def fit(self, accounts_offset: dict[str, Any] | None = None) -> State:
        """Train until ``max_duration``; evaluate and checkpoint at their intervals."""
        state = self.state
        state.accounts.start(accounts_offset)
        state.model.train()
        self.engine.run(Event.FIT_START, state)
        if self._algorithm_states is not None:
            self.engine.load_state_dict(self._algorithm_states)
            self._algorithm_states = None
        while state.batch < self.last_batch and state.stop_reason is None:
            if state.batch_in_epoch == 0:
                self.engine.run(Event.EPOCH_START, state)
            self._train_epoch(state.data.train_batches(state.epoch, skip=state.batch_in_epoch))
        self._flush_losses()
        if (preempted := state.stop_reason == preemption.STATUS) and self.settings.checkpoint_dir:
            self.save_checkpoint()  # first: the scheduler's grace time runs
        state.accounts.begin_step(state.batch + 1, "other")  # closes the last step's row
        state.accounts.resolve_device()
        state.unreadable_files = distributed.gathered(state.data.unreadable_files(), state.world_size)
        self.engine.run(Event.FIT_END, state)
        if self.settings.checkpoint_dir and self.settings.checkpoint_final and not preempted:
            self.save_checkpoint()
        if self.shards:
            self.shards.finish()
        return state

    def _train_epoch(self, batches: Iterator) -> None:
        state, accounts, replicas = self.state, self.state.accounts, self.replicas
        while state.batch < self.last_batch:
            accounts.begin_step(state.batch + 1, "data")
            if replicas is not None and replicas.begin_step(state.batch):
                return  # this node joined with a live node's state: its data goes on from there
            try:
                batch = next(batches)
            except StopIteration:
                break
            samples = self._train_step(batch)
            while samples is None:  # a node lost in the step: the step again, with the next quorum
                replicas.begin_step(state.batch)
                samples = self._train_step(batch)
            state.batch += 1
            state.batch_in_epoch += 1
            state.samples += samples * state.data_ranks
            self.window.samples += samples * state.data_ranks
            self.engine.run(Event.BATCH_END, state)
            if state.batch_in_epoch == state.timeline.batches_per_epoch:
                self.engine.run(Event.EPOCH_END, state)
                state.epoch += 1
                state.batch_in_epoch = 0
            self._after_step()
            if state.batch_in_epoch == 0 or state.stop_reason is not None:
                break

    def _train_step(self, batch: Any) -> int | None:
        """One optimizer step over this rank's ``batch`` and the missing nodes' shares it trains
        (fault_tolerance=replicas); its own share's samples, or None: not committed, gradients dropped."""
        state, accounts = self.state, self.state.accounts
        shares = [(state.data_rank, batch), *(self.replicas.missing_batches(state) if self.replicas else [])]
        several = len(shares) > 1
        prepared = [self._prepared(rank, batch, index == 0, several) for index, (rank, batch) in enumerate(shares)]
        terms = self._terms_on_all_ranks([targets for _, targets, _, _ in prepared])
        losses = []
        for state.inputs, state.targets, _, draws in prepared:
            if several:  # each share's passes draw what they would on its own rank; its gradients kept apart
                restore_draws(draws, state.device)
            losses.append(self._passes(state.inputs, state.targets, terms))
            if several:  # summed as the nodes' are (core/replicas.py)
                self.replicas.hold_share(self._trainable())
        if self.replicas is not None and not self.replicas.exchanged(self._trainable()):
            state.optimizer.zero_grad(set_to_none=True)
            return None
        (state.inputs, state.targets, samples, _), scaler, run = prepared[0], state.precision.scaler, self.engine.run
        state.loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        accounts.switch("optimizer")
        if scaler:
            scaler.unscale_(state.optimizer)
        run(Event.BEFORE_OPTIMIZER_STEP, state)
        state.precision.step(state.optimizer, state.raw_model)
        state.optimizer.zero_grad(set_to_none=True)
        if self.settings.budget is not None:
            self.settings.budget.after_step(state, state.batch + 1)
        self.scheduler.step()
        self._pending_losses.append(state.loss.detach())
        accounts.switch("other")
        return samples

    def _prepared(self, data_rank: int, batch: Any, first: bool, several: bool) -> tuple[Any, Any, int, Any]:
        """A share's batch as the model takes it (seeded for its data rank); among ``several``, the
        state its draws are in after AFTER_DATALOADER, which its passes start from."""
        state, accounts = self.state, self.state.accounts
        seed_step(self.settings.seed, state.batch, data_rank, state.device)
        if first:
            self.engine.run(Event.BATCH_START, state)
        accounts.switch("to_device")
        state.inputs, state.targets, samples = state.task.batch(batch, state)
        accounts.switch("forward")
        self.engine.run(Event.AFTER_DATALOADER, state)
        return state.inputs, state.targets, samples, draws_state(state.device) if several else None

    def _trainable(self) -> list[nn.Parameter]:
        return [p for p in self.state.raw_model.parameters() if p.requires_grad]

    def _passes(self, inputs: Any, targets: Any, terms: torch.Tensor | None) -> torch.Tensor:
        """A share's passes (micro-batched; under ``auto`` retried smaller when any rank ran out of memory)."""
        state, microbatching = self.state, self.settings.microbatching
        while True:
            plan, out_of_memory = microbatching.plan(inputs, state.world_size), False
            try:
                loss = self._forward_backward(inputs, targets, plan, terms)
            except torch.OutOfMemoryError:
                if not microbatching.may_retry(plan, state.world_size):
                    raise
                out_of_memory = True
            if not microbatching.retry(state, plan, out_of_memory):
                break
        if plan.by_hand:
            average_gradients(self._trainable(), state.world_size)
        microbatching.step_fitted()
        return loss

    def _terms_on_all_ranks(self, shares: list[Any]) -> torch.Tensor | None:
        """On several ranks, the step's loss terms over all of them (of each share's targets) when the
        task's vary by batch: one all-reduce of a count on the device, before the step's passes (every
        rank makes it at the same point). None on one rank and when there is one term per sample."""
        state = self.state
        if state.data_ranks == 1:
            return None
        counts = [state.task.loss_terms(targets) for targets in shares]
        if counts[0] is None:
            return None
        terms = torch.stack(counts).sum(0)
        if state.world_size > 1:
            dist.all_reduce(terms)
        return terms if self.replicas is None else self.replicas.summed(terms)

    def _loss_share(
        self, part: slice, batch_size: int, parts: int, terms: torch.Tensor | None
    ) -> torch.Tensor | float | None:
        """What a micro-batch's mean loss is multiplied by so that the ranks' gradients, which DDP
        averages, are those of the mean over every term of the step: its share of the step's
        ``terms`` (times the ranks), or without them of the samples; None: the loss as it is."""
        if terms is None:
            return None if parts == 1 else (part.stop - part.start) / batch_size
        return self.state.task.loss_terms(self.state.targets) * self.state.data_ranks / terms

    def _forward_backward(self, inputs: Any, targets: Any, plan: StepPlan, terms: torch.Tensor | None) -> torch.Tensor:
        """Forward and backward over ``plan``'s micro-batches; return the batch's mean loss.

        Each micro-batch fires BEFORE_FORWARD to AFTER_BACKWARD (``state.inputs``/``targets`` hold
        it) and its loss counts by its share of the batch (:meth:`_loss_share`); DDP synchronises
        in the pass ``plan`` says, the others run under ``no_sync``; FSDP2 reduce-scatters in every
        pass (:func:`~trainrun.core.parallel.defers_reduction`).
        """
        state, run, accounts = self.state, self.engine.run, self.state.accounts
        scaler, parts = state.precision.scaler, plan.parts
        if terms is None and len(parts) > 1:  # one rank, a split batch: the batch's own count
            terms = state.task.loss_terms(targets)
        total = None
        for index, part in enumerate(parts):
            if len(parts) > 1:
                state.inputs, state.targets = take(inputs, part, plan.batch_size), take(targets, part, plan.batch_size)
            synchronise = plan.synchronises(index) or state.world_size == 1
            with parallel.pass_context(state.model, state.raw_model, synchronise):
                accounts.switch("forward")
                with state.precision.autocast():
                    run(Event.BEFORE_FORWARD, state)
                    state.outputs = state.model(state.inputs)
                    run(Event.AFTER_FORWARD, state)
                    run(Event.BEFORE_LOSS, state)
                    state.loss = state.loss_fn(state.outputs, state.targets)
                    run(Event.AFTER_LOSS, state)
                accounts.switch("backward")
                run(Event.BEFORE_BACKWARD, state)
                share = self._loss_share(part, plan.batch_size, len(parts), terms)
                loss = state.loss if share is None else state.loss * share
                (scaler.scale(loss) if scaler else loss).backward()
                run(Event.AFTER_BACKWARD, state)
            total = loss.detach() if total is None else total + loss.detach()
        return total

    def _after_step(self) -> None:
        state, settings = self.state, self.settings
        if state.batch % settings.log_interval == 0:
            self._flush_losses()
        ends = state.timeline.ends_interval
        if ends(state.batch, self._steps(settings.eval_interval)):
            self.evaluate()
            self._stop_if_target_reached()
        checkpoint_every = self._steps(settings.checkpoint_interval)
        if checkpoint_every and ends(state.batch, checkpoint_every):
            if state.batch < state.timeline.max_batches or not settings.checkpoint_final:
                self.save_checkpoint()

    def _stop_if_target_reached(self) -> None:
        """MLPerf's clock: the run ends at the first evaluation that reaches ``stop_at`` (at or above
        it, or at or below for a quality where lower is better: a loss). Every rank
        sees the same metrics (reduced over ranks), so every rank stops at the same step."""
        state, target, rule = self.state, self.settings.stop_at, self.state.task.quality_rule
        value = state.eval_metrics[rule.metric]
        if target is not None and rule.reached(value, target):
            state.stop_reason = "target_reached"
            state.notice(f"{rule.label} {rule.format(value)} reached stop_at={target:g}: training stops here")

    def _flush_losses(self) -> None:
        """Check the losses of the steps since the last flush; stop with the step of a NaN/inf.

        Under fp16 loss scaling a non-finite loss is a step the scaler skipped (its gradients are
        not finite either), left out of the reported loss; only :data:`MAX_SKIPPED_STEPS` of them
        in a row mean divergence. Every rank flushes at the same steps and the ranks decide
        together (the first diverged step on any rank), so all of them stop there with the same
        message rather than some waiting in a collective for the one that stopped. A scheduler's
        notice on any rank is decided in the same collective: every rank stops at this step.
        """
        state = self.state
        if not self._pending_losses:
            return
        values = torch.stack(self._pending_losses).float().cpu()
        state.accounts.resolve_device()  # the GPU has just been synchronised anyway
        first_step = state.batch - len(values) + 1
        self._pending_losses.clear()
        finite = torch.isfinite(values)
        diverged = None
        for offset, ok in enumerate(finite.tolist()):
            self._skipped_in_a_row = 0 if ok else self._skipped_in_a_row + 1
            tolerated = state.precision.scaler is not None and self._skipped_in_a_row < MAX_SKIPPED_STEPS
            if not ok and not tolerated and diverged is None:
                diverged = first_step + offset
        notice = self.settings.preemption
        asked = state.batch if notice is not None and notice.received else None
        diverged, asked = distributed.firsts_on_any_rank([diverged, asked], state.world_size)
        if diverged is not None:
            raise TrainingDiverged(
                f"loss is not finite at step {diverged} (epoch {state.epoch}); "
                "try a lower optimizer.lr, gradient clipping or precision=fp32"
            )
        if asked is not None and state.stop_reason is None:  # core/preemption.py
            state.stop_reason = preemption.STATUS
            state.notice(f"{preemption.SIGNAL.name} (a scheduler's notice): checkpoint at step {state.batch}, stop")
        if not finite.all():
            state.notice(f"fp16 loss scaling skipped {int((~finite).sum())} step(s) before step {state.batch + 1}")
        self.window.loss_sum += float(values[finite].sum())
        self.window.loss_count += int(finite.sum())
        if finite[-1]:
            state.train_loss = float(values[-1])

    # ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The task's metrics on the evaluation set and the window's training figures, over all ranks."""
        state, window = self.state, self.window
        self._flush_losses()
        previous = state.accounts.switch("eval")
        self.engine.run(Event.EVAL_START, state)
        distributed.average_buffers(state.raw_model, state.world_size)  # each rank's statistics, averaged
        state.model.eval()
        metrics = evaluated(state, self.settings.microbatching.size)  # in micro-batches, each sample once
        losses = torch.tensor([window.loss_sum, window.loss_count], dtype=torch.float64, device=state.device)
        if state.world_size > 1:
            dist.all_reduce(losses)
        state.eval_metrics = {
            **metrics,
            "train_loss": float(losses[0] / losses[1]) if losses[1] else float("nan"),
            "throughput": self.window_throughput(),
        }
        state.model.train()
        if state.compiled is not None:
            state.compiled.end_warm_up()
        self.engine.run(Event.EVAL_END, state)
        self.window = Window(started=state.accounts.train_seconds())
        state.accounts.switch(previous)
        return state.eval_metrics

    def window_throughput(self) -> float:
        """Training samples per second since the last evaluation."""
        seconds = self.state.accounts.train_seconds() - self.window.started
        return self.window.samples / seconds if seconds > 0 else 0.0

    def save_checkpoint(self) -> None:
        """Rank 0 writes a checkpoint atomically and prunes old ones; all ranks wait for it."""
        state, directory = self.state, self.settings.checkpoint_dir
        self._flush_losses()  # the window saved holds every step's loss, not only those of past log intervals
        previous = state.accounts.switch("checkpoint")
        distributed.average_buffers(state.raw_model, state.world_size)  # as an evaluation here would see them
        window = self._global_window()
        name = checkpoint.checkpoint_name(state.epoch, state.batch, sharded=self.shards is not None)
        try:
            if self.shards and state.replica == 0:  # fault_tolerance=replicas: node 0's ranks write
                payload = progress.payload(self, window, weights=False)  # the ranks write the weights
                self.shards.save(directory / name, state.raw_model, state.optimizer, payload)
            elif state.is_main:
                checkpoint.atomic_torch_save(progress.payload(self, window), directory / name)
                checkpoint.prune(directory, self.settings.checkpoint_keep)
        except OSError as error:  # disk full, quota, permissions: the older checkpoints are untouched
            raise WriteError(
                f"could not write checkpoint '{directory / name}': {error.strerror or error}; the checkpoints "
                "written before it are intact (resume=auto continues from the newest)"
            ) from error
        distributed.wait_for_all(state.world_size)
        state.accounts.switch(previous)

    def _global_window(self) -> Window:
        """The window with every rank's losses summed: what a resume on any number of ranks continues."""
        window, world_size = self.window, self.state.world_size
        if world_size == 1:
            return window
        losses = torch.tensor([window.loss_sum, window.loss_count], dtype=torch.float64)
        dist.all_reduce(losses)  # through gloo: the window lives on the host
        return Window(float(losses[0]), int(losses[1]), window.samples, window.started)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore checkpoint ``path`` (a file, or a folder of any ranks' shards); the accounts to go on from."""
        state = self.state
        payload = checkpoint.load_checkpoint(path)
        checkpoint.check_topology(payload, state.timeline.samples_per_batch, state.data_ranks)
        checkpoint.check_readable(path, parallel.is_sharded(state.raw_model), state.world_size)
        if checkpoint.is_sharded(path):
            load_sharded(path, state.raw_model, state.optimizer, state.world_size)
        elif payload.get("optimizer") is None:
            raise CheckpointError(
                f"checkpoint '{path}' holds weights only (consolidate --weights-only): start from them with "
                f"model.weights={path}"
            )
        else:
            checkpoint.check_model_shapes(state.raw_model.state_dict(), payload["model"])
            load_whole(state.raw_model, state.optimizer, payload["model"], payload["optimizer"])
        self._algorithm_states = progress.restore(self, payload)
        return payload["accounts"]

    def _received(self, payload: dict[str, Any]) -> None:
        """A live node's payload, its weights and optimizer state already in place: the rest, now."""
        self.engine.load_state_dict(progress.restore(self, payload))
