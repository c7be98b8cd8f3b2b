"""One rank of a run as fake tensors: the run's model (built by trainrun's builders on the meta
device, with its methods' structure), sharded as the trainer shards it over a fake process group,
its optimizer and its state, one step's passes reduced as the trainer reduces them (of more than
two micro-batches the first and the last: those between hold what the first does) and one
evaluation micro-batch, measured by torch's memory trackers (``MemTracker``; ``FSDPMemTracker``
under fsdp); a pass's model FLOPs are counted apart, on the whole model without checkpointing, by
torch's FLOP counter (:func:`pass_flops`). :mod:`trainrun.estimate` sizes runs with it.

Written here because the rank has to be trainrun's (its builders, its micro-batching, its optimizer);
it follows torchtitan's ``scripts/estimate/estimation.py``. The tensors are on the CPU device
(attention as the CPU's flash kernel keeps it: output and log-sum-exp, as CUDA's flash and
memory-efficient kernels do with a mask or dropout inside, where the CPU's math path would keep its
scores: :class:`AsFusedAttention`); the optimizer's update is not tracked (torch's fused and foreach
kernels update the state in place: what the state holds is counted, not a kernel's scratch).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.utils._python_dispatch import TorchDispatchMode

from trainrun.algorithms import build_algorithms
from trainrun.core import parallel
from trainrun.core.microbatches import microbatch_slices, take
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.data.interface import TextFacts
from trainrun.estimate.autocast import AsGpuAutocast, AsGpuGroupedProducts
from trainrun.estimate.flops import flop_formulas
from trainrun.estimate.layout import batch_format, inductor_lays_out_channels_last, laid_out_channels_last
from trainrun.estimate.operations import (
    GROUPED_KERNEL_ARCHITECTURES,
    AsFusedAttention,
    InsideRegions,
    Operation,
    OperationLog,
)
from trainrun.estimate.trackers import evaluation_tracker, forward_only, whole_peak_only
from trainrun.models.build import build_model
from trainrun.optim.optimizers import build_optimizer
from trainrun.run import parallelism
from trainrun.schema import TrainConfig
from trainrun.tasks.base import BatchPlace, Task

GB = 1e9
COMPUTE_DTYPES = {"fp32": None, "amp": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


@dataclass(frozen=True)
class RunShape:
    """What one rank of the run holds and runs: its ranks, batches and model inputs."""

    ranks: int
    nodes: int
    per_rank_batch: int
    micro_batch: int
    eval_micro_batch: int
    text: TextFacts | None  # a language model's vocabulary and window
    vocab_source: str
    checkpointing: str

    @property
    def passes(self) -> int:
        return len(microbatch_slices(self.per_rank_batch, self.micro_batch))


@dataclass(frozen=True)
class MethodWork:
    """A method's work on the device besides the passes (``Algorithm.device_work``), as operations."""

    name: str
    interval: str  # how often it runs: a duration
    operations: tuple[Operation, ...]  # each as OperationLog records it


@dataclass(frozen=True)
class Memory:
    """One rank's memory (GB) for a :class:`RunShape`, and the operations of its optimizer's step and
    of its methods' work on the device besides the passes."""

    held: dict[str, float]  # between steps: weights, gradients, optimizer state
    peak: dict[str, float]  # at the step's peak, by part, with its total
    eval_peak: float
    optimizer: tuple[Operation, ...] = ()  # each as OperationLog records it
    methods: tuple[MethodWork, ...] = ()
    units: int = 1  # FSDP2's units (its repeated blocks and the root); 1 unsharded

    @property
    def highest(self) -> float:
        return max(self.peak["total"], self.eval_peak)


@contextlib.contextmanager
def fake_world(ranks: int) -> Iterator[None]:
    """A process group of ``ranks`` that exchanges nothing (torch's fake backend), for one rank's view."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("trainrun estimate runs outside a process group")
    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def meta_model(config: TrainConfig, shape: RunShape) -> nn.Module:
    """The run's model on the meta device, with its methods' structure (built outside fake mode:
    fake tensors of the meta device do not materialise)."""
    from trainrun.models.found import built_on_meta

    torch.manual_seed(config.seed)
    model = built_on_meta(lambda: build_model(dataclasses.replace(config.model, weights=None), shape.text))
    for method in build_algorithms(config.algorithms):
        method.rebuild(model)
    return model


def materialise(model: nn.Module) -> None:
    """``model.to_empty(device="cpu")`` that keeps a tensor registered twice one tensor (MONAI's
    DynUNet registers its blocks under two names; torch's swap of a meta tensor for a fake one
    refuses a tensor held twice)."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, parameter in module._parameters.items():
            if parameter is not None and id(parameter) not in made:
                made[id(parameter)] = nn.Parameter(torch.empty_like(parameter, device="cpu"), parameter.requires_grad)
            if parameter is not None:
                module._parameters[name] = made[id(parameter)]
        for name, buffer in module._buffers.items():
            if buffer is not None and id(buffer) not in made:
                made[id(buffer)] = torch.empty_like(buffer, device="cpu")
            if buffer is not None:
                module._buffers[name] = made[id(buffer)]


def frozen_as_buffers(model: nn.Module) -> None:
    """Each frozen parameter (ALiBi's zero position table) held as a buffer of the same tensor: the
    same bytes, which torch's ``MemTracker`` cannot track as a parameter (it hooks every parameter's
    gradient, and a tensor without one refuses the hook)."""
    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            if not parameter.requires_grad:
                del module._parameters[name]
                module.register_buffer(name, parameter.data)


class _Rank:
    """The run's model (from the meta device), optimizer and task on one rank, as fake tensors."""

    def __init__(
        self, config: TrainConfig, shape: RunShape, task: Task, model: nn.Module, mesh: DeviceMesh | None
    ) -> None:
        self.config, self.shape, self.task = config, shape, task
        self.dtype = COMPUTE_DTYPES[config.precision]
        settings = dataclasses.replace(parallelism(config), activation_checkpointing=shape.checkpointing)
        self.sharded = mesh is not None
        frozen_as_buffers(model)
        if self.sharded:
            model = parallel.prepare(model, settings, self.dtype, torch.device("cpu"), mesh)
        else:  # as prepare leaves it: checkpointed, whole on the device
            parallel.checkpoint_activations(model, settings)
            materialise(model)
            if hasattr(model, "initialise"):
                model.initialise()
        self.model = model
        self.optimizer = build_optimizer(model, config.optimizer, config.train_batch_size)
        self.loss_fn = getattr(task, "fake_tensor_loss", task.loss)(config.loss)

    def batch(self, example: Any) -> tuple[Any, Any]:
        """``example`` (:func:`example_batch`) as the task hands it to the model: fake tensors on the
        device, and what the task keeps on the host (its ``host_keys``: counts the host reads) real."""
        from torch._guards import detect_fake_mode

        state = BatchPlace(torch.device("cpu"), batch_format(self.model))
        inputs, targets, _ = self.task.batch(example, state)
        mode, host = detect_fake_mode(), getattr(self.task, "host_keys", ())

        def on_device(value: Any, key: str = "") -> Any:
            if isinstance(value, dict):
                return {name: on_device(item, name) for name, item in value.items()}
            if isinstance(value, torch.Tensor) and key not in host and mode.is_our_fake(value) is False:
                return mode.from_tensor(value)
            return value

        return on_device(inputs), on_device(targets)

    def autocast(self) -> contextlib.AbstractContextManager:
        return Precision(self.config.precision, "cpu", self.dtype).autocast()

    def step_passes(self, inputs: Any, targets: Any, tracker: Any | None = None, passes: int = 2) -> None:
        """A step's forward and backward passes, each micro-batch reduced as the trainer reduces it;
        of more than ``passes``, the first ones and the last (those between hold what the first do)."""
        size = self.shape.per_rank_batch
        parts = microbatch_slices(size, self.shape.micro_batch)
        parts = parts if len(parts) <= passes else [*parts[: passes - 1], parts[-1]]
        for index, part in enumerate(parts):
            with parallel.pass_context(self.model, self.model, synchronises=index == len(parts) - 1):
                with unset_fake_temporarily():  # a batch's host counts stay real: the host reads them
                    part_inputs, part_targets = (take(value, part, size) for value in (inputs, targets))
                with self.autocast():
                    loss = self.loss_fn(self.model(part_inputs), part_targets)
                (loss * (part.stop - part.start) / size).backward()
            if tracker is not None:
                tracker.reset_mod_stats()  # the tracker follows one forward per module between resets

    def make_optimizer_state(self) -> None:
        """The optimizer's state, as its first step makes it."""
        self._optimizer_step(contextlib.nullcontext())

    def optimizer_operations(self) -> tuple[Operation, ...]:
        """A step of the optimizer after the first (which made its state) as its operations
        (:class:`OperationLog`): on the rank's shards under fsdp, its share of Muon's products."""
        log = OperationLog()
        self._optimizer_step(log)
        return tuple(log.operations)

    def method_operations(self, inputs: Any, targets: Any) -> tuple[MethodWork, ...]:
        """Each of the run's methods' work on the device besides the passes, once, as its operations:
        each method reads a state of this rank's model and a batch, a step into a one-step run."""
        precision = Precision(self.config.precision, "cpu", self.dtype)  # a record: fp8 is not checked on the CPU
        state = State(
            self.model, self.optimizer, Timeline(1, self.shape.per_rank_batch, 1), torch.device("cpu"), precision
        )
        state.inputs, state.targets, state.num_classes = inputs, targets, self.config.model.num_classes
        found = []
        for method in build_algorithms(self.config.algorithms):
            work = method.device_work(state)
            if work is not None:
                run, interval = work
                log = OperationLog()
                with log:
                    run()
                found.append(MethodWork(method.name, interval, tuple(log.operations)))
        return tuple(found)

    def _optimizer_step(self, under: contextlib.AbstractContextManager) -> None:
        """One optimizer step from zero gradients, the step alone under ``under``."""
        for parameter in self.model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        with under:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def evaluate(self, inputs: Any) -> None:
        self.model.eval()
        with torch.no_grad(), self.autocast():
            self.task.predict(self.model, inputs)
        self.model.train()

    def tracker(self, evaluation: bool = False) -> Any:
        """torch's memory tracker of this rank's step (an ``evaluation``'s: :func:`evaluation_tracker`)."""
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed._tools.mem_tracker import MemTracker

        kind = whole_peak_only(FSDPMemTracker if self.sharded else MemTracker)
        kind = evaluation_tracker(kind) if evaluation else kind
        if self.sharded:
            return kind(self.model, self.optimizer)
        tracker = kind()
        tracker.track_external(self.model, *self.optimizers)
        return tracker

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """The optimizers holding the state: the run's, or those it is made of (Muon with Adam)."""
        return getattr(self.optimizer, "parts", (self.optimizer,))

    def held(self) -> dict[str, float]:
        """GB this rank holds between steps (its gradients as a step leaves them)."""
        return {part: round(held / GB, 3) for part, held in parallel.held_bytes(self.model, self.optimizers).items()}


def tracked_parts(snapshot: dict) -> dict[str, float]:
    """A tracker's snapshot of the CPU device as GB by part, the total last."""
    (device_snapshot,) = snapshot.values()
    named = {(key if isinstance(key, str) else key.value).lower(): value / GB for key, value in device_snapshot.items()}
    return {key: round(value, 3) for key, value in named.items() if value > 0 or key == "total"}


def measure(config: TrainConfig, shape: RunShape, task: Task) -> Memory:
    """One rank's memory through a training step and an evaluation micro-batch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = meta_model(config, shape)
    # made outside fake mode: the host's counts a collation reads must have values
    examples = [task.example_batch(config, size, shape.text) for size in (shape.per_rank_batch, shape.eval_micro_batch)]
    sharded = parallel.shards(parallel.Parallelism(config.parallel.name))
    mesh = parallel.sharding_mesh("cpu", shape.ranks, shape.nodes) if sharded else None  # made outside fake mode
    with FakeTensorMode(allow_non_fake_inputs=True), AsGpuGroupedProducts(), AsFusedAttention():
        rank = _Rank(config, shape, task, model, mesh)
        inputs, targets = rank.batch(examples[0])
        rank.make_optimizer_state()
        operations = rank.optimizer_operations()
        methods = rank.method_operations(inputs, targets)
        tracker = rank.tracker()
        if rank.sharded:
            tracker.track_inputs((inputs,))
        with tracker:
            rank.step_passes(inputs, targets, tracker)
        peak = tracked_parts(tracker.get_tracker_snapshot("peak"))
        held = rank.held()
        rank.optimizer.zero_grad(set_to_none=True)
        eval_inputs, _ = rank.batch(examples[1])
        eval_tracker = rank.tracker(evaluation=True)
        with eval_tracker:
            rank.evaluate(eval_inputs)
        eval_peak = tracked_parts(eval_tracker.get_tracker_snapshot("peak"))["total"]
    units = sum(isinstance(module, FSDPModule) for module in rank.model.modules()) if rank.sharded else 1
    return Memory(held, peak, eval_peak, operations, methods, units)


def pass_flops(config: TrainConfig, task: Task, text: TextFacts | None, samples: int, train: bool = True) -> float:
    """Model FLOPs of ``samples`` samples of ``config``'s shapes (``data.resolution``, ``text``'s
    window, the crops): a training forward and backward, or an evaluation forward (``train``
    false), on the whole model as the run builds it with its methods, without activation
    checkpointing's recompute (a run's MFU is of model FLOPs); counted apart from :func:`measure`'s
    trackers, which the counter inside them would change (an evaluation's module tracker following
    the forward alone: :func:`~trainrun.estimate.trackers.forward_only`)."""
    from torch.utils.flop_counter import FlopCounterMode
    from torch.utils.module_tracker import ModuleTracker

    counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    if not train:
        counter.mod_tracker = forward_only(ModuleTracker)()
    _fake_pass(config, task, text, samples, train, counter)
    return float(counter.get_total_flops())


def pass_operations(
    config: TrainConfig,
    task: Task,
    text: TextFacts | None,
    samples: int,
    checkpointing: str = "none",
    train: bool = True,
) -> list[Operation]:
    """A training forward and backward (an evaluation forward: ``train`` false) of ``samples`` samples
    of ``config``'s shapes as the GPU runs its operations (:class:`OperationLog`): on the whole model,
    with ``checkpointing``'s recompute, attention as a fused kernel (:class:`AsFusedAttention`;
    FlexAttention's: ``as_fused_kernel``), each call in the precision the GPU's autocast gives it
    (:class:`AsGpuAutocast`); those of the modules a compiled run compiles marked so
    (:func:`~trainrun.core.compiled.compiled_regions`, and the loss where
    :func:`~trainrun.core.compiled.compiles_loss`), and under precision=fp8 the products of the layers
    torchao trains in float8 as float8 products with their casts
    (:data:`~trainrun.estimate.operations.FLOAT8_CAST_BYTES`); a channels-first convolution with cuDNN's
    transposes, but in a graph inductor lays out channels-last (:mod:`trainrun.estimate.layout`)."""
    from trainrun.core.compiled import compiled_regions, compiles_loss
    from trainrun.core.precision import float8_eligible
    from trainrun.models.flex import as_fused_kernel

    log = OperationLog(grouped_kernel=config.hardware.architecture in GROUPED_KERNEL_ARCHITECTURES)

    def watch(rank: _Rank) -> None:
        model = rank.model
        if config.compile:
            log.regions = InsideRegions(compiled_regions(model))
            if compiles_loss(model, rank.task):
                rank.loss_fn = log.regions.around(rank.loss_fn)
        if config.precision == "fp8":
            log.float8 = InsideRegions(
                [module for name, module in model.named_modules() if float8_eligible(module, name)]
            )

    with AsFusedAttention(text.real_token_share if text else None), AsGpuAutocast(), as_fused_kernel():
        _fake_pass(config, task, text, samples, train, log, checkpointing, watch)
    if not inductor_lays_out_channels_last(log.convolutions, inference=not train):
        return log.operations
    return laid_out_channels_last(log.operations, log.untiled)


def _fake_pass(
    config: TrainConfig,
    task: Task,
    text: TextFacts | None,
    samples: int,
    train: bool,
    under: TorchDispatchMode,
    checkpointing: str = "none",
    watch: Callable[[_Rank], None] | None = None,
) -> None:
    """A training pass (or an evaluation forward) of ``samples`` samples on fake tensors, run under
    ``under`` (``watch``: called with the rank before it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    shape = RunShape(1, 1, samples, samples, samples, text, "", checkpointing)
    model, example = meta_model(config, shape), task.example_batch(config, samples, text)
    with FakeTensorMode(allow_non_fake_inputs=True), AsGpuGroupedProducts():
        rank = _Rank(config, shape, task, model, None)
        inputs, targets = rank.batch(example)
        if watch:
            watch(rank)
        with under:
            if train:
                rank.step_passes(inputs, targets, passes=1)
            else:
                rank.evaluate(inputs)


def float8_share(config: TrainConfig, text: TextFacts | None, per_sample: float) -> float:
    """Of a training sample's ``per_sample`` FLOPs, those precision=fp8 computes in float8: the
    linear layers torchao's float8 training converts (:func:`~trainrun.core.precision.float8_eligible`),
    six FLOPs a weight a token forward and backward."""
    from trainrun.core.precision import float8_eligible

    model = meta_model(config, RunShape(1, 1, 1, 1, 1, text, "", "none"))
    weights = sum(module.weight.numel() for name, module in model.named_modules() if float8_eligible(module, name))
    tokens = text.max_seq_len * (text.real_token_share or 1.0) if text else 1
    return min(1.0, 6 * weights * tokens / per_sample)
